"""Local search on the fine graph, every move judged by the exact simulator.

The refinement step of multilevel planning: after a coarse plan is expanded (or a MILP
stopped at its time limit), move one placement group at a time to another device while
that improves the plan, and when no move helps, swap a group of the worst device with
one of another device. Moves start from the groups of the worst device (the busiest
for max-load; the last to finish for step time), since only those can lower the value.
A plateau move is taken when it keeps the value and lowers the sum of squared device
loads, which spreads work and opens the next real improvement.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

Score = Callable[[np.ndarray], tuple[float, np.ndarray]]
"""group_device -> (objective value, per-device load used to pick and to break ties)."""


def local_search(group_device: np.ndarray, score: Score, *, num_devices: int,
                 group_memory: np.ndarray, memory_cap: float, deadline: float,
                 max_rounds: int = 10_000) -> tuple[np.ndarray, float]:
    """Improve `group_device` by single-group moves until none helps or `deadline`
    (a time.perf_counter() value) passes; returns the placement and its value."""
    best = group_device.copy()
    value, loads = score(best)
    used = np.bincount(best, weights=group_memory, minlength=num_devices)
    for _ in range(max_rounds):
        move = _best_move(best, value, loads, score, num_devices, group_memory,
                          memory_cap, used, deadline)
        if move is None:
            break
        for g, d in move[0]:
            used[best[g]] -= group_memory[g]
            used[d] += group_memory[g]
            best[g] = d
        value, loads = move[1], move[2]
    return best, value


def _best_move(current: np.ndarray, value: float, loads: np.ndarray, score: Score,
               num_devices: int, group_memory: np.ndarray, memory_cap: float,
               used: np.ndarray, deadline: float):
    """The best improving single move, else the best improving swap, as
    ([(group, new device), ...], value, loads); None when neither improves."""
    worst = int(np.argmax(loads))
    spread = float(np.square(loads).sum())
    tolerance = 1e-12 * max(1.0, abs(value))
    mine = np.flatnonzero(current == worst).tolist()
    best = None

    def consider(changes: list[tuple[int, int]]) -> None:
        nonlocal best
        if time.perf_counter() > deadline:
            return
        old = [(g, int(current[g])) for g, _ in changes]
        for g, d in changes:
            current[g] = d
        v, new_loads = score(current)
        for g, d in old:
            current[g] = d
        key = (v, float(np.square(new_loads).sum()))
        better = v < value - tolerance or (
            v <= value + tolerance and key[1] < spread * (1 - 1e-9))
        if better and (best is None or key < best[0]):
            best = (key, changes, v, new_loads)

    for g in mine:
        for d in range(num_devices):
            if d != worst and used[d] + group_memory[g] <= memory_cap:
                consider([(g, d)])
        if time.perf_counter() > deadline:
            break
    if best is None:
        others = np.flatnonzero(current != worst).tolist()
        for g in mine:
            for h in others:
                d = int(current[h])
                if (used[d] - group_memory[h] + group_memory[g] <= memory_cap
                        and used[worst] - group_memory[g] + group_memory[h] <= memory_cap):
                    consider([(g, d), (h, worst)])
            if time.perf_counter() > deadline:
                break
    if best is None:
        return None
    _, changes, v, new_loads = best
    return changes, v, new_loads
