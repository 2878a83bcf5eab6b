"""The planning policy: the MILP makes the plans, within one budget, and says so."""

from __future__ import annotations

import dataclasses

import pytest

from placement.milp.backends import BACKENDS
from placement.policy import MIN_SOLVE_S, plan_mp_degrees, plan_worker
from tests.placement.milp_cases import CLUSTER, training_dag

MILP_SOLVERS = {"highs", "cbc", "glpk"}
needs_highs = pytest.mark.skipif(not BACKENDS["highs"].is_available(),
                                 reason="highs not installed")


def capped(seed: int, num_ops: int, share: float):
    """A training DAG whose devices hold `share` of all its state each (the planner's
    default 4 bytes of state per parameter byte)."""
    graph = training_dag(seed, num_ops)
    total = 4 * sum(op.param_bytes for op in graph.ops)
    return dataclasses.replace(graph, metadata={"device_memory_bytes": total * share})


@pytest.mark.solver
@needs_highs
def test_the_milp_makes_the_plan_where_the_heuristics_miss():
    # HONEST_CASES[0] of test_milp (the same graph and cap): every heuristic, the
    # rotated splits and local search miss the optimum at 2 micro-batches on 3
    # devices; the job's policy must still find it.
    plans = plan_mp_degrees(capped(9, 5, 0.7 * 2 / 3), CLUSTER, [3], time_limit_s=20.0,
                            micro_batches=lambda m: (1, 2))
    assert plans[3].solver in MILP_SOLVERS and plans[3].status == "optimal"
    assert plans[3].value == pytest.approx(43.5)  # search_step_time's optimum


@pytest.mark.solver
@needs_highs
def test_one_device_is_proven_optimal_without_a_solve():
    plans = plan_mp_degrees(training_dag(5, 5), CLUSTER, [1], time_limit_s=20.0)
    assert plans[1].status == "optimal" and plans[1].gap == 0
    assert plans[1].solver == "heuristic:single-device"
    assert any("optimal by the analytic bound" in n for n in plans[1].notes)


@pytest.mark.solver
@needs_highs
def test_the_plan_of_least_step_time_over_the_micro_batch_counts_wins():
    graph = training_dag(5, 5)
    each = {k: plan_worker(graph, CLUSTER, num_devices=2, num_micro_batches=k,
                           time_limit_s=10.0) for k in (1, 2)}
    best = plan_mp_degrees(graph, CLUSTER, [2], time_limit_s=20.0,
                           micro_batches=lambda m: (1, 2))[2]
    assert best.step_time == pytest.approx(min(p.step_time for p in each.values()))


def test_a_spent_budget_gives_the_heuristic_plan_and_says_why():
    plans = plan_mp_degrees(training_dag(5, 5), CLUSTER, [2],
                            time_limit_s=MIN_SOLVE_S, micro_batches=lambda m: (1, 2, 4))
    assert plans[2].solver.startswith("heuristic:")
    assert any("planning budget" in n for n in plans[2].notes)


def test_the_plan_says_what_every_micro_batch_count_came_to():
    graph = training_dag(5, 5)
    plans = plan_mp_degrees(graph, CLUSTER, [1, 2], time_limit_s=3.0, solver="heuristic",
                            micro_batches=lambda m: (1,) if m == 1 else (1, 2, 4))
    each = {k: plan_worker(graph, CLUSTER, num_devices=2, num_micro_batches=k,
                           time_limit_s=1.0, solver="heuristic").value for k in (1, 2, 4)}
    unit = plans[2].time_unit
    scale, shown = (1e3, "ms") if unit == "s" else (1.0, unit)
    assert ("value per micro-batch count: " + ", ".join(
        f"K={k} {v * scale:.4g} {shown}" for k, v in each.items())) in plans[2].notes
    assert plans[2].value == min(each.values())
    # One count tried: nothing to compare.
    assert not any(n.startswith("value per micro-batch count") for n in plans[1].notes)
