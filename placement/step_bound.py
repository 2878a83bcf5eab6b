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
"""

from __future__ import annotations

import numpy as np

from placement.simulate import step_time_lower_bound
from placement.tasks import TaskGraph

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


def window_bound(tg: TaskGraph, num_devices: int) -> float:
    """max over a, b of a + work(S(a, b)) / k + b (see the module docstring), and the
    same for the tasks of each placement group alone on its one device."""
    if tg.num_tasks == 0:
        return 0.0
    head, tail = heads_tails(tg)
    after = tail - tg.duration_s
    best = _window(head, after, tg.duration_s, num_devices)
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
    """The larger of the analytic bound and the window bound."""
    return max(step_time_lower_bound(tg, num_devices), window_bound(tg, num_devices))
