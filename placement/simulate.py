"""The two cost models of a placement (DESIGN.md), their lower bounds, and a timeline.

- Step time (makespan): each device runs one task at a time, non-preemptively, in its
  given order; a task starts when its device is free and every input has arrived (the
  producer's finish, plus the transfer time when it sits on another device). Transfers
  do not occupy devices. Devices that share a host (CPU threads) slow each other down:
  while tasks run on two or more devices at once, each progresses at
  1 / `TaskGraph.corun_slowdown` of its own rate.
- Max-load (pipelined throughput): each device's task time, plus, for each task with a
  successor on another device, its send cost once on its own device and once on every
  other device holding a successor (`TaskGraph.send_s`: where the backward is implied,
  a forward task's cost includes the summed gradient coming back).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from placement.tasks import TaskGraph


class OrderError(ValueError):
    """A per-device task order that contradicts the graph (it would deadlock)."""


@dataclass(frozen=True, eq=False)
class Schedule:
    start_s: np.ndarray
    finish_s: np.ndarray
    device: np.ndarray
    order: tuple[tuple[int, ...], ...]
    """Per device: task indices in execution order."""

    @property
    def step_time_s(self) -> float:
        return float(self.finish_s.max(initial=0.0))


def device_loads(tg: TaskGraph, group_device: np.ndarray, num_devices: int) -> np.ndarray:
    """Per-device load of the max-load model (compute plus send/receive costs)."""
    dev = tg.task_devices(group_device)
    loads = np.bincount(dev, weights=tg.duration_s, minlength=num_devices).astype(float)
    src, dst = tg.edge_src, tg.edge_dst
    crossing = dev[src] != dev[dst]
    if not crossing.any():
        return loads
    senders = np.unique(src[crossing])
    np.add.at(loads, dev[senders], tg.send_s[senders])
    # Each (sender, receiving device) pair pays once, however many successors it holds.
    pairs = np.unique(np.stack([src[crossing], dev[dst[crossing]]]), axis=1)
    np.add.at(loads, pairs[1], tg.send_s[pairs[0]])
    return loads


def max_load(tg: TaskGraph, group_device: np.ndarray, num_devices: int) -> float:
    return float(device_loads(tg, group_device, num_devices).max())


def busy_time(tg: TaskGraph, group_device: np.ndarray, num_devices: int) -> np.ndarray:
    return np.bincount(tg.task_devices(group_device), weights=tg.duration_s,
                       minlength=num_devices).astype(float)


def critical_path_s(tg: TaskGraph) -> float:
    """Longest chain of task times, transfers free (any placement may colocate them)."""
    finish = np.zeros(tg.num_tasks)
    for t in tg.topological_order:
        ready = max((finish[p] for p, _ in tg.predecessors[t]), default=0.0)
        finish[t] = ready + tg.duration_s[t]
    return float(finish.max(initial=0.0))


def max_load_lower_bound(tg: TaskGraph, num_devices: int) -> float:
    """Total work spread evenly, or the heaviest colocation group, whichever is more."""
    total = float(tg.duration_s.sum())
    return max(total / num_devices, float(tg.group_work_s.max(initial=0.0)))


def step_time_lower_bound(tg: TaskGraph, num_devices: int) -> float:
    return max(critical_path_s(tg), max_load_lower_bound(tg, num_devices))


def evaluate_order(tg: TaskGraph, group_device: np.ndarray,
                   order: Sequence[Sequence[int]]) -> Schedule:
    """Start every task as early as its device's order and its inputs allow."""
    dev = tg.task_devices(group_device)
    n = tg.num_tasks
    on_device = dev.tolist()
    seen = [False] * n
    next_on_device = [-1] * n
    has_prev = [False] * n
    for d, tasks in enumerate(order):
        for i, t in enumerate(tasks):
            if on_device[t] != d or seen[t]:
                raise OrderError(f"task {tg.tasks[t]} is listed on device {d} but placed on "
                                 f"{dev[t]} (or listed twice)")
            seen[t] = True
            if i + 1 < len(tasks):
                next_on_device[t] = tasks[i + 1]
                has_prev[tasks[i + 1]] = True
    if not all(seen):
        missing = tg.tasks[seen.index(False)]
        raise OrderError(f"the order leaves out task {missing}")

    if tg.corun_slowdown != 1.0:
        start, finish = _shared_host_times(tg, dev, order)
    else:
        start, finish = _times(tg, dev, next_on_device, has_prev)
    return Schedule(start_s=start, finish_s=finish, device=dev,
                    order=tuple(tuple(int(t) for t in ts) for ts in order))


#: Fewest tasks per height (`TaskGraph.height_layers`, on average) at which
#: `upward_rank` takes a numpy pass per height rather than a Python step per task.
LAYER_WIDTH = 4

_DEADLOCK = ("the per-device order deadlocks: a task waits for one that is ordered after "
             "it on another device")


def _times(tg: TaskGraph, dev: np.ndarray, next_on_device: list[int],
           has_prev: list[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Start and finish of every task when tasks take their own time wherever they run
    (one pass in topological order)."""
    n = tg.num_tasks
    on_device = dev.tolist()
    duration = tg.duration_list
    successors = tg.successors
    indegree = [a + b for a, b in zip(tg.in_degree.tolist(), has_prev)]
    ready_at = [0.0] * n
    finish = [0.0] * n
    stack = [t for t in range(n) if indegree[t] == 0]
    done = 0
    while stack:
        t = stack.pop()
        done += 1
        end = finish[t] = ready_at[t] + duration[t]
        here = on_device[t]
        for s, c in successors[t]:
            arrive = end + c if on_device[s] != here else end
            if arrive > ready_at[s]:
                ready_at[s] = arrive
            indegree[s] -= 1
            if indegree[s] == 0:
                stack.append(s)
        nxt = next_on_device[t]
        if nxt >= 0:
            if end > ready_at[nxt]:
                ready_at[nxt] = end
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                stack.append(nxt)
    if done < n:
        raise OrderError(_DEADLOCK)
    return np.array(ready_at), np.array(finish)


def _shared_host_times(tg: TaskGraph, dev: np.ndarray,
                       order: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Start and finish of every task when devices running at the same time slow each
    other down (processor sharing): an event loop over task starts and finishes, as a
    task's finish now depends on what the other devices do while it runs."""
    n = tg.num_tasks
    rate_shared = 1.0 / tg.corun_slowdown
    waiting = tg.in_degree.copy()  # unfinished graph predecessors
    ready_at = np.zeros(n)
    start = np.zeros(n)
    finish = np.zeros(n)
    position = [0] * len(order)
    running: dict[int, list] = {}  # device -> [task, work left]
    now, done = 0.0, 0
    while done < n:
        heads = {d: ts[position[d]] for d, ts in enumerate(order)
                 if d not in running and position[d] < len(ts)
                 and waiting[ts[position[d]]] == 0}
        for d, t in heads.items():
            if ready_at[t] <= now:
                start[t] = now
                running[d] = [t, float(tg.duration_s[t])]
        if not running:
            if not heads:
                raise OrderError(_DEADLOCK)
            now = min(ready_at[t] for t in heads.values())
            continue
        rate = rate_shared if len(running) > 1 else 1.0
        step = min(left for _, left in running.values()) / rate
        arrivals = [ready_at[t] - now for d, t in heads.items() if d not in running]
        step = min([step, *arrivals])
        now += step
        for d, entry in list(running.items()):
            entry[1] -= step * rate
            if entry[1] > 1e-12 * max(1.0, tg.duration_s[entry[0]]):
                continue
            t = entry[0]
            del running[d]
            finish[t] = now
            position[d] += 1
            done += 1
            for succ, cost in tg.successors[t]:
                waiting[succ] -= 1
                ready_at[succ] = max(ready_at[succ],
                                     now + (cost if dev[succ] != d else 0.0))
    return start, finish


def critical_chain(tg: TaskGraph, schedule: Schedule) -> list[int]:
    """The tasks of a chain of binding constraints that ends at the last finish, last
    first: each task started when this predecessor's output arrived or when the task
    before it on its device finished. Only moving a task of this chain (or shortening
    what it waits for) can lower the step time, which is what local search exploits."""
    if tg.num_tasks == 0:
        return []
    previous = np.full(tg.num_tasks, -1, dtype=np.int64)
    for tasks in schedule.order:
        previous[list(tasks[1:])] = tasks[:-1]
    slack = 1e-9 * max(schedule.step_time_s, 1e-300)
    dev, start, finish = schedule.device, schedule.start_s, schedule.finish_s
    chain = [int(np.argmax(finish))]
    while True:
        t = chain[-1]
        binding = [p for p, c in tg.predecessors[t]
                   if finish[p] + (c if dev[p] != dev[t] else 0.0) >= start[t] - slack]
        if not binding and previous[t] >= 0 and finish[previous[t]] >= start[t] - slack:
            binding = [int(previous[t])]
        if not binding:
            return chain
        chain.append(int(binding[0]))


def upward_rank(tg: TaskGraph, comm_weight: np.ndarray | float) -> np.ndarray:
    """HEFT's upward rank: a task's time plus the longest (time + transfer) path after
    it; `comm_weight` scales each edge's transfer (0 where its ends share a device)."""
    weights = np.broadcast_to(tg.edge_transfer_s * comm_weight, tg.edge_src.shape)
    if tg.num_tasks >= LAYER_WIDTH * len(tg.height_layers):
        # One numpy pass per height instead of one Python step per task: on
        # Inception-V3 with four micro-batches (1,048 tasks, 4 per height and more) a
        # third of the dispatch's time went to the loop below.
        rank = tg.duration_s.astype(float)
        dst = tg.edge_dst
        for edges, sources, starts in tg.height_layers[1:]:
            rank[sources] += np.maximum.reduceat(weights[edges] + rank[dst[edges]], starts)
        return rank
    succ_weight: list[list[tuple[int, float]]] = [[] for _ in range(tg.num_tasks)]
    for s, d, w in zip(tg.edge_src.tolist(), tg.edge_dst.tolist(), weights.tolist()):
        succ_weight[s].append((d, w))
    rank = [0.0] * tg.num_tasks
    duration = tg.duration_list
    for t in reversed(tg.topological_order):
        rank[t] = duration[t] + max((w + rank[d] for d, w in succ_weight[t]), default=0.0)
    return np.array(rank)


def priority_order(tg: TaskGraph, rank: np.ndarray) -> list[int]:
    """Tasks by decreasing rank; ties keep topological order, so the result is one."""
    return np.lexsort((tg.topological_position, -rank)).tolist()


def ready_time(t: int, here: int, inputs, on_device: list[int], finish: list[float]) -> float:
    """When task t, on device `here`, has all of its `inputs` ((task, transfer) pairs)
    given each input's `finish`: the simulator's innermost loop, written out because a
    generator inside max() costs it a third of its time."""
    ready = 0.0
    for p, c in inputs[t]:
        arrive = finish[p] + c if on_device[p] != here else finish[p]
        if arrive > ready:
            ready = arrive
    return ready


class DeviceTimeline:
    """Busy intervals of one device, for insertion-based list scheduling."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def earliest_start(self, ready_s: float, duration_s: float) -> float:
        i = bisect.bisect_right(self.ends, ready_s)
        t = ready_s
        while i < len(self.starts):
            if t + duration_s <= self.starts[i]:
                return t
            t = max(t, self.ends[i])
            i += 1
        return t

    def insert(self, start_s: float, end_s: float) -> None:
        i = bisect.bisect_right(self.starts, start_s)
        # Zero-length tasks may share an instant with a neighbour; order by start keeps
        # both lists sorted because busy intervals never overlap.
        self.starts.insert(i, start_s)
        self.ends.insert(i, end_s)


def placed_rank(tg: TaskGraph, dev: np.ndarray) -> np.ndarray:
    """Per task: its upward rank with the transfers of placement `dev` (task -> device),
    so at least the time from its start to the end of any schedule of `dev`."""
    return upward_rank(tg, (dev[tg.edge_src] != dev[tg.edge_dst]).astype(float))


def staggered_rank(tg: TaskGraph, rank: np.ndarray, stagger_s: float) -> np.ndarray:
    """`rank` with micro-batch m's lowered by m x `stagger_s`."""
    return rank - stagger_s * tg.micro_batch if stagger_s else rank


def list_schedule(tg: TaskGraph, group_device: np.ndarray, num_devices: int,
                  stagger_s: float = 0.0) -> Schedule:
    """An order for a fixed placement: tasks by upward rank, each inserted at its
    device's earliest fitting gap; then evaluated as-soon-as-possible in that order.

    `stagger_s` lowers the rank of micro-batch m's tasks by m x stagger_s: the copies
    of one op then no longer tie, and earlier micro-batches go first by about that
    much, as in a pipeline's schedule, so a device works on the next micro-batch's
    early ops while the previous one's later ops run elsewhere."""
    dev = tg.task_devices(group_device)
    on_device = dev.tolist()
    duration = tg.duration_list
    predecessors = tg.predecessors
    start = [0.0] * tg.num_tasks
    ready_finish = [0.0] * tg.num_tasks
    timelines = [DeviceTimeline() for _ in range(num_devices)]
    for t in priority_order(tg, staggered_rank(tg, placed_rank(tg, dev), stagger_s)):
        here = on_device[t]
        ready = ready_time(t, here, predecessors, on_device, ready_finish)
        s = start[t] = timelines[here].earliest_start(ready, duration[t])
        end = ready_finish[t] = s + duration[t]
        timelines[here].insert(s, end)
    order = order_by_start(tg, dev, np.array(start), np.array(ready_finish), num_devices)
    return evaluate_order(tg, group_device, order)


def dispatch_schedule(tg: TaskGraph, group_device: np.ndarray, num_devices: int,
                      stagger_s: float = 0.0, cutoff_s: float = math.inf) -> Schedule | None:
    """An order for a fixed placement by dispatch in time: whenever a device falls idle
    it starts, of its tasks whose inputs have arrived, the one of highest upward rank
    (micro-batch m's lowered by m x `stagger_s`, as in `list_schedule`); with none
    arrived, it waits for the first to arrive. Where `list_schedule` places tasks in
    rank order, each into the earliest gap its inputs allow, so that a task of low rank
    (a pipeline's first stage's backward) waits until every task ranked above it is
    placed, here a device never idles while one of its tasks is ready, and a ready
    task of low rank runs as soon as nothing ranked above it is ready on its device.
    On the Inception-V3 paper preset on four V100s with four micro-batches this takes
    the local search's plans from 103-108 ms to 97-99 ms (a minute each).

    None, with a finite `cutoff_s`, once the step is sure to end after it (see
    `dispatch_by`, the tasks' ranks as tails)."""
    rank = placed_rank(tg, tg.task_devices(group_device))
    return dispatch_by(tg, group_device, num_devices,
                       (-staggered_rank(tg, rank, stagger_s)).tolist(),
                       tail=rank.tolist() if cutoff_s < math.inf else None, cutoff_s=cutoff_s)


def dispatch_by(tg: TaskGraph, group_device: np.ndarray, num_devices: int,
                priority: list[float], *, tail: list[float] | None = None,
                cutoff_s: float = math.inf) -> Schedule | None:
    """`dispatch_schedule` with a device's ready task of least `priority` going first.

    With `tail` (per task, at least the time from its start to the step's end, in any
    schedule of this placement) it returns None once the step is sure to end after
    `cutoff_s`: a task started at s ends the step no sooner than s + its tail, and a
    device no sooner than its clock plus the work it has left. A local search asks
    this of moves that must beat `cutoff_s` to be taken: on Inception-V3 4x4, of the
    single moves from a descended placement 98% stop early, and ranking and dispatching
    one takes 0.8 ms where it took 1.3 to the end. A co-run slowdown only lengthens
    tasks, so its steps end later still."""
    dev = tg.task_devices(group_device)
    on_device = dev.tolist()
    duration = tg.duration_list
    successors = tg.successors
    waiting = tg.in_degree.tolist()
    arrival = [0.0] * tg.num_tasks
    start = [0.0] * tg.num_tasks
    finish = [0.0] * tg.num_tasks
    # Per device: tasks whose inputs are all sent, by arrival, and those arrived by
    # the device's clock, by priority (ties by index, a topological tie-break would
    # cost a key; any order of ready tasks is feasible).
    sent: list[list[tuple[float, float, int]]] = [[] for _ in range(num_devices)]
    arrived: list[list[tuple[float, int]]] = [[] for _ in range(num_devices)]
    free = [0.0] * num_devices
    # The bounds add up durations in other orders than the schedule does: a relative
    # slack keeps their rounding from cutting a step that ends at `cutoff_s`.
    limit = cutoff_s * (1 + 1e-9)
    left = (None if tail is None else
            np.bincount(dev, weights=tg.duration_s, minlength=num_devices).tolist())
    order: list[list[int]] = [[] for _ in range(num_devices)]
    push, pop = heapq.heappush, heapq.heappop
    for t in np.flatnonzero(tg.in_degree == 0).tolist():
        push(sent[on_device[t]], (0.0, priority[t], t))
    devices = range(num_devices)
    for _ in range(tg.num_tasks):
        # The device that can start a task soonest goes next, so that every task
        # becomes ready (its last input scheduled) before any device passes its arrival.
        soonest, d = math.inf, -1
        for e in devices:
            if arrived[e]:
                at = free[e]
            elif sent[e]:
                at = sent[e][0][0]
                if at < free[e]:
                    at = free[e]
            else:
                continue
            if at < soonest:
                soonest, d = at, e
        here_sent, here_arrived = sent[d], arrived[d]
        while here_sent and here_sent[0][0] <= soonest:
            _, key, t = pop(here_sent)
            push(here_arrived, (key, t))
        _, t = pop(here_arrived)
        begin = arrival[t]
        if begin < soonest:
            begin = soonest
        start[t] = begin
        end = finish[t] = free[d] = begin + duration[t]
        if tail is not None:
            left[d] -= duration[t]
            if end + left[d] > limit or begin + tail[t] > limit:
                return None
        order[d].append(t)
        for s, c in successors[t]:
            e = on_device[s]
            at = end + c if e != d else end
            if at > arrival[s]:
                arrival[s] = at
            waiting[s] -= 1
            if waiting[s] == 0:
                # A device's clock never goes back, so a task whose inputs have all
                # arrived by it (most: a colocated input arrives as its device frees)
                # skips the queue by arrival, a push and a pop fewer.
                if arrival[s] <= free[e]:
                    push(arrived[e], (priority[s], s))
                else:
                    push(sent[e], (arrival[s], priority[s], s))
    if tg.corun_slowdown != 1.0:
        return evaluate_order(tg, group_device, order)
    return Schedule(start_s=np.array(start), finish_s=np.array(finish), device=dev,
                    order=tuple(tuple(ts) for ts in order))


def order_by_start(tg: TaskGraph, dev: np.ndarray, start: np.ndarray,
                   finish: np.ndarray, num_devices: int) -> list[list[int]]:
    """Per device, its tasks by (start, finish, topological position): the key rises
    strictly along every edge of a feasible timed schedule, even through zero-length
    tasks, so the order never deadlocks."""
    order: list[list[int]] = [[] for _ in range(num_devices)]
    on_device = dev.tolist()
    for t in np.lexsort((tg.topological_position, finish, start)).tolist():
        order[on_device[t]].append(t)
    return order


def memory_bytes(tg: TaskGraph, group_device: np.ndarray, num_devices: int,
                 param_state_factor: float) -> np.ndarray:
    """Per device: trainable parameters x `param_state_factor` (weights, gradients,
    optimizer state), frozen ones once (weights only), plus the activations its ops
    keep for the backward pass."""
    graph = tg.graph
    per_op = np.array([op.trainable_bytes * param_state_factor + op.frozen_bytes
                       + op.activation_bytes for op in graph.ops])
    op_group = np.array([tg.group_of_op[op.id] for op in graph.ops], dtype=np.int64)
    return np.bincount(group_device[op_group], weights=per_op,
                       minlength=num_devices).astype(float)

