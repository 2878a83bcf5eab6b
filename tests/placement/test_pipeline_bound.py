"""The step-time relaxation and the order round of the step-time MILP: the relaxation's
bound never exceeds the brute-force optimum and beats the analytic and window bounds
where a placement must pay fill, drain or transfers, also with only some groups'
placement integral; the order round finds the best order of a placement whose list
schedule is not."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.milp import pipeline_bound
from placement.milp.backends import BACKENDS, SolveOptions
from placement.milp.incumbent import Incumbent
from placement.milp.makespan import order_round
from placement.milp.pipeline_bound import (
    build_relaxation,
    integral_order,
    relaxation_data,
    solve_relaxation,
)
from placement.milp.solve import solve_plan
from placement.problem import best_heuristic
from placement.simulate import list_schedule
from placement.step_bound import step_time_bound
from tests.placement.helpers import chain_graph
from tests.placement.milp_cases import (
    _search_order,
    problem,
    random_dag,
    search_step_time,
    training_dag,
)


def relaxation_bound(p, solver: str = "highs") -> float:
    name, group_device, value = best_heuristic(p)
    incumbent = Incumbent(group_device, value, name)
    result = solve_relaxation(p, BACKENDS[solver], incumbent, time.perf_counter() + 20)
    assert not incumbent.notes, incumbent.notes
    return result.bound


# Seeds whose brute force takes at most a few seconds (seed 8's takes 20 s, 11's minutes).
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5, 6, 7, 9, 10])
def test_the_bound_is_at_most_the_brute_force_optimum(seed):
    k = 2 + seed % 2
    p = problem(training_dag(seed, 3 + seed % 3), k, "makespan", num_micro_batches=2)
    assert relaxation_bound(p) <= search_step_time(p.tg, k) * (1 + 1e-6)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), num_ops=st.integers(1, 12), k=st.integers(1, 4),
       micro=st.integers(1, 3), colocate=st.booleans())
def test_no_placement_beats_the_bound(seed, num_ops, k, micro, colocate):
    p = problem(random_dag(seed, num_ops, colocate=colocate), k, "makespan",
                num_micro_batches=micro)
    group_device = np.random.default_rng(seed).integers(0, k, size=p.tg.num_groups)
    assert list_schedule(p.tg, group_device, k).step_time_s >= (
        relaxation_bound(p) * (1 - 1e-6))


def placement_value(p, group_device: np.ndarray) -> float:
    """The relaxation's rows at one placement, heads and tails those it implies."""
    data = relaxation_data(p, upper_bound=1e6)
    model = build_relaxation(data)
    pipeline_bound.set_start(model, data, group_device)
    return model.C.value * data.scale


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), num_ops=st.integers(2, 9), k=st.integers(2, 4),
       micro=st.integers(1, 3))
def test_every_row_holds_on_every_placement(seed, num_ops, k, micro):
    # Each row, with a device's entry and exit delays, is at most the list schedule of
    # the placement whose heads and tails it is given.
    p = problem(training_dag(seed, num_ops), k, "makespan", num_micro_batches=micro)
    group_device = np.random.default_rng(seed).integers(0, k, size=p.tg.num_groups)
    assert placement_value(p, group_device) <= (
        list_schedule(p.tg, group_device, k).step_time_s * (1 + 1e-9))


def test_a_device_without_work_in_a_window_is_charged_at_most_its_chain():
    # All of a three-op chain on one device, transfers of 10 against times of 1: the
    # empty device's delays into and out of op0's window would be 11 each, but the
    # window's own chain (op0 to op0', 6) is all a plan must run between its ends.
    p = problem(chain_graph([1, 1, 1], cost=10.0, backward=[1, 1, 1]), 2, "makespan")
    together = np.zeros(p.tg.num_groups, dtype=np.int64)
    assert list_schedule(p.tg, together, 2).step_time_s == pytest.approx(6.0)
    assert placement_value(p, together) == pytest.approx(6.0)


@pytest.mark.parametrize("seed", [20, 22])
def test_entry_and_exit_delays_raise_the_bound_to_the_optimum(seed, monkeypatch):
    # Two devices, two micro-batches: a device that holds neither end of a window
    # starts its share of it only after a transfer in and ends it a transfer before
    # the end; without the delays the bound is 1-1.5 below the optimum.
    p = problem(training_dag(seed, 3 + seed % 3), 2, "makespan", num_micro_batches=2)
    optimum = search_step_time(p.tg, 2)
    assert relaxation_bound(p) == pytest.approx(optimum, rel=1e-6)
    monkeypatch.setattr(pipeline_bound, "window_delays", lambda tg, pairs, *_: (
        np.zeros(len(pairs)), np.zeros(len(pairs))))
    assert relaxation_bound(p) <= optimum - 1


def partial_bound(p, count: int) -> float:
    """The relaxation's optimum with the first `count` groups of `integral_order`
    integral, the rest in [0, 1]."""
    data = relaxation_data(p, upper_bound=1e6)
    model = build_relaxation(data, integral_order(data.tg)[:count])
    result = BACKENDS["highs"].run(model, SolveOptions(time_limit_s=20, gap=0.0))
    assert result.status == "optimal"
    return result.lower_bound * data.scale


# (seed, ops, devices): two micro-batches; with 2 of the 3-4 groups integral the bound
# is above the LP's (no group integral) and already the optimum.
PARTIAL_CASES = [(1, 4, 3), (9, 5, 3), (2, 4, 2)]


@pytest.mark.parametrize("case", PARTIAL_CASES)
def test_partial_integrality_bounds_rise_with_it_and_stay_below_the_optimum(case):
    seed, num_ops, k = case
    p = problem(training_dag(seed, num_ops), k, "makespan", num_micro_batches=2)
    optimum = search_step_time(p.tg, k)
    bounds = [partial_bound(p, c) for c in range(p.tg.num_groups + 1)]
    assert all(a <= b * (1 + 1e-6) for a, b in zip(bounds, bounds[1:]))
    assert bounds[-1] <= optimum * (1 + 1e-6)
    assert bounds[0] < bounds[2] == pytest.approx(optimum, rel=1e-6)


@pytest.mark.parametrize("seed", [1, 3, 9])
def test_the_partial_rounds_keep_the_bound_valid(seed, monkeypatch):
    # One integral group first, then two, then the full model from their floor.
    monkeypatch.setattr(pipeline_bound, "FIRST_INTEGRAL", 1)
    monkeypatch.setattr(pipeline_bound, "PARTIAL_MIN_GROUPS", 1)
    k = 3
    p = problem(training_dag(seed, 5), k, "makespan", num_micro_batches=2)
    assert relaxation_bound(p) <= search_step_time(p.tg, k) * (1 + 1e-6)


@pytest.mark.parametrize("rises, calls", [(False, 2), (True, 3)])
def test_the_partial_rounds_stop_when_a_doubling_leaves_the_bound(rises, calls,
                                                                  monkeypatch):
    # Four groups: partial models of 1 and 2 integral groups, then the full model.
    monkeypatch.setattr(pipeline_bound, "FIRST_INTEGRAL", 1)
    monkeypatch.setattr(pipeline_bound, "PARTIAL_MIN_GROUPS", 1)
    p = problem(training_dag(3, 5), 2, "makespan", num_micro_batches=2)
    assert p.tg.num_groups == 4
    solved = []

    def fake_solve(problem, backend, incumbent, deadline, proven, max_pairs, integral):
        solved.append(integral)
        return 1.0 + len(solved) * rises, None

    monkeypatch.setattr(pipeline_bound, "_solve", fake_solve)
    name, group_device, value = best_heuristic(p)
    result = solve_relaxation(p, BACKENDS["highs"], Incumbent(group_device, value, name),
                              time.perf_counter() + 20)
    assert len(solved) == calls
    assert result.bound == 1.0 + calls * rises
    assert (solved[-1] is None) == rises


@pytest.mark.parametrize("solver", ["highs", "cbc", "glpk"])
def test_fill_and_drain_raise_the_bound_to_the_optimum(solver):
    # Three ops with backward, two micro-batches, two devices: the window bound is 20;
    # every placement either serialises the groups or pays a pipeline's fill, drain and
    # transfers, and the optimum, 24.5, is what the relaxation proves.
    p = problem(training_dag(6, 3), 2, "makespan", num_micro_batches=2)
    assert step_time_bound(p.tg, 2) == pytest.approx(20.0)
    assert search_step_time(p.tg, 2) == pytest.approx(24.5)
    assert relaxation_bound(p, solver) == pytest.approx(24.5, rel=1e-6)


def test_the_plan_reports_the_relaxation_bound():
    p = problem(training_dag(6, 3), 2, "makespan", solver="highs", num_micro_batches=2)
    plan = solve_plan(p, "highs")
    assert plan.value == pytest.approx(24.5)
    assert plan.lower_bound == pytest.approx(24.5, rel=1e-6)
    assert plan.status == "optimal"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_order_round_finds_the_best_order_of_the_placement(seed):
    # Placements found by search whose list schedule (upward rank) is not their best
    # order; the brute force over orders gives that best.
    p = problem(random_dag(seed, 7), 2, "makespan")
    tg = p.tg
    group_device = {0: [0, 0, 0, 0, 1, 1, 0], 1: [0, 0, 0, 0, 0, 0, 1],
                    2: [0, 0, 0, 0, 0, 1, 1], 3: [0, 0, 0, 0, 0, 1, 0]}[seed]
    group_device = np.array(group_device)
    listed = list_schedule(tg, group_device, 2).step_time_s
    position = np.empty(tg.num_tasks, dtype=np.int64)
    position[list(tg.topological_order)] = np.arange(tg.num_tasks)
    tail = np.zeros(tg.num_tasks)
    for t in reversed(tg.topological_order):
        tail[t] = tg.duration_s[t] + max((tail[s] for s, _ in tg.successors[t]),
                                         default=0.0)
    best = [np.inf]
    _search_order(tg, tg.task_devices(group_device), 2, position, tail, best)
    assert best[0] < listed - 1e-9
    incumbent = Incumbent(group_device, listed, "listed")
    order_round(p, BACKENDS["highs"], incumbent, time.perf_counter() + 10)
    assert incumbent.value == pytest.approx(best[0])
    assert incumbent.source == "highs order on the listed placement"
    assert incumbent.order is not None
