"""Local search that moves runs of pooled units (`pooled_work`) between devices.

A decomposed batch norm's per-channel chain is tied to its neighbours by senders of
about its own work, so moving any one of its units alone costs more than it brings,
and single-group local search (`refine.local_search`) leaves the chains where the
split put them; moving a run of a chain at once pays one cut for several units. On
decomposed ResNet-50 this took the plan of a 60 s solve from 1.1531 to 1.1526 W/4.
Hand-written: moves of this model's own chains, which no solver or library offers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from placement.ideal_dp import merged_senders
from placement.pooled_work import anchored_pools
from placement.simulate import device_loads
from placement.tasks import TaskGraph

#: Units a moved run may hold: a pool may be most of a graph (Inception-V3's walk
#: keeps 4 of 326 units), and its runs grow with its square.
MAX_RUN = 16


def pool_moves(tg: TaskGraph, num_devices: int, units: Sequence[Sequence[int]],
               group_device: np.ndarray, light: float, group_memory: np.ndarray,
               memory_cap: float, deadline: float) -> tuple[np.ndarray, float]:
    """`group_device` (constant on each of `units`) improved by moving a run (in unit
    order) of one pool's units (the units left with no sender of cost over `light`)
    to another device while that lowers the max-load, until `deadline`; returns the
    placement and its max-load."""
    k = num_devices
    unit_of_group = np.empty(tg.num_groups, dtype=np.int64)
    for i, groups in enumerate(units):
        unit_of_group[list(groups)] = i
    work = np.bincount(unit_of_group[tg.group], weights=tg.duration_s, minlength=len(units))
    memory = np.bincount(unit_of_group, weights=group_memory, minlength=len(units))
    cost_of: dict[tuple[int, ...], float] = {}
    senders = merged_senders(tg, unit_of_group)
    for u, t, c in zip(senders.unit.tolist(), senders.targets, senders.cost.tolist()):
        members = tuple(sorted({int(u), *t}))
        cost_of[members] = cost_of.get(members, 0.0) + c
    members = list(cost_of)
    cost = np.array([cost_of[m] for m in members])
    walked = np.zeros(len(units), dtype=bool)
    walked[[x for m, c in zip(members, cost.tolist()) if c > light for x in m]] = True
    dropped = [j for j, c in enumerate(cost.tolist()) if c <= light]
    pools, _ = anchored_pools(work, [members[j] for j in dropped], cost[dropped], walked)
    runs = [list(pool.units[a:b + 1]) for pool in pools for a in range(len(pool.units))
            for b in range(a, min(a + MAX_RUN, len(pool.units)))]
    at: list[list[int]] = [[] for _ in range(len(units))]
    for j, m in enumerate(members):
        for x in m:
            at[x].append(j)
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
                change = _change(run, d, unit_device, work, members, cost, at, k)
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
    placed = unit_device[unit_of_group]
    return placed, float(device_loads(tg, placed, k).max())


def _change(run: list[int], d: int, unit_device: np.ndarray, work: np.ndarray,
            members: list[tuple[int, ...]], cost: np.ndarray, at: list[list[int]],
            k: int) -> np.ndarray:
    """What moving `run` to device d adds to each device's load."""
    change = np.zeros(k)
    np.add.at(change, unit_device[run], -work[run])
    change[d] += work[run].sum()
    moved = unit_device.copy()
    moved[run] = d
    for j in {j for x in run for j in at[x]}:
        m = list(members[j])
        before, after = np.unique(unit_device[m]), np.unique(moved[m])
        if len(before) > 1:
            change[before] -= cost[j]
        if len(after) > 1:
            change[after] += cost[j]
    return change
