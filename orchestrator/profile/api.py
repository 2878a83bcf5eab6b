"""`profile_model` and `partition`: the public entry points (see the package docstring)."""

from __future__ import annotations

import copy
import statistics
import time
from contextlib import contextmanager

import torch
from tqdm import tqdm

from orchestrator.models import ModelSpec, build
from orchestrator.profile.costs import (OpCost, activation_bytes, measure_op,
                                        measure_split_costs, op_signature, reference_env,
                                        step_peak_bytes, time_ops)
from orchestrator.profile.roofline import Efficiency, op_time_s
from orchestrator.profile.trace import Partition, partition as cut, trace
from placement.cluster import A100, H100, V100, DeviceKind, preset as cluster_preset
from placement.errors import UserError
from placement.graph import Edge, Op, OpGraph

#: --target values: the local CPU (measured) or a GPU kind (projected).
TARGETS = {"cpu": None, "v100": V100, "a100": A100, "h100": H100}
#: GPU kinds every graph gets projected times for.
PROJECTED_KINDS = ("v100", "a100", "h100")


def partition(model: str, *, preset: str = "tiny", seq_chunk: int | None = None,
              device: str | torch.device | None = None,
              seed: int = 0) -> tuple[Partition, ModelSpec]:
    """Build `model` (weights from `seed`) and cut its traced step into ops."""
    spec = build(model, preset, seq_chunk=seq_chunk, device=device, seed=seed)
    return cut(trace(spec.module, spec.name)), spec


@contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def profile_model(model: str, *, preset: str = "tiny", batch: int | None = None,
                  seq_chunk: int | None = None, target: str = "cpu", repeats: int = 5,
                  warmup: int = 2, efficiency: Efficiency | None = None,
                  extra_kinds: tuple[DeviceKind, ...] = (),
                  progress: bool = False) -> OpGraph:
    """Trace, cut and cost `model` (a registered name or "MODULE:FN").

    `paper` presets are built on the meta device: no weight is allocated, op times for
    the CPU are projected like the GPUs' instead of measured. Otherwise each op is timed
    on one CPU thread (one core acts as one device). Every graph carries times for
    `cpu` and each GPU kind in PROJECTED_KINDS; `target` names the kind the graph is
    meant for (recorded in its metadata, and the one `summary` reports);
    `extra_kinds` adds projected times for more device kinds (keyed by their names).
    """
    if target not in TARGETS:
        raise UserError(f"unknown --target {target!r}: choose one of {', '.join(TARGETS)}")
    if repeats < 1 or warmup < 0:
        raise UserError(f"repeats={repeats} must be >= 1 and warmup={warmup} >= 0")
    start = time.perf_counter()
    device = "meta" if preset == "paper" else "cpu"
    part, spec = partition(model, preset=preset, seq_chunk=seq_chunk, device=device)
    batch = spec.batch_size(batch, "--batch")
    data = spec.make_batch(batch, device=device)
    timed = device != "meta"
    eff = efficiency or Efficiency()
    with _threads(1):
        env = reference_env(part, data)
        steps = (2 * warmup + repeats + max(repeats, 10)) if timed else 0
        with tqdm(total=len(part.ops) + steps, desc=f"profiling {spec.name}",
                  unit="step", disable=not progress, leave=False) as bar:
            costs: list[OpCost] = []
            seen: dict[tuple, OpCost] = {}
            for op in part.ops:
                key = op_signature(part, op.id, env)
                if key not in seen:
                    seen[key] = measure_op(part, op.id, env)
                costs.append(copy.deepcopy(seen[key]))
                bar.update()
            if timed:
                times = time_ops(part, data, repeats=repeats, warmup=warmup,
                                 progress=bar.update)
                for cost, (f, b) in zip(costs, times):
                    cost.forward_s, cost.backward_s = f, b
                split = measure_split_costs(part, data, repeats=repeats, warmup=warmup,
                                            progress=bar.update)
        memory = step_peak_bytes(part.module, data)
    graph = _op_graph(part, spec, env, costs, eff, timed=timed, batch=batch,
                      target=target, extra_kinds=extra_kinds)
    metadata = dict(graph.metadata, **memory,
                    profile_seconds=round(time.perf_counter() - start, 3))
    if timed:
        metadata["split_overhead"] = {"cpu": round(split.overhead, 4)}
        metadata["corun_slowdown"] = {"cpu": round(split.corun_slowdown, 4)}
    return OpGraph(ops=graph.ops, edges=graph.edges, name=graph.name, metadata=metadata)


def measure_step_s(model: str, *, preset: str = "tiny", batch: int | None = None,
                   seq_chunk: int | None = None, repeats: int = 10,
                   warmup: int = 3) -> float:
    """Median wall time of one whole forward+backward of the model on one CPU thread
    (what a profiled graph's single-device step time is compared with)."""
    spec = build(model, preset, seq_chunk=seq_chunk)
    data = spec.make_batch(spec.batch_size(batch, "--batch"))
    times = []
    with _threads(1):
        for i in range(warmup + repeats):
            spec.module.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            spec.module(*data).backward()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _value_bytes(v) -> float:
    return float(v.numel() * v.element_size()) if isinstance(v, torch.Tensor) else 0.0


def _shape(v) -> list[int] | None:
    return list(v.shape) if isinstance(v, torch.Tensor) else None


def _kernel_size(part: Partition, anchor) -> list[int] | None:
    """Window of a convolution or pooling op, as [height, width]."""
    if anchor.op == "call_module":
        size = getattr(part.module.get_submodule(anchor.target), "kernel_size", None)
    elif anchor.op == "call_function" and getattr(anchor.target, "__name__", "") in (
            "max_pool2d", "avg_pool2d", "_max_pool2d", "max_pool2d_with_indices"):
        size = anchor.kwargs.get("kernel_size", anchor.args[1] if len(anchor.args) > 1
                                 else None)
    else:
        return None
    if isinstance(size, int):
        return [size, size]
    if isinstance(size, tuple | list) and all(isinstance(k, int) for k in size):
        return list(size)
    return None


def _colocation(part: Partition) -> dict[int, str]:
    """Ops that share a parameter must sit together: name each such set after the
    module of its first parameter."""
    parent = list(range(len(part.ops)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for op in part.ops:
        for p in op.params:
            if p in owner:
                parent[find(op.id)] = find(owner[p])
            else:
                owner[p] = op.id
    members: dict[int, list[int]] = {}
    for op in part.ops:
        members.setdefault(find(op.id), []).append(op.id)
    names = {}
    for root, ids in members.items():
        if len(ids) > 1:
            first = part.ops[min(ids)]
            label = first.params[0].rsplit(".", 1)[0] if first.params else first.name
            for i in ids:
                names[i] = f"params:{label}"
    return names


def _op_graph(part: Partition, spec: ModelSpec, env: dict, costs: list[OpCost],
              eff: Efficiency, *, timed: bool, batch: int, target: str,
              extra_kinds: tuple[DeviceKind, ...]) -> OpGraph:
    params = dict(part.module.named_parameters())
    colocation = _colocation(part)
    acts = activation_bytes(part, costs)
    counted: set[str] = set()
    projected = {k: TARGETS[k] for k in PROJECTED_KINDS}
    projected.update((kind.name, kind) for kind in extra_kinds)
    if not timed:
        projected["cpu"] = cluster_preset("cpu").device
    ops = []
    for op, cost in zip(part.ops, costs):
        own = [p for p in op.params if p not in counted]
        counted.update(own)
        fwd = {k: op_time_s(cost.forward_kernels, op.kind, d, eff)
               for k, d in projected.items()}
        bwd = {k: op_time_s(cost.backward_kernels, op.kind, d, eff)
               for k, d in projected.items()}
        if timed:
            fwd["cpu"], bwd["cpu"] = cost.forward_s, cost.backward_s
        anchor = part.nodes[op.nodes[0]]
        attrs = {
            "layer_kind": op.kind,
            "module": op.module,
            "output_shape": _shape(env[op.nodes[0]] if op.kind != "lstm"
                                   else env[op.nodes[1]]),
            "input_shapes": [_shape(env[a.name]) if a.op != "get_attr"
                             else list(params[a.target].shape)
                             for a in anchor.all_input_nodes],
            "output_shapes": {name: _shape(env[name]) for name in op.outputs},
            "forward_flops": cost.forward_flops,
            "backward_flops": cost.backward_flops,
            "params": list(op.params),
            "fx_nodes": list(op.nodes),
        }
        if op.kind in ("conv2d", "linear") and anchor.op == "call_module":
            attrs["weight_shape"] = list(params[f"{anchor.target}.weight"].shape)
        kernel = _kernel_size(part, anchor)
        if kernel is not None:
            attrs["kernel_size"] = kernel
        ops.append(Op(
            id=op.id, name=op.name, forward_s=fwd, backward_s=bwd,
            output_bytes=sum(_value_bytes(env[n]) for n in op.outputs),
            param_bytes=float(sum(params[p].numel() * params[p].element_size()
                                  for p in own)),
            activation_bytes=acts[op.id], colocation=colocation.get(op.id),
            attrs=attrs))
    edges = tuple(Edge(src=s, dst=d, bytes=sum(_value_bytes(env[n]) for n in names))
                  for (s, d), names in part.edges.items())
    metadata = {
        "model": spec.name, "preset": spec.preset, "batch": batch,
        "seq_chunk": spec.seq_chunk, "target": target,
        "cpu_times": "measured" if timed else "projected",
        "gpu_times": "projected (roofline)", "efficiency": eff.to_dict(),
        "forward_flops": sum(c.forward_flops for c in costs),
        "backward_flops": sum(c.backward_flops for c in costs),
        "torch": torch.__version__,
    }
    return OpGraph(ops=tuple(ops), edges=edges, name=f"{spec.name}-{spec.preset}",
                   metadata=metadata)


def single_device_step_s(graph: OpGraph, kind: str) -> float:
    """Step time of the whole graph on one device of `kind`: every op's forward and
    backward in sequence (nothing overlaps on one device)."""
    return sum(op.time_s(kind) + op.time_s(kind, backward=True) for op in graph.ops)

