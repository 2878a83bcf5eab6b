"""Local search on the fine graph, every move judged by the exact simulator.

The refinement step of multilevel planning: after a coarse plan is expanded (or a MILP
stopped at its time limit), move one placement group at a time to another device while
that improves the plan, and when no move helps, swap a group of the worst device with
one of another device. Moves start from the groups of the worst device (the busiest
for max-load; the last to finish for step time), since only those can lower the value.
A plateau move is taken when it keeps the value and lowers the sum of squared device
loads, which spreads work and opens the next real improvement.

For step time a cheaper neighbourhood comes first (`chain_search`): only the groups of
the schedule's critical chain, whichever devices they sit on, since a move elsewhere
cannot shorten the chain that sets the step time; the first improving move is taken,
so each step costs a few simulations where the full neighbourhood costs hundreds.

For a fixed placement the list schedule's order can be improved by justification
(`justified`, the forward-backward improvement of project scheduling, Valls et al.
2005): schedule the reversed graph with the tasks that finish last going first, then
the graph again with the tasks whose reversed schedule lets them start earliest going
first, while the step time falls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from placement.simulate import (
    DeviceTimeline,
    OrderError,
    Schedule,
    ready_time,
    critical_chain,
    dispatch_by,
    evaluate_order,
    list_schedule,
    order_by_start,
)
from placement.tasks import TaskGraph

#: Most backward-forward passes `justified` makes; each is two list schedules.
JUSTIFY_ROUNDS = 4
#: Farthest a task of a critical device arc moves along its device in `order_search`.
INSERT_REACH = 6
#: `schedule_search`: the chance that a step moves a group rather than a task, and its
#: temperatures at the start and at the deadline, as shares of the starting step time
#: (on GNMT's paper preset on two V100s, 25,000 simulations: starting shares of
#: 0.004-0.008 reached 361.3-361.8 ms in 5 or 6 runs of 6, 0.016 in 5, 0.03 with group
#: moves at 0.2 and twice the time 363.1-376.6 in 4; group moves with chance 0.05-0.25
#: alike).
GROUP_MOVE = 0.1
ANNEAL_START = 0.008
ANNEAL_END = 0.0003
#: Steps of one anneal of `schedule_search`: on GNMT's paper preset on two V100s,
#: anneals of 5,000 steps reached 361.3-361.8 ms in 10 s of CPU time in four runs of
#: four (about two anneals), one anneal over the whole time 361.8-374.7, anneals of
#: 20,000 steps 361.3-362.3.
ANNEAL_STEPS = 5000

#: `ordered_move_search`: how many of the best moves, ranked by the plan's own order
#: kept (`_regrouped`), get an order descent, and how long each may take. On
#: Inception-V3's paper preset on four V100s with four micro-batches, eight tries of up
#: to 1 s took a plan from 94.78 to 94.14 ms in five moves (6 s); in the solve, with
#: 0.5 s, the solves of seed 0 ended at 94.15-94.5, and forty tries of 0.5 s
#: found no move from another seed's plan (95.16).
MOVE_TRIES = 8
MOVE_TRY_S = 0.5

ChainScore = Callable[[np.ndarray, tuple[float, float] | None],
                      tuple[tuple[float, float], Sequence[int]] | None]
"""(group_device, below) -> ((objective value, tie-break), the groups of its critical
chain); None when `below` is a key and the placement's is not below it. Almost every
move a descent tries is such a placement, and the chain is a quarter of a score's
time on Inception-V3 4x4."""
Score = Callable[[np.ndarray], tuple[float, np.ndarray]]
"""group_device -> (objective value, per-device load used to pick and to break ties)."""
Branches = Sequence[tuple[int, ...]] | None
"""Per group: the groups of its branch (itself among them), which move together."""


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


def chain_search(group_device: np.ndarray, score: ChainScore, *, num_devices: int,
                 group_memory: np.ndarray, memory_cap: float, deadline: float,
                 branches: Branches = None) -> tuple[np.ndarray, float]:
    """Move one group of the critical chain at a time to another device while that
    lowers (value, tie-break), taking the first such move, until none does or
    `deadline` passes; returns the placement and its value. With `branches`, a group
    whose move helps nowhere is tried once more with its whole branch (`_move_group`)."""
    best, key, _ = _chain_descent(group_device, score(group_device, None), score, num_devices,
                                  group_memory, memory_cap, deadline, branches)
    return best, key[0]


def _chain_descent(group_device: np.ndarray, scored, score: ChainScore, num_devices: int,
                   group_memory: np.ndarray, memory_cap: float, deadline: float,
                   branches: Branches = None):
    """`chain_search` from a placement whose score is known; returns the placement,
    its key and its critical chain's groups."""
    best = group_device.copy()
    key, chain = scored
    used = np.bincount(best, weights=group_memory, minlength=num_devices)
    improved = True
    while improved and time.perf_counter() <= deadline:
        improved = False
        for g in chain:
            found = _move_group(best, g, key, score, used, group_memory, memory_cap,
                                branches)
            if found is not None:
                key, chain = found
                improved = True
            if improved or time.perf_counter() > deadline:
                break
    return best, key, chain


def _move_group(best: np.ndarray, g: int, key, score: ChainScore, used: np.ndarray,
                group_memory: np.ndarray, memory_cap: float, branches: Branches = None):
    """Move group g to the first device where the key falls, in place (`best` and
    `used`), and return (new key, new chain); None, `best` unchanged, when none.
    Where `branches` gives g a branch of several groups and no move of g alone helps,
    the whole branch is tried on each device the same way: moving one op of an
    Inception branch adds two transfers, moving the branch one or none."""
    units = [(g,)] if branches is None or len(branches[g]) == 1 else [(g,), branches[g]]
    for unit in units:
        moved = list(unit)
        old = best[moved].copy()
        for d in range(len(used)):
            leaving = old != d
            gained = float(group_memory[moved][leaving].sum())
            if not leaving.any() or used[d] + gained > memory_cap:
                continue
            best[moved] = d
            found = score(best, key)
            if found is not None:
                np.subtract.at(used, old[leaving], group_memory[moved][leaving])
                used[d] += gained
                return found
            best[moved] = old
    return None


def chain_sweep(group_device: np.ndarray, scored, score: ChainScore, num_devices: int,
                group_memory: np.ndarray, memory_cap: float, deadline: float,
                branches: Branches = None):
    """As `_chain_descent`, but after an improving move the scan goes on from the
    moved group's place in the new chain instead of from the chain's head, until a
    whole chain's length of groups in a row has no improving move. On a long chain
    the head's groups are otherwise tried again after every move: on the 1,000-op
    layered DAG's largest part (404 tasks) this reached 1,099.8 in 14 s where
    `chain_search` reached 1,120.4 in 19 s from the same placement."""
    best = group_device.copy()
    key, chain = scored
    used = np.bincount(best, weights=group_memory, minlength=num_devices)
    at, misses = 0, 0
    while chain and misses < len(chain) and time.perf_counter() <= deadline:
        g = chain[at % len(chain)]
        found = _move_group(best, g, key, score, used, group_memory, memory_cap, branches)
        if found is not None:
            key, chain = found
            misses = 0
            at = chain.index(g) + 1 if g in chain else at
        else:
            misses += 1
            at += 1
    return best, key, chain


def kicked_search(group_device: np.ndarray, score: ChainScore, *, num_devices: int,
                  group_memory: np.ndarray, memory_cap: float, deadline: float,
                  rng: np.random.Generator, kick: int = 2, patience: int = 100,
                  good_enough: float = -np.inf, descent=_chain_descent,
                  branches: Branches = None) -> tuple[np.ndarray, float]:
    """Iterated local search: from the best placement so far, move `kick` random groups
    of its critical chain (with `branches`, each with its whole branch at even odds)
    to random devices that have memory for them, run
    `chain_search`, and keep the result when it is better; until `deadline`,
    `patience` kicks in a row without a gain, or a value of at most `good_enough` (a
    proven bound, say). What the single moves cannot reach alone (a chain that gets
    longer before it gets shorter) these kicks can. `descent` is `_chain_descent` or
    `chain_sweep`, given `branches` (`chain_search`)."""
    best, (best_key, chain) = group_device.copy(), score(group_device, None)
    misses = 0
    while (time.perf_counter() < deadline and num_devices > 1 and misses < patience
           and best_key[0] > good_enough):
        misses += 1
        trial = best.copy()
        used = np.bincount(trial, weights=group_memory, minlength=num_devices)
        for g in rng.choice(chain, size=min(kick, len(chain)), replace=False).tolist():
            whole = branches is not None and len(branches[g]) > 1 and rng.random() < 0.5
            moved = list(branches[g]) if whole else [g]
            fits = [d for d in range(num_devices) if (trial[moved] != d).any()
                    and used[d] + group_memory[moved][trial[moved] != d].sum() <= memory_cap]
            if fits:
                d = int(rng.choice(fits))
                np.subtract.at(used, trial[moved], group_memory[moved])
                used[d] += group_memory[moved].sum()
                trial[moved] = d
        trial, key, trial_chain = descent(trial, score(trial, None), score, num_devices,
                                          group_memory, memory_cap, deadline, branches)
        if key < best_key:
            best, best_key, chain, misses = trial, key, trial_chain, 0
    return best, best_key[0]


def justified(tg: TaskGraph, group_device: np.ndarray, num_devices: int,
              schedule: Schedule, dispatch: bool = False) -> Schedule:
    """The better of `schedule` and its justifications (see the module docstring) for
    the same placement: never worse than `schedule`. With `dispatch` each forward pass
    also dispatches the tasks in time by their latest starts (`dispatch_by`), the
    better of the two going on: where devices idle while tasks wait (several
    micro-batches), placing each task into the earliest gap in latest-start order
    leaves them idle where the dispatch would not."""
    dev = tg.task_devices(group_device)
    position = tg.topological_position
    best = schedule
    for _ in range(JUSTIFY_ROUNDS):
        # Latest finish first is a topological order of the reversed graph, whose
        # inputs are the graph's outputs.
        _, back_finish = _insertion_schedule(
            tg, tg.successors, dev, num_devices, np.lexsort((-position, -best.finish_s)))
        latest_start = back_finish.max(initial=0.0) - back_finish
        start, finish = _insertion_schedule(
            tg, tg.predecessors, dev, num_devices, np.lexsort((position, latest_start)))
        candidate = evaluate_order(tg, group_device,
                                   order_by_start(tg, dev, start, finish, num_devices))
        if dispatch:
            candidate = min(candidate, dispatch_by(tg, group_device, num_devices,
                                                   latest_start.tolist()),
                            key=lambda c: c.step_time_s)
        if candidate.step_time_s >= best.step_time_s * (1 - 1e-12):
            break
        best = candidate
    return best


def _insertion_schedule(tg: TaskGraph, inputs, dev: np.ndarray, num_devices: int,
                        priority: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and finish times when the tasks, in `priority` (a topological order of
    the graph whose per-task `inputs` are (task, transfer) pairs: `tg`'s predecessors,
    or its successors for the reversed graph), each take the earliest gap of their
    device that their inputs allow."""
    timelines = [DeviceTimeline() for _ in range(num_devices)]
    on_device = dev.tolist()
    duration = tg.duration_list
    start = [0.0] * tg.num_tasks
    finish = [0.0] * tg.num_tasks
    for t in priority.tolist():
        here = on_device[t]
        ready = ready_time(t, here, inputs, on_device, finish)
        s = start[t] = timelines[here].earliest_start(ready, duration[t])
        end = finish[t] = s + duration[t]
        timelines[here].insert(s, end)
    return np.array(start), np.array(finish)


class Leaders:
    """The `size` best placements noted (lowest value first), each differing from the
    others in at least `apart` groups, so that they are not one move from each other;
    the searches change their arrays in place, so each is kept as a copy."""

    def __init__(self, size: int, apart: int = 1):
        self.size, self.apart = size, apart
        self._kept: list[tuple[float, np.ndarray]] = []

    def note(self, group_device: np.ndarray, value: float) -> None:
        near = [i for i, (_, gd) in enumerate(self._kept)
                if np.count_nonzero(gd != group_device) < self.apart]
        if near or len(self._kept) >= self.size:
            rivals = near or [max(range(len(self._kept)), key=lambda i: self._kept[i][0])]
            if value >= min(self._kept[i][0] for i in rivals):
                return
            self._kept = [e for i, e in enumerate(self._kept) if i not in rivals]
        self._kept.append((value, group_device.copy()))

    def placements(self) -> list[np.ndarray]:
        return [gd for _, gd in sorted(self._kept, key=lambda e: e[0])]


def order_search(tg: TaskGraph, group_device: np.ndarray, schedule: Schedule, *,
                 deadline: float, rng: np.random.Generator, kick: int = 2,
                 patience: int = 200) -> Schedule:
    """Improve the per-device order of a fixed placement (never worse than `schedule`):
    swap two tasks that run back to back on one device where the later one waited for
    the earlier (the critical chain's device arcs; the N1 neighbourhood of job-shop
    local search, van Laarhoven, Aarts and Lenstra 1992), taking the first swap that
    lowers (step time, sum of the devices' last finishes); when none does, swap
    `kick` random back-to-back pairs of the chain's devices and descend again, keeping
    the result when it is better, until `patience` kicks in a row fail or `deadline`.
    The list schedule and its justification order by ranks alone; on GNMT's paper
    preset on two V100s the best placement's list schedule is 9% above its best order."""
    best, best_key = _order_descent(tg, group_device, schedule, deadline)
    misses = 0
    while time.perf_counter() < deadline and misses < patience:
        misses += 1
        order = [list(ts) for ts in best.order]
        for _ in range(kick):
            d = int(rng.integers(len(order)))
            if len(order[d]) > 1:
                i = int(rng.integers(len(order[d]) - 1))
                order[d][i], order[d][i + 1] = order[d][i + 1], order[d][i]
        try:
            trial = evaluate_order(tg, group_device, order)
        except OrderError:
            continue
        trial, key = _order_descent(tg, group_device, trial, deadline)
        if key < best_key:
            best, best_key, misses = trial, key, 0
    return best


def schedule_search(tg: TaskGraph, group_device: np.ndarray, schedule: Schedule, *,
                    group_memory: np.ndarray, memory_cap: float, deadline: float,
                    rng: np.random.Generator) -> tuple[np.ndarray, Schedule]:
    """Simulated annealing over placements and orders together, from `group_device`
    and its `schedule`, until `deadline`; returns the best placement met and its
    schedule (never worse than `schedule`). A step takes a random move of
    `order_search`'s neighbourhood (a task of a critical device arc moved up to
    INSERT_REACH places), or with chance GROUP_MOVE a random group moved to another
    device with memory for it, with the better of two orders: the current one, the
    group's tasks joining the other device's sequence where the schedule ran them
    (`order_by_start` of its times, which rise along every edge, so it never
    deadlocks), and the new placement's justified list schedule. A move that lengthens
    the step by delta is taken with chance exp(-delta / T), T falling geometrically from
    ANNEAL_START to ANNEAL_END of the starting step time over ANNEAL_STEPS steps, or by
    the deadline if sooner; then the next anneal starts from the best plan met, from the
    temperature the deadline's clock has reached. The placement searches
    judge a placement by its (justified) list schedule, which ranks GNMT's optimal
    placement on two V100s (357.8 ms, CP-SAT) behind placements whose best orders are
    worse: this search judges it by the order it finds. There, from HEFT's placement
    with 25,000 simulations, it reached 361.3-362.4 ms in four runs of four, where
    `order_search` from the same start with group moves added as a last resort and as
    kicks reached 368.7-381.3."""
    num_devices = len(schedule.order)
    gd = group_device.copy()
    current, current_key = schedule, _order_key(schedule)
    best = (gd.copy(), current, current_key)
    hot = ANNEAL_START * schedule.step_time_s
    used = np.bincount(gd, weights=group_memory, minlength=num_devices)
    began = time.perf_counter()
    span = max(deadline - began, 1e-9)
    step, chain = 0, []
    while (now := time.perf_counter()) < deadline:
        if step == ANNEAL_STEPS:
            step = 0
            gd, current, current_key, chain = best[0].copy(), best[1], best[2], []
            used = np.bincount(gd, weights=group_memory, minlength=num_devices)
        # Each anneal cools over ANNEAL_STEPS steps, or by the deadline when that comes
        # first, so that however short the time the search ends cold, a descent.
        cooled = max(step / ANNEAL_STEPS, (now - began) / span)
        temperature = hot * (ANNEAL_END / ANNEAL_START) ** cooled
        step += 1
        moved = (_random_group_move(gd, used, group_memory, memory_cap, rng)
                 if rng.random() < GROUP_MOVE else None)
        try:
            if moved is not None:
                trial_gd = gd.copy()
                trial_gd[moved[0]] = moved[1]
                trial = min(_regrouped(tg, trial_gd, current, num_devices),
                            justified(tg, trial_gd, num_devices,
                                      list_schedule(tg, trial_gd, num_devices)),
                            key=_order_key)
            else:
                chain = chain or critical_chain(tg, current)
                order = _random_insertion(current, chain, rng)
                if order is None:
                    continue
                trial_gd, trial = gd, evaluate_order(tg, gd, order)
        except OrderError:
            continue
        key = _order_key(trial)
        delta = key[0] - current_key[0]
        if key < current_key or (temperature > 0 and
                                 rng.random() < np.exp(-max(delta, 0.0) / temperature)):
            if moved is not None:
                g, d = moved
                used[gd[g]] -= group_memory[g]
                used[d] += group_memory[g]
            gd, current, current_key, chain = trial_gd, trial, key, []
            if key < best[2]:
                best = (gd.copy(), current, key)
    return best[0], best[1]


def ordered_move_search(tg: TaskGraph, group_device: np.ndarray, schedule: Schedule, *,
                        group_memory: np.ndarray, memory_cap: float, deadline: float,
                        tries: int = MOVE_TRIES, try_s: float = MOVE_TRY_S
                        ) -> tuple[np.ndarray, Schedule]:
    """First-improvement descent over moves of one critical-chain group to another
    device (with memory for it), each judged by its best order near the plan's: the
    plan's order with the moved tasks joining the other device where they ran
    (`_regrouped`) ranks the moves, and the `tries` best get `_order_descent` for up to
    `try_s` each; the first that beats the plan (step time, then the sum of the
    devices' last finishes) is taken, until none does or `deadline`. Never worse than
    `schedule`. The placement searches judge a move by a fresh list schedule or
    dispatch, far from the order the order search found for the plan: on Inception-V3's
    paper preset on four V100s with four micro-batches they give its plan 95.76 ms
    where its order gives 94.78, and every move off its busiest device 96.6-100.6, so no
    move is ever taken; judged here, five moves took it to 94.14 ms in 6 s."""
    num_devices = len(schedule.order)
    gd, best, key = group_device.copy(), schedule, _order_key(schedule)
    used = np.bincount(gd, weights=group_memory, minlength=num_devices)
    while time.perf_counter() < deadline:
        ranked = []
        for g in dict.fromkeys(tg.group[critical_chain(tg, best)].tolist()):
            for d in range(num_devices):
                if d == gd[g] or used[d] + group_memory[g] > memory_cap:
                    continue
                trial_gd = gd.copy()
                trial_gd[g] = d
                trial = _regrouped(tg, trial_gd, best, num_devices)
                ranked.append((_order_key(trial), g, d, trial_gd, trial))
            if time.perf_counter() > deadline:
                break
        ranked.sort(key=lambda r: r[:3])
        for _, g, d, trial_gd, trial in ranked[:tries]:
            found, found_key = _order_descent(tg, trial_gd, trial,
                                              min(deadline, time.perf_counter() + try_s))
            if found_key < key:
                used[gd[g]] -= group_memory[g]
                used[d] += group_memory[g]
                gd, best, key = trial_gd, found, found_key
                break
        else:
            break
    return gd, best


def _random_group_move(group_device: np.ndarray, used: np.ndarray, group_memory: np.ndarray,
                       memory_cap: float, rng: np.random.Generator) -> tuple[int, int] | None:
    """(group, device): a random group and a random other device with memory for it;
    None when there is none."""
    g = int(rng.integers(len(group_device)))
    fits = [d for d in range(len(used)) if d != group_device[g]
            and used[d] + group_memory[g] <= memory_cap]
    return (g, int(rng.choice(fits))) if fits else None


def _random_insertion(schedule: Schedule, chain: Sequence[int],
                      rng: np.random.Generator) -> list[list[int]] | None:
    """The order with one random move of `_insertions` on a random critical device arc
    of `chain`; None when the chain has no device arc or the move leaves the device."""
    position = {t: (d, i) for d, ts in enumerate(schedule.order) for i, t in enumerate(ts)}
    arcs = [position[later] for later, earlier in zip(chain, chain[1:])
            if position[later][1] > 0
            and schedule.order[position[later][0]][position[later][1] - 1] == earlier]
    if not arcs:
        return None
    d, i = arcs[int(rng.integers(len(arcs)))]
    reach = int(rng.integers(1, INSERT_REACH + 1))
    src, dst = (i, i - reach) if rng.random() < 0.5 else (i - 1, i - 1 + reach)
    seq = list(schedule.order[d])
    if not 0 <= dst < len(seq):
        return None
    seq.insert(dst, seq.pop(src))
    return [list(ts) if e != d else seq for e, ts in enumerate(schedule.order)]


def _regrouped(tg: TaskGraph, group_device: np.ndarray, schedule: Schedule,
               num_devices: int) -> Schedule:
    """`schedule`'s order for a placement with some groups moved: each device's tasks
    by the schedule's times."""
    dev = tg.task_devices(group_device)
    return evaluate_order(tg, group_device, order_by_start(
        tg, dev, schedule.start_s, schedule.finish_s, num_devices))


def _order_key(schedule: Schedule) -> tuple[float, float]:
    last = np.zeros(int(schedule.device.max(initial=0)) + 1)
    np.maximum.at(last, schedule.device, schedule.finish_s)
    return schedule.step_time_s, float(last.sum())


def _order_descent(tg: TaskGraph, group_device: np.ndarray, schedule: Schedule,
                   deadline: float) -> tuple[Schedule, tuple[float, float]]:
    """First-improvement descent over the critical chain's device arcs: the later task
    of an arc moved up to INSERT_REACH places earlier on its device, or the earlier one
    as far later."""
    best, key = schedule, _order_key(schedule)
    improved = True
    while improved and time.perf_counter() <= deadline:
        improved = False
        position = {t: (d, i) for d, ts in enumerate(best.order) for i, t in enumerate(ts)}
        chain = critical_chain(tg, best)
        for later, earlier in zip(chain, chain[1:]):
            d, i = position[later]
            if i == 0 or best.order[d][i - 1] != earlier:
                continue
            for trial_order in _insertions(best.order, d, i):
                try:
                    trial = evaluate_order(tg, group_device, trial_order)
                except OrderError:
                    continue
                trial_key = _order_key(trial)
                if trial_key < key:
                    best, key, improved = trial, trial_key, True
                    break
            if improved or time.perf_counter() > deadline:
                break
    return best, key


def _insertions(order, d: int, i: int):
    """Orders with task i of device d moved before task i - j, or task i - 1 moved
    after task i - 1 + j, for j = 1 .. INSERT_REACH."""
    seq = list(order[d])
    for j in range(1, INSERT_REACH + 1):
        for src, dst in ((i, i - j), (i - 1, i - 1 + j)):
            if 0 <= dst < len(seq):
                moved = seq[:src] + seq[src + 1:]
                moved.insert(dst, seq[src])
                yield [list(ts) if e != d else moved for e, ts in enumerate(order)]
