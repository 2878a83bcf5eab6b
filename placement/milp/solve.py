"""MILP placement, end to end: heuristic start, coarse solve, fine solve, checks.

Every plan returned here has been re-evaluated by the simulator; a solver result the
simulator disagrees with is dropped (with a note) and the best plan so far is kept, so
the result is never worse than the heuristic it started from.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
import numpy as np

from placement.coarsen import chain_clusters
from placement.heuristics import rotated_splits
from placement.ideal_dp import ideal_split, join_roots, side_inputs
from placement.milp import makespan as mk
from placement.milp import max_load as ml
from placement.milp.backends import BACKENDS, Backend, SolveOptions, choose_backend
from placement.path_bound import heavy_group_bound, path_cut_bound
from placement.pool_moves import boundary_swaps, max_load_search, pool_moves
from placement.segment_bound import segment_bound
from placement.line_process import LineProcess, spare_core
from placement.sequence_dp import (
    MAX_LINE_CHILDREN,
    heavy_end_first,
    line_target,
    relaxed_bound,
    sequence_dp,
)
from placement.sequences import joined_sequences
from placement.milp.incumbent import (
    HEURISTIC,
    Incumbent,
    believable,
    placement_fits,
    refined,
    run_checked,
    worth_a_round,
)
from placement.plan import Plan
from placement.problem import Problem, best_heuristic, finish_plan
from placement.simulate import device_loads

#: Above this many groups the max-load MILP first runs on chain-merged clusters.
MAX_LOAD_FINE_GROUPS = 120
#: Share of the time limit the coarse max-load solve may use.
COARSE_SHARE = 0.35
#: Share of the time limit the ideal DP may use before the MILP rounds.
IDEAL_DP_SHARE = 0.15
#: Rotations of the group sequence the wrap-around contiguous split tries, and the
#: share of the time limit it may use.
ROTATIONS = 24
ROTATION_SHARE = 0.1
#: Share of the time left that the segment bound may take.
SEGMENT_BOUND_SHARE = 0.1
#: Fine models of more units get their root LP solved by the interior point method: on
#: decomposed ResNet-50 (1,084 units) the dual simplex took longer than the dozen
#: seconds the fine round gets there, and that LP's bound is all the round proves; on
#: core-aten ResNet-50 (182 units) the switch cost the bound the simplex reaches
#: (gap 1.39% -> 2.73%, one run each).
INTERIOR_ROOT_UNITS = 500
#: Share of the time left that the sequence DP may take (graphs of more than
#: MAX_LOAD_FINE_GROUPS units, where the fine MILP alone proves little).
SEQUENCE_DP_SHARE = 0.5
#: Where the exact DP proves too little: the share of the time left that its relaxation
#: (sequence_dp.relaxed_bound) may take, and the senders it drops, as a share of total
#: work / devices. On decomposed ResNet-50 the relaxation proved 1.071-1.073 W/4 with
#: shares 0.002-0.01 (the state cap, not the share, stops it); 0.005 drops 3% of
#: bert12's senders. With 0.6 of the time left the climb on decomposed ResNet-50
#: reached 1.1285 W/4 and every test after it stopped at the deadline (load 4.6).
RELAXED_DP_SHARE = 0.8
#: ... and the share its first test, at the 2% gap (CHARGE_GAP), may take: on decomposed
#: bert12 that test, which meets the gap, needs 20-25 s after 6 s of tables, where
#: the MILP rounds and the window search after it improve nothing; on decomposed
#: ResNet-50 it fails in about 6 s and the climb still has its share.
RELAXED_LINE_SHARE = 0.95
LIGHT_SENDER_SHARE = 0.005
#: The relaxation also merges the states of a layer whose loads lie within cells of
#: this share of total work / devices (`sequence_dp._merge_close`), and of up to the
#: second share where a test passes the state cap.
MERGE_CELL_SHARE = 0.005
MAX_MERGE_CELL_SHARE = 0.02
#: ... and the cells of its test at the line. Replayed alone (2026-12-07, nothing else
#: running, 16 dominance rounds): on the 12-layer Llama at 1.0402 W/4 cells of 0.03
#: prove with 95,581 states at the peak in 30-32 s, 0.02 with 189,928 in 82 s (under
#: the profiler); on decomposed bert12 at 1.0413 W/4 in 4.0 s against 13.9; decomposed
#: ResNet-50 finds a relaxed placement with either, and T5 (`aten`) passes the cap
#: with either.
LINE_CELL_SHARE = 0.03
#: The line test's process stops this long before the planner's deadline (a layer of
#: its test takes up to half a second), so that its answer is read within the limit.
LINE_MARGIN_S = 1.0
#: Share of the time left that the pool moves (placement/pool_moves.py) may take: on
#: decomposed ResNet-50 they took 1 s of the 9 s left (load 3.9).
POOL_MOVES_SHARE = 0.3
#: Share of the time left that the boundary swaps (pool_moves.boundary_swaps) may
#: take: on core-aten bert12 they finish in 1.2-1.9 s of the 9 s left (load 1-5); on
#: decomposed ResNet-50 they stop at this share (2.7 s), the plan 0.016096 -> 0.016081
#: (the window search then reaches 0.016071, as without them).
BOUNDARY_SWAPS_SHARE = 0.3
#: Share of the time left after the coarse round that the window search keeps (the
#: fine MILP, whose bound it cannot replace, runs first), the free units at first on
#: each side of a cut, and the seconds one window's MILP may take (one shorter than
#: the least is not started).
WINDOW_SHARE = 0.35
WINDOW_RADIUS = 4
WINDOW_SECONDS = 15.0
WINDOW_MIN_SECONDS = 1.0
#: Share of the time left that local search may take before a MILP round.
REFINE_SHARE = 0.2


def solve_plan(problem: Problem, solver: str,
               backends: Mapping[str, Backend] = BACKENDS) -> Plan:
    """The configured objective's MILP plan with `solver` ('glpk', 'cbc', 'highs' or
    'auto', which takes the first installed one)."""
    started = time.perf_counter()
    backend = choose_backend(solver, backends)
    deadline = started + problem.config.time_limit_s
    name, group_device, value = best_heuristic(problem)
    incumbent = Incumbent(group_device, value, f"{HEURISTIC}{name}")
    solve = _max_load if problem.config.objective == "max-load" else _makespan
    # The analytic bound may prove the heuristic's plan already (one device, say).
    by_bound = value - problem.lower_bound() <= problem.config.gap * value
    try:
        if by_bound:
            bound, status = problem.lower_bound(), "optimal"
        else:
            bound, status = solve(problem, backend, incumbent, deadline)
    except Exception as exc:  # noqa: BLE001 - an internal failure is not the user's
        incumbent.notes.append(
            f"warning: the {problem.config.objective} MILP failed in its {incumbent.stage} "
            f"stage ({type(exc).__name__}: {exc}); kept the best plan so far")
        bound, status = incumbent.proven_bound, "time_limit"
    # Every plan a solver's model made (maybe refined after) is named from the backend;
    # the baselines, the DPs and the searches from their placements are not.
    by_solver = incumbent.source.startswith(backend.name)
    if incumbent.rejected:
        bound, status = incumbent.proven_bound, "time_limit"
    bound = min(max(bound, problem.lower_bound()), incumbent.value)
    closed = incumbent.value - bound <= problem.config.gap * incumbent.value
    elapsed = time.perf_counter() - started
    notes = list(incumbent.notes)
    if closed and not incumbent.rejected:
        status = "optimal"
    else:
        out_of_time = elapsed >= 0.9 * problem.config.time_limit_s
        status = ("heuristic" if not by_solver
                  else "time_limit" if incumbent.rejected or out_of_time else "feasible")
        gap = (incumbent.value - bound) / incumbent.value if incumbent.value > 0 else 0.0
        notes.append((f"time limit {problem.config.time_limit_s:g} s reached: "
                      if out_of_time else "not proven optimal: ")
                     + f"best plan so far, within {gap:.2%} of the proven bound")
    if by_bound:
        notes.append(f"{incumbent.source} is optimal by the analytic bound: "
                     f"{backend.name} had nothing to improve")
    elif not by_solver:
        notes.append(f"{backend.name} found no plan better than {incumbent.source} in "
                     f"{elapsed:.1f} s"
                     + (" and proved it optimal" if status == "optimal" else ""))
    notes.append(f"plan from {incumbent.source}")
    return finish_plan(problem, incumbent.group_device,
                       solver=backend.name if by_solver else incumbent.source,
                       status=status, lower_bound=bound,
                       solve_seconds=time.perf_counter() - started,
                       order=incumbent.order, notes=notes)


def _options(problem: Problem, deadline: float, share: float = 1.0,
             cutoff: float | None = None, interior_root: bool = False
             ) -> SolveOptions | None:
    # Keep a little time for checking, refining and packaging the solver's answer.
    reserve = min(2.0, 0.05 * problem.config.time_limit_s)
    left = (deadline - time.perf_counter()) * share - reserve
    if left < 0.5:
        return None
    return SolveOptions(time_limit_s=left, gap=problem.config.gap,
                        threads=problem.config.threads, cutoff=cutoff,
                        interior_root=interior_root)


# ---- max-load -------------------------------------------------------------------------

def _max_load_moves(problem: Problem, incumbent: Incumbent, deadline: float):
    """(score, refine): a placement's max-load and loads; local search on the
    incumbent from `source` in `share` of the time left."""
    tg, k = problem.tg, problem.num_devices

    def score(gd: np.ndarray) -> tuple[float, np.ndarray]:
        loads = device_loads(tg, gd, k)
        return float(loads.max()), loads

    def refine(source: str, share: float) -> None:
        incumbent.stage = "local search"
        until = time.perf_counter() + share * max(0.0, deadline - time.perf_counter())
        gd, value = max_load_search(tg, incumbent.group_device, num_devices=k,
                                    group_memory=problem.group_memory,
                                    memory_cap=problem.memory_cap, deadline=until)
        incumbent.offer(gd, value, refined(source))

    return score, refine


def _max_load(problem: Problem, backend: Backend, incumbent: Incumbent,
              deadline: float) -> tuple[float, str]:
    tg, k = problem.tg, problem.num_devices
    score, refine = _max_load_moves(problem, incumbent, deadline)

    # Exact presolve: a side input never loses by sitting with its one neighbour
    # (ideal_dp.side_inputs), so every plan is moved so, and the fine model's units are
    # the groups with their side inputs (its optimum and bound are the groups').
    incumbent.stage = "presolve"
    root = join_roots(side_inputs(tg, problem.group_memory, problem.memory_cap))
    sequences = joined_sequences(tg, root)
    seq = sequences[0]
    _snap_side_inputs(incumbent, root, score)
    for share, candidate in zip((0.5, 1.0), sequences):
        split = rotated_splits(tg, k, problem.group_memory, problem.memory_cap, candidate,
                               ROTATIONS, time.perf_counter() + share * ROTATION_SHARE * max(
                                   0.0, deadline - time.perf_counter()))
        if split is not None:
            incumbent.offer(*split, "contiguous-dp (side inputs joined, rotated)")
    # The optimum over contiguous splits: the MILP starts from it, so never loses to it.
    ideal = ideal_split(tg, k, problem.group_memory, problem.memory_cap,
                        upper=incumbent.value,
                        deadline=time.perf_counter() + IDEAL_DP_SHARE * max(
                            0.0, deadline - time.perf_counter()))
    if ideal is not None:
        incumbent.offer(ideal.group_device, ideal.value, "ideal-dp")
    # Local search first gives the MILP a better incumbent, but must leave it time.
    refine(incumbent.source, REFINE_SHARE)
    _snap_side_inputs(incumbent, root, score)
    members: dict[int, list[int]] = {}
    for g in seq:
        members.setdefault(int(root[g]), []).append(g)
    units = list(members.values())
    # Past MAX_LOAD_FINE_GROUPS units the sequence DP walks them (None: the MILP alone).
    walk = (heavy_end_first(tg, units, k, incumbent.value)
            if len(units) > MAX_LOAD_FINE_GROUPS else None)
    line = _line_process(problem, incumbent, walk, deadline) if walk is not None else None
    try:
        bound, status = _max_load_stages(problem, backend, incumbent, deadline, seq,
                                         root, units, walk, line)
        if line is not None and status != "optimal":
            if line.proven(wait_until=deadline):
                incumbent.proven_bound = max(incumbent.proven_bound, line.bound)
                bound = max(bound, line.bound)
            elif line.failure is not None:
                incumbent.notes.append(f"warning: the relaxed DP's line test failed in "
                                       f"its own process ({line.failure}); its bound is "
                                       "left out")
    finally:
        if line is not None:
            line.close()
    return bound, status


def _line_process(problem: Problem, incumbent: Incumbent, walk: list[list[int]],
                  deadline: float) -> LineProcess | None:
    """The relaxation's test at the gap line under the incumbent, started in a
    process of its own where a core is spare (`placement.line_process`); None where
    none is, or where the line lies under the analytic bound."""
    tg, k = problem.tg, problem.num_devices
    share = float(tg.duration_s.sum()) / k
    target = line_target(problem.lower_bound(), incumbent.value)
    if not spare_core(problem.config.threads) or target <= problem.lower_bound():
        return None
    try:
        return LineProcess(tg, walk, k, LIGHT_SENDER_SHARE * share, target,
                           deadline - LINE_MARGIN_S, MAX_LINE_CHILDREN // k,
                           LINE_CELL_SHARE * share)
    except OSError as exc:  # no interpreter or temporary file to start it with
        incumbent.notes.append(f"warning: the relaxed DP's line test could not start a "
                               f"process of its own ({exc}); it runs in the planner's")
        return None


def _max_load_stages(problem: Problem, backend: Backend, incumbent: Incumbent,
                     deadline: float, seq: list[int], root: np.ndarray,
                     units: list[list[int]], walk: list[list[int]] | None,
                     line: LineProcess | None) -> tuple[float, str]:
    """The bounds, the DP, the searches and the MILP rounds after the presolve (the
    DP, the searches and the coarse round where `walk` is not None)."""
    tg, k = problem.tg, problem.num_devices
    score, refine = _max_load_moves(problem, incumbent, deadline)

    incumbent.stage = "transfer bounds"
    known = path_cut_bound(tg, k, heavy_group_bound(tg, problem.lower_bound()),
                           incumbent.value)
    known = segment_bound(tg, k, seq, known, incumbent.value,
                          deadline=time.perf_counter() + SEGMENT_BOUND_SHARE * max(
                              0.0, deadline - time.perf_counter()))
    # Proven without the MILP solver: it stands whatever the solver later answers.
    incumbent.proven_bound = known
    if walk is not None:
        known = incumbent.proven_bound = _sequence_dp(problem, incumbent, walk, known,
                                                      deadline, line)
        incumbent.stage = "pool moves"
        incumbent.offer(*pool_moves(tg, k, units, incumbent.group_device,
                                    LIGHT_SENDER_SHARE * float(tg.duration_s.sum()) / k,
                                    problem.group_memory, problem.memory_cap,
                                    time.perf_counter() + POOL_MOVES_SHARE * max(
                                        0.0, deadline - time.perf_counter())),
                        refined(incumbent.source))
        incumbent.stage = "boundary swaps"
        incumbent.offer(*boundary_swaps(tg, k, units, incumbent.group_device,
                                        problem.group_memory, problem.memory_cap,
                                        time.perf_counter() + BOUNDARY_SWAPS_SHARE * max(
                                            0.0, deadline - time.perf_counter())),
                        refined(incumbent.source))
        if incumbent.value - known <= problem.config.gap * incumbent.value:
            return known, "optimal"
        incumbent.stage = "coarsening"
        clusters = chain_clusters(tg, max_work_s=float(tg.duration_s.sum()) / k / 8)
        _max_load_round(problem, backend, incumbent, clusters,
                        deadline, COARSE_SHARE,
                        f"{backend.name} on {len(clusters)} clusters", known, exact=False)
        refine(incumbent.source, REFINE_SHARE)
        _snap_side_inputs(incumbent, root, score)
    bound, status = _max_load_round(problem, backend, incumbent, units, deadline,
                                    1.0 - WINDOW_SHARE if walk is not None else 1.0,
                                    backend.name, known, exact=True)
    if status != "optimal":
        if walk is not None:
            _window_search(problem, backend, incumbent, units, known, deadline)
        refine(incumbent.source, 1.0)
    return max(bound, known), status


def _sequence_dp(problem: Problem, incumbent: Incumbent, walk: list[list[int]],
                 known: float, deadline: float, line: LineProcess | None) -> float:
    """The sequence DP's bisection (placement/sequence_dp.py) along `walk` in its share
    of the time left: its plan when better and within the memory caps (the DP does not
    model them), and the larger of its bound and `known`; then, where the gap is still
    open, its relaxation's bound (`relaxed_bound`) in a share of the time left, whose
    test at the line is `line`'s where that process runs."""
    tg, k = problem.tg, problem.num_devices
    incumbent.stage = "sequence DP"
    found = sequence_dp(tg, walk, k, known, incumbent.value, problem.config.gap,
                        deadline=time.perf_counter() + SEQUENCE_DP_SHARE * max(
                            0.0, deadline - time.perf_counter()))
    if found.unit_device is not None:
        group_device = np.empty(tg.num_groups, dtype=np.int64)
        for groups, d in zip(walk, found.unit_device.tolist()):
            group_device[groups] = d
        used = np.bincount(group_device, weights=problem.group_memory, minlength=k)
        if used.max() <= problem.memory_cap * (1 + 1e-9):
            incumbent.offer(group_device, float(device_loads(tg, group_device, k).max()),
                            "sequence-dp")
    known = max(known, found.lower_bound)
    if incumbent.value - known <= problem.config.gap * incumbent.value:
        return known
    incumbent.stage = "relaxed sequence DP"
    light = LIGHT_SENDER_SHARE * float(tg.duration_s.sum()) / k
    left = max(0.0, deadline - time.perf_counter())
    return relaxed_bound(tg, walk, k, known, incumbent.value, light,
                         deadline=time.perf_counter() + RELAXED_DP_SHARE * left,
                         line_deadline=time.perf_counter() + RELAXED_LINE_SHARE * left,
                         merge=MERGE_CELL_SHARE * float(tg.duration_s.sum()) / k,
                         max_merge=MAX_MERGE_CELL_SHARE * float(tg.duration_s.sum()) / k,
                         line_merge=LINE_CELL_SHARE * float(tg.duration_s.sum()) / k,
                         line=line is None,
                         settled=(lambda: False) if line is None else line.proven)


def _window_search(problem: Problem, backend: Backend, incumbent: Incumbent,
                   units: list[list[int]], known_bound: float, until: float) -> None:
    """Re-optimise the incumbent around its cuts until `until`: the units within r
    positions (along `units`, in sequence order) of a unit on another device are
    free, the others stay with their devices' other fixed units, merged into one unit
    per device, and the MILP over those units is solved exactly (it is small). The
    fine MILP alone does not improve the incumbent on operator graphs in a minute;
    a neighbourhood of its cuts is where a better plan is (the contiguous splits'
    cut points, shifted and blurred). A window proven to hold no better plan grows r;
    one stopped by its time limit shrinks it."""
    tg, k = problem.tg, problem.num_devices
    radius = WINDOW_RADIUS
    while until - time.perf_counter() > WINDOW_MIN_SECONDS:
        unit_device = incumbent.group_device[[groups[0] for groups in units]]
        near = np.flatnonzero(unit_device[1:] != unit_device[:-1])
        free = np.zeros(len(units), dtype=bool)
        for b in near.tolist():
            free[max(0, b - radius + 1):b + radius + 1] = True
        if free.all() or not free.any():
            return
        blocks = [[g for u in np.flatnonzero(~free & (unit_device == d)).tolist()
                   for g in units[u]] for d in range(k)]
        window = [b for b in blocks if b] + [units[u]
                                             for u in np.flatnonzero(free).tolist()]
        incumbent.stage = f"window search ({int(free.sum())} free units)"
        data = ml.max_load_data(tg, window, k, problem.group_memory, problem.memory_cap,
                                known_bound)
        model = ml.build_max_load(data)
        ml.set_start(model, data, incumbent.group_device[[groups[0] for groups in window]])
        options = SolveOptions(time_limit_s=min(WINDOW_SECONDS,
                                                until - time.perf_counter()),
                               gap=problem.config.gap, threads=problem.config.threads,
                               cutoff=incumbent.value / data.scale)
        result = run_checked(backend, model, options, incumbent)
        found = ml.unit_devices(model) if result.has_solution else None
        improved = False
        if found is not None:
            unit_of_group = np.empty(tg.num_groups, dtype=np.int64)
            for i, groups in enumerate(window):
                unit_of_group[groups] = i
            group_device = found[unit_of_group]
            if placement_fits(problem, group_device, incumbent, backend):
                value = float(device_loads(tg, group_device, k).max())
                believable(model.L.value * data.scale, value, incumbent, backend)
                improved = incumbent.offer(group_device, value,
                                           f"{backend.name} (window search)")
        if not improved:
            radius = (int(radius * 1.5) + 1 if result.status in ("optimal", "no_solution")
                      else max(WINDOW_RADIUS, radius // 2))


def _snap_side_inputs(incumbent: Incumbent, root: np.ndarray, score) -> None:
    """Move every side input to its neighbour's device: no device's load grows
    (ideal_dp.side_inputs), so the plan is kept whenever its value is no worse."""
    snapped = incumbent.group_device[root]
    value = score(snapped)[0]
    if value <= incumbent.value * (1 + 1e-12):
        incumbent.group_device, incumbent.value = snapped, min(value, incumbent.value)


def _max_load_round(problem: Problem, backend: Backend, incumbent: Incumbent,
                    units: list[list[int]], deadline: float, share: float,
                    source: str, known_bound: float, exact: bool) -> tuple[float, str]:
    """One MILP over `units`; its bound is a fine bound only when the units are
    `exact` (keeping each unit together loses nothing). Only that model gets the
    incumbent as a cutoff (a coarse model may not reach it, and its solution is still
    worth refining)."""
    tg = problem.tg
    fine = exact
    data = ml.max_load_data(tg, units, problem.num_devices, problem.group_memory,
                            problem.memory_cap, known_bound)
    if not worth_a_round(problem, deadline):
        return -math.inf, "time_limit"
    incumbent.stage = f"model build ({source})"
    model = ml.build_max_load(data)
    unit_of_group = np.empty(tg.num_groups, dtype=np.int64)
    for i, groups in enumerate(units):
        unit_of_group[groups] = i
    start = incumbent.group_device[[groups[0] for groups in units]]
    if fine or all(len(set(incumbent.group_device[g].tolist())) == 1 for g in units):
        ml.set_start(model, data, start)
    # The time left is measured after the build: Pyomo takes seconds on big graphs.
    options = _options(problem, deadline, share,
                       incumbent.value / data.scale if fine else None,
                       interior_root=fine and len(units) > INTERIOR_ROOT_UNITS)
    if options is None:
        return -math.inf, "time_limit"
    incumbent.stage = f"solve ({source})"
    result = run_checked(backend, model, options, incumbent)
    unit_device = (ml.unit_devices(model)
                   if result.has_solution and model.L.value is not None else None)
    if result.has_solution and unit_device is None:
        incumbent.notes.append(f"warning: {backend.name} returned a partial solution; "
                               "ignored it")
    if unit_device is not None:
        group_device = unit_device[unit_of_group]
        if placement_fits(problem, group_device, incumbent, backend):
            value = float(device_loads(tg, group_device, problem.num_devices).max())
            believable(model.L.value * data.scale, value, incumbent, backend)
            incumbent.offer(group_device, value, source)
    bound = result.lower_bound * data.scale if fine else -math.inf
    if result.status == "optimal" and fine:
        return max(bound, incumbent.value * (1 - problem.config.gap)), "optimal"
    return bound, "time_limit"


# ---- makespan -------------------------------------------------------------------------

def _makespan(problem: Problem, backend: Backend, incumbent: Incumbent,
              deadline: float) -> tuple[float, str]:
    return mk.solve_makespan(problem, backend, incumbent, deadline)
