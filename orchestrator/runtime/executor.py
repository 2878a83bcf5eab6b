"""Runs one training step of an fx-traced model under a plan: each device executes its
tasks (op forward or backward, per micro-batch) in the plan's order on its own thread.

Why a hand-written executor: PyTorch's pipeline APIs (torch.distributed.pipelining)
split a model into sequential stages with fixed schedules; a DLPlacer plan places
arbitrary ops of a DAG on devices with a per-device order, which is what this runs.

Every op boundary is an autograd boundary: an op's inputs from other ops are detached
leaves (one copy of a value per device that reads it), so the backward of each op is a
separate `torch.autograd.backward` call on its device's thread, fed with the gradients
its consumers produced (summed per device before they cross). That is exactly the task
graph the simulator schedules (placement/tasks.py), so the plan's predicted step time
describes what runs here, and on a CPU host the devices' backwards run concurrently
(the autograd engine would otherwise run all CPU backward work on one thread).

On GPUs each plan device has one long-lived CUDA stream (the caching allocator reuses a
block only on the stream that allocated it, so a stream per step would strand memory),
and the host never waits for a device inside a step: every task records a CUDA event
when queued, a consumer's stream waits on its producer's event before reading (a value
forward, a gradient backward, a prologue value), a tensor read on a stream other than
the one that allocated it is `record_stream`ed there (so its memory is not reused
while that read is pending), host-to-device copies come from pinned memory with
`non_blocking=True`, and the step's streams wait for the caller's stream at the start
(the optimizer's updates) and the caller's stream for them at the end. On CPU devices
all of that is skipped: a CPU op is done when its call returns.
"""

from __future__ import annotations

import ctypes
import functools
import queue
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import fx

from placement.errors import UserError


class PlanMismatchError(UserError):
    """A plan whose ops do not match the model's traced graph."""


@dataclass(frozen=True)
class OpPartition:
    """An fx GraphModule and, per op id, the names of the fx nodes the op runs (in
    graph order). Placeholders, get_attr and output nodes may be left unassigned: batch
    inputs and parameters are fetched by whichever op reads them. Any other unassigned
    node is *prologue*: computed from the inputs alone (no gradient), once per
    micro-batch, by whichever op needs it first."""

    module: fx.GraphModule
    op_nodes: Mapping[int, Sequence[str]]


class _Failed(Exception):
    """Raised in waiting threads once another device's task has failed."""


def _keep_freed_memory() -> None:
    """Tell glibc malloc to keep freed memory instead of unmapping it: with several
    device threads, each step's activations otherwise come back as fresh mmaps whose
    page faults cost as much system time as the ops save (measured: ~2,800 faults and
    10 ms of a 50 ms BigLSTM step). The top pad keeps a thread's arena from deleting
    a 64 MB heap that frees have emptied (glibc's heap_trim does so whatever the trim
    threshold) and mapping a new one as soon as it grows again: a device thread whose
    arena sat on that boundary took 16,000 page faults per Inception-V3 split step
    (225 heaps mapped and unmapped in 48 steps, strace), and the profile measured a
    split overhead of 1.33-1.41 instead of 1.12-1.18; which thread that hit changed
    from run to run. A no-op where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    libc.mallopt(m_mmap_threshold, 32 * 2**20)  # glibc's largest mmap threshold
    libc.mallopt(m_trim_threshold, 2**30)
    libc.mallopt(m_top_pad, 64 * 2**20)


class PlanExecutor:
    """Executes steps of `partition.module` placed by `assignment` and `order`."""

    def __init__(self, partition: OpPartition, assignment: Mapping[int, int],
                 order: Sequence[Sequence[tuple[int, str, int]]],
                 devices: Sequence[torch.device], *, num_micro_batches: int,
                 batched: Sequence[bool] | None = None,
                 autocast_dtype: torch.dtype | None = None,
                 whole_module: torch.nn.Module | None = None) -> None:
        """`batched[i]`: whether batch input i has the samples along dim 0 (and is split
        into micro-batches); the others (e.g. BigLSTM's shared softmax samples) go whole
        to every micro-batch. None: every input is batched. `whole_module`: what a
        one-device plan runs per micro-batch instead of the traced module (e.g. the
        traced module wrapped in DDP)."""
        self.gm = partition.module
        self.whole_module = whole_module if whole_module is not None else self.gm
        self.devices = list(devices)
        self.num_micro_batches = num_micro_batches
        self.batched = None if batched is None else tuple(batched)
        self.autocast_dtype = autocast_dtype
        self.assignment = dict(assignment)
        nodes = {n.name: n for n in self.gm.graph.nodes}
        self.op_of_node: dict[str, int] = {}
        for op, names in partition.op_nodes.items():
            for name in names:
                if name not in nodes:
                    raise PlanMismatchError(f"op {op} names fx node {name!r}, which the "
                                            "model's graph lacks: re-profile the model")
                self.op_of_node[name] = op
        self.op_nodes = {op: [nodes[n] for n in names]
                         for op, names in partition.op_nodes.items()}
        self._check_plan(order)
        if len(self.devices) > 1:
            _keep_freed_memory()
        self.order = [[(int(o), phase == "backward", int(m)) for o, phase, m in tasks]
                      for tasks in order]
        self._threads: _DeviceThreads | None = None
        self.streams = ([torch.cuda.Stream(d) if d.type == "cuda" else None
                         for d in self.devices] if len(self.devices) > 1 else [])
        self.output_node = next(n for n in self.gm.graph.nodes if n.op == "output")
        self.placeholder_index = {n.name: i for i, n in enumerate(
            n for n in self.gm.graph.nodes if n.op == "placeholder")}
        self.calls = {node.name: _bind(self.gm, node) for node in self.gm.graph.nodes
                      if node.op in ("call_module", "call_function", "call_method")}
        loss_arg = self.output_node.args[0]
        self.loss_node = loss_arg.name if isinstance(loss_arg, fx.Node) else None
        # Producer op -> its nodes read by other ops (values that cross an op boundary).
        # Per op: (node, the other ops reading it, whether it is the step's output).
        self.exported: dict[int, list[tuple[fx.Node, list[int], bool]]] = {}
        for op, op_nodes in self.op_nodes.items():
            self.exported[op] = []
            for node in op_nodes:
                readers = sorted({self.op_of_node[u.name] for u in node.users
                                  if u.op != "output" and u.name in self.op_of_node
                                  and self.op_of_node[u.name] != op})
                is_output = self.output_node in node.users
                if readers or is_output:
                    self.exported[op].append((node, readers, is_output))
        # Exported node -> the devices holding its readers, each holding one copy of it.
        self.reader_devices = {node.name: sorted({self.assignment[r] for r in readers})
                               for exported in self.exported.values()
                               for node, readers, _ in exported}

    def _check_plan(self, order: Sequence[Sequence[tuple[int, str, int]]]) -> None:
        unplaced = set(self.op_nodes) - set(self.assignment)
        extra = set(self.assignment) - set(self.op_nodes)
        if unplaced or extra:
            bad = sorted(unplaced or extra)[:5]
            what = "places no device for" if unplaced else "places ops the model lacks:"
            raise PlanMismatchError(f"the plan {what} op(s) {bad}: make the plan from this "
                                    "model's profiled graph (orchestrator profile, then plan)")
        if max(self.assignment.values()) >= len(self.devices):
            raise PlanMismatchError(
                f"the plan uses {max(self.assignment.values()) + 1} devices but the worker "
                f"has {len(self.devices)}: plan with --devices {len(self.devices)}")
        for device, tasks in enumerate(order):
            for op, _phase, _m in tasks:
                if self.assignment.get(int(op)) != device:
                    raise PlanMismatchError(f"the plan orders op {op} on device {device} "
                                            "but assigns it elsewhere: the plan is corrupt")

    # -- one step ---------------------------------------------------------------------

    def step(self, batch: Sequence[torch.Tensor], batch_size: int,
             on_device_done: Callable[[int], None] | None = None) -> float:
        """Forward and backward of one batch: accumulates parameter gradients (scaled so
        that they are those of the batch's mean loss) and returns that mean loss.

        `on_device_done(d)` is called on device d's thread once its last task is done:
        its gradients are final then, so their allreduce can overlap the other devices'
        remaining backward work."""
        k = self.num_micro_batches
        if batch_size % k:
            raise UserError(f"per-worker batch {batch_size} does not split into {k} "
                            f"micro-batches: use a multiple of {k}")
        batched = self.batched or (True,) * len(batch)
        micro = [list(t.chunk(k, dim=0)) if is_batched else [t] * k
                 for t, is_batched in zip(batch, batched)]
        if len(self.devices) == 1:
            return self._step_one_device([[m[i] for m in micro] for i in range(k)],
                                         on_device_done)
        state = _StepState(self, [[m[i] for m in micro] for i in range(k)], on_device_done)
        if self._threads is None:
            self._threads = _DeviceThreads(len(self.devices))
            weakref.finalize(self, self._threads.close)
        callers = _caller_streams(self.devices)
        for stream, device in zip(self.streams, self.devices):
            if stream is not None:
                # The device's first task must see the caller's work on its inputs and
                # parameters (the previous step's optimizer update).
                stream.wait_stream(callers[device])
        self._threads.run([functools.partial(state.run_device, d)
                           for d in range(len(self.devices))])
        for stream, device in zip(self.streams, self.devices):
            if stream is not None:
                callers[device].wait_stream(stream)
        if state.error is not None:
            raise state.error
        # The one host read of the step: the value it returns.
        return sum(float(loss) for loss in state.losses) / k


    def _step_one_device(self, micro_batches: list[list[torch.Tensor]],
                         on_device_done: Callable[[int], None] | None) -> float:
        """All ops on one device: op boundaries buy nothing there, so each micro-batch
        is one plain forward and backward of the whole module (the same tasks, in an
        order the plan's simulator also allows)."""
        device = self.devices[0]
        autocast = (torch.autocast(device.type, dtype=self.autocast_dtype)
                    if self.autocast_dtype is not None else nullcontext())
        losses = []
        no_sync = getattr(self.whole_module, "no_sync", None)
        for i, inputs in enumerate(micro_batches):
            # DDP allreduces in the last micro-batch's backward only.
            last = i == len(micro_batches) - 1
            with nullcontext() if last or no_sync is None else no_sync():
                with autocast:
                    loss = self.whole_module(*(_to(t, device) for t in inputs))
                (loss / len(micro_batches)).backward()
            losses.append(loss.detach())
        if on_device_done is not None:
            on_device_done(0)
        return sum(float(loss) for loss in losses) / len(losses)


class _DeviceThreads:
    """One long-lived thread per device, each running the jobs handed to it.

    Threads that outlive a step keep their malloc arenas and thread-local settings, and
    a step does not pay for starting them. Each job runs with the intra-op thread count
    of the thread that handed it over: a new thread starts with OpenMP's and MKL's
    default team (every core), so two device threads would otherwise run four compute
    threads on two cores (measured here: two threads of independent GEMMs ran 1.47x one
    thread's rate with the default, 1.67x with the caller's count of 1)."""

    def __init__(self, num_devices: int) -> None:
        self.queues = [queue.SimpleQueue() for _ in range(num_devices)]
        self.threads = [threading.Thread(target=_serve, args=(jobs,), daemon=True,
                                         name=f"device-{d}")
                        for d, jobs in enumerate(self.queues)]
        for t in self.threads:
            t.start()

    def run(self, jobs: Sequence[Callable[[], None]]) -> None:
        """Run jobs[d] on device d's thread, all at once; return when all are done."""
        done = threading.Semaphore(0)
        threads = torch.get_num_threads()
        for q, job in zip(self.queues, jobs, strict=True):
            q.put((job, threads, done))
        for _ in jobs:
            done.acquire()

    def close(self) -> None:
        """Stop the threads and wait for them (also at interpreter exit: a thread torch
        has set up must not be torn down while it waits)."""
        for q in self.queues:
            q.put(None)
        for t in self.threads:
            if t is not threading.current_thread():
                t.join()


def _serve(jobs: queue.SimpleQueue) -> None:
    # Set on the first job whatever the thread reports: a new thread's
    # torch.get_num_threads() already gives the caller's count while MKL's team in it
    # is still the default.
    current = None
    while (item := jobs.get()) is not None:
        job, threads, done = item
        # Hold no reference to a finished step between jobs: it leads to the executor,
        # whose collection is what stops this thread.
        del item
        if threads != current:
            torch.set_num_threads(threads)
            current = threads
        try:
            job()
        finally:
            del job
            done.release()


class _StepState:
    """Values, gradients and completion events of the tasks of one step."""

    def __init__(self, ex: PlanExecutor, micro_batches: list[list[torch.Tensor]],
                 on_device_done: Callable[[int], None] | None):
        self.ex = ex
        self.on_device_done = on_device_done
        self.inputs = micro_batches
        k = ex.num_micro_batches
        self.done = {(op, bwd, m): threading.Event()
                     for op in ex.op_nodes for bwd in (False, True) for m in range(k)}
        # (op, backward, micro-batch) -> CUDA event recorded on the task's stream once
        # the task is queued; absent for tasks on CPU devices.
        self.cuda_done: dict[tuple[int, bool, int], torch.cuda.Event] = {}
        self.values: list[dict[str, object]] = [{} for _ in range(k)]
        # (consumer device, micro-batch) -> {producer node name: detached leaf}. One
        # copy per device, shared by the ops there that read it: the value crosses to a
        # device once, and their gradients add up in the copy's `.grad` (each op's
        # backward runs on that device's thread), so one summed gradient crosses back.
        # That is what the max-load model charges (placement/tasks.py).
        self.leaves: dict[tuple[int, int], dict[str, object]] = {}
        # (device, micro-batch, input index) -> the batch input on that device
        self.device_inputs: dict[tuple[int, int, int], object] = {}
        # micro-batch -> {node name: (value, CUDA event or None)}
        self.prologue: list[dict[str, tuple[object, object]]] = [{} for _ in range(k)]
        self.prologue_lock = threading.RLock()
        self.losses: list[object] = [0.0] * k
        self.error: BaseException | None = None

    def run_device(self, d: int) -> None:
        ex = self.ex
        stream = ex.streams[d]
        # Entering the stream also makes its GPU this thread's current device (a new
        # thread starts on cuda:0 whatever device Ray gave the worker).
        stream_ctx = torch.cuda.stream(stream) if stream is not None else nullcontext()
        try:
            with stream_ctx:
                for op, backward, m in ex.order[d]:
                    if backward:
                        self._backward(op, m, d)
                    else:
                        self._forward(op, m, d)
                    if stream is not None:
                        self.cuda_done[(op, backward, m)] = _record(stream)
                    self.done[(op, backward, m)].set()
                if self.on_device_done is not None:
                    self.on_device_done(d)
        except _Failed:
            return
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            self.error = err
            for event in self.done.values():
                event.set()

    def _wait(self, key: tuple[int, bool, int], d: int) -> None:
        """Wait until task `key` is queued, and order device d's stream after it."""
        self.done[key].wait()
        if self.error is not None:
            raise _Failed
        _stream_wait(self.ex.streams[d], self.cuda_done.get(key))

    def _input(self, m: int, index: int, d: int):
        key = (d, m, index)
        if key not in self.device_inputs:
            self.device_inputs[key] = _to(self.inputs[m][index], self.ex.devices[d])
        return self.device_inputs[key]

    def _fetch(self, node: fx.Node, op: int, m: int, d: int, local: dict[str, object]):
        """The value of `node` for op `op` on device d (whose own values so far are
        `local`)."""
        ex = self.ex
        name = node.name
        producer = ex.op_of_node.get(name)
        if producer == op:
            return local[name]
        if producer is not None:
            leaves = self.leaves.setdefault((d, m), {})
            if name not in leaves:
                self._wait((producer, False, m), d)
                value = self.values[m][name]
                _read_here(value)
                leaves[name] = _detach_to(value, ex.devices[d])
            return leaves[name]
        if node.op == "placeholder":
            return self._input(m, ex.placeholder_index[name], d)
        if node.op == "get_attr":
            return _get_attr(ex.gm, node.target)
        return self._prologue(node, m, d)

    def _prologue(self, node: fx.Node, m: int, d: int):
        """A prologue value, computed by the first device that needs it (on its stream)
        and read by the others after that stream's event."""
        with self.prologue_lock:
            if node.name not in self.prologue[m]:
                fetch = lambda n: self._fetch(n, -1, m, d, {})  # noqa: E731
                with torch.no_grad():
                    value = self.ex.calls[node.name](
                        fx.node.map_arg(node.args, fetch), fx.node.map_arg(node.kwargs, fetch))
                stream = self.ex.streams[d]
                self.prologue[m][node.name] = (
                    value, _record(stream) if stream is not None else None)
            value, event = self.prologue[m][node.name]
        _stream_wait(self.ex.streams[d], event)
        _read_here(value)
        return _to(value, self.ex.devices[d])

    def _forward(self, op: int, m: int, d: int) -> None:
        ex = self.ex
        device = ex.devices[d]
        autocast = (torch.autocast(device.type, dtype=ex.autocast_dtype)
                    if ex.autocast_dtype is not None else nullcontext())
        local: dict[str, object] = {}
        fetch = lambda n: self._fetch(n, op, m, d, local)  # noqa: E731
        with autocast:
            for node in ex.op_nodes[op]:
                if node.op == "placeholder":
                    local[node.name] = self._input(m, ex.placeholder_index[node.name], d)
                elif node.op == "get_attr":
                    local[node.name] = _get_attr(ex.gm, node.target)
                else:
                    local[node.name] = ex.calls[node.name](
                        fx.node.map_arg(node.args, fetch), fx.node.map_arg(node.kwargs, fetch))
        if ex.loss_node is not None and ex.op_of_node.get(ex.loss_node) == op:
            # Kept on the device: the host reads the losses once, after the step.
            self.losses[m] = local[ex.loss_node].detach()
        # Keep only what other ops and this op's backward read: autograd saves what
        # the backward needs by itself, and the plan's memory model counts just that
        # (holding every value to the end of the step gave Inception-V3's tiny split
        # step 2.7x the plain step's peak).
        for node, _readers, _is_output in ex.exported[op]:
            self.values[m][node.name] = local[node.name]

    def _backward(self, op: int, m: int, d: int) -> None:
        ex = self.ex
        device = ex.devices[d]
        tensors, grads = [], []
        for node, readers, is_output in ex.exported[op]:
            value = self.values[m][node.name]
            total = None
            if is_output:
                total = torch.full_like(value, 1.0 / ex.num_micro_batches)
            for consumer in readers:
                self._wait((consumer, True, m), d)
            for reader_device in ex.reader_devices[node.name]:
                # Each device's copy is read here once, after all its readers' backward
                # (waited above): drop it and its summed gradient.
                leaf = self.leaves.get((reader_device, m), {}).pop(node.name, None)
                total = _add(total, _grads_of(leaf, device))
            # Every reader has run its backward (and this stream is ordered after
            # them): the value is not read again.
            del self.values[m][node.name]
            if total is None:
                continue
            for out, g in zip(_flat(value), _flat(total)):
                if isinstance(out, torch.Tensor) and out.requires_grad and g is not None:
                    tensors.append(out)
                    grads.append(g.to(out.dtype))
        if tensors:
            torch.autograd.backward(tensors, grads)


def _caller_streams(devices: Sequence[torch.device]) -> dict[torch.device, object]:
    """The calling thread's current stream on each GPU among `devices`."""
    return {d: torch.cuda.current_stream(d) for d in devices if d.type == "cuda"}


def _record(stream) -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record(stream)
    return event


def _stream_wait(stream, event) -> None:
    """Order `stream` after `event` (nothing to order on a CPU device)."""
    if stream is not None and event is not None:
        stream.wait_event(event)


def _read_here(value) -> None:
    """Mark the GPU tensors in `value` as used by this thread's current stream on their
    device (where its reads, and a copy to another device, run), so that the caching
    allocator does not hand their memory out again before those reads are done."""
    for t in _flat(value):
        if isinstance(t, torch.Tensor) and t.is_cuda:
            t.record_stream(torch.cuda.current_stream(t.device))


def _get_attr(gm: fx.GraphModule, target: str):
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _bind(gm: fx.GraphModule, node: fx.Node) -> Callable:
    """`f(args, kwargs)` running one fx node, resolved once (not per call)."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        return lambda args, kwargs: module(*args, **kwargs)
    if node.op == "call_function":
        target = node.target
        return lambda args, kwargs: target(*args, **kwargs)
    method = node.target
    return lambda args, kwargs: getattr(args[0], method)(*args[1:], **kwargs)


def _to(value, device: torch.device):
    """`value` (tensors, nested tuples) on `device`, copied only when elsewhere; a host
    tensor goes to a GPU from pinned memory, without blocking the host."""
    if isinstance(value, torch.Tensor):
        if value.device == device:
            return value
        if value.device.type == "cpu" and device.type == "cuda":
            return value.pin_memory().to(device, non_blocking=True)
        # Non-blocking only towards a GPU: a host reading a copy must have it complete.
        return value.to(device, non_blocking=device.type == "cuda")
    if isinstance(value, (tuple, list)):
        return type(value)(_to(v, device) for v in value)
    return value


def _detach_to(value, device: torch.device):
    """A consumer's copy of a producer's value: detached leaves (so the consumer's
    backward stops there and leaves the gradient in `.grad`), nested tuples too."""
    if isinstance(value, (tuple, list)):
        return type(value)(_detach_to(v, device) for v in value)
    if not isinstance(value, torch.Tensor):
        return value
    leaf = _to(value.detach(), device)
    if leaf.is_floating_point():
        leaf.requires_grad_(value.requires_grad)
    return leaf


def _grads_of(leaf, device: torch.device):
    """The gradient a consumer left on its detached copy of a value (tuples too)."""
    if isinstance(leaf, torch.Tensor):
        if leaf.grad is None:
            return None
        _read_here(leaf.grad)
        return _to(leaf.grad, device)
    if isinstance(leaf, (tuple, list)):
        return type(leaf)(_grads_of(v, device) for v in leaf)
    return None


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, torch.Tensor):
        return a + b
    return type(a)(_add(x, y) for x, y in zip(a, b))



def _flat(value) -> list:
    """Leaves of nested tuples/lists, Nones kept (so values and gradients align)."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _flat(v)]
    return [value]


def batched_inputs(make_batch: Callable[[int], Sequence[torch.Tensor]]) -> tuple[bool, ...]:
    """Which of a model's batch tensors carry the samples along dim 0: those whose first
    dimension follows the batch size (compared at two sizes, on the meta device)."""
    two, three = make_batch(2, device="meta"), make_batch(3, device="meta")
    return tuple(a.dim() > 0 and (a.shape[0], b.shape[0]) == (2, 3) for a, b in zip(two, three))
