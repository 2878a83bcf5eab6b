"""The max-load MILP: place units (clusters of placement groups) so that the busiest
device's compute plus its transfers is least (the pipelined model of DESIGN.md).

Transfer accounting, exactly as `placement.simulate.device_loads`: a task u whose
output crosses devices pays its send cost c_u once on its own device and once on every
other device that holds one of its successors. Tasks with the same unit and the same
set of successor units are merged into one *sender* with the summed cost (they cross
together in every placement), which shrinks the model several-fold on training graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyomo.environ as pyo

from placement.ideal_dp import merged_senders
from placement.tasks import TaskGraph


@dataclass(frozen=True, kw_only=True)
class MaxLoadData:
    num_devices: int
    work: np.ndarray
    """Per unit: compute time (sum over its tasks)."""
    memory: np.ndarray
    """Per unit: bytes it keeps on its device."""
    memory_cap: float
    sender_unit: tuple[int, ...]
    sender_targets: tuple[tuple[int, ...], ...]
    """Per sender: the other units holding a successor."""
    sender_cost: tuple[float, ...]
    lower_bound: float
    """A proven bound on the max-load (total work / devices, heaviest unit, or the
    caller's)."""
    scale: float
    """Model time unit in the graph's unit (the model sees times / scale, about 100
    for the bound) so that solver tolerances stay negligible."""


def max_load_data(tg: TaskGraph, units: Sequence[Sequence[int]], num_devices: int,
                  group_memory: np.ndarray, memory_cap: float,
                  known_bound: float = 0.0) -> MaxLoadData:
    """The model's data for `units` (lists of groups; in sequence order, since the
    symmetry breaking numbers devices by their first unit). `known_bound`: a proven
    max-load bound of the fine problem (e.g. `path_bound`), which bounds L too."""
    unit_of_group = np.empty(tg.num_groups, dtype=np.int64)
    for i, groups in enumerate(units):
        unit_of_group[list(groups)] = i
    work = np.bincount(unit_of_group[tg.group], weights=tg.duration_s,
                       minlength=len(units))
    memory = np.array([group_memory[list(groups)].sum() for groups in units])
    senders = merged_senders(tg, unit_of_group)
    total = float(tg.duration_s.sum())
    return MaxLoadData(
        num_devices=num_devices, work=work, memory=memory, memory_cap=float(memory_cap),
        sender_unit=tuple(senders.unit.tolist()), sender_targets=senders.targets,
        sender_cost=tuple(senders.cost.tolist()),
        lower_bound=max(total / num_devices, float(work.max(initial=0.0)), known_bound),
        scale=max(total / num_devices, 1e-300) / 100)


def build_max_load(data: MaxLoadData) -> pyo.ConcreteModel:
    m = pyo.ConcreteModel(name="max_load")
    num_units = len(data.work)
    m.U = pyo.Set(initialize=range(num_units), doc="units (clusters of groups)")
    m.D = pyo.Set(initialize=range(data.num_devices), doc="devices")
    m.S = pyo.Set(initialize=range(len(data.sender_cost)), doc="senders")
    m.ST = pyo.Set(dimen=2, initialize=[(s, v) for s, ts in enumerate(data.sender_targets)
                                        for v in ts], doc="(sender, successor unit)")
    sc = data.scale
    m.work = pyo.Param(m.U, initialize=dict(enumerate((data.work / sc).tolist())))
    m.memory = pyo.Param(m.U, initialize=dict(enumerate(data.memory.tolist())))
    m.memory_cap = pyo.Param(initialize=data.memory_cap, mutable=True)
    m.cost = pyo.Param(m.S, initialize={s: c / sc for s, c in enumerate(data.sender_cost)})
    m.unit = pyo.Param(m.S, initialize=dict(enumerate(data.sender_unit)))
    total_work = float(data.work.sum()) / sc

    m.x = pyo.Var(m.U, m.D, within=pyo.Binary, doc="unit u sits on device d")
    m.send = pyo.Var(m.S, m.D, bounds=(0, 1), doc="sender s pays its send on device d")
    m.recv = pyo.Var(m.S, m.D, bounds=(0, 1), doc="device d receives sender s's output")
    m.prefix = pyo.Var(m.U, m.D, bounds=(0, None), doc="units 0..u on device d")
    m.L = pyo.Var(bounds=(data.lower_bound / sc, None), doc="max-load")

    # sum_d x[u,d] = 1
    def assign_rule(m, u):
        return sum(m.x[u, d] for d in m.D) == 1
    m.assign = pyo.Constraint(m.U, rule=assign_rule)

    # send[s,d] >= x[unit(s),d] - x[v,d]: s's output leaves device d for unit v
    def send_rule(m, s, v, d):
        return m.send[s, d] >= m.x[m.unit[s], d] - m.x[v, d]
    m.send_def = pyo.Constraint(m.ST, m.D, rule=send_rule)

    # recv[s,d] >= x[v,d] - x[unit(s),d]: device d holds v but not s's unit
    def recv_rule(m, s, v, d):
        return m.recv[s, d] >= m.x[v, d] - m.x[m.unit[s], d]
    m.recv_def = pyo.Constraint(m.ST, m.D, rule=recv_rule)

    # A crossing output has a receiver: sum_d recv[s,d] >= sum_d send[s,d]
    def receiver_rule(m, s):
        return sum(m.recv[s, d] for d in m.D) >= sum(m.send[s, d] for d in m.D)
    m.receiver = pyo.Constraint(m.S, rule=receiver_rule)

    # load_d = sum_u work_u x[u,d] + sum_s cost_s (send[s,d] + recv[s,d]) <= L
    def load_rule(m, d):
        return (sum(m.work[u] * m.x[u, d] for u in m.U)
                + sum(m.cost[s] * (m.send[s, d] + m.recv[s, d]) for s in m.S) <= m.L)
    m.device_load = pyo.Constraint(m.D, rule=load_rule)

    # Valid inequality (the lower bound with transfers): k L >= total work + all transfers
    def total_rule(m):
        return (len(m.D) * m.L >= total_work
                + sum(m.cost[s] * (m.send[s, d] + m.recv[s, d]) for s in m.S for d in m.D))
    m.total = pyo.Constraint(rule=total_rule)

    add_memory_and_symmetry(m)

    m.objective = pyo.Objective(expr=m.L, sense=pyo.minimize)
    return m


def add_memory_and_symmetry(m: pyo.ConcreteModel) -> None:
    """The constraint families both builders share over the assignment x[u,d]: each
    device's memory cap, and the numbering of identical devices by their first unit."""
    # sum_u (memory_u / memory_cap) x[u,d] <= 1, in bytes over the cap: coefficients of
    # bytes (1e7) against a cap (1e10) left HiGHS warning that the model was badly
    # scaled. A cap that all units together fit under cannot bind and adds no rows.
    fits_anyway = sum(pyo.value(m.memory[u]) for u in m.U) <= pyo.value(m.memory_cap)

    def memory_rule(m, d):
        if fits_anyway:
            return pyo.Constraint.Skip
        return sum(m.memory[u] / m.memory_cap * m.x[u, d] for u in m.U) <= 1
    m.memory_fit = pyo.Constraint(m.D, rule=memory_rule)

    # prefix[u,d] = prefix[u-1,d] + x[u,d] (a running count, to keep symmetry sparse)
    def prefix_rule(m, u, d):
        return m.prefix[u, d] == (m.prefix[u - 1, d] if u else 0) + m.x[u, d]
    m.prefix_def = pyo.Constraint(m.U, m.D, rule=prefix_rule)

    # Identical devices: number them by their first unit. x[u,d] <= prefix[u-1,d-1]
    # (device d may hold u only if device d-1 holds an earlier unit).
    def symmetry_rule(m, u, d):
        if d == 0:
            return pyo.Constraint.Skip
        if u == 0:
            return m.x[u, d] == 0
        return m.x[u, d] <= m.prefix[u - 1, d - 1]
    m.symmetry = pyo.Constraint(m.U, m.D, rule=symmetry_rule)


def canonical_devices(unit_device: np.ndarray) -> np.ndarray:
    """Renumber devices by their first unit, as the symmetry breaking demands."""
    relabel: dict[int, int] = {}
    for d in unit_device.tolist():
        relabel.setdefault(d, len(relabel))
    return np.array([relabel[d] for d in unit_device.tolist()], dtype=np.int64)


def start_assignment(m: pyo.ConcreteModel, unit_device: np.ndarray) -> np.ndarray:
    """Load a placement into x and prefix (the variables of `add_memory_and_symmetry`'s
    models), devices renumbered by their first unit; returns the renumbered one-hot
    assignment, unit by device."""
    unit_device = canonical_devices(unit_device)
    onehot = np.zeros((len(unit_device), len(m.D)))
    onehot[np.arange(len(unit_device)), unit_device] = 1
    prefix = np.cumsum(onehot, axis=0)
    for u in m.U:
        for d in m.D:
            m.x[u, d].value = onehot[u, d]
            m.prefix[u, d].value = prefix[u, d]
    return onehot


def set_start(m: pyo.ConcreteModel, data: MaxLoadData, unit_device: np.ndarray) -> None:
    """Load a placement into the model's variables (a warm start)."""
    onehot = start_assignment(m, unit_device)
    unit_device = onehot.argmax(axis=1)
    loads = data.work @ onehot
    for s in m.S:
        mine = unit_device[data.sender_unit[s]]
        holders = {int(unit_device[v]) for v in data.sender_targets[s]} - {int(mine)}
        for d in m.D:
            m.send[s, d].value = float(d == mine and bool(holders))
            m.recv[s, d].value = float(d in holders)
            loads[d] += data.sender_cost[s] * (m.send[s, d].value + m.recv[s, d].value)
    m.L.value = max(float(loads.max()), data.lower_bound) / data.scale


def unit_devices(m: pyo.ConcreteModel) -> np.ndarray | None:
    """Each unit's device from the x values; None when a solver left any x unset."""
    values = [[m.x[u, d].value for d in m.D] for u in m.U]
    if any(v is None for row in values for v in row):
        return None
    return np.array([int(np.argmax(row)) for row in values], dtype=np.int64)
