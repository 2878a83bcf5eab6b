"""`profile_model` and `partition`: the public entry points (see the package docstring)."""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import SimpleNamespace

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from orchestrator.models import ModelSpec, build
from orchestrator.profile.costs import (SPLIT_MAX_RATIOS, OpCost, StepClock,
                                        activation_bytes, measure_op, measure_split_costs,
                                        op_signature, reference_env, step_peak_bytes,
                                        time_ops)
from orchestrator.profile.capture import GRANULARITIES, Capture, capture
from orchestrator.profile.roofline import Efficiency, op_time_s, optimizer_kernels
from orchestrator.profile.trace import Partition, aten_name
from orchestrator.runtime.devices import random_streams_and_buffers_kept
from orchestrator.runtime.executor import batched_inputs
from placement.cluster import (A100, H100, PRECISIONS, V100, DeviceKind,
                               preset as cluster_preset)
from placement.errors import UserError
from placement.graph import Edge, Op, OpGraph
from placement.policy import MICRO_BATCH_COUNTS

#: --target values: the local CPU (measured) or a GPU kind (projected, or measured
#: with --device cuda on a GPU of that kind).
TARGETS = {"cpu": None, "v100": V100, "a100": A100, "h100": H100, "cuda": None}
#: GPU kinds every graph gets projected times for.
PROJECTED_KINDS = ("v100", "a100", "h100")
#: --device values: where ops are timed ("meta": nowhere, every time projected).
DEVICES = ("cpu", "cuda", "meta")


def gpu_kind(device_name: str) -> str:
    """The device kind whose times a measurement on the GPU `device_name` (as
    torch.cuda.get_device_name gives it) stands for: a projected kind of the same chip,
    else `cuda` (a GPU no preset describes)."""
    name = device_name.lower()
    return next((kind for kind in PROJECTED_KINDS if kind in name), "cuda")


def default_device(preset: str) -> str:
    """Where `profile_model` times ops when not told: on the GPU when this process has
    one (what a job on it trains on), else tiny presets on the CPU and paper presets
    nowhere (meta device: no weight allocated)."""
    if torch.cuda.is_available():
        return "cuda"
    return "meta" if preset == "paper" else "cpu"


def profile_notes(graph: OpGraph) -> list[str]:
    """What a user should know about how the graph models their step, one line each."""
    notes = []
    checkpointed = graph.metadata.get("checkpointed_layers")
    if checkpointed:
        # The capture runs the checkpointed forward once, as plain ops, and the split
        # step's autograd keeps what each op saves: nothing is recomputed.
        notes.append(f"activation checkpointing is on in {checkpointed} layers "
                     "(transformers' gradient_checkpointing), but the split step keeps "
                     "their activations: memory is planned and used without it")
    return notes


def _checkpointed_layers(module: torch.nn.Module) -> int:
    """Layers with transformers' activation checkpointing on: modules with the flag
    and no module under them with it (the model that holds them has it too)."""
    def flagged(m: torch.nn.Module) -> bool:
        return getattr(m, "gradient_checkpointing", False) is True

    return sum(flagged(m) and not any(flagged(c) for c in m.modules() if c is not m)
               for m in module.modules())


def partition(model: str, *, preset: str = "tiny", seq_chunk: int | None = None,
              device: str | torch.device | None = None, seed: int = 0,
              granularity: str = "module", check_batch_sizes: bool = True
              ) -> tuple[Partition, ModelSpec]:
    """Build `model` (weights from `seed`) and cut its captured step into ops; on the
    `meta` device no weight is allocated and the ops are a CPU capture's
    (`_tensors_for`). `check_batch_sizes`: whether to run the step once on another
    batch size (`_check_other_batch_size`); a worker, whose driver checked the model
    before Ray started, leaves it out of its start-up."""
    device, tensors = _tensors_for(device, granularity)
    with tensors:
        part, spec, _ = _captured(model, preset=preset, seq_chunk=seq_chunk,
                                  device=device, seed=seed, granularity=granularity,
                                  check_batch_sizes=check_batch_sizes)
    return part, spec


def worker_partition(model: str, *, preset: str = "tiny", seed: int = 0,
                     granularity: str = "module") -> Partition:
    """The partition a worker cuts (it builds and captures the model on its CPU), with
    no weight allocated (see `_tensors_for`)."""
    return partition(model, preset=preset, seed=seed, granularity=granularity,
                     device="meta")[0]


@contextmanager
def _generic_cpu_kernels():
    """FakeTensorMode's CPU picks MKL-DNN kernels where it can (an LSTM becomes one
    `mkldnn_rnn_layer`, which FlopCounterMode has no formula for: GNMT's encoder
    counted 0 FLOPs); with MKL-DNN off the CPU takes its generic kernels. Those match
    the meta device's (Inception-V3, VGG-16: the same costs to the bit) but for the
    LSTM, whose input GEMM the CPU runs once for all time steps, as cuDNN does, where
    the meta device runs one per step: 3-5% less projected step for BigLSTM and GNMT
    at `aten` granularity than the meta device gave. Only `enabled` is switched:
    `torch.backends.mkldnn.flags` also sets oneDNN's TF32 flag, which warns on every
    profile on a build without Intel GPU support."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


def _tensors_for(device, granularity: str) -> tuple[str | torch.device | None,
                                                   AbstractContextManager]:
    """Where a capture's tensors live, and the mode they are made in. At an operator
    granularity `meta` builds the model in a FakeTensorMode on the CPU: shapes and no
    memory, as on the meta device, but the CPU's kernels choose the output layouts, so
    the graph torch.export records is the one a worker records on its CPU, op for op.
    On the meta device itself scaled_dot_product_attention takes the math kernel, whose
    output layout made torch.export add two `contiguous` copies to every transformers
    attention at `aten` (and other ops at `core-aten`): a plan of that graph named op
    ids the worker's graph lacks. At `module` granularity the ops are layers, which
    both devices cut alike, and the meta device stays (fake tensors cost about 1.5x
    its time to profile)."""
    if str(device) == "meta" and granularity != "module":
        return "cpu", FakeTensorMode(allow_non_fake_inputs=True)
    return device, nullcontext()


def _captured(model: str, *, preset: str, seq_chunk: int | None, device, seed: int,
              granularity: str, check_batch_sizes: bool = True
              ) -> tuple[Partition, ModelSpec, Capture]:
    if granularity not in GRANULARITIES:
        raise UserError(f"unknown --granularity {granularity!r}: choose one of "
                        f"{', '.join(GRANULARITIES)}")
    spec = build(model, preset, seq_chunk=seq_chunk, device=device, seed=seed)
    # torch.export traces an example batch (two samples at least, so that the samples
    # dimension is not specialised to 1); fx tracing needs none.
    size = max(spec.batch or 2, 2)
    example = spec.make_batch(size, device=device or "cpu")
    captured = capture(spec.module, example, batched_inputs(spec.make_batch),
                       granularity=granularity, name=spec.name)
    if check_batch_sizes:
        _check_other_batch_size(captured, spec, size, device or "cpu")
    return captured.partition(), spec, captured


def _check_other_batch_size(captured: Capture, spec: ModelSpec, size: int, device) -> None:
    """Run the captured step's forward on a batch of another size than the example's:
    micro-batches and data-parallel shares are smaller batches, and a step that takes
    only one size (a reshape to the batch size the model was built for) would fail
    deep inside profiling or a worker. Refused as the model's fault only where the
    model itself fails too; otherwise the capture is at fault."""
    other = size // 2 if size >= 4 else size + 1  # a batch of 1 may squeeze the samples away
    batch = spec.make_batch(other, device=device)
    # Leaves no trace: the steps start from the same buffers and random streams.
    with torch.no_grad(), random_streams_and_buffers_kept(
            [captured.module, spec.module], [device]):
        try:
            captured.module(*batch)
        except Exception as captured_err:  # noqa: BLE001 - any failure of the model's code
            try:
                spec.module(*batch)
            except Exception as err:  # noqa: BLE001 - the model's own failure there
                first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                raise UserError(
                    f"{spec.name} fails on a batch of {other} samples (it ran on {size}): "
                    f"{first[:300]}; micro-batches and data-parallel workers take smaller "
                    "batches, so the model must take a batch of any size: compute sizes "
                    "from x.shape[0], not from a number fixed when it was built") from None
            raise RuntimeError(f"the {captured.method} capture of {spec.name} fails on a "
                               f"batch of {other} samples where the model itself runs") \
                from captured_err


def _progress_bar(total: int, desc: str, enabled: bool):
    """A tqdm bar, or a silent stand-in: tqdm is loaded only when a bar is shown, so
    that profiling runs where only torch and numpy are installed (scripts/gpu_check.py
    on a bare GPU machine)."""
    if not enabled:
        return nullcontext(SimpleNamespace(update=lambda *_: None))
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", leave=False)


@contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def profile_model(model: str, *, preset: str = "tiny", batch: int | None = None,
                  seq_chunk: int | None = None, target: str | None = None,
                  device: str | None = None, precision: str = "fp32", repeats: int = 5,
                  warmup: int = 2, efficiency: Efficiency | None = None,
                  extra_kinds: tuple[DeviceKind, ...] = (),
                  progress: bool = False, granularity: str = "module") -> OpGraph:
    """Trace, cut and cost `model` (a registered name or "MODULE:FN").

    `device` (default: `default_device(preset)`) is where ops are timed: `cpu`, each
    op on one CPU thread (one core acts as one device); `cuda`, the current GPU, with
    CUDA events after the warm-up steps, its times keyed by `gpu_kind` of the GPU
    (they replace that kind's projection); `meta`, nowhere: no weight is allocated and
    the CPU's times are projected like the GPUs'. Every graph carries times for `cpu`
    and each GPU kind in PROJECTED_KINDS, projected at the matmul `precision`
    (fp32, tf32, bf16); `target` names the kind the graph is meant for (recorded in
    its metadata, and the one `summary` reports; default: the measured kind);
    `extra_kinds` adds projected times for more device kinds (keyed by their names).
    `granularity`: `module` (layers and functions), `aten`, `core-aten` or
    `decomposed` (one op per ATen operator); see `orchestrator.profile.capture`.
    """
    device = default_device(preset) if device is None else device
    if device not in DEVICES:
        raise UserError(f"unknown --device {device!r}: choose one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: this machine has no CUDA device (torch "
                        f"{torch.__version__}, cuda {torch.version.cuda}): profile on a GPU "
                        "node, or use --device cpu")
    measured = (gpu_kind(torch.cuda.get_device_name()) if device == "cuda"
                else "cpu" if device == "cpu" else None)
    target = target or measured or "cpu"
    if target not in TARGETS:
        raise UserError(f"unknown --target {target!r}: choose one of {', '.join(TARGETS)}")
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if repeats < 1 or warmup < 0:
        raise UserError(f"repeats={repeats} must be >= 1 and warmup={warmup} >= 0")
    start = time.perf_counter()
    tensor_device, tensors = _tensors_for(device, granularity)
    with tensors, _threads(1):
        part, spec, captured = _captured(model, preset=preset, seq_chunk=seq_chunk,
                                         device=tensor_device, seed=0,
                                         granularity=granularity)
        batch = spec.batch_size(batch, "--batch")
        data = spec.make_batch(batch, device=tensor_device)
        timed = measured is not None
        eff = efficiency or Efficiency()
        with _generic_cpu_kernels() if tensor_device != device else nullcontext():
            env, costs, split = _costs(
                part, data, timed=timed, repeats=repeats, warmup=warmup, progress=progress,
                name=spec.name, batched=batched_inputs(spec.make_batch),
                micro_batches=[k for k in MICRO_BATCH_COUNTS if batch % k == 0])
            memory = step_peak_bytes(part.module, data)
    graph = _op_graph(part, spec, env, costs, eff, measured=measured, batch=batch,
                      target=target, precision=precision, extra_kinds=extra_kinds)
    metadata = dict(graph.metadata, **memory, granularity=granularity,
                    capture=captured.method, capture_seconds=round(captured.seconds, 3),
                    profile_seconds=round(time.perf_counter() - start, 3))
    checkpointed = _checkpointed_layers(spec.module)
    if checkpointed:
        metadata["checkpointed_layers"] = checkpointed
    if timed:
        # Per micro-batch count (JSON keys are strings): placement/tasks.py ratio_at.
        metadata["split_overhead"] = {measured: {str(k): round(r, 4)
                                                 for k, r in split.overhead.items()}}
        metadata["corun_slowdown"] = {measured: {str(k): round(r, 4)
                                                 for k, r in split.corun_slowdown.items()}}
    if device == "cuda":
        metadata["gpu_times"] = (f"{measured} measured (CUDA events) on "
                                 f"{torch.cuda.get_device_name()}, others projected")
    return OpGraph(ops=graph.ops, edges=graph.edges, name=graph.name, metadata=metadata)


def _costs(part: Partition, data, *, timed: bool, repeats: int, warmup: int,
           progress: bool, name: str, batched: Sequence[bool], micro_batches: list[int]):
    """The reference values of a step, each op's kernels (ops of one signature measured
    once) and, when `timed`, each op's forward and backward seconds and the split
    step's costs at each of `micro_batches` (micro-batch counts)."""
    env = reference_env(part, data)
    steps = (2 * warmup + repeats + max(repeats, SPLIT_MAX_RATIOS)) if timed else 0
    split = None
    with _progress_bar(len(part.ops) + steps, f"profiling {name}", progress) as bar:
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
                                        micro_batches=micro_batches, batched=batched,
                                        progress=bar.update)
    return env, costs, split


def measure_step_s(model: str, *, preset: str = "tiny", batch: int | None = None,
                   seq_chunk: int | None = None, repeats: int = 10,
                   warmup: int = 3, device: str = "cpu") -> float:
    """Median time of one whole forward+backward of the model on one CPU thread, or on
    the current GPU timed with CUDA events (what a profiled graph's single-device step
    time is compared with)."""
    spec = build(model, preset, seq_chunk=seq_chunk, device=device)
    data = spec.make_batch(spec.batch_size(batch, "--batch"), device=device)
    clock = StepClock(torch.device(device))
    times = []
    with _threads(1):
        for i in range(warmup + repeats):
            spec.module.zero_grad(set_to_none=True)
            t0 = clock.mark()
            spec.module(*data).backward()
            t1 = clock.mark()
            clock.settle()
            if i >= warmup:
                times.append(clock.seconds(t0, t1))
    return statistics.median(times)


def _value_bytes(v) -> float:
    return float(v.numel() * v.element_size()) if isinstance(v, torch.Tensor) else 0.0


def _gradient_bytes(v) -> float:
    """Bytes of the gradient a value carries back in training: none where it does not
    require grad (token ids, an attention mask, a function of the inputs alone)."""
    return _value_bytes(v) if isinstance(v, torch.Tensor) and v.requires_grad else 0.0


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


def _output_node(op, anchor) -> str:
    """The node whose shape is an op's `output_shape`: a traced op's anchor (a recurrent
    chunk's outputs are its second node), an exported op's last output (its first
    operators are often views of the input)."""
    if op.kind == "lstm":
        return op.nodes[1]
    if aten_name(anchor) is not None and op.outputs:
        return op.outputs[-1]
    return op.nodes[0]


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
              eff: Efficiency, *, measured: str | None, batch: int, target: str,
              precision: str, extra_kinds: tuple[DeviceKind, ...]) -> OpGraph:
    params = dict(part.module.named_parameters())
    colocation = _colocation(part)
    acts = activation_bytes(part, costs)
    counted: set[str] = set()
    projected = {k: TARGETS[k] for k in PROJECTED_KINDS}
    projected.update((kind.name, kind) for kind in extra_kinds)
    if measured != "cpu":
        projected["cpu"] = cluster_preset("cpu").device
    ops = []
    for op, cost in zip(part.ops, costs):
        own = [p for p in op.params if p not in counted]
        counted.update(own)
        sizes = {p: float(params[p].numel() * params[p].element_size()) for p in own}
        own_bytes = sum(sizes.values(), 0.0)
        frozen_bytes = sum((size for p, size in sizes.items()
                            if not params[p].requires_grad), 0.0)
        # The optimizer step updates the op's parameters once their gradients are final
        # (a frozen one has none: the step skips it).
        backward_kernels = cost.backward_kernels + optimizer_kernels(own_bytes - frozen_bytes)
        fwd = {k: op_time_s(cost.forward_kernels, op.kind, d, eff, precision)
               for k, d in projected.items()}
        bwd = {k: op_time_s(backward_kernels, op.kind, d, eff, precision)
               for k, d in projected.items()}
        if measured is not None:
            fwd[measured], bwd[measured] = cost.forward_s, cost.backward_s
        anchor = part.nodes[op.nodes[0]]
        attrs = {
            "layer_kind": op.kind,
            "module": op.module,
            "output_shape": _shape(env[_output_node(op, anchor)]),
            "input_shapes": [_shape(env[a.name] if a.op != "get_attr"
                                    else part.eval_node(a, env))
                             for a in anchor.all_input_nodes],
            "output_shapes": {name: _shape(env[name]) for name in op.outputs},
            "forward_flops": cost.forward_flops,
            "backward_flops": cost.backward_flops,
            "params": list(op.params),
            "fx_nodes": list(op.nodes),
        }
        if op.kind in ("conv2d", "linear") and anchor.op == "call_module":
            attrs["weight_shape"] = list(part.module.get_submodule(anchor.target).weight.shape)
        kernel = _kernel_size(part, anchor)
        if kernel is not None:
            attrs["kernel_size"] = kernel
        ops.append(Op(
            id=op.id, name=op.name, forward_s=fwd, backward_s=bwd,
            output_bytes=sum(_value_bytes(env[n]) for n in op.outputs),
            param_bytes=own_bytes, frozen_bytes=frozen_bytes,
            activation_bytes=acts[op.id], colocation=colocation.get(op.id),
            attrs=attrs))
    edges = tuple(Edge(src=s, dst=d, bytes=sum(_value_bytes(env[n]) for n in names),
                       grad_bytes=sum(_gradient_bytes(env[n]) for n in names))
                  for (s, d), names in part.edges.items())
    metadata = {
        "model": spec.name, "preset": spec.preset, "batch": batch,
        "seq_chunk": spec.seq_chunk, "target": target,
        "cpu_times": "measured" if measured == "cpu" else "projected",
        "gpu_times": "projected (roofline)", "precision": precision,
        "efficiency": eff.to_dict(),
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

