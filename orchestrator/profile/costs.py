"""What each op of a partition costs: measured on this CPU and projected for GPUs.

- `time_ops`: forward and backward seconds of every op on the device the partition's
  module sits on, measured inside whole training steps (warm-up steps, then `repeats`
  timed ones; see there): the host's clock on a CPU, CUDA events on a GPU.
- `measure_op`: the op run alone on its recorded inputs, forward and
  `torch.autograd.grad` backward: every aten kernel it runs with its FLOPs (from
  `torch.utils.flop_counter`) and the bytes it reads and writes (views move nothing),
  which feed the roofline of `orchestrator.profile.roofline`; and the bytes it saves
  for the backward (activations), counted once per storage across the graph,
  parameters excluded.
- `measure_split_costs`: how much slower a step runs when each op is its own
  executor task and the batch runs in K micro-batches, and how much slower again
  while another device thread of this host works too.
- `step_peak_bytes`: the peak of live memory over one whole training step.

Everything but the timing runs on the meta device as well: FLOPs, bytes and memory are
exact without allocating a weight.
"""

from __future__ import annotations

import copy
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only
from torch.utils.flop_counter import FlopCounterMode

from orchestrator.profile.trace import Partition


@dataclass(kw_only=True)
class Kernel:
    flops: float
    bytes: float
    matmul: bool
    """A GEMM or convolution (compute-bound if large enough)."""


@dataclass(kw_only=True)
class OpCost:
    forward_s: float | None = None
    backward_s: float | None = None
    forward_kernels: list[Kernel] = field(default_factory=list)
    backward_kernels: list[Kernel] = field(default_factory=list)
    saved_bytes: float = 0.0
    """Bytes of tensors the op itself creates and saves for its backward."""
    saved_inputs: dict[int, float] = field(default_factory=dict)
    """Position in the op's `inputs` -> bytes, for inputs it saves for its backward."""
    saved_outputs: set[int] = field(default_factory=set)
    """Positions in its `outputs` of values it saves (a consumer saving them adds
    nothing)."""

    @property
    def forward_flops(self) -> float:
        return sum(k.flops for k in self.forward_kernels)

    @property
    def backward_flops(self) -> float:
        return sum(k.flops for k in self.backward_kernels)


def _nbytes(v: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_flatten(v)[0]
               if isinstance(t, torch.Tensor))


class _KernelLog(TorchDispatchMode):
    """Records every aten call's bytes moved (inputs read + outputs written)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, float]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # prim calls (`prim.device` and the like: FakeTensorMode dispatches them, the
        # meta device does not) read metadata, not data.
        if (not func.is_view and func.namespace != "prim"
                and func.overloadpacket.__name__ not in _NO_DATA_OPS):
            moved = _nbytes((args, kwargs)) + _nbytes(out)
            self.calls.append((func.overloadpacket.__name__, float(moved)))
        return out


#: aten calls that move no data (metadata, aliasing) or that we account for elsewhere.
_NO_DATA_OPS = {"detach", "alias", "lift_fresh", "_to_copy_noop", "empty", "empty_like",
                "new_empty", "zeros_like_noop", "_local_scalar_dense", "set_", "sym_size",
                "sym_stride", "sym_numel", "is_same_size"}
_MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "convolution",
               "convolution_backward", "_convolution", "linear"}


def _kernels(run: Callable[[], Any]) -> tuple[Any, list[Kernel]]:
    """Run `run()` logging its kernels; FLOPs per kernel from FlopCounterMode."""
    log = _KernelLog()
    counter = FlopCounterMode(display=False)
    with counter, log:
        result = run()
    # FlopCounterMode counts per aten packet, not per call: spread each packet's total
    # over its calls, weighted by their bytes (exact when a packet is called once, and
    # for the repeated per-step GEMMs of an LSTM, which are all the same size).
    totals = {str(k).split(".")[-1]: v for k, v in counter.get_flop_counts().get("Global", {}).items()}
    bytes_per_packet: dict[str, float] = {}
    for name, moved in log.calls:
        bytes_per_packet[name] = bytes_per_packet.get(name, 0.0) + moved
    kernels = []
    for name, moved in log.calls:
        flops = totals.get(name, 0) * (moved / bytes_per_packet[name]
                                       if bytes_per_packet[name] else 0.0)
        kernels.append(Kernel(flops=flops, bytes=moved, matmul=name in _MATMUL_OPS))
    return result, kernels


class _SavedLog:
    """saved_tensors_hooks that record the storages an op saves for its backward."""

    def __init__(self) -> None:
        self.saved: dict[int, tuple[torch.Tensor, int]] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        self.saved.setdefault(st._cdata, (t, st.nbytes()))
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


def _storage_ids(values: Iterable[Any]) -> dict[int, Any]:
    return {t.untyped_storage()._cdata: t for v in values for t in tree_flatten(v)[0]
            if isinstance(t, torch.Tensor)}


def reference_env(part: Partition, batch: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """Every value of one forward pass, each tensor a leaf that requires grad exactly
    where the step's value does (no autograd graph kept past an op). `measure_op` runs an
    op's backward only through the inputs that carry a gradient in the model: a float
    that does not (a router's `histc` counts in a mixture of experts) may feed an op
    with no derivative (`cumsum` to int32), which autograd refuses."""
    with torch.no_grad():
        env = part.inputs_env(batch)
    with torch.enable_grad():
        for op in part.ops:
            part.run_op(op.id, env)
            env.update((name, tree_map_only(torch.Tensor, _leaf, env[name]))
                       for name in op.nodes)
    return env


def _leaf(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().requires_grad_(tensor.requires_grad)


def op_signature(part: Partition, op_id: int, env: dict[str, Any]) -> tuple:
    """What determines an op's kernels: its nodes' targets and the shapes it reads and
    writes. The chunks of one recurrent layer share it (but for the first, which starts
    from a zero state, and a shorter last one), so they are costed once."""
    op = part.ops[op_id]

    def shapes(names: Iterable[str]) -> tuple:
        return tuple((tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else repr(v)
                     for v in (env[n] for n in names))

    nodes = tuple((part.nodes[n].op, str(part.nodes[n].target)) for n in op.nodes)
    reads = [a.name for n in op.nodes for a in part.nodes[n].all_input_nodes
             if a.name in env]
    return nodes, shapes(op.inputs), shapes(reads), shapes(op.nodes)


def measure_op(part: Partition, op_id: int, env: dict[str, Any]) -> OpCost:
    """Kernels and saved bytes of op `op_id` run alone on its inputs from `env`."""
    op = part.ops[op_id]
    base = {k: env[k] for k in (*part.placeholders, *part.prologue)}
    inputs = {k: tree_map_only(torch.Tensor, _leaf, env[k]) for k in op.inputs}
    params = [p for name, p in part.module.named_parameters()
              if name in set(op.params) and p.requires_grad]
    wrt = [v for v in tree_flatten(list(inputs.values()))[0]
           if isinstance(v, torch.Tensor) and v.requires_grad] + params

    def forward() -> list[torch.Tensor]:
        local = {**base, **inputs}
        part.run_op(op_id, local)
        return [local[k] for k in op.outputs]

    def backward(outs: list[torch.Tensor]) -> None:
        pairs = [(o, torch.ones_like(o)) for o in outs
                 if isinstance(o, torch.Tensor) and o.requires_grad]
        if pairs and wrt:
            torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                allow_unused=True)

    cost = OpCost()
    saved = _SavedLog()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        outs, cost.forward_kernels = _kernels(forward)
    _, cost.backward_kernels = _kernels(lambda: backward(outs))
    _attribute_saved(cost, saved, list(inputs.values()), outs, params)
    return cost


class StepClock:
    """Marks on a step's timeline: the host's clock on a CPU; on a GPU, CUDA events
    recorded on the current stream, so that a mark says when the device got there, not
    when the host queued the work (the host runs ahead of an asynchronous GPU). Read
    the seconds between marks only after `settle()`."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def settle(self) -> None:
        """Wait for the device to pass every mark made so far (a no-op on a CPU)."""
        if self.cuda:
            torch.cuda.synchronize()

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start


def module_device(module: torch.nn.Module) -> torch.device:
    """Where `module`'s parameters sit (the CPU for a module without any)."""
    return next((p.device for p in module.parameters()), torch.device("cpu"))


def time_ops(part: Partition, batch: tuple[torch.Tensor, ...], *, repeats: int,
             warmup: int, progress: Callable[[], None] | None = None
             ) -> list[tuple[float, float]]:
    """(forward_s, backward_s) of every op, measured inside whole training steps.

    Each step runs the ops in id order with the autograd graph connected (exactly the
    computation of `module(*batch).backward()`), timing each op's forward; then one
    backward with a hook on every autograd node, which gives the wall time since the
    previous node finished to the op whose forward created the node (the CPU engine
    runs nodes one at a time, so this splits the backward among the ops). Timers,
    hooks and interpreting the graph op by op cost time themselves, so the same step
    is run once more as the traced module's own forward and backward, and the ops'
    forward and backward shares are scaled to those clean times: the instrumented
    step says how a step's time splits among the ops, the clean one how long it is.
    (The prologue, which no op owns, is spread over the forward shares: on one device
    it runs once per step either way.) Timing ops inside real steps, rather than one
    op over and over, keeps the cache, allocator and engine effects of a real step in
    the figures.

    An op's time is its mean over the *central* steps: those whose total lies between
    the quartiles of the step totals (all steps when there are fewer than 4). A
    per-op median would be robust too, but on a shared machine op times are
    right-skewed (preemption), and a sum of medians falls well below the median of
    sums, which is what a step takes; means over the central steps add up to it.

    On a GPU the marks are CUDA events (`StepClock`): an op's time is what the device
    spent from the end of the previous op's kernels to the end of its own, and the
    host waits for the device once per step, after the clean step.
    """
    clock = StepClock(module_device(part.module))
    fwd: list[list[float]] = [[] for _ in part.ops]
    bwd: list[list[float]] = [[] for _ in part.ops]
    for rep in range(warmup + repeats):
        part.module.zero_grad(set_to_none=True)
        env = part.inputs_env(batch)
        owner: dict[torch.autograd.graph.Node, int] = {}
        fwd_marks = [clock.mark()]
        for op in part.ops:
            part.run_op(op.id, env)
            fwd_marks.append(clock.mark())
            _claim_nodes(owner, [env[k] for k in op.outputs], op.id)
        bwd_marks = _backward_marks(env[part.loss], owner, clock)
        del env, owner
        part.module.zero_grad(set_to_none=True)
        t0 = clock.mark()
        loss = part.module(*batch)
        t1 = clock.mark()
        loss.backward()
        t2 = clock.mark()
        del loss
        clock.settle()
        step_fwd = [clock.seconds(a, b) for a, b in zip(fwd_marks, fwd_marks[1:])]
        shares = _backward_shares(bwd_marks, len(part.ops), clock)
        fwd_scale = _scale(clock.seconds(t0, t1), step_fwd)
        bwd_scale = _scale(clock.seconds(t1, t2), shares)
        if rep >= warmup:
            for i in range(len(part.ops)):
                fwd[i].append(step_fwd[i] * fwd_scale)
                bwd[i].append(shares[i] * bwd_scale)
        if progress is not None:
            progress()
    part.module.zero_grad(set_to_none=True)
    keep = central_steps([sum(f[r] + b[r] for f, b in zip(fwd, bwd))
                          for r in range(repeats)])
    return [(statistics.fmean(f[r] for r in keep), statistics.fmean(b[r] for r in keep))
            for f, b in zip(fwd, bwd)]


@dataclass(frozen=True)
class SplitCosts:
    overhead: dict[int, float]
    """Per micro-batch count K: the step with every op its own executor task and the
    batch in K micro-batches, over the plain step's time."""
    corun_slowdown: dict[int, float]
    """Per K: that split step's time while another device thread runs one, over its
    time alone."""


#: Paired ratios per micro-batch count at least, and at most: past the least, the split
#: costs stop at `SPLIT_BUDGET_S`. Each repetition times a plain step and, per count K,
#: a split step alone and beside a neighbour (two of each, the second timed): tiny GNMT's
#: 12 repetitions took 33 s of its 38 s profile at load 5 on 2 cores, its op times 0.7 s,
#: and the job profiles twice (the base and the worker batch).
SPLIT_MIN_RATIOS, SPLIT_MAX_RATIOS = 5, 10
#: Seconds of split-cost repetitions after which no new one starts once
#: `SPLIT_MIN_RATIOS` are in.
SPLIT_BUDGET_S = 4.0


def measure_split_costs(part: Partition, batch: tuple[torch.Tensor, ...], *,
                        repeats: int, warmup: int, micro_batches: Sequence[int] = (1,),
                        batched: Sequence[bool] | None = None,
                        progress: Callable[[], None] | None = None) -> SplitCosts:
    """What a plan split over device threads pays that the op times do not show, for
    each micro-batch count K in `micro_batches` (each must divide the batch; `batched`
    as PlanExecutor's: which inputs carry the samples).

    - Overhead: a split plan runs each op's forward and backward as separate tasks
      (detached inputs, one `torch.autograd.backward` per op: see
      `orchestrator.runtime.executor`), once per micro-batch, which costs fixed time
      per task that the plain step does not pay, and K micro-batches of B/K samples
      run each kernel K times on smaller tensors. Both grow with K, not with the op's
      time: tiny BigLSTM at 8 samples took 1.6, 2.6 and 5.3x the plain step split at
      K = 1, 2 and 4, where one factor measured at K = 1 and spread over K tasks of
      1/K each had its K = 4 plans predicted at a fifth of their timed step. Measured
      with every task on one device, so that no task waits for another device
      (`placement.tasks.split_overhead`); at least 1, as the split step runs the plain
      step's kernels and more (medians of 0.95 and 0.99 came out on this noisy host,
      in trials whose predictions were 14% and 27% optimistic).
    - Co-run slowdown: device threads of one host share its caches, its memory
      bandwidth and the interpreter lock, so their tasks run slower while another
      device works (measured on the tiny BigLSTM: 4-8% longer tasks). Measured as the
      split step's time while a copy of the model runs split steps of the same K on
      threads of its own without a pause (`placement.tasks.corun_slowdown`); at least
      1, as a neighbour cannot speed a task up.

    Each repetition runs a pair of plain steps, then per K a pair of split steps and a
    pair of split steps beside the neighbour, so that all see the same load; only the
    second step of each pair is timed, as a step that follows one of another kind runs
    slower (other threads' memory and caches) than one in a run of its own kind, which
    is what training does. Each figure is the median of `SPLIT_MIN_RATIOS` to
    `SPLIT_MAX_RATIOS` paired ratios (or `repeats`, if more), as many as fit
    `SPLIT_BUDGET_S`: one ratio is as noisy as the machine (ratios of two medians moved
    between 1.0 and 1.5 from call to call).

    On a GPU only the overhead is measured (timed with CUDA events): a worker's GPUs
    are separate chips, which share no cores or caches, so the co-run slowdown is 1."""
    device = module_device(part.module)
    clock = StepClock(device)
    size = batch[0].shape[0] if batch and batch[0].dim() else 1
    assert micro_batches and all(size % k == 0 for k in micro_batches), (size, micro_batches)
    executors = {k: _split_executor(part, part.module, device, k, batched)
                 for k in micro_batches}
    twin_module = copy.deepcopy(part.module) if not clock.cuda else None
    twins = ({k: _split_executor(part, twin_module, device, k, batched)
              for k in micro_batches} if twin_module is not None else None)

    def plain_step() -> None:
        part.module(*batch).backward()

    def timed_pair(run: Callable[[], None]) -> float:
        """Seconds of the second of two steps of `run`."""
        part.module.zero_grad(set_to_none=True)
        run()
        part.module.zero_grad(set_to_none=True)
        t0 = clock.mark()
        run()
        t1 = clock.mark()
        clock.settle()
        part.module.zero_grad(set_to_none=True)
        return clock.seconds(t0, t1)

    def beside_neighbour(k: int) -> float:
        running, stop = threading.Event(), threading.Event()

        def neighbour() -> None:
            while not stop.is_set():
                twins[k].step(batch, size)
                twin_module.zero_grad(set_to_none=True)
                running.set()

        thread = threading.Thread(target=neighbour, daemon=True)
        thread.start()
        running.wait()
        elapsed = timed_pair(lambda: executors[k].step(batch, size))
        stop.set()
        thread.join()
        return elapsed

    overheads: dict[int, list[float]] = {k: [] for k in micro_batches}
    slowdowns: dict[int, list[float]] = {k: [] for k in micro_batches}
    started = time.perf_counter()
    for rep in range(warmup + max(repeats, SPLIT_MAX_RATIOS)):
        if (rep >= warmup + SPLIT_MIN_RATIOS
                and time.perf_counter() - started > SPLIT_BUDGET_S):
            break
        plain = timed_pair(plain_step)
        for k in micro_batches:
            split = timed_pair(lambda k=k: executors[k].step(batch, size))
            beside = beside_neighbour(k) if twins is not None else split
            if rep >= warmup:
                overheads[k].append(split / plain)
                slowdowns[k].append(beside / split)
        if progress is not None:
            progress()
    return SplitCosts(
        overhead={k: max(1.0, statistics.median(v)) for k, v in overheads.items()},
        corun_slowdown={k: max(1.0, statistics.median(v)) for k, v in slowdowns.items()})


def _split_executor(part: Partition, module: torch.nn.Module, device: torch.device,
                    num_micro_batches: int, batched: Sequence[bool] | None):
    """An executor running `module` (the partition's module or a copy) with every op
    its own task on `device`, each micro-batch's forwards then its backwards; a second,
    idle device makes it take its split path."""
    from orchestrator.runtime.executor import OpPartition, PlanExecutor

    order = [(op.id, phase, m) for m in range(num_micro_batches)
             for phase, ops in (("forward", part.ops), ("backward", part.ops[::-1]))
             for op in ops]
    return PlanExecutor(OpPartition(module, {op.id: op.nodes for op in part.ops}),
                        {op.id: 0 for op in part.ops}, [order, []],
                        [device] * 2, num_micro_batches=num_micro_batches, batched=batched)


def _scale(clean_s: float, shares: list[float]) -> float:
    return clean_s / sum(shares) if sum(shares) > 0 else 0.0


def _claim_nodes(owner: dict, outputs: list[Any], op_id: int) -> None:
    """Give op `op_id` every autograd node reachable from its outputs that no earlier
    op has (the nodes its forward created, parameter accumulators included)."""
    stack = [t.grad_fn for t in outputs
             if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in owner:
            continue
        owner[node] = op_id
        stack.extend(n for n, _ in node.next_functions)


def _backward_marks(loss: torch.Tensor, owner: dict, clock: StepClock) -> list:
    """Backward of `loss` with a mark as each autograd node finishes: [start mark,
    then (op id, mark) per node in the order they ran] (see `time_ops`)."""
    marks: list = []

    def make_hook(op_id: int):
        def hook(*_):
            marks.append((op_id, clock.mark()))
        return hook

    handles = [node.register_hook(make_hook(op_id)) for node, op_id in owner.items()]
    marks.append(clock.mark())
    loss.backward()
    for h in handles:
        h.remove()
    return marks


def _backward_shares(marks: list, num_ops: int, clock: StepClock) -> list[float]:
    """The backward's time split among the ops: each node's time since the previous
    mark goes to the op that created it."""
    spent = [0.0] * num_ops
    last = marks[0]
    for op_id, mark in marks[1:]:
        spent[op_id] += clock.seconds(last, mark)
        last = mark
    return spent


def central_steps(totals: list[float]) -> list[int]:
    """Indices of the steps whose total lies between the quartiles (all if < 4)."""
    if len(totals) < 4:
        return list(range(len(totals)))
    q1, _, q3 = statistics.quantiles(totals, n=4)
    return [r for r, t in enumerate(totals) if q1 <= t <= q3]


def _attribute_saved(cost: OpCost, saved: _SavedLog, inputs: list[Any],
                     outputs: list[Any], params: list[torch.Tensor]) -> None:
    param_ids = _storage_ids(params)
    input_ids = {sid: i for i, v in enumerate(inputs) for sid in _storage_ids([v])}
    output_ids = {sid: i for i, v in enumerate(outputs) for sid in _storage_ids([v])}
    for sid, (_, nbytes) in saved.saved.items():
        if sid in param_ids:
            continue
        if sid in input_ids:
            cost.saved_inputs[input_ids[sid]] = float(nbytes)
            continue
        if sid in output_ids:
            cost.saved_outputs.add(output_ids[sid])
        cost.saved_bytes += nbytes


def activation_bytes(part: Partition, costs: list[OpCost]) -> list[float]:
    """Saved-for-backward bytes per op, each value counted once: by its producer if the
    producer saves it, else by its first consumer that does."""
    counted = {part.ops[i].outputs[j] for i, c in enumerate(costs) for j in c.saved_outputs}
    result = []
    for op, c in zip(part.ops, costs):
        extra = 0.0
        for j, nbytes in c.saved_inputs.items():
            name = op.inputs[j]
            if name not in counted:
                counted.add(name)
                extra += nbytes
        result.append(c.saved_bytes + extra)
    return result


class LivePeak(TorchDispatchMode):
    """Peak bytes of live tensor storages created inside the mode (forward, backward,
    gradients), each storage counted once while it lives. Works on the meta device."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if st._cdata not in self._seen:
                    self._seen.add(st._cdata)
                    self.live += st.nbytes()
                    weakref.finalize(st, self._free, st._cdata, st.nbytes())
        self.peak = max(self.peak, self.live)
        return out

    def _free(self, sid: int, nbytes: int) -> None:
        self._seen.discard(sid)
        self.live -= nbytes


def step_peak_bytes(module: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> dict[str, float]:
    """Memory of one training step (forward + backward, no optimizer state):
    parameters plus the peak of everything created during the step, gradients
    included."""
    param_bytes = float(sum(p.numel() * p.element_size() for p in module.parameters()))
    module.zero_grad(set_to_none=True)
    tracker = LivePeak()
    with tracker:
        module(*batch).backward()
    module.zero_grad(set_to_none=True)
    return {"param_bytes": param_bytes, "step_peak_bytes": param_bytes + tracker.peak}
