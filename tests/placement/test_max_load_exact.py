"""Max-load MILP exactness where no heuristic reaches the optimum, per solver.

Each case is a training graph (every op with a backward task on its device, ops 0 and
n-1 colocated) under a memory cap that binds (the capped optimum is worse than the
free one), on which every baseline placer, the ideal DP included, is strictly worse
than the brute-force optimum: a solver that returned its start would fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from placement.ideal_dp import ideal_split
from placement.milp.backends import BACKENDS
from placement.milp.solve import solve_plan
from placement.planner import heuristic_placements
from placement.simulate import max_load
from tests.placement.max_load_cases import brute_max_load, fits, max_load_problem, training_dag

SOLVERS = ("highs", "cbc", "glpk")
#: (seed, ops, devices) found by search; the test re-checks what makes each one hard.
CASES = ((3, 6, 2), (11, 7, 3), (5, 7, 2), (11, 6, 2))


def _case(seed: int, num_ops: int, k: int, solver: str = "heuristic"):
    graph = training_dag(seed, num_ops, colocate=True)
    cap = sum(op.param_bytes for op in graph.ops) / k * 1.15
    return (max_load_problem(graph, k, memory_cap=cap, solver=solver),
            max_load_problem(graph, k))


@pytest.mark.parametrize("seed,num_ops,k", CASES)
def test_every_heuristic_is_strictly_worse_and_the_cap_binds(seed, num_ops, k):
    capped, free = _case(seed, num_ops, k)
    optimum = brute_max_load(capped, contiguous=False)
    assert optimum > brute_max_load(free, contiguous=False)
    values = [max_load(capped.tg, gd, k) for gd in heuristic_placements(capped).values()
              if fits(capped, gd)]
    ideal = ideal_split(capped.tg, k, capped.group_memory, capped.memory_cap)
    values += [ideal.value] if ideal is not None else []
    assert values and min(values) > optimum * (1 + 1e-9)


@pytest.mark.solver
@pytest.mark.parametrize("solver", [
    pytest.param(s, marks=pytest.mark.skipif(not BACKENDS[s].is_available(),
                                             reason=f"{s} not installed"))
    for s in SOLVERS])
@pytest.mark.parametrize("seed,num_ops,k", CASES)
def test_max_load_milp_finds_the_capped_optimum(solver, seed, num_ops, k):
    capped, _ = _case(seed, num_ops, k, solver)
    plan = solve_plan(capped, solver)
    group_device = capped.tg.group_devices(dict(plan.assignment))  # checks colocation
    assert fits(capped, group_device)
    assert plan.value == pytest.approx(brute_max_load(capped, contiguous=False), rel=1e-9)
    assert plan.status == "optimal"
    assert plan.lower_bound == pytest.approx(plan.value, rel=1e-6)
    assert np.isclose(max_load(capped.tg, group_device, k), plan.value)


def test_a_heuristic_that_strands_a_group_is_skipped_not_an_internal_error():
    """HEFT's greedy order fills both devices before the last group on this graph: its
    placement breaks the cap, and the plan comes from a heuristic that fits instead of
    an AssertionError."""
    graph = training_dag(55, 6)
    p = max_load_problem(graph, 2,
                         memory_cap=sum(op.param_bytes for op in graph.ops) / 2 * 1.15)
    assert not fits(p, heuristic_placements(p)["heft"])
    plan = solve_plan(p, "highs")
    assert fits(p, p.tg.group_devices(dict(plan.assignment)))
