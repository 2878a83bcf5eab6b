"""A step-time bound that places the groups against their energy (`placement.energy_bound`).

The group energy bound spreads the work that must lie in a window [a, C - b] evenly
over the devices; a placement cannot split a group, so each device d's share is the
energy of the groups it holds:

  x[g,d]  group g on device d (binary);
  C >= a + b + sum_g M_g(a,b) x[g,d]    for the pairs (a, b) of largest energy, all d;
  each device's memory cap; devices numbered by their first group.

Any bound the solver proves is a bound on every plan's step time. A model of its own,
not rows of the step-time relaxation (`placement.milp.pipeline_bound`): on
Inception-V3's paper preset on four V100s with four micro-batches the relaxation with
these rows proved 80.2 ms in 10 s where it proves 82.7 without them, while on GNMT's
(four V100s, four micro-batches, 24 groups) this model alone proves 172.4 ms in about
2 s, its build included, where total work / 4 is 168.4 and the relaxation reached no
more.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pyomo.environ as pyo

from placement.energy_bound import energy_rows, group_energy
from placement.milp.backends import Backend, SolveOptions
from placement.milp.incumbent import Incumbent, run_checked
from placement.milp.max_load import add_memory_and_symmetry, start_assignment
from placement.problem import Problem
from placement.step_bound import join_heads_tails

#: Most (a, b) pairs, each one row per device over the groups: on GNMT's preset above
#: the best 30 prove as much as the best 300, in 0.7 s instead of 8.7.
MAX_ROWS = 30


@dataclass(frozen=True, kw_only=True)
class EnergyData:
    num_devices: int
    group_memory: np.ndarray
    memory_cap: float
    lower_bound: float
    rows: tuple[tuple[float, np.ndarray], ...]
    """(a + b, M_g(a, b) per group)."""
    scale: float


def energy_data(problem: Problem, upper_bound: float) -> EnergyData:
    tg, k = problem.tg, problem.num_devices
    rows = energy_rows(group_energy(tg, *join_heads_tails(tg)), k, MAX_ROWS)
    return EnergyData(num_devices=k, group_memory=problem.group_memory,
                      memory_cap=problem.memory_cap, lower_bound=problem.lower_bound(),
                      rows=tuple(rows), scale=max(upper_bound, 1e-300) / 1000)


def build_energy_relaxation(data: EnergyData) -> pyo.ConcreteModel:
    sc = data.scale
    m = pyo.ConcreteModel(name="group_energy_relaxation")
    m.U = pyo.Set(initialize=range(len(data.group_memory)), doc="placement groups")
    m.D = pyo.Set(initialize=range(data.num_devices), doc="devices")
    m.R = pyo.Set(initialize=range(len(data.rows)), doc="energy pairs (a, b)")
    m.memory = pyo.Param(m.U, initialize=dict(enumerate(data.group_memory.tolist())))
    m.memory_cap = pyo.Param(initialize=data.memory_cap, mutable=True)

    m.x = pyo.Var(m.U, m.D, within=pyo.Binary)
    m.prefix = pyo.Var(m.U, m.D, bounds=(0, None))
    m.C = pyo.Var(bounds=(data.lower_bound / sc, None))

    # sum_d x[g,d] = 1
    m.assign = pyo.Constraint(m.U, rule=lambda m, g: sum(m.x[g, d] for d in m.D) == 1)

    # C >= a + b + sum_g M_g(a,b) x[g,d]
    def energy_rule(m, r, d):
        base, mandatory = data.rows[r]
        return m.C >= base / sc + sum(float(mandatory[g] / sc) * m.x[g, d]
                                      for g in np.flatnonzero(mandatory).tolist())
    m.energy = pyo.Constraint(m.R, m.D, rule=energy_rule)

    add_memory_and_symmetry(m)
    m.objective = pyo.Objective(expr=m.C, sense=pyo.minimize)
    return m


def set_start(m: pyo.ConcreteModel, data: EnergyData, group_device: np.ndarray) -> None:
    onehot = start_assignment(m, group_device)
    values = [data.lower_bound]
    for base, mandatory in data.rows:
        values.append(base + float((mandatory @ onehot).max()))
    m.C.value = max(values) / data.scale


def solve_energy_relaxation(problem: Problem, backend: Backend, incumbent: Incumbent,
                            deadline: float) -> float:
    """The model's proven bound (-inf when none was proven or no pair proves anything)."""
    incumbent.stage = "model build (group energy)"
    data = energy_data(problem, incumbent.value)
    if not data.rows:
        return -math.inf
    model = build_energy_relaxation(data)
    set_start(model, data, incumbent.group_device)
    left = deadline - time.perf_counter()
    if left < 0.5:
        return -math.inf
    incumbent.stage = "solve (group energy)"
    # Its optimum is a bound, not a plan: stop only close to it.
    options = SolveOptions(time_limit_s=left, gap=problem.config.gap * 1e-2,
                           threads=problem.config.threads)
    return run_checked(backend, model, options, incumbent).lower_bound * data.scale
