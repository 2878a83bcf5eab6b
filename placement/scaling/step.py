"""Step time of one worker (`mp_degree` devices) at a per-worker batch, from its plan.

Batch rule. A graph is profiled at one batch b0 (`graph.metadata["batch"]`, or
given). Per micro-batch of m samples an op computes for t(b0) * max(m, m_floor) / b0:
linear in the batch above a small-batch floor m_floor, below which the device is
under-occupied and fewer samples take no less time (the flat left end of every GPU
throughput-vs-batch curve). Tensor sizes (edges, outputs, saved activations) scale
exactly linearly in the batch; parameters and their gradients do not. The plan's
placement and per-device task order are kept and re-simulated at the new batch, so
the step time is the plan's own schedule, not a rescaled number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from placement.cluster import ClusterSpec
from placement.errors import UserError
from placement.graph import Op, OpGraph
from placement.plan import Plan
from placement.simulate import evaluate_order, memory_bytes
from placement.tasks import Task, TaskGraph, build_tasks, corun_slowdown, split_overhead


@dataclass(frozen=True, kw_only=True)
class BatchRule:
    profiled_batch: float
    """b0: the batch the graph's op times were measured at (samples)."""
    min_efficient_batch: float = 8.0
    """m_floor: samples per micro-batch below which an op takes no less time."""
    fixed_fraction: float = 0.0
    """f: the share of an op's time at b0 that does not depend on the batch (launches,
    the interpreter, allocations), from `fit_fixed_fraction`; 0 is purely linear."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.fixed_fraction <= 1.0:
            raise ValueError(f"fixed_fraction={self.fixed_fraction}: must be in [0, 1]")
        if not (self.profiled_batch > 0 and math.isfinite(self.profiled_batch)):
            raise UserError(f"profiled batch {self.profiled_batch}: must be > 0 samples "
                            "(pass --profiled-batch or set the graph's metadata.batch)")
        if not self.min_efficient_batch >= 0:
            raise UserError(f"minimum efficient batch {self.min_efficient_batch}: must be >= 0")

    def compute_factor(self, batch: float, num_micro_batches: int) -> float:
        """Factor on an op's profiled full-batch time such that each of its K
        micro-batch tasks (1/K of it) costs t(b0) * (f + (1 - f) * m / b0), with
        m = max(batch / K, m_floor): affine in the micro-batch, as t(m) = alpha + beta m."""
        micro = max(batch / num_micro_batches, self.min_efficient_batch)
        f = self.fixed_fraction
        return num_micro_batches * (f + (1 - f) * micro / self.profiled_batch)

    def data_factor(self, batch: float) -> float:
        return batch / self.profiled_batch


def fit_fixed_fraction(batch: float, time_s: float, larger_batch: float,
                       larger_time_s: float) -> float:
    """f of t(b) = alpha + beta b through two profiles, as alpha / t(batch), clipped to
    [0, 1] (timing noise can put the line's intercept a little below 0 or above t)."""
    if not (larger_batch > batch > 0 and time_s > 0 and larger_time_s > 0):
        raise ValueError(f"batches {batch} < {larger_batch} and times {time_s}, "
                         f"{larger_time_s} s must be positive and increasing")
    beta = (larger_time_s - time_s) / (larger_batch - batch)
    return min(1.0, max(0.0, (time_s - beta * batch) / time_s))


def scale_graph(graph: OpGraph, compute_factor: float, data_factor: float) -> OpGraph:
    """The graph at another batch: op times x compute_factor, tensors x data_factor."""
    ops = tuple(replace(
        op,
        forward_s={k: t * compute_factor for k, t in op.forward_s.items()},
        backward_s={k: t * compute_factor for k, t in op.backward_s.items()},
        output_bytes=op.output_bytes * data_factor,
        activation_bytes=op.activation_bytes * data_factor,
        transfer_s=None if op.transfer_s is None else op.transfer_s * data_factor,
    ) for op in graph.ops)
    edges = tuple(replace(e, bytes=e.bytes * data_factor,
                          cost_s=None if e.cost_s is None else e.cost_s * data_factor,
                          grad_bytes=None if e.grad_bytes is None
                          else e.grad_bytes * data_factor)
                  for e in graph.edges)
    return replace(graph, ops=ops, edges=edges)


def gradient_bytes(op: Op) -> float:
    """Bytes of gradient an op's device allreduces: its trainable parameters, unless
    the profiler recorded fewer (`attrs["gradient_bytes"]`: a sparse embedding
    gradient)."""
    return float(op.attrs.get("gradient_bytes", op.trainable_bytes))


@dataclass(frozen=True, kw_only=True)
class WorkerStep:
    """One worker's step at one per-worker batch (before gradient exchange)."""

    mp_degree: int
    batch: float
    """Samples per worker per step."""
    num_micro_batches: int
    compute_s: float
    """Simulated makespan of forward + backward with the plan's placement and order."""
    backward_s: float
    """Backward busy time of the device with the most (bounds allreduce overlap)."""
    gradient_bytes: float
    """Gradient bytes of the device holding the most: what its allreduce moves."""
    param_bytes: float
    """Trainable parameter bytes of the device holding the most: what its optimizer
    updates."""
    memory_bytes: float
    """Memory of the fullest device: parameters x state factor + activations."""


def _group_device(tg: TaskGraph, plan: Plan) -> np.ndarray:
    graph_ops = {op.id for op in tg.graph.ops}
    if set(plan.assignment) != graph_ops:
        extra = sorted(set(plan.assignment) - graph_ops)[:3]
        missing = sorted(graph_ops - set(plan.assignment))[:3]
        raise UserError(f"plan for {plan.graph_name!r} does not match graph "
                        f"{tg.graph.name!r} (ops only in the plan: {extra}, only in the "
                        f"graph: {missing}): re-plan this graph or drop the plan file")
    try:
        return tg.group_devices(dict(plan.assignment))
    except ValueError as err:
        raise UserError(f"plan for {plan.graph_name!r}: {err}: re-plan this graph") from None


def _order(tg: TaskGraph, plan: Plan) -> list[list[int]]:
    index = {task: i for i, task in enumerate(tg.tasks)}
    try:
        return [[index[Task(op, phase == "backward", mb)] for op, phase, mb in tasks]
                for tasks in plan.order]
    except KeyError as err:
        raise UserError(f"plan for {plan.graph_name!r} orders task {err.args[0]} that this "
                        "graph does not have: re-plan this graph") from None


def worker_step(graph: OpGraph, plan: Plan, cluster: ClusterSpec, batch: float,
                rule: BatchRule, param_state_factor: float = 4.0) -> WorkerStep:
    """Re-simulate `plan` with the graph scaled to `batch` samples per worker."""
    k = plan.num_micro_batches
    scaled = scale_graph(graph, rule.compute_factor(batch, k), rule.data_factor(batch))
    kind = cluster.device.name
    tg = build_tasks(scaled, link=cluster.intra_node, device_kind=kind, num_micro_batches=k,
                     time_factor=split_overhead(graph, kind, plan.num_devices, k),
                     corun_slowdown=corun_slowdown(graph, kind, plan.num_devices, k))
    group_device = _group_device(tg, plan)
    schedule = evaluate_order(tg, group_device, _order(tg, plan))
    dev = tg.task_devices(group_device)
    backward = np.array([t.backward for t in tg.tasks], dtype=bool)
    backward_busy = np.bincount(dev[backward], weights=tg.duration_s[backward],
                                minlength=plan.num_devices)
    op_device = np.array([plan.assignment[op.id] for op in graph.ops], dtype=np.int64)
    grads = np.bincount(op_device, minlength=plan.num_devices, weights=np.array(
        [gradient_bytes(op) for op in graph.ops]))
    params = np.bincount(op_device, minlength=plan.num_devices,
                         weights=np.array([op.trainable_bytes for op in graph.ops]))
    memory = memory_bytes(tg, group_device, plan.num_devices, param_state_factor)
    return WorkerStep(
        mp_degree=plan.num_devices, batch=batch, num_micro_batches=k,
        compute_s=schedule.step_time_s, backward_s=float(backward_busy.max(initial=0.0)),
        gradient_bytes=float(grads.max(initial=0.0)), param_bytes=float(params.max(initial=0.0)),
        memory_bytes=float(memory.max(initial=0.0)),
    )


def optimizer_s(param_bytes: float, memory_bandwidth_bytes_per_s: float,
                passes: float) -> float:
    """An elementwise optimizer update is memory-bound: `passes` sweeps over the
    device's parameter bytes (Adam reads w, g, m, v and writes w, m, v: 7)."""
    # see Williams, Waterman & Patterson 2009 (roofline): time = bytes / bandwidth
    return passes * param_bytes / memory_bandwidth_bytes_per_s
