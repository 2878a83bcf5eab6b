"""The task graph of one training step: what the simulator and the placers schedule.

A *task* is one op's forward or backward for one micro-batch. A forward graph whose ops
carry backward times is unrolled here: each op u gets a backward task u' on u's device,
every edge u->v gets a gradient edge v'->u' of the same size, and u -> u' (u' needs
u's saved activations). A graph whose backward ops are explicit (the peer format) is
taken as it is. With K micro-batches every task is repeated K times at 1/K of its time
and every transfer at 1/K of its bytes (work is taken as linear in the batch); what
small micro-batches cost beyond that on a split plan (fixed costs per task, kernels on
smaller tensors) is the profiler's measured split overhead at that K (`split_overhead`),
which multiplies every task's time, so the simulator and the MILP both see it.

Placement is decided per *group*: the ops of one colocation group, and every task of
those ops, must share a device.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from placement.cluster import Link
from placement.graph import OpGraph


class Task(NamedTuple):
    op_id: int
    backward: bool
    micro_batch: int

    def label(self) -> list:
        return [self.op_id, "backward" if self.backward else "forward", self.micro_batch]


@dataclass(frozen=True, eq=False)
class TaskGraph:
    """Arrays over tasks 0..n-1 (numpy, so the simulator and solvers stay fast)."""

    graph: OpGraph
    tasks: tuple[Task, ...]
    duration_s: np.ndarray
    """Per task: seconds (or the graph's own unit)."""
    group: np.ndarray
    """Per task: index of its placement group."""
    group_ops: tuple[tuple[int, ...], ...]
    """Per group: the op ids in it."""
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_transfer_s: np.ndarray
    """Per edge: time to move the tensor when its ends sit on different devices."""
    send_s: np.ndarray
    """Per task: the cost of sending its output to another device (max over its edges);
    the max-load model charges it once on the sender and once per receiving device.
    Where the backward is implied, an op's forward task also carries its gradient's
    return and its backward task nothing (see `max_load_send_s`)."""
    num_micro_batches: int
    corun_slowdown: float = 1.0
    """How much slower a task runs while a task of another device runs at the same time
    (devices that share a host's cores, caches and memory bandwidth: CPU threads); 1
    for devices that do not slow each other down. See `corun_slowdown`."""

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def num_groups(self) -> int:
        return len(self.group_ops)

    @cached_property
    def group_of_op(self) -> dict[int, int]:
        return {op: g for g, ops in enumerate(self.group_ops) for op in ops}

    @cached_property
    def successors(self) -> tuple[tuple[tuple[int, float], ...], ...]:
        out: list[list[tuple[int, float]]] = [[] for _ in range(self.num_tasks)]
        for s, d, c in zip(self.edge_src.tolist(), self.edge_dst.tolist(),
                           self.edge_transfer_s.tolist()):
            out[s].append((d, c))
        return tuple(tuple(x) for x in out)

    @cached_property
    def predecessors(self) -> tuple[tuple[tuple[int, float], ...], ...]:
        inc: list[list[tuple[int, float]]] = [[] for _ in range(self.num_tasks)]
        for s, d, c in zip(self.edge_src.tolist(), self.edge_dst.tolist(),
                           self.edge_transfer_s.tolist()):
            inc[d].append((s, c))
        return tuple(tuple(x) for x in inc)

    @cached_property
    def topological_order(self) -> tuple[int, ...]:
        indegree = np.bincount(self.edge_dst, minlength=self.num_tasks).tolist()
        ready = [t for t in range(self.num_tasks) if indegree[t] == 0]
        order: list[int] = []
        while ready:
            t = ready.pop()
            order.append(t)
            for d, _ in self.successors[t]:
                indegree[d] -= 1
                if indegree[d] == 0:
                    ready.append(d)
        assert len(order) == self.num_tasks, "task graphs are acyclic by construction"
        return tuple(order)

    @cached_property
    def topological_position(self) -> np.ndarray:
        """Per task: its index in `topological_order`."""
        position = np.empty(self.num_tasks, dtype=np.int64)
        position[list(self.topological_order)] = np.arange(self.num_tasks)
        return position

    @cached_property
    def duration_list(self) -> list[float]:
        """`duration_s` as Python floats: the simulator's loops index it per task, and
        a list's item is several times faster to read than a numpy array's."""
        return self.duration_s.tolist()

    @cached_property
    def in_degree(self) -> np.ndarray:
        """Per task: how many edges enter it."""
        return np.bincount(self.edge_dst, minlength=self.num_tasks)

    @cached_property
    def height_layers(self) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
        """The tasks by height (edges on the longest path to a task without successors),
        lowest first; per height: the edges that leave its tasks, sorted by source, the
        sources in that order, and where each source's run of edges starts. A task's
        successors all sit lower, so a pass up the heights sees every successor done."""
        height = np.zeros(self.num_tasks, dtype=np.int64)
        for t in reversed(self.topological_order):
            height[t] = max((height[d] + 1 for d, _ in self.successors[t]), default=0)
        edges = np.lexsort((self.edge_src, height[self.edge_src]))
        src = self.edge_src[edges]
        layers = []
        bounds = np.searchsorted(height[src], np.arange(int(height.max(initial=0)) + 2))
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            run = src[lo:hi]
            starts = np.flatnonzero(np.diff(run, prepend=-1))
            layers.append((edges[lo:hi], run[starts], starts))
        return tuple(layers)

    @cached_property
    def micro_batch(self) -> np.ndarray:
        """Per task: its micro-batch."""
        return np.array([t.micro_batch for t in self.tasks], dtype=np.int64)

    @cached_property
    def group_work_s(self) -> np.ndarray:
        return np.bincount(self.group, weights=self.duration_s, minlength=self.num_groups)

    def task_devices(self, group_device: np.ndarray) -> np.ndarray:
        return group_device[self.group]

    def group_devices(self, assignment: dict[int, int]) -> np.ndarray:
        """Op id -> device as a per-group device array (checks colocation)."""
        devices = np.full(self.num_groups, -1, dtype=np.int64)
        for op_id, dev in assignment.items():
            g = self.group_of_op[op_id]
            if devices[g] not in (-1, dev):
                raise ValueError(
                    f"op {op_id} is on device {dev} but its colocation group is on "
                    f"device {devices[g]}: colocated ops must share a device"
                )
            devices[g] = dev
        missing = [ops[0] for g, ops in enumerate(self.group_ops) if devices[g] < 0]
        if missing:
            raise ValueError(f"the placement gives no device to op {missing[0]}")
        return devices

    def assignment(self, group_device: np.ndarray) -> dict[int, int]:
        """Per-group devices back to op id -> device."""
        return {op: int(group_device[g]) for g, ops in enumerate(self.group_ops) for op in ops}


def _placement_groups(graph: OpGraph) -> tuple[tuple[int, ...], ...]:
    groups: dict[object, list[int]] = {}
    for op in graph.ops:
        key = ("colocation", op.colocation) if op.colocation is not None else ("op", op.id)
        groups.setdefault(key, []).append(op.id)
    return tuple(tuple(ops) for ops in groups.values())


def ratio_at(measured: float | Mapping[str, float], num_micro_batches: int) -> float:
    """A profiled ratio at `num_micro_batches` K, from its value per measured K (a
    mapping of K, as a string, to the ratio) or one value for every K (a graph
    profiled before the ratios were measured per K).

    Between measured counts, and past the largest, the ratio is the line through its
    neighbours: a split step with K micro-batches of a batch B costs K * alpha + beta * B
    (alpha: the fixed cost of one micro-batch's tasks), affine in K. Below the smallest
    measured K the smallest's value holds; never below 1."""
    if not isinstance(measured, Mapping):
        return float(measured)
    points = sorted((int(k), float(v)) for k, v in measured.items())
    ks = [k for k, _ in points]
    values = [v for _, v in points]
    k = num_micro_batches
    if len(points) == 1 or k <= ks[0]:
        return values[0]
    if k <= ks[-1]:
        return float(np.interp(k, ks, values))
    slope = (values[-1] - values[-2]) / (ks[-1] - ks[-2])
    return max(1.0, values[-1] + slope * (k - ks[-1]))


def split_overhead(graph: OpGraph, device_kind: str, num_devices: int,
                   num_micro_batches: int = 1) -> float:
    """What each task's time is multiplied by when a worker's ops run on `num_devices`
    devices with `num_micro_batches` micro-batches: the executor runs a one-device
    plan as plain forward and backward calls of the whole module (the times the
    profiler measured), and a split plan as one autograd call per op and micro-batch,
    whose fixed costs grow with the micro-batch count; the profiler measures them as a
    ratio per count (`metadata["split_overhead"][kind]`, see `ratio_at`; 1 where it
    was not measured)."""
    if num_devices <= 1:
        return 1.0
    measured = graph.metadata.get("split_overhead", {}).get(device_kind)
    return 1.0 if measured is None else ratio_at(measured, num_micro_batches)


def corun_slowdown(graph: OpGraph, device_kind: str, num_devices: int,
                   num_micro_batches: int = 1) -> float:
    """How much slower a task of a split plan runs while another device's task runs:
    the profiler's measured ratio at `num_micro_batches`
    (`metadata["corun_slowdown"][kind]`, see `ratio_at`) for devices that share one
    host, such as CPU threads; 1 where it was not measured (GPUs)."""
    if num_devices <= 1:
        return 1.0
    measured = graph.metadata.get("corun_slowdown", {}).get(device_kind)
    return 1.0 if measured is None else max(1.0, ratio_at(measured, num_micro_batches))


def build_tasks(graph: OpGraph, *, link: Link, device_kind: str,
                num_micro_batches: int = 1, training: bool = True,
                time_factor: float = 1.0, corun_slowdown: float = 1.0) -> TaskGraph:
    """Unroll `graph` into the tasks of one step on devices of `device_kind`.

    `training=False` drops implied backward tasks (inference); explicit backward ops of
    the peer format are kept either way, as the file describes them. Every task's time
    is multiplied by `time_factor` (see `split_overhead`); `corun_slowdown` is the
    simulator's (see `TaskGraph.corun_slowdown`).
    """
    if corun_slowdown < 1:
        raise ValueError(f"corun_slowdown={corun_slowdown} must be >= 1")
    if num_micro_batches < 1:
        raise ValueError(f"num_micro_batches={num_micro_batches} must be >= 1")
    k = num_micro_batches
    group_ops = _placement_groups(graph)
    group_of_op = {op: g for g, ops in enumerate(group_ops) for op in ops}
    implied_backward = training and not graph.has_explicit_backward and any(
        op.backward_s for op in graph.ops)

    tasks: list[Task] = []
    duration: list[float] = []
    group: list[int] = []
    index: dict[Task, int] = {}
    for m in range(k):
        for phase in ((False, True) if implied_backward else (False,)):
            for op in graph.ops:
                task = Task(op.id, phase, m)
                index[task] = len(tasks)
                tasks.append(task)
                duration.append(op.time_s(device_kind, backward=phase) * time_factor / k)
                group.append(group_of_op[op.id])

    def transfer(bytes_: float, cost_s: float | None) -> float:
        if cost_s is not None:
            return cost_s / k
        return link.transfer_s(bytes_ / k) if bytes_ > 0 else 0.0

    # Per edge, the same in every micro-batch: the value's transfer and its gradient's.
    # What requires grad of the value crosses back (none of an attention mask or token
    # ids); the producer's backward still waits for its readers' (the executor frees the
    # value then), so the edge stays. An explicit time is the value's and its gradient's.
    edge_costs = []
    for e in graph.edges:
        explicit = e.cost_s if e.cost_s is not None else graph.op(e.src).transfer_s
        edge_costs.append((transfer(e.bytes, explicit),
                           0.0 if e.grad_bytes == 0 else transfer(e.gradient_bytes, explicit)))

    src: list[int] = []
    dst: list[int] = []
    cost: list[float] = []
    for m in range(k):
        for e, (value_s, gradient_s) in zip(graph.edges, edge_costs):
            src.append(index[Task(e.src, False, m)])
            dst.append(index[Task(e.dst, False, m)])
            cost.append(value_s)
            if implied_backward:
                src.append(index[Task(e.dst, True, m)])
                dst.append(index[Task(e.src, True, m)])
                cost.append(gradient_s)
        if implied_backward:
            for op in graph.ops:
                src.append(index[Task(op.id, False, m)])
                dst.append(index[Task(op.id, True, m)])
                cost.append(0.0)

    edge_src = np.asarray(src, dtype=np.int64)
    edge_dst = np.asarray(dst, dtype=np.int64)
    edge_cost = np.asarray(cost, dtype=np.float64)
    send = max_load_send_s(tasks, edge_src, edge_dst, edge_cost,
                           gradients_summed=implied_backward)
    return TaskGraph(
        graph=graph, tasks=tuple(tasks), duration_s=np.asarray(duration),
        group=np.asarray(group, dtype=np.int64), group_ops=group_ops,
        edge_src=edge_src, edge_dst=edge_dst, edge_transfer_s=edge_cost,
        send_s=send, num_micro_batches=k, corun_slowdown=corun_slowdown,
    )


def max_load_send_s(tasks: tuple[Task, ...] | list[Task], edge_src: np.ndarray,
                    edge_dst: np.ndarray, edge_cost: np.ndarray, *,
                    gradients_summed: bool) -> np.ndarray:
    """Per task: what the max-load model charges when its output crosses devices (see
    `TaskGraph.send_s`): the largest of its edges' transfers.

    `gradients_summed` (a backward implied by the forward graph): the executor sends
    a value to each reading device once, and the gradients of that device's readers
    add up in that copy before one sum crosses back (orchestrator/runtime/executor.py).
    So the return is charged where the value leaves, on the producer's forward task:
    the largest transfer of its gradient edges (a reader's backward to the producer's,
    sized by the part of the value that requires grad, `Edge.grad_bytes`) added to the
    value's. The sender's device and each reading device pay it once, as they pay the
    value, and a backward task's gradient edges charge nothing."""
    send = np.zeros(len(tasks))
    if not len(edge_src):
        return send
    if not gradients_summed:
        np.maximum.at(send, edge_src, edge_cost)
        return send
    backward = np.array([t.backward for t in tasks], dtype=bool)
    forward_of = {(t.op_id, t.micro_batch): i for i, t in enumerate(tasks) if not t.backward}
    values = ~backward[edge_src]
    np.maximum.at(send, edge_src[values], edge_cost[values])
    # Gradient edges run between backward tasks, from a reader's to its producer's.
    returns = backward[edge_src] & backward[edge_dst]
    returned = np.zeros(len(tasks))
    producer = np.array([forward_of[(tasks[t].op_id, tasks[t].micro_batch)]
                         for t in edge_dst[returns].tolist()], dtype=np.int64)
    np.maximum.at(returned, producer, edge_cost[returns])
    return send + returned


def one_micro_batch(tg: TaskGraph) -> TaskGraph:
    """The tasks of micro-batch 0 (build_tasks lays the step out micro-batch by
    micro-batch, each a copy of the first at the same times and transfers)."""
    k = tg.num_micro_batches
    n = tg.num_tasks // k
    keep = tg.edge_src < n
    assert (tg.edge_dst[keep] < n).all() and keep.sum() * k == len(tg.edge_src), (
        "micro-batches are copies without edges between them")
    return TaskGraph(graph=tg.graph, tasks=tg.tasks[:n], duration_s=tg.duration_s[:n],
                     group=tg.group[:n], group_ops=tg.group_ops,
                     edge_src=tg.edge_src[keep], edge_dst=tg.edge_dst[keep],
                     edge_transfer_s=tg.edge_transfer_s[keep], send_s=tg.send_s[:n],
                     num_micro_batches=1)
