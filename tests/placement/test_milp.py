"""The placement MILP against brute force, per solver; failures and limits."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from placement.errors import UserError
from placement.io import load_graph
from placement.milp.backends import BACKENDS, Backend, SolveResult, choose_backend
from placement.milp.solve import solve_plan
from placement.planner import SOLVERS, best_heuristic
from placement.simulate import evaluate_order, max_load
from tests.placement.milp_cases import (
    brute_max_load,
    brute_step_time,
    problem,
    random_dag,
)

SOLVER_NAMES = ("glpk", "cbc", "highs")


def installed(name: str) -> bool:
    return BACKENDS[name].is_available()


needs = {name: pytest.mark.skipif(not installed(name), reason=f"{name} not installed")
         for name in SOLVER_NAMES}
CASES = [(seed, 5 + seed % 3, 2 + seed % 2) for seed in range(3)]


@pytest.mark.solver
@pytest.mark.parametrize("solver", [pytest.param(s, marks=needs[s]) for s in SOLVER_NAMES])
@pytest.mark.parametrize("seed,num_ops,k", CASES)
def test_max_load_is_the_brute_force_optimum(solver, seed, num_ops, k):
    p = problem(random_dag(seed, num_ops, colocate=seed == 1), k, "max-load")
    plan = solve_plan(p, solver)
    assert plan.value == pytest.approx(brute_max_load(p.tg, k), rel=1e-9)
    assert plan.status == "optimal"
    assert plan.lower_bound == pytest.approx(plan.value, rel=1e-6)
    assert max_load(p.tg, p.tg.group_devices(dict(plan.assignment)), k) == plan.value


@pytest.mark.solver
@pytest.mark.parametrize("solver", [pytest.param(s, marks=needs[s]) for s in SOLVER_NAMES])
@pytest.mark.parametrize("seed,num_ops,k", CASES)
def test_step_time_is_the_brute_force_optimum(solver, seed, num_ops, k):
    p = problem(random_dag(seed + 10, num_ops, colocate=seed == 1), k, "makespan")
    plan = solve_plan(p, solver)
    assert plan.value == pytest.approx(brute_step_time(p.tg, k), rel=1e-9)
    assert plan.status == "optimal"
    # The plan's own order reproduces its value in the simulator.
    gd = p.tg.group_devices(dict(plan.assignment))
    index = {tuple(t.label()): i for i, t in enumerate(p.tg.tasks)}
    order = [[index[tuple(task)] for task in tasks] for tasks in plan.order]
    assert evaluate_order(p.tg, gd, order).step_time_s == pytest.approx(plan.value)


def test_solvers_are_registered_in_the_planner():
    assert {"glpk", "cbc", "highs", "auto"} <= set(SOLVERS)


def _unavailable(name: str, install: str) -> Backend:
    return Backend(name=name, install=install, is_available=lambda: False,
                   run=BACKENDS["highs"].run, takes_warm_start=False)


def test_a_missing_solver_names_its_install_command():
    backends = {"highs": _unavailable("highs", "pip install highspy")}
    with pytest.raises(UserError, match="pip install highspy"):
        choose_backend("highs", backends)
    with pytest.raises(UserError, match="unknown"):
        choose_backend("gurobi-nope", backends)


@pytest.mark.skipif(not installed("glpk"), reason="glpk not installed")
def test_auto_falls_back_to_an_installed_solver():
    backends = {"highs": _unavailable("highs", "pip install highspy"),
                "cbc": _unavailable("cbc", "apt-get install coinor-cbc"),
                "glpk": BACKENDS["glpk"]}
    assert choose_backend("auto", backends).name == "glpk"
    p = problem(random_dag(3, 6), 2, "max-load")
    assert solve_plan(p, "auto", backends).solver == "glpk"
    with pytest.raises(UserError, match="coinor-cbc"):
        choose_backend("auto", {"cbc": backends["cbc"]})


def _fake(run) -> dict[str, Backend]:
    return {"fake": Backend(name="fake", install="-", is_available=lambda: True, run=run,
                            takes_warm_start=False)}


def test_a_crashing_solver_leaves_the_heuristic_plan_with_a_warning():
    def crash(model, options):
        raise RuntimeError("segfault-like failure")

    p = problem(random_dag(4, 7), 3, "max-load")
    plan = solve_plan(p, "fake", _fake(crash))
    assert plan.value <= best_heuristic(p)[2] + 1e-12
    assert any("fake failed" in n for n in plan.notes)


@pytest.mark.parametrize("objective", ["max-load", "makespan"])
def test_a_solver_claiming_a_wrong_value_is_not_believed(objective):
    def lie(model, options):
        # Every unit on device 0, and an objective of zero: the simulator disagrees.
        for (u, d), var in model.x.items():
            var.value = float(d == 0)
        (model.L if objective == "max-load" else model.C).value = 0.0
        return SolveResult(solver="fake", status="optimal", has_solution=True,
                           lower_bound=0.0, seconds=0.0)

    p = problem(random_dag(5, 7), 2, objective)
    plan = solve_plan(p, "fake", _fake(lie))
    assert plan.value <= best_heuristic(p)[2] + 1e-12
    assert plan.lower_bound >= p.lower_bound() - 1e-12
    assert any("simulator gives" in n for n in plan.notes)


@pytest.mark.solver
@pytest.mark.skipif(not installed("highs"), reason="highs not installed")
@pytest.mark.parametrize("objective", ["max-load", "makespan"])
def test_time_limit_returns_the_best_plan_so_far_marked_with_its_gap(objective):
    p = problem(random_dag(7, 40, edge_prob=0.1), 4, objective, time_limit_s=2.0,
                gap=0.0)
    started = time.perf_counter()
    plan = solve_plan(p, "highs")
    assert time.perf_counter() - started < 2.0 + 10.0
    assert plan.value <= best_heuristic(p)[2] + 1e-12
    assert plan.lower_bound <= plan.value
    if plan.status == "time_limit":
        assert any(f"{plan.gap:.2%}" in n for n in plan.notes)
    else:
        assert plan.status == "optimal" and math.isclose(plan.gap, 0, abs_tol=1e-6)


@pytest.mark.solver
@pytest.mark.parametrize("solver", [pytest.param(s, marks=needs[s]) for s in SOLVER_NAMES])
def test_never_worse_than_the_heuristic_on_a_peer_graph(solver, peer_graphs):
    from placement.planner import PlanConfig, make_problem
    from tests.placement.milp_cases import CLUSTER

    graph = load_graph(peer_graphs / "bert24_training.json")
    for objective in ("max-load", "makespan"):
        p = make_problem(graph, CLUSTER, PlanConfig(num_devices=6, objective=objective,
                                                    time_limit_s=3.0))
        plan = solve_plan(p, solver)
        assert plan.value <= best_heuristic(p)[2] * (1 + 1e-12)
        assert plan.lower_bound <= plan.value
        assert np.isfinite(plan.value)


def test_the_planner_loads_pyomo_only_when_a_milp_solver_runs():
    import subprocess
    import sys

    code = ("import sys, placement.planner; "
            "assert 'pyomo' not in sys.modules and 'highspy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parents[2])


@pytest.mark.solver
@pytest.mark.skipif(not installed("highs"), reason="highs not installed")
def test_the_cli_plans_with_a_milp_solver(capsys):
    import json

    from orchestrator.cli import main

    root = Path(__file__).resolve().parents[2]
    assert main(["plan", "--graph", str(root / "examples" / "branchy.json"),
                 "--devices", "2", "--solver", "highs", "--time-limit", "10",
                 "--gap", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["solver"] == "highs" and out["status"] == "optimal"
    assert out["value"] == pytest.approx(out["lower_bound"])


@pytest.mark.parametrize("objective", ["max-load", "makespan"])
def test_a_partial_solution_is_ignored_with_a_warning(objective):
    def partial(model, options):
        for var in model.x.values():
            var.value = None
        return SolveResult(solver="fake", status="time_limit", has_solution=True,
                           lower_bound=0.0, seconds=0.0)

    p = problem(random_dag(6, 7), 2, objective)
    plan = solve_plan(p, "fake", _fake(partial))
    assert plan.value <= best_heuristic(p)[2] + 1e-12
    assert any("partial solution" in n for n in plan.notes)
