"""A step-time bound that charges the fill and drain of a group's copies on its device.

The window bound (`placement.step_bound`) counts a task inside [a, C - b] only when
all of it must lie there, and lets each task run beside its own copies. But every
micro-batch copy of an op, and its colocated backward, sits in one placement group
on ONE device, so they run one at a time. With r_i the head of task i (the longest
chain before it) and q_i the time after it (the longest chain after its finish), the
most work of group g that any schedule does before time a is the busy time by a of
g's tasks on one machine released at r_i, preemption allowed, B_g(a) (every
work-conserving schedule reaches it, and no schedule does more), and the most it
does in the last b of the step is T_g(b), the same with releases q_i. So g does at
least

    M_g(a, b) = max(0, W_g - B_g(a) - T_g(b))

inside [a, C - b] (for a group of one task, that task's share of the window, where
the window bound counts whole tasks only), and the devices run at most k (C - a - b)
there:

    C >= a + b + sum_g M_g(a, b) / k,    C >= a + b + M_g(a, b) for each g

(energetic reasoning, Lopez and Esquirol 1996, with the group as one machine). When
a + b > C, [0, a] and [C - b, C] cover the step, so W_g <= B_g(a) + T_g(b) and every
M_g is 0: a pair with some M_g > 0 proves C >= a + b, so the inequalities hold
whenever any M_g is positive. On GNMT's paper preset on four V100s with four
micro-batches this is 171.0 ms where total work / 4 is 168.4; per device,
C >= a + b + sum_g M_g(a, b) x[g,d] is a valid inequality of any model that chooses
the placement x (`placement.milp.energy_relaxation`), which there proves 172.4.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placement.tasks import TaskGraph

#: Most thresholds a (and b) tried, evenly spaced over the sorted candidates; any
#: subset still gives a valid bound.
MAX_THRESHOLDS = 128


def busy_by(release: np.ndarray, duration: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The most work one machine does by each time in `at` on tasks released at
    `release`, preemption allowed: the busy time of the work-conserving schedule."""
    order = np.argsort(release, kind="stable")
    times, work = [0.0], [0.0]
    free, done = -np.inf, 0.0
    for i in order.tolist():
        start = max(free, float(release[i]))
        if start > times[-1]:
            times.append(start)
            work.append(done)
        done += float(duration[i])
        free = start + float(duration[i])
        times.append(free)
        work.append(done)
    return np.interp(at, times, work)


def _thresholds(values: np.ndarray) -> np.ndarray:
    out = np.unique(values)
    if len(out) > MAX_THRESHOLDS:
        out = out[np.linspace(0, len(out) - 1, MAX_THRESHOLDS).astype(np.int64)]
    return out


@dataclass(frozen=True)
class GroupEnergy:
    """What M_g(a, b) needs, for thresholds a in `starts` and b in `ends`."""

    tg: TaskGraph
    starts: np.ndarray
    ends: np.ndarray
    before: np.ndarray
    """(len(starts), groups): B_g(a)."""
    last: np.ndarray
    """(len(ends), groups): T_g(b)."""

    def mandatory(self, j: int) -> np.ndarray:
        """(len(starts), groups): M_g(a, b) for every a and b = ends[j]."""
        return np.maximum(0.0, self.tg.group_work_s[None, :] - self.before
                          - self.last[j][None, :])


def group_energy(tg: TaskGraph, head: np.ndarray, tail: np.ndarray) -> GroupEnergy:
    """M_g's ingredients for the heads and tails given (`tail` includes each task's
    own time, as `placement.step_bound.heads_tails` gives it)."""
    dur = tg.duration_s
    after = tail - dur
    starts, ends = _thresholds(np.concatenate([head, head + dur])), _thresholds(
        np.concatenate([after, after + dur]))
    before = np.zeros((len(starts), tg.num_groups))
    last = np.zeros((len(ends), tg.num_groups))
    by_group = np.argsort(tg.group, kind="stable")
    bounds = np.searchsorted(tg.group[by_group], np.arange(tg.num_groups + 1))
    for g in range(tg.num_groups):
        ts = by_group[bounds[g]:bounds[g + 1]]
        before[:, g] = busy_by(head[ts], dur[ts], starts)
        last[:, g] = busy_by(after[ts], dur[ts], ends)
    return GroupEnergy(tg, starts, ends, before, last)


def _proves(mandatory: np.ndarray, tg: TaskGraph) -> np.ndarray:
    """Whether a pair's work inside the window is positive beyond rounding (only then
    does it prove C >= a + b)."""
    return mandatory.max(axis=-1) > 1e-9 * max(float(tg.duration_s.sum()), 1e-300)


def energy_bound(energy: GroupEnergy, num_devices: int) -> float:
    """max over the pairs (a, b) that prove anything of a + b + max(sum_g M_g / k,
    max_g M_g)."""
    best = 0.0
    for j, b in enumerate(energy.ends.tolist()):
        m = energy.mandatory(j)
        value = energy.starts + b + np.maximum(m.sum(axis=1) / num_devices, m.max(axis=1))
        value = value[_proves(m, energy.tg)]
        if len(value):
            best = max(best, float(value.max()))
    return best


def energy_rows(energy: GroupEnergy, num_devices: int, max_rows: int
                ) -> list[tuple[float, np.ndarray]]:
    """The `max_rows` pairs with the largest placement-free value, as (a + b, M_g):
    C >= a + b + sum_g M_g x[g,d] holds on every device d of every placement."""
    rows: list[tuple[float, float, np.ndarray]] = []
    for j, b in enumerate(energy.ends.tolist()):
        m = energy.mandatory(j)
        value = np.where(_proves(m, energy.tg),
                         energy.starts + b + m.sum(axis=1) / num_devices, -np.inf)
        # The best of each b only: all pairs' rows would not fit in memory on big graphs.
        for i in np.argsort(-value, kind="stable")[:max_rows].tolist():
            if value[i] > -np.inf:
                rows.append((float(value[i]), float(energy.starts[i] + b), m[i]))
        rows.sort(key=lambda r: -r[0])
        del rows[max_rows:]
    return [(base, m) for _, base, m in rows]
