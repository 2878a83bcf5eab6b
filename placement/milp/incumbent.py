"""The best plan so far, and the checks a solver's answer passes before it counts."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import pyomo.environ as pyo

from placement.milp.backends import Backend, SolveOptions, SolveResult
from placement.problem import Problem


@dataclass
class Incumbent:
    """The best plan so far and how it came about."""

    group_device: np.ndarray
    value: float
    source: str
    order: list[list[int]] | None = None
    """Per device task order that gives `value`; None: a list schedule gives it."""
    notes: list[str] = field(default_factory=list)
    rejected: bool = False
    """A solver's answer failed a check: its claims (optimality, bound) do not count."""
    proven_bound: float = -math.inf
    """A bound proven without the MILP solver (transfer bounds, sequence DP), which a
    rejected solver answer leaves standing."""
    stage: str = "heuristic start"
    """What the solve is doing now, named in the warning if it fails."""

    def offer(self, group_device: np.ndarray, value: float, source: str,
              order: list[list[int]] | None = None) -> bool:
        """Keep the plan if it is strictly better; returns whether it was kept."""
        if value < self.value - 1e-12 * max(1.0, abs(self.value)):
            self.group_device, self.value, self.source, self.order = (
                group_device.copy(), value, source, order)
            return True
        return False


#: How a plan's source starts when a baseline placer (maybe refined) made it.
HEURISTIC = "heuristic:"
LOCAL_SEARCH = " + local search"


def refined(source: str) -> str:
    """The source of a plan that local search improved (named once, however often)."""
    return source if source.endswith(LOCAL_SEARCH) else source + LOCAL_SEARCH


def worth_a_round(problem: Problem, deadline: float) -> bool:
    """Whether enough time is left to build a model and let a solver work on it: a
    Pyomo build alone takes seconds on a big graph, so a sliver of time would only
    overrun the limit."""
    left = deadline - time.perf_counter()
    return left >= max(1.0, 0.15 * problem.config.time_limit_s)


def run_checked(backend: Backend, model: pyo.ConcreteModel, options: SolveOptions,
                incumbent: Incumbent) -> SolveResult:
    """Run the solver; a crash becomes a warning and no solution, never a plan."""
    try:
        result = backend.run(model, options)
    except Exception as exc:  # noqa: BLE001 - any solver failure leaves the incumbent
        incumbent.notes.append(f"warning: {backend.name} failed ({type(exc).__name__}: "
                               f"{exc}); kept the {incumbent.source} plan")
        return SolveResult(solver=backend.name, status="error", has_solution=False,
                           lower_bound=-math.inf, seconds=0.0, message=str(exc))
    if result.status == "error":
        incumbent.notes.append(f"warning: {result.message}; kept the best plan so far")
    return result


def placement_fits(problem: Problem, group_device: np.ndarray, incumbent: Incumbent,
                   backend: Backend) -> bool:
    """Whether a solver's placement names real devices and fits their memory."""
    k = problem.num_devices
    used = np.bincount(np.clip(group_device, 0, k - 1), weights=problem.group_memory,
                       minlength=k)
    if (group_device.min() < 0 or group_device.max() >= k
            or used.max() > problem.memory_cap * (1 + 1e-9)):
        incumbent.notes.append(f"warning: {backend.name} returned a placement that breaks "
                               "the device count or memory caps; ignored it")
        incumbent.rejected = True
        return False
    return True


def believable(claimed: float, simulated: float, incumbent: Incumbent,
               backend: Backend) -> bool:
    """Whether the simulator confirms the solver's objective (it may only be lower). If
    not, the solver's claims do not count; its placement is still judged by the
    simulator, like any other."""
    if simulated > claimed * (1 + 1e-4):
        incumbent.notes.append(
            f"warning: {backend.name} claimed {claimed:.6g} but the simulator gives "
            f"{simulated:.6g}; its bound and status are ignored, its placement is kept "
            "only if the simulator finds it better")
        incumbent.rejected = True
        return False
    return True
