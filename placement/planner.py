"""`plan(graph, cluster, config) -> Plan`: the one entry point to placement.

The problem types live in `placement.problem` (the MILP builds on them too); they are
re-exported here, as the names a caller of `plan` needs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from placement.cluster import ClusterSpec
from placement.errors import UserError
from placement.graph import OpGraph
from placement.plan import Plan
from placement.problem import (
    InfeasiblePlacementError,
    PlanConfig,
    Problem,
    best_heuristic,
    finish_plan,
    heuristic_placements,
    make_problem,
)

__all__ = ["SOLVERS", "InfeasiblePlacementError", "PlanConfig", "Problem", "best_heuristic",
           "finish_plan", "heuristic_placements", "make_problem", "plan", "solve_heuristic"]

Solver = Callable[[Problem], Plan]
SOLVERS: dict[str, Solver] = {}


def plan(graph: OpGraph, cluster: ClusterSpec, config: PlanConfig) -> Plan:
    """Place one worker's ops onto its `config.num_devices` devices."""
    try:
        solver = SOLVERS[config.solver]
    except KeyError:
        raise UserError(f"solver {config.solver!r} is unknown: choose one of "
                        f"{', '.join(SOLVERS)}") from None
    return solver(make_problem(graph, cluster, config))


def solve_heuristic(problem: Problem) -> Plan:
    started = time.perf_counter()
    name, group_device, _ = best_heuristic(problem)
    return finish_plan(problem, group_device, solver=f"heuristic:{name}", status="heuristic",
                       lower_bound=problem.lower_bound(),
                       solve_seconds=time.perf_counter() - started)


SOLVERS["heuristic"] = solve_heuristic


def _milp_solver(name: str) -> Solver:
    def solve(problem: Problem) -> Plan:
        # Imported on use: Pyomo is slow to import, and a heuristic plan needs none.
        from placement.milp.solve import solve_plan

        return solve_plan(problem, name)
    return solve


for _name in ("glpk", "cbc", "highs", "auto"):
    SOLVERS[_name] = _milp_solver(_name)
