"""Baseline placers: one device; HEFT list scheduling; the optimal contiguous split.

Each returns a per-group device array; `placement.planner` turns it into a full plan.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from placement.simulate import DeviceTimeline, max_load, priority_order, upward_rank
from placement.tasks import TaskGraph


def single_device(tg: TaskGraph) -> np.ndarray:
    return np.zeros(tg.num_groups, dtype=np.int64)


#: Most assignments the memory-first search tries before it gives up.
MEMORY_SEARCH_NODES = 200_000


def memory_first(tg: TaskGraph, num_devices: int, group_memory: np.ndarray,
                 memory_cap: float) -> np.ndarray:
    """A placement chosen for memory alone, for caps so tight that the time-driven
    placers run out of room: groups by decreasing memory, each on the device with the
    least used (worst-fit decreasing); where that breaks the cap, a depth-first search
    over the same order (devices of equal use tried once) for one that fits, within
    MEMORY_SEARCH_NODES steps. Returns the worst-fit placement if none is found."""
    order = np.argsort(-group_memory, kind="stable").tolist()
    group_device = np.zeros(tg.num_groups, dtype=np.int64)
    used = np.zeros(num_devices)
    for g in order:
        d = int(np.argmin(used))
        group_device[g] = d
        used[d] += group_memory[g]
    if used.max() <= memory_cap:
        return group_device
    found = group_device.copy()
    used[:] = 0.0
    budget = [MEMORY_SEARCH_NODES]

    def place(i: int) -> bool:
        if i == len(order):
            return True
        g = order[i]
        tried = set()
        for d in np.argsort(used, kind="stable").tolist():
            if used[d] + group_memory[g] > memory_cap or used[d] in tried:
                continue
            budget[0] -= 1
            if budget[0] < 0:
                return False
            tried.add(used[d])
            used[d] += group_memory[g]
            found[g] = d
            if place(i + 1):
                return True
            used[d] -= group_memory[g]
        return False

    return found if place(0) else group_device


def heft(tg: TaskGraph, num_devices: int, group_memory: np.ndarray,
         memory_cap: float, stagger_s: float = 0.0) -> np.ndarray:
    """HEFT (Topcuoglu et al. 2002): tasks by upward rank with average transfer costs;
    each group goes to the device where its first scheduled task finishes earliest
    (insertion into idle gaps), among devices with memory left for it (the one with the
    most memory left when none has: greedy can run out where a placement fits, and
    the caller drops a placement that breaks the cap). `stagger_s` lowers micro-batch
    m's ranks by m x stagger_s, as `placement.simulate.list_schedule` does: the
    timelines each group is placed against are then a pipeline's, where each
    micro-batch runs ahead of the next, instead of every copy of an op side by side."""
    average_comm = (num_devices - 1) / num_devices
    group_device = np.full(tg.num_groups, -1, dtype=np.int64)
    used = np.zeros(num_devices)
    timelines = [DeviceTimeline() for _ in range(num_devices)]
    finish = np.zeros(tg.num_tasks)
    dev_of_task = np.full(tg.num_tasks, -1, dtype=np.int64)
    for t in priority_order(tg, upward_rank(tg, average_comm) - stagger_s * tg.micro_batch):
        g = tg.group[t]
        if group_device[g] >= 0:
            candidates = [int(group_device[g])]
        else:
            candidates = ([d for d in range(num_devices)
                           if used[d] + group_memory[g] <= memory_cap]
                          or [int(np.argmin(used))])
        best = None
        for d in candidates:
            ready = max((finish[p] + (c if dev_of_task[p] != d else 0.0)
                         for p, c in tg.predecessors[t]), default=0.0)
            start = timelines[d].earliest_start(ready, tg.duration_s[t])
            if best is None or start + tg.duration_s[t] < best[0] - 1e-15:
                best = (start + tg.duration_s[t], start, d)
        end, start, d = best
        if group_device[g] < 0:
            group_device[g] = d
            used[d] += group_memory[g]
        timelines[d].insert(start, end)
        finish[t] = end
        dev_of_task[t] = d
    return group_device


def group_sequence(tg: TaskGraph, order: Sequence[int] | None = None) -> list[int]:
    """Groups in the topological order of their first forward task (`order`, a
    topological order of the tasks; `tg.topological_order` by default)."""
    first = np.full(tg.num_groups, np.iinfo(np.int64).max)
    any_first = np.full(tg.num_groups, np.iinfo(np.int64).max)
    for pos, t in enumerate(tg.topological_order if order is None else order):
        g = tg.group[t]
        any_first[g] = min(any_first[g], pos)
        if not tg.tasks[t].backward and not tg.graph.op(tg.tasks[t].op_id).is_backward:
            first[g] = min(first[g], pos)
    key = np.where(first < np.iinfo(np.int64).max, first, any_first)
    return sorted(range(tg.num_groups), key=lambda g: key[g])


def contiguous_split(tg: TaskGraph, num_devices: int, group_memory: np.ndarray,
                     memory_cap: float, seq: list[int] | None = None) -> np.ndarray:
    """The max-load-optimal split of the group sequence (or `seq`, any order of all
    groups) into at most `num_devices` consecutive intervals, by dynamic programming
    over interval costs (PipeDream's idea). An interval's max-load is its own: its
    work, the send cost of each of its tasks with a successor outside, and the send
    cost of each outside task feeding it. When no split fits `memory_cap`, the best
    split regardless of memory (the caller drops a placement that breaks the cap)."""
    seq = group_sequence(tg) if seq is None else seq
    n = len(seq)
    cost = _interval_costs(tg, seq, group_memory, memory_cap,
                           work_limit=_balanced_upper_bound(tg, seq, num_devices,
                                                            group_memory, memory_cap))
    # best[c, j]: least max-load of the first j groups on at most c devices.
    best = np.full((num_devices + 1, n + 1), np.inf)
    cut = np.zeros((num_devices + 1, n + 1), dtype=np.int64)
    best[:, 0] = 0.0
    for c in range(1, num_devices + 1):
        for j in range(1, n + 1):
            candidates = np.maximum(best[c - 1, :j], cost[:j, j])
            i = int(np.argmin(candidates))
            best[c, j], cut[c, j] = candidates[i], i
    if not np.isfinite(best[num_devices, n]):
        return contiguous_split(tg, num_devices, group_memory, np.inf, seq)
    group_device = np.empty(tg.num_groups, dtype=np.int64)
    j, c = n, num_devices
    while j > 0:
        i = int(cut[c, j])
        for g in seq[i:j]:
            group_device[g] = c - 1
        j, c = i, c - 1
    # Intervals were filled from the last device backwards; renumber so the first
    # interval sits on device 0.
    return group_device - group_device.min()


def rotated_splits(tg: TaskGraph, num_devices: int, group_memory: np.ndarray,
                   memory_cap: float, seq: list[int], rotations: int,
                   deadline: float) -> tuple[np.ndarray, float] | None:
    """The best contiguous split of `rotations` evenly spaced rotations of `seq` (one
    device may then hold a prefix and a suffix of it), as (placement, max-load), until
    `deadline` (a time.perf_counter() value); None when none fits. A model whose last
    op shares a weight with its first (BERT's decoder and word embedding) pays that
    weight's transfers on every interval split; a wrap-around split keeps them together."""
    best = None
    step = max(1, len(seq) // max(1, rotations))
    for r in range(0, len(seq), step):
        if time.perf_counter() > deadline:
            break
        split = contiguous_split(tg, num_devices, group_memory, memory_cap,
                                 seq[r:] + seq[:r])
        if np.bincount(split, weights=group_memory,
                       minlength=num_devices).max() > memory_cap:
            continue
        value = max_load(tg, split, num_devices)
        if best is None or value < best[1]:
            best = (split, value)
    return best


def _balanced_upper_bound(tg: TaskGraph, seq: list[int], num_devices: int,
                          group_memory: np.ndarray, memory_cap: float) -> float:
    """The max-load of cutting the sequence at every total/k of work. An interval of an
    optimal split has no more work than that (when that split fits in memory, so the
    optimum is at most its max-load), so longer intervals can be skipped."""
    work = tg.group_work_s[seq]
    target = work.sum() / num_devices
    device = np.minimum((np.cumsum(work) - work) // max(target, 1e-300),
                        num_devices - 1).astype(np.int64)
    group_device = np.empty(tg.num_groups, dtype=np.int64)
    group_device[seq] = device
    if np.bincount(group_device, weights=group_memory, minlength=num_devices).max() > memory_cap:
        return np.inf
    return max_load(tg, group_device, num_devices)


def _interval_costs(tg: TaskGraph, seq: list[int], group_memory: np.ndarray,
                    memory_cap: float, work_limit: float) -> np.ndarray:
    """cost[i, j] = max-load of groups seq[i:j] on one device (inf when it exceeds the
    memory cap or when its work alone exceeds `work_limit`).

    Each task adds its send cost to a union of rectangles of (i, j) cells, summed
    with a 2-D difference array: a task at position q with successors at positions S
    pays on its own device when i <= q < j and [i, j) misses part of S, and on a
    receiving device when q lies outside [i, j) and [i, j) holds some s in S (for the
    sorted S, the interval's first successor is s_t exactly when s_(t-1) < i <= s_t).
    """
    n = len(seq)
    pos = np.empty(tg.num_groups, dtype=np.int64)
    pos[seq] = np.arange(n)
    task_pos = pos[tg.group]
    # (i from, i to, j from, j to, cost), bounds inclusive.
    rects: list[tuple[int, int, int, int, float]] = []
    for u in np.flatnonzero(tg.send_s > 0).tolist():
        q = int(task_pos[u])
        succ = sorted({int(task_pos[v]) for v, _ in tg.successors[u]} - {q})
        if not succ:
            continue
        c = float(tg.send_s[u])
        rects.append((0, q, q + 1, n, c))
        rects.append((0, min(q, succ[0]), max(q, succ[-1]) + 1, n, -c))
        previous = -1
        for s_t in succ:
            if s_t + 1 <= q:
                rects.append((previous + 1, s_t, s_t + 1, q, c))
            if s_t > q:
                rects.append((max(previous, q) + 1, s_t, s_t + 1, n, c))
            previous = s_t
    diff = np.zeros((n + 2, n + 2))
    if rects:
        a, b, lo, hi, c = (np.array(x) for x in zip(*rects))
        np.add.at(diff, (a, lo), c)
        np.add.at(diff, (b + 1, lo), -c)
        np.add.at(diff, (a, hi + 1), -c)
        np.add.at(diff, (b + 1, hi + 1), c)
    transfers = diff.cumsum(axis=0).cumsum(axis=1)[:n + 1, :n + 1]
    work = np.concatenate([[0.0], np.cumsum(tg.group_work_s[seq])])
    memory = np.concatenate([[0.0], np.cumsum(group_memory[seq])])
    span_work = work[None, :] - work[:, None]
    span_memory = memory[None, :] - memory[:, None]
    later = np.arange(n + 1)[None, :] > np.arange(n + 1)[:, None]
    ok = later & (span_memory <= memory_cap) & (span_work <= work_limit * (1 + 1e-12))
    return np.where(ok, span_work + transfers, np.inf)
