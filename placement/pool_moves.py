"""Local search that moves runs of units between devices: runs of pooled units
(`pooled_work`), and runs at the cuts of a plan along the joined sequence.

A decomposed batch norm's per-channel chain is tied to its neighbours by senders of
about its own work, so moving any one of its units alone costs more than it brings,
and single-group local search (`refine.local_search`) leaves the chains where the
split put them; moving a run of a chain at once pays one cut for several units. On
decomposed ResNet-50 this took the plan of a 60 s solve from 1.1531 to 1.1526 W/4.

The same holds for the runs next to a plan's cuts (`boundary_swaps`): moving a few
units across a cut, or two such runs in opposite directions, changes which tensors
cross as a whole, where single groups and swaps of two groups find nothing. On
core-aten bert12 the 60 s solve's plan (a rotated contiguous split after local
search, 0.021567) is a local optimum of those and of every single run of up to
MAX_RUN units along the sequence; swapping units 243-245 of the busiest device with
units 481-490 of its successor gives 0.021559 in 0.5 s, what the window search's
MILP reached with 78 free units after 19 s.

`max_load_search` is `refine.local_search` for the max-load on the same changes, with
every group its own unit: a swap of two groups that share no sender is the sum of their
two moves' changes, so a round of swaps is one array sum where `local_search` simulated
each (190,000 a round on decomposed bert12, where the minute's share ran out before the
first round ended).
Hand-written: moves of this model's own runs, which no solver or library offers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from placement.ideal_dp import merged_senders
from placement.pooled_work import anchored_pools
from placement.simulate import device_loads
from placement.tasks import TaskGraph

#: Units a moved run may hold: a pool may be most of a graph (Inception-V3's walk
#: keeps 4 of 326 units), and its runs grow with its square.
MAX_RUN = 16


@dataclass(frozen=True)
class _Units:
    """`units` (lists of groups) with their work, memory and senders, the senders
    with the same members merged (their charge depends only on the members' devices)."""

    unit_of_group: np.ndarray
    work: np.ndarray
    memory: np.ndarray
    members: list[tuple[int, ...]]
    cost: np.ndarray
    at: list[list[int]]
    """Per unit: the senders it is a member of."""


def _units(tg: TaskGraph, units: Sequence[Sequence[int]],
           group_memory: np.ndarray) -> _Units:
    unit_of_group = np.empty(tg.num_groups, dtype=np.int64)
    for i, groups in enumerate(units):
        unit_of_group[list(groups)] = i
    cost_of: dict[tuple[int, ...], float] = {}
    senders = merged_senders(tg, unit_of_group)
    for u, t, c in zip(senders.unit.tolist(), senders.targets, senders.cost.tolist()):
        members = tuple(sorted({int(u), *t}))
        cost_of[members] = cost_of.get(members, 0.0) + c
    members = list(cost_of)
    at: list[list[int]] = [[] for _ in range(len(units))]
    for j, m in enumerate(members):
        for x in m:
            at[x].append(j)
    return _Units(
        unit_of_group=unit_of_group,
        work=np.bincount(unit_of_group[tg.group], weights=tg.duration_s,
                         minlength=len(units)),
        memory=np.bincount(unit_of_group, weights=group_memory, minlength=len(units)),
        members=members, cost=np.array([cost_of[m] for m in members]), at=at)


def pool_moves(tg: TaskGraph, num_devices: int, units: Sequence[Sequence[int]],
               group_device: np.ndarray, light: float, group_memory: np.ndarray,
               memory_cap: float, deadline: float) -> tuple[np.ndarray, float]:
    """`group_device` (constant on each of `units`) improved by moving a run (in unit
    order) of one pool's units (the units left with no sender of cost over `light`)
    to another device while that lowers the max-load, until `deadline`; returns the
    placement and its max-load."""
    k = num_devices
    u = _units(tg, units, group_memory)
    members, cost, work, memory = u.members, u.cost, u.work, u.memory
    walked = np.zeros(len(units), dtype=bool)
    walked[[x for m, c in zip(members, cost.tolist()) if c > light for x in m]] = True
    dropped = [j for j, c in enumerate(cost.tolist()) if c <= light]
    pools, _ = anchored_pools(work, [members[j] for j in dropped], cost[dropped], walked)
    runs = [list(pool.units[a:b + 1]) for pool in pools for a in range(len(pool.units))
            for b in range(a, min(a + MAX_RUN, len(pool.units)))]
    unit_device = group_device[[groups[0] for groups in units]].copy()
    loads = device_loads(tg, group_device, k)
    used = np.bincount(unit_device, weights=memory, minlength=k)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        top = float(loads.max())
        for run in runs:
            if time.perf_counter() > deadline:
                break
            if not (unit_device[run] == int(np.argmax(loads))).any():
                continue
            for d in range(k):
                change = _change(run, d, unit_device, u, k)
                if (loads + change).max() < top - 1e-12 * top and (
                        used[d] + memory[run][unit_device[run] != d].sum()
                        <= memory_cap * (1 + 1e-9)):
                    np.add.at(used, unit_device[run], -memory[run])
                    used[d] += memory[run].sum()
                    unit_device[run] = d
                    loads = loads + change
                    improved = True
                    break
            if improved:
                break
    placed = unit_device[u.unit_of_group]
    return placed, float(device_loads(tg, placed, k).max())


def boundary_swaps(tg: TaskGraph, num_devices: int, units: Sequence[Sequence[int]],
                   group_device: np.ndarray, group_memory: np.ndarray, memory_cap: float,
                   deadline: float) -> tuple[np.ndarray, float]:
    """`group_device` (constant on each of `units`, in sequence order) improved while
    that lowers the max-load, until `deadline`: a *boundary run* of the busiest device
    (at most MAX_RUN of its units in a row, next to a unit on another device) moves
    to another device d, alone or swapped with a boundary run of d's; the best such
    change each time. Returns the placement and its max-load."""
    k = num_devices
    u = _units(tg, units, group_memory)
    unit_device = group_device[[groups[0] for groups in units]].copy()
    loads = device_loads(tg, group_device, k)
    used = np.bincount(unit_device, weights=u.memory, minlength=k)
    while time.perf_counter() < deadline:
        busiest, top = int(np.argmax(loads)), float(loads.max())
        runs = _boundary_runs(unit_device)
        best: tuple[float, list[tuple[list[int], int]], np.ndarray] | None = None
        for a in (run for run in runs if unit_device[run[0]] == busiest):
            if time.perf_counter() > deadline:
                break
            for d in range(k):
                if d == busiest:
                    continue
                change = _change(a, d, unit_device, u, k)
                moved = unit_device.copy()
                moved[a] = d
                for swap in [[]] + [run for run in runs if unit_device[run[0]] == d]:
                    both = change + (_change(swap, busiest, moved, u, k) if swap else 0.0)
                    shift = u.memory[a].sum() - u.memory[swap].sum()
                    value = float((loads + both).max())
                    if (value < top - 1e-12 * top and (best is None or value < best[0])
                            and used[d] + shift <= memory_cap * (1 + 1e-9)
                            and used[busiest] - shift <= memory_cap * (1 + 1e-9)):
                        best = (value, [(a, d), (swap, busiest)], loads + both)
        if best is None:
            break
        _, moves, loads = best
        for run, d in moves:
            np.add.at(used, unit_device[run], -u.memory[run])
            used[d] += u.memory[run].sum()
            unit_device[run] = d
    placed = unit_device[u.unit_of_group]
    return placed, float(device_loads(tg, placed, k).max())


def max_load_search(tg: TaskGraph, group_device: np.ndarray, *, num_devices: int,
                    group_memory: np.ndarray, memory_cap: float, deadline: float,
                    max_rounds: int = 10_000) -> tuple[np.ndarray, float]:
    """`refine.local_search` with the max-load as its score: the same neighbourhood
    (the busiest device's groups moved, else swapped with another device's) and the
    same choice (the least (max-load, sum of squared loads) among improving changes,
    the first in its loops' order on ties), until none improves or `deadline` passes.
    Returns the placement and its max-load."""
    k = num_devices
    u = _units(tg, [[g] for g in range(tg.num_groups)], group_memory)
    # Per group: the groups it shares a sender with, whose swaps do not add up.
    near = [np.array(sorted({x for j in u.at[g] for x in u.members[j]}), dtype=np.int64)
            for g in range(tg.num_groups)]
    best = group_device.copy()
    loads = device_loads(tg, best, k)
    used = np.bincount(best, weights=group_memory, minlength=k)
    for _ in range(max_rounds):
        move = _best_load_move(u, best, loads, used, near, group_memory, memory_cap,
                               deadline)
        if move is None:
            break
        changes, loads = move
        for g, d in changes:
            used[best[g]] -= group_memory[g]
            used[d] += group_memory[g]
            best[g] = d
    return best, float(device_loads(tg, best, k).max())


def _best_load_move(u: _Units, current: np.ndarray, loads: np.ndarray, used: np.ndarray,
                    near: list[np.ndarray], group_memory: np.ndarray, memory_cap: float,
                    deadline: float) -> tuple[list[tuple[int, int]], np.ndarray] | None:
    """`refine._best_move` on `_change`: the best improving single move, else the best
    improving swap, as ([(group, new device), ...], the loads after it); None when
    neither improves or `deadline` passes first."""
    k = len(loads)
    worst = int(np.argmax(loads))
    value = float(loads.max())
    spread = float(np.square(loads).sum())
    tolerance = 1e-12 * max(1.0, abs(value))
    mine = np.flatnonzero(current == worst)
    # change[i, d]: what moving mine[i] to d adds to the loads (zero for d = worst).
    change = np.zeros((len(mine), k, k))
    for i, g in enumerate(mine.tolist()):
        if time.perf_counter() > deadline:
            return None
        for d in range(k):
            if d != worst:
                change[i, d] = _change([g], d, current, u, k)

    def pick(new_loads: np.ndarray, allowed: np.ndarray) -> np.ndarray | None:
        # The first least (value, spread) among improving ones; keys equal but for
        # rounding (summed from changes here, simulated in `_best_move`) count as
        # equal, so ties fall to the same change.
        v = new_loads.max(axis=-1)
        sq = np.square(new_loads).sum(axis=-1)
        better = allowed & ((v < value - tolerance)
                            | ((v <= value + tolerance) & (sq < spread * (1 - 1e-9))))
        if not better.any():
            return None
        least = better & (v <= v[better].min() + tolerance)
        least &= sq <= sq[least].min() * (1 + 1e-12)
        return np.array(np.unravel_index(int(np.argmax(least.ravel())), least.shape))

    fits = used[None, :] + group_memory[mine][:, None] <= memory_cap
    fits[:, worst] = False
    single = pick(loads + change, fits)
    if single is not None:
        g, d = int(mine[single[0]]), int(single[1])
        return [(g, d)], loads + change[single[0], d]
    others = np.flatnonzero(current != worst)
    if not len(mine) or not len(others):
        return None
    theirs = np.empty((len(others), k))
    for j, h in enumerate(others.tolist()):
        if time.perf_counter() > deadline:
            return None
        theirs[j] = _change([h], worst, current, u, k)
    to = current[others]
    # A swap's loads: its two moves' changes added, but for the pairs that share a
    # sender, whose second change is taken after the first.
    swapped = loads + change[:, to, :] + theirs[None, :, :]
    slot = np.full(len(current), -1, dtype=np.int64)
    slot[others] = np.arange(len(others))
    for i, g in enumerate(mine.tolist()):
        for h in near[g][slot[near[g]] >= 0].tolist():
            moved = current.copy()
            moved[g] = current[h]
            swapped[i, slot[h]] = (loads + change[i, current[h]]
                                   + _change([h], worst, moved, u, k))
    allowed = ((used[to][None, :] - group_memory[others][None, :]
                + group_memory[mine][:, None] <= memory_cap)
               & (used[worst] - group_memory[mine][:, None]
                  + group_memory[others][None, :] <= memory_cap))
    pair = pick(swapped, allowed)
    if pair is None:
        return None
    g, h = int(mine[pair[0]]), int(others[pair[1]])
    return [(g, int(current[h])), (h, worst)], swapped[pair[0], pair[1]]


def _boundary_runs(unit_device: np.ndarray) -> list[list[int]]:
    """The runs of at most MAX_RUN units in a row on one device that end or start at
    a cut (a neighbour on another device)."""
    n = len(unit_device)
    runs: set[tuple[int, int]] = set()
    for c in np.flatnonzero(unit_device[1:] != unit_device[:-1]).tolist():
        for end, step in ((c, -1), (c + 1, 1)):
            other = end
            while (abs(other - end) < MAX_RUN and 0 <= other < n
                   and unit_device[other] == unit_device[end]):
                runs.add((min(end, other), max(end, other)))
                other += step
    return [list(range(a, b + 1)) for a, b in sorted(runs)]


def _change(run: list[int], d: int, unit_device: np.ndarray, u: _Units,
            k: int) -> np.ndarray:
    """What moving `run` to device d adds to each device's load."""
    change = np.zeros(k)
    np.add.at(change, unit_device[run], -u.work[run])
    change[d] += u.work[run].sum()
    moved = unit_device.copy()
    moved[run] = d
    for j in {j for x in run for j in u.at[x]}:
        m = list(u.members[j])
        before, after = np.unique(unit_device[m]), np.unique(moved[m])
        if len(before) > 1:
            change[before] -= u.cost[j]
        if len(after) > 1:
            change[after] += u.cost[j]
    return change
