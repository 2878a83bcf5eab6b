"""A step-time lower bound that sees where work must sit in time, not only how much.

The analytic bound max(critical path, total work / k) is loose when a step's work
cannot all run in parallel: while the first ops of the graph run, the other devices
have nothing to do, and likewise at the end. The window bound charges that. Every task
t starts no earlier than head_t (the longest chain of task times before it) and is
followed by at least after_t (the longest chain after it), whatever the placement, as
a transfer only adds delay. So the tasks S(a, b) with head >= a and after >= b all run
inside [a, C - b] on k devices, and C >= a + work(S) / k + b for every a and b
(the energetic reasoning of scheduling, e.g. Lopez and Esquirol 1996). Taking b = 0 and
a = 0 gives total / k back; a chain gives the critical path back. The tasks of one
placement group (an op's forward and backward over all micro-batches) share a device,
so the same holds for them with k = 1.

The heads and tails themselves see transfers (`join_heads_tails`): the inputs of a task
v either run on v's device, one at a time before v, or arrive from another device after
their transfer. Whichever inputs share v's device in a plan, v starts no earlier than
the smaller of the two, so the least over all such choices is a head that every
placement respects, and it exceeds the transfer-free one wherever two inputs of v are
about as long as the transfer (a join on the critical path must serialize or pay).
Outputs give tails the same way.
"""

from __future__ import annotations

import numpy as np

from placement.energy_bound import energy_bound, group_energy
from placement.simulate import step_time_lower_bound
from placement.tasks import TaskGraph

#: Most cells (interval starts x interval ends x tasks) `energetic_bound` holds at once.
ENERGETIC_CELLS = 1 << 20
#: Most head thresholds a tried (evenly spaced over the sorted heads); any subset of
#: thresholds still gives a valid bound.
MAX_THRESHOLDS = 256


def heads_tails(tg: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    """head_t: longest chain of task times before t; tail_t: from t to the end, t's
    own time included (transfers free, since a placement may avoid them)."""
    head = np.zeros(tg.num_tasks)
    tail = np.zeros(tg.num_tasks)
    order = tg.topological_order
    for t in order:
        head[t] = max((head[p] + tg.duration_s[p] for p, _ in tg.predecessors[t]), default=0.0)
    for t in reversed(order):
        tail[t] = tg.duration_s[t] + max((tail[s] for s, _ in tg.successors[t]), default=0.0)
    return head, tail


def join_heads_tails(tg: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    """As `heads_tails`, but each head (tail) is the least start (time after the
    finish) over which inputs (outputs) share the task's device; see the module
    docstring. Tasks of the task's own group always share it; tasks of one other group
    share a device with each other."""
    head = np.zeros(tg.num_tasks)
    after = np.zeros(tg.num_tasks)
    order = tg.topological_order
    for v in order:
        head[v] = _join(v, tg.predecessors[v], head, tg)
    for u in reversed(order):
        after[u] = _join(u, tg.successors[u], after, tg)
    return head, after + tg.duration_s


def _join(v: int, neighbours, release: np.ndarray, tg: TaskGraph) -> float:
    """The least bound on v's start over which of its `neighbours` (inputs, with
    `release` their heads; or outputs, with `release` the time after them) run on v's
    device. Sorting the other groups by how late they would make v wait from another
    device, the best choice keeps a prefix of them on v's device (keeping more only
    lengthens v's device's queue), so len(groups) + 1 choices cover every placement."""
    if not neighbours:
        return 0.0
    cost: dict[int, float] = {}
    for t, c in neighbours:
        cost[t] = max(cost.get(t, 0.0), c)
    mine = tg.group[v]
    local = [t for t in cost if tg.group[t] == mine]
    by_group: dict[int, list[int]] = {}
    for t in cost:
        if tg.group[t] != mine:
            by_group.setdefault(int(tg.group[t]), []).append(t)
    dur = tg.duration_s
    remote = []
    for ts in by_group.values():
        arrive = max(release[t] + dur[t] + cost[t] for t in ts)
        if len(ts) > 1:
            arrive = max(arrive, _one_device(ts, release, dur) + min(cost[t] for t in ts))
        remote.append((arrive, ts))
    remote.sort(key=lambda x: -x[0])
    best = np.inf
    kept = list(local)
    for arrive, ts in remote:
        best = min(best, max(_one_device(kept, release, dur), arrive))
        kept += ts
    return float(min(best, _one_device(kept, release, dur)))


def _one_device(tasks: list[int], release: np.ndarray, dur: np.ndarray) -> float:
    """Earliest time one device can finish `tasks`, each no earlier than its release:
    max over a of a + the work released at a or later (0 for no tasks)."""
    if not tasks:
        return 0.0
    r = release[tasks]
    by_release = np.argsort(-r, kind="stable")
    return float((r[by_release] + np.cumsum(dur[tasks][by_release])).max())


def window_bound(tg: TaskGraph, num_devices: int,
                 joined: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """max over a, b of a + work(S(a, b)) / k + b (see the module docstring), and the
    same for the tasks of each placement group alone on its one device; with the heads
    and tails of `join_heads_tails` (or those given), whose longest head + task + tail
    is a bound too."""
    if tg.num_tasks == 0:
        return 0.0
    head, tail = joined or join_heads_tails(tg)
    after = tail - tg.duration_s
    best = max(float((head + tail).max()), _window(head, after, tg.duration_s, num_devices))
    by_group = np.argsort(tg.group, kind="stable")
    starts = np.searchsorted(tg.group[by_group], np.arange(tg.num_groups + 1))
    for g in range(tg.num_groups):
        ts = by_group[starts[g]:starts[g + 1]]
        best = max(best, _window(head[ts], after[ts], tg.duration_s[ts], 1))
    return best


def _window(head: np.ndarray, after: np.ndarray, duration: np.ndarray,
            num_devices: int) -> float:
    heads = np.unique(head)
    if len(heads) > MAX_THRESHOLDS:
        heads = heads[np.linspace(0, len(heads) - 1, MAX_THRESHOLDS).astype(np.int64)]
    best = 0.0
    for a in heads.tolist():
        inside = head >= a
        by_after = np.argsort(-after[inside], kind="stable")
        b = after[inside][by_after]
        work = np.cumsum(duration[inside][by_after])
        # S(a, b) for b = each task's after-time: the tasks up to it in that order.
        best = max(best, float((a + work / num_devices + b).max()))
    return best


def step_time_bound(tg: TaskGraph, num_devices: int) -> float:
    """The largest of the analytic bound, the window bound and the group energy bound
    (`placement.energy_bound`), the last two over the join heads and tails."""
    if tg.num_tasks == 0:
        return 0.0
    head, tail = join_heads_tails(tg)
    return max(step_time_lower_bound(tg, num_devices),
               window_bound(tg, num_devices, (head, tail)),
               energy_bound(group_energy(tg, head, tail), num_devices))


def energetic_bound(tg: TaskGraph, num_devices: int, lower: float) -> float:
    """The energetic reasoning check of Lopez and Esquirol (1996) in full, from a known
    bound `lower`: for a step of C, task t starts in [head_t, C - tail_t] and so runs
    at least min(p, t2 - t1, head + p - t1, t2 - (C - tail)) of its p inside any
    interval [t1, t2], and if the tasks' least work inside some interval exceeds
    k (t2 - t1), no plan takes C. The window bound counts only the tasks that lie
    wholly inside; this counts the parts that stick out too (on the layered DAGs'
    blocks of 24-67 tasks 0.6-2.3 higher). Returns the largest C the check refutes,
    found by bisection (refuting a C refutes every smaller one), or `lower`; the time
    grows with the cube of the tasks."""
    head, tail = join_heads_tails(tg)
    after = tail - tg.duration_s
    p = tg.duration_s

    def refuted(step: float) -> bool:
        finish_by = step - after
        if (head + p > finish_by * (1 + 1e-12)).any():
            return True
        t1 = np.unique(np.concatenate([head, head + p, finish_by - p]))
        t2 = np.unique(np.concatenate([finish_by, head + p, finish_by - p]))
        # Interval starts a chunk at a time: the arrays hold chunk x |t2| x tasks.
        chunk = max(1, ENERGETIC_CELLS // (len(t2) * len(p)))
        for i in range(0, len(t1), chunk):
            length = t2[None, :] - t1[i:i + chunk, None]
            inside = np.minimum(
                np.minimum(length[:, :, None], p),
                np.minimum((head + p)[None, None, :] - t1[i:i + chunk, None, None],
                           t2[None, :, None] - (finish_by - p)[None, None, :]))
            work = np.maximum(inside, 0.0).sum(axis=2)
            if ((length > 0) & (work > num_devices * length * (1 + 1e-9) + 1e-12)).any():
                return True
        return False

    tolerance = 1e-4 * max(lower, 1e-300)
    if tg.num_tasks == 0 or not refuted(lower + tolerance):
        return lower
    low, high = lower + tolerance, 2 * lower + tolerance
    while refuted(high):
        low, high = high, 2 * high
    while high - low > tolerance:
        mid = (low + high) / 2
        low, high = (mid, high) if refuted(mid) else (low, mid)
    return low
