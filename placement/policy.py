"""The one planning policy: how every command that needs a worker's plan gets it.

For each mp_degree and each micro-batch count to try, the MILP with `solver` (default
'auto': HiGHS, else CBC, else GLPK), warm-started from the best heuristic and falling
back to it with a note naming why (`placement.milp.solve.solve_plan`), each given an
equal share of what is left of one total time budget. Of an mp_degree's micro-batch
counts, the plan of least predicted step time (or max-load) wins. The job's planning stage, the
cross-over CLI, `orchestrator train` without --plan and `orchestrator plan` all call it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from placement.cluster import ClusterSpec
from placement.errors import UserError
from placement.graph import OpGraph
from placement.plan import Plan
from placement.planner import PlanConfig, plan

DEFAULT_SOLVER = "auto"
#: Micro-batch counts a job tries on more than one device (and the profiler times a
#: split step at: orchestrator/profile/costs.py measure_split_costs).
MICRO_BATCH_COUNTS = (1, 2, 4)
#: Least time worth handing a MILP solve; with less left, the heuristic plans alone.
MIN_SOLVE_S = 1.0


def job_micro_batches(mp_degree: int) -> tuple[int, ...]:
    """Micro-batch counts a job tries: 1 on one device (nothing to pipeline), else 1, 2
    and 4."""
    return (1,) if mp_degree == 1 else MICRO_BATCH_COUNTS


def plan_mp_degrees(graph: OpGraph, cluster: ClusterSpec, mp_degrees: Sequence[int], *,
                    time_limit_s: float, solver: str = DEFAULT_SOLVER,
                    micro_batches: Callable[[int], Sequence[int]] = job_micro_batches,
                    objective: str = "makespan", gap: float = 0.01,
                    threads: int | None = None) -> dict[int, Plan]:
    """Per mp_degree, the plan of least value (the objective's: step time by default)
    over `micro_batches(m)`, all of them within `time_limit_s` seconds in total."""
    if time_limit_s <= 0:
        raise UserError(f"a planning time limit of {time_limit_s} s: give more than 0")
    jobs = [(m, k) for m in mp_degrees for k in micro_batches(m)]
    deadline = time.perf_counter() + time_limit_s
    best: dict[int, Plan] = {}
    values: dict[int, dict[int, float]] = {m: {} for m in mp_degrees}
    for i, (m, k) in enumerate(jobs):
        share = (deadline - time.perf_counter()) / (len(jobs) - i)
        enough = share >= MIN_SOLVE_S
        p = plan(graph, cluster, PlanConfig(
            num_devices=m, num_micro_batches=k, objective=objective,
            solver=solver if enough else "heuristic",
            time_limit_s=share if enough else MIN_SOLVE_S, gap=gap, threads=threads))
        if not enough:
            p = _with_note(p, f"the planning budget of {time_limit_s:g} s was spent: "
                              f"{solver} did not run, the plan is the heuristic's")
        values[m][k] = p.value
        if m not in best or p.value < best[m].value:
            best[m] = p
    return {m: _with_note(p, micro_batch_note(values[m], p.time_unit))
            if len(values[m]) > 1 else p for m, p in best.items()}


def micro_batch_note(values: dict[int, float], time_unit: str) -> str:
    """The note on an mp_degree's plan that says what every micro-batch count tried
    came to, so that the choice of K can be read (and checked against a measure)."""
    scale, unit = (1e3, "ms") if time_unit == "s" else (1.0, time_unit)
    return "value per micro-batch count: " + ", ".join(
        f"K={k} {v * scale:.4g} {unit}" for k, v in sorted(values.items()))


def plan_worker(graph: OpGraph, cluster: ClusterSpec, *, num_devices: int,
                num_micro_batches: int = 1, time_limit_s: float,
                solver: str = DEFAULT_SOLVER, objective: str = "makespan",
                gap: float = 0.01, threads: int | None = None) -> Plan:
    """One worker's plan for one micro-batch count, within `time_limit_s`."""
    return plan_mp_degrees(graph, cluster, [num_devices], time_limit_s=time_limit_s,
                           solver=solver, micro_batches=lambda _: (num_micro_batches,),
                           objective=objective, gap=gap, threads=threads)[num_devices]


def _with_note(p: Plan, note: str) -> Plan:
    return dataclasses.replace(p, notes=(*p.notes, note))
