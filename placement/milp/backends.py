"""The checked solve step: run one MILP solver on a built Pyomo model.

Each backend knows how to tell whether it is installed, how to install it, and how to
run with a time limit, a relative gap, a thread count and (where the solver takes one)
the model's current variable values as a warm start. The result is a small frozen
record; the solution, when there is one, is loaded into the model's variables.
"""

from __future__ import annotations

import contextlib
import logging
import math
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyomo.environ as pyo
from pyomo.common.errors import ApplicationError
from pyomo.opt import SolverStatus, TerminationCondition

from placement.errors import UserError

#: Order in which `auto` tries the solvers: HiGHS and CBC are far stronger than GLPK
#: on these models (SOLVER_NOTES.md), and HiGHS ships with pip.
AUTO_ORDER = ("highs", "cbc", "glpk")


class SolverUnavailableError(UserError):
    """The requested MILP solver is not installed."""


@dataclass(frozen=True, kw_only=True)
class SolveOptions:
    time_limit_s: float
    """Wall-clock limit handed to the solver."""
    gap: float
    """Relative gap at which the solver may stop."""
    threads: int | None = None
    """Solver threads; None lets the solver choose."""
    warm_start: bool = True
    """Hand the model's current variable values to solvers that take a start."""
    cutoff: float | None = None
    """The incumbent's objective value (the heuristic's): only better plans matter."""
    interior_root: bool = False
    """Solve the root LP by the interior point method (HiGHS's `mip_lp_solver`; the
    other solvers ignore it): on the fine max-load model of decomposed ResNet-50
    (24,000 columns) the dual simplex took 12-14 s of a 12 s limit, so whether the run
    proved the LP's bound was the load's call; the interior point method took 7 s."""

    def __post_init__(self) -> None:
        if self.time_limit_s <= 0:
            raise ValueError(f"time_limit_s={self.time_limit_s} must be > 0")
        if not 0 <= self.gap < 1:
            raise ValueError(f"gap={self.gap} must lie in [0, 1)")


@dataclass(frozen=True, kw_only=True)
class SolveResult:
    solver: str
    status: str
    """'optimal', 'time_limit' (stopped with a solution), 'no_solution', or 'error'."""
    has_solution: bool
    """Whether the model's variables now hold the solver's solution."""
    lower_bound: float
    """The solver's proven bound on the objective (-inf when it proved none)."""
    seconds: float
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class Backend:
    name: str
    install: str
    """How a user installs it, for the error message."""
    is_available: Callable[[], bool]
    run: Callable[[pyo.ConcreteModel, SolveOptions], SolveResult]
    takes_warm_start: bool


def _highs_available() -> bool:
    from pyomo.contrib.solver.common.factory import SolverFactory

    return bool(SolverFactory("highs").available())


def _run_highs(model: pyo.ConcreteModel, options: SolveOptions) -> SolveResult:
    # Pyomo's new solver interface: the older appsi_highs hung past its time limit on
    # a 576-binary model on this machine (SOLVER_NOTES.md).
    from pyomo.contrib.solver.common.results import (
        SolutionStatus,
        TerminationCondition as Term,
    )

    started = time.perf_counter()
    solver_options = {}
    if options.cutoff is not None:
        # A cutoff just above the incumbent's value prunes every node that cannot
        # beat it.
        solver_options["objective_bound"] = options.cutoff * (1 + 1e-9) + 1e-12
    if options.interior_root:
        solver_options["mip_lp_solver"] = "ipm"
    res = _highs_solver(options.warm_start).solve(
        model, time_limit=options.time_limit_s, rel_gap=options.gap,
        threads=options.threads, load_solutions=False, solver_options=solver_options,
        raise_exception_on_nonoptimal_result=False)
    has = res.solution_status in (SolutionStatus.feasible, SolutionStatus.optimal)
    if has:
        res.solution_loader.load_vars()
    bound = res.objective_bound
    bound = -math.inf if bound is None or not math.isfinite(bound) else float(bound)
    term = res.termination_condition
    if term == Term.convergenceCriteriaSatisfied and has:
        status = "optimal"
    elif term in (Term.provenInfeasible, Term.infeasibleOrUnbounded, Term.objectiveLimit):
        # Nothing beats the cutoff: the incumbent is optimal up to the gap.
        status = "no_solution"
        if "objective_bound" in solver_options and term != Term.objectiveLimit:
            bound = max(bound, solver_options["objective_bound"] * (1 - options.gap))
    elif has:
        status = "time_limit"
    else:
        status = "no_solution"
    return SolveResult(solver="highs", status=status, has_solution=has, lower_bound=bound,
                       seconds=time.perf_counter() - started, message=str(term))


def _highs_solver(warm_start: bool):
    """Pyomo's HiGHS interface; with `warm_start`, one that hands the model's current
    variable values to HiGHS as a MIP start just before it runs. The interface has no
    option for a start, and its update step clears one set any earlier. A start lets
    HiGHS's improvement heuristics (RINS, local search) work around the incumbent,
    which a cutoff alone does not."""
    from pyomo.contrib.solver.solvers.highs import Highs

    if not warm_start:
        return Highs()

    class HighsWithStart(Highs):
        def _solve(self):
            columns = self._pyomo_var_to_solver_var_map
            variables = self._model.component_data_objects(pyo.Var, active=True)
            known = [(columns[id(v)], float(v.value)) for v in variables
                     if v.value is not None and id(v) in columns]
            if known:
                index, value = zip(*known)
                self._solver_model.setSolution(len(index), np.array(index, dtype=np.int32),
                                               np.array(value, dtype=np.float64))
            return super()._solve()

    return HighsWithStart()


@contextlib.contextmanager
def _quiet(logger: str):
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _shell_available(name: str) -> bool:
    return bool(pyo.SolverFactory(name).available(exception_flag=False))


def _run_shell(name: str, model: pyo.ConcreteModel, options: SolveOptions) -> SolveResult:
    """CBC or GLPK through their executables."""
    solver = pyo.SolverFactory(name)
    if name == "cbc":
        # CBC counts CPU seconds unless told otherwise; on a shared machine that lets
        # it run far past a wall-clock limit.
        solver.options["timeMode"] = "elapsed"
        solver.options["seconds"] = options.time_limit_s
        solver.options["ratioGap"] = options.gap
        if options.threads:
            solver.options["threads"] = options.threads
        # A hard stop past the limit: CBC has spent minutes in a MIP start or root LP on
        # big models without looking at its clock. (Pyomo would hand the same figure to
        # glpsol as a fractional --tmlim, which glpsol rejects; it overruns less anyway.)
        grace = max(5.0, 0.25 * options.time_limit_s)
        kwargs = {"warmstart": options.warm_start,
                  "timelimit": options.time_limit_s + grace}
    else:
        # glpsol checks its limit only between steps and overruns it on big models.
        solver.options["tmlim"] = max(1, math.floor(0.9 * options.time_limit_s))
        solver.options["mipgap"] = options.gap
        kwargs = {}
    started = time.perf_counter()
    try:
        res = solver.solve(model, load_solutions=False, **kwargs)
    except subprocess.TimeoutExpired:
        return SolveResult(solver=name, status="error", has_solution=False,
                           lower_bound=-math.inf, seconds=time.perf_counter() - started,
                           message=f"{name} ran well past its time limit and was stopped")
    except ApplicationError as exc:
        # glpsol exits abnormally when its time limit strikes before it has written a
        # solution file (SOLVER_NOTES.md): there is no solution to load.
        return SolveResult(solver=name, status="error", has_solution=False,
                           lower_bound=-math.inf, seconds=time.perf_counter() - started,
                           message=f"{name} did not exit normally: {exc}")
    seconds = time.perf_counter() - started
    term = res.solver.termination_condition
    has = len(res.solution) > 0 and res.solver.status in (
        SolverStatus.ok, SolverStatus.aborted, SolverStatus.warning)
    if has:
        # Pyomo warns when it loads the solution of a run stopped by its time limit;
        # that is expected here, and the caller reports the gap instead.
        with _quiet("pyomo.core"):
            model.solutions.load_from(res)
    bound = res.problem.lower_bound
    bound = float(bound) if bound is not None and math.isfinite(float(bound)) else -math.inf
    if term == TerminationCondition.optimal and has:
        status = "optimal"
    elif has:
        status = "time_limit"
    elif term in (TerminationCondition.infeasible, TerminationCondition.error):
        status = "error"
    else:
        status = "no_solution"
    return SolveResult(solver=name, status=status, has_solution=has, lower_bound=bound,
                       seconds=seconds, message=f"{res.solver.status}/{term}")


BACKENDS: dict[str, Backend] = {
    "highs": Backend(name="highs", install="pip install highspy",
                     is_available=_highs_available, run=_run_highs,
                     takes_warm_start=True),
    "cbc": Backend(name="cbc", install="apt-get install coinor-cbc",
                   is_available=lambda: _shell_available("cbc"),
                   run=lambda m, o: _run_shell("cbc", m, o), takes_warm_start=True),
    "glpk": Backend(name="glpk", install="apt-get install glpk-utils",
                    is_available=lambda: _shell_available("glpk"),
                    run=lambda m, o: _run_shell("glpk", m, o), takes_warm_start=False),
}


def choose_backend(name: str, backends: Mapping[str, Backend] = BACKENDS) -> Backend:
    """The backend to run for `name`; 'auto' picks the first installed of AUTO_ORDER."""
    if name == "auto":
        for candidate in AUTO_ORDER:
            if candidate in backends and backends[candidate].is_available():
                return backends[candidate]
        raise SolverUnavailableError(
            "no MILP solver is installed: " + "; ".join(
                f"{backends[n].install} (for {n})" for n in AUTO_ORDER if n in backends)
            + "; or use --solver heuristic")
    backend = backends.get(name)
    if backend is None:
        raise SolverUnavailableError(f"MILP solver {name!r} is unknown: choose one of "
                                     f"{', '.join(backends)} or auto")
    if not backend.is_available():
        raise SolverUnavailableError(
            f"MILP solver {name!r} is not installed: {backend.install}, or use "
            "--solver auto (it falls back to an installed one)")
    return backend
