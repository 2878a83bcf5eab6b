"""A step-time lower bound that charges a placement's pipeline fill, drain and transfers.

The analytic and window bounds (`placement.step_bound`) hold for every placement at
once, so they must allow the one that spreads every window's work evenly over the
devices and sends nothing: with K micro-batches that is far below any real plan. This
relaxation lets the solver choose the placement and charges, for that placement:

  x[g,d]  group g on device d (binary), z[e] edge e crosses devices (>= x[u,d] - x[v,d]);
  E[t]    a lower bound on task t's start: E[v] >= E[u] + p_u + c_e z_e;
  Q[t]    a lower bound on the time after t's finish: Q[u] >= Q[v] + p_v + c_e z_e;
  C >= E[t] + p_t for sinks (the critical path with the transfers this placement makes);
  C >= E[a] + Q[b] + K sum_g w_g(a,b) x[g,d]
         + in(a,b) (1 - x[g(a),d]) + out(a,b) (1 - x[g(b),d])
                                                for chosen task pairs (a, b), devices d,
where w_g(a,b) is the time of g's tasks that are a or follow it and are b or precede
it, in one micro-batch. Every such task of every micro-batch runs after E[a] and ends
by C - Q[b] (the micro-batches are copies with no edges between them, so a's copies
all have a's earliest start, and b's copies its tail), and those on device d run one
at a time there: energetic reasoning with heads and tails that see the placement. A
pair (a, -) or (-, b) drops that side. A device that does not hold a receives its
first task of the window over a crossing edge u->v of the window: that task starts
at least in(a,b) after a does, the least over such edges (groups apart) of the
longest chain from a's start to u's finish plus the edge's transfer; out(a,b) is the
same at b's end (on Inception-V3's pipeline windows the stem's last pool's time and
a branch's transfer, 0.4-0.6 ms each side). A device that holds no task of the window
gets the row too, so in + out is capped by the chain from a to b (or a's tail, b's
head), which every plan runs between E[a] and C - Q[b]. No order decision is in the model, so it stays
small enough to solve on the fine graph, and any bound the solver proves on it is a
bound on the step time of every plan (the co-run slowdown only delays tasks further).

Branching over every group's x closes slowly: its LP spreads each group over all
devices, where no edge crosses, and on Inception-V3's paper preset on four V100s with
four micro-batches (131 groups) HiGHS proved 80-82 ms in a few seconds, 84.6 in a
minute. So the model is solved first with x binary only for the few groups that
weigh most (`integral_order`: work plus the largest transfer into or out of them;
there the stem's convolutions, whose activations cost 1-3.5 ms to move) and the
rest in [0, 1], with its strongest rows only (PARTIAL_PAIRS). Relaxing integrality
only widens the model, so its proven bound holds too; on that preset it proves
84.93 ms with 8 integral groups in 5-9 s, the model's own optimum (the full model,
every row, started at that floor, proves it optimal). Doubling the integral groups
from that floor follows while the time lasts and the bound rises, then the full
model. On graphs of few groups only the full model runs (PARTIAL_MIN_GROUPS).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pyomo.environ as pyo

from placement.milp.backends import Backend, SolveOptions
from placement.milp.incumbent import Incumbent, run_checked
from placement.milp.max_load import add_memory_and_symmetry, start_assignment, unit_devices
from placement.problem import Problem
from placement.step_bound import heads_tails
from placement.tasks import TaskGraph, one_micro_batch

#: Most energy pairs (a, b) per device the model carries, the strongest by their static
#: value (each is one row per device over the groups), and most terms in all their rows.
MAX_PAIRS = 400
MAX_TERMS = 200_000
#: Integral groups of the first partial model (doubled each round after it) and the
#: energy pairs of the partial models: on the preset above 8 groups and 40 pairs prove
#: 84.93 ms in 5-9 s, where 400 pairs take 22 s to prove the same.
FIRST_INTEGRAL = 8
PARTIAL_PAIRS = 40
#: Fewest groups for which the partial models run: with few, branching over every
#: group closes well, and the partial models' fewer rows cost more than they save
#: (GNMT's preset on four V100s with four micro-batches, 24 groups, no floor: the full
#: model proves 172.6 ms in 20 s, the partial models first 171.0).
PARTIAL_MIN_GROUPS = 32


@dataclass(frozen=True, kw_only=True)
class RelaxationData:
    tg: TaskGraph
    """One micro-batch's tasks (the step's micro-batches are copies of it)."""
    num_micro_batches: int
    num_devices: int
    group_memory: np.ndarray
    memory_cap: float
    lower_bound: float
    head: np.ndarray
    tail: np.ndarray
    pairs: tuple[tuple[int, int], ...]
    """(a, b) task pairs; -1 drops that side."""
    weights: np.ndarray
    """Per pair and group: w_g(a, b), one micro-batch's time."""
    entry: np.ndarray
    """Per pair: in(a, b), the delay before a device that does not hold a starts."""
    exit: np.ndarray
    """Per pair: out(a, b), the delay after a device that does not hold b ends."""
    scale: float


def reach_or_self(tg: TaskGraph) -> np.ndarray:
    """reach[i, j]: i == j or a path leads from i to j."""
    reach = np.eye(tg.num_tasks, dtype=bool)
    for t in reversed(tg.topological_order):
        for s, _ in tg.successors[t]:
            reach[t] |= reach[s]
    return reach


def relaxation_data(problem: Problem, upper_bound: float, proven: float = -math.inf,
                    max_pairs: int = MAX_PAIRS) -> RelaxationData:
    """The model's data with the `max_pairs` strongest energy pairs; `proven` is a bound
    proven elsewhere, C's floor with the problem's own."""
    k, K = problem.num_devices, problem.tg.num_micro_batches
    tg = one_micro_batch(problem.tg)
    head, tail = heads_tails(tg)
    after = tail - tg.duration_s
    reach = reach_or_self(tg)
    n, dur = tg.num_tasks, tg.duration_s
    # Rows: (a, -) per task, (-, b) per task, (a, b) for each op's forward and backward
    # (the fill before an op and the drain after its gradient), and (-, -), the busy time.
    forward = {t.op_id: i for i, t in enumerate(tg.tasks) if not t.backward}
    both = [(forward[t.op_id], i) for i, t in enumerate(tg.tasks) if t.backward]
    pairs = [(a, -1) for a in range(n)] + [(-1, b) for b in range(n)] + both + [(-1, -1)]
    # Each row's static value (its heads, tails and work spread over k devices) ranks
    # it; only the kept rows get their per-group weights, so memory stays O(rows x n).
    work = np.concatenate([reach @ dur, dur @ reach,
                           [float(dur[reach[a] & reach[:, b]].sum()) for a, b in both],
                           [float(dur.sum())]])
    static = (np.concatenate([head, np.zeros(n), head[[a for a, _ in both]], [0.0]])
              + np.concatenate([np.zeros(n), after, after[[b for _, b in both]], [0.0]])
              + K * work / k)
    busy = len(pairs) - 1
    keep = np.argsort(-static, kind="stable")[:max_pairs]
    if busy not in keep:
        keep = np.append(keep, busy)
    weights = np.zeros((len(keep), tg.num_groups))
    for row, i in enumerate(keep.tolist()):
        a, b = pairs[i]
        inside = ((reach[a] if a >= 0 else np.ones(n, bool))
                  & (reach[:, b] if b >= 0 else np.ones(n, bool)))
        weights[row] = np.bincount(tg.group[inside], weights=dur[inside],
                                   minlength=tg.num_groups)
    # Bound the model's size too: a Pyomo build is not under the time limit.
    terms = np.cumsum(np.count_nonzero(weights, axis=1)) * k
    fits = terms <= MAX_TERMS
    fits[keep == busy] = True
    kept = [pairs[i] for i in keep[fits].tolist()]
    entry, exit_ = window_delays(tg, kept, reach, head, tail)
    return RelaxationData(
        tg=tg, num_micro_batches=K, num_devices=k, group_memory=problem.group_memory,
        memory_cap=problem.memory_cap, lower_bound=max(problem.lower_bound(), proven),
        head=head, tail=after, pairs=tuple(kept), weights=weights[fits], entry=entry,
        exit=exit_, scale=max(upper_bound, 1e-300) / 1000)


def _chains(tg: TaskGraph, ends: list[int], forward: bool) -> np.ndarray:
    """(tasks, len(ends)): the longest chain of task times from each end's start to
    each task's finish (`forward`), or from each task's start to each end's finish;
    -inf where no path leads."""
    chain = np.full((tg.num_tasks, len(ends)), -np.inf)
    chain[ends, np.arange(len(ends))] = 0.0
    order = tg.topological_order if forward else tg.topological_order[::-1]
    links = tg.predecessors if forward else tg.successors
    for t in order:
        for s, _ in links[t]:
            np.maximum(chain[t], chain[s], out=chain[t])
        chain[t] += tg.duration_s[t]
    return chain


def window_delays(tg: TaskGraph, pairs: list[tuple[int, int]], reach: np.ndarray,
                  head: np.ndarray, tail: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per pair (a, b): in(a, b) and out(a, b) of the module docstring (0 for a
    dropped side or a window no edge of which can cross); `tail` includes each task's
    own time, `head` does not."""
    starts = sorted({a for a, _ in pairs if a >= 0})
    ends = sorted({b for _, b in pairs if b >= 0})
    from_start = _chains(tg, starts, forward=True)
    to_end = _chains(tg, ends, forward=False)
    column = {a: i for i, a in enumerate(starts)}
    row = {b: i for i, b in enumerate(ends)}
    src, dst, cost = tg.edge_src, tg.edge_dst, tg.edge_transfer_s
    can_cross = tg.group[src] != tg.group[dst]
    everything = np.ones(tg.num_tasks, dtype=bool)
    entry, exit_ = np.zeros(len(pairs)), np.zeros(len(pairs))
    for r, (a, b) in enumerate(pairs):
        if a < 0 and b < 0:
            continue
        inside = (reach[a] if a >= 0 else everything) & (reach[:, b] if b >= 0 else everything)
        edges = can_cross & inside[src] & inside[dst]
        if not edges.any():
            continue
        # A chain every plan runs between E[a] and C - Q[b]: the longest from a to b,
        # a's tail (its own time included) or b's head and its own time.
        span = (from_start[b, column[a]] if a >= 0 and b >= 0
                else tail[a] if a >= 0 else head[b] + tg.duration_s[b])
        if a >= 0:
            entry[r] = min(float((from_start[src[edges], column[a]] + cost[edges]).min()),
                           span)
        if b >= 0:
            exit_[r] = min(float((cost[edges] + to_end[dst[edges], row[b]]).min()),
                           span - entry[r])
    return entry, exit_


def integral_order(tg: TaskGraph) -> np.ndarray:
    """Groups by what placing them whole costs, most first: their work plus the
    largest transfer of an edge between them and another group."""
    crossing = tg.group[tg.edge_src] != tg.group[tg.edge_dst]
    largest = np.zeros(tg.num_groups)
    for end in (tg.edge_src, tg.edge_dst):
        np.maximum.at(largest, tg.group[end[crossing]], tg.edge_transfer_s[crossing])
    return np.argsort(-(tg.group_work_s + largest), kind="stable")


def build_relaxation(data: RelaxationData,
                     integral: np.ndarray | None = None) -> pyo.ConcreteModel:
    """The model; with `integral`, only those groups' x are binary, the others' in
    [0, 1] (a relaxation of it, so its bounds hold too)."""
    tg, sc, K = data.tg, data.scale, data.num_micro_batches
    dur = tg.duration_s / sc
    m = pyo.ConcreteModel(name="step_time_relaxation")
    m.T = pyo.Set(initialize=range(tg.num_tasks), doc="one micro-batch's tasks")
    m.U = pyo.Set(initialize=range(tg.num_groups), doc="placement groups")
    m.D = pyo.Set(initialize=range(data.num_devices), doc="devices")
    crossing = [e for e in range(len(tg.edge_src)) if tg.edge_transfer_s[e] > 0
                and tg.group[tg.edge_src[e]] != tg.group[tg.edge_dst[e]]]
    m.E = pyo.Set(initialize=range(len(tg.edge_src)), doc="edges")
    m.X = pyo.Set(initialize=crossing, doc="edges that may cross devices")
    m.R = pyo.Set(initialize=range(len(data.pairs)), doc="energy pairs (a, b)")
    m.memory = pyo.Param(m.U, initialize=dict(enumerate(data.group_memory.tolist())))
    m.memory_cap = pyo.Param(initialize=data.memory_cap, mutable=True)

    whole = set(range(tg.num_groups) if integral is None else integral.tolist())
    m.x = pyo.Var(m.U, m.D, bounds=(0, 1),
                  domain=lambda m, g, d: pyo.Binary if g in whole else pyo.Reals)
    m.prefix = pyo.Var(m.U, m.D, bounds=(0, None))
    m.z = pyo.Var(m.X, bounds=(0, 1))
    m.start = pyo.Var(m.T, bounds=lambda m, t: (data.head[t] / sc, None))
    m.after = pyo.Var(m.T, bounds=lambda m, t: (data.tail[t] / sc, None))
    m.C = pyo.Var(bounds=(data.lower_bound / sc, None))

    # sum_d x[g,d] = 1
    m.assign = pyo.Constraint(m.U, rule=lambda m, g: sum(m.x[g, d] for d in m.D) == 1)

    # z[e] >= x[g(u),d] - x[g(v),d]
    def cross_rule(m, e, d):
        return m.z[e] >= m.x[tg.group[tg.edge_src[e]], d] - m.x[tg.group[tg.edge_dst[e]], d]
    m.cross = pyo.Constraint(m.X, m.D, rule=cross_rule)

    def delay(m, e):
        return float(tg.edge_transfer_s[e] / sc) * m.z[e] if e in m.X else 0

    # E[v] >= E[u] + p_u + c_e z_e
    def head_rule(m, e):
        u, v = int(tg.edge_src[e]), int(tg.edge_dst[e])
        return m.start[v] >= m.start[u] + float(dur[u]) + delay(m, e)
    m.heads = pyo.Constraint(m.E, rule=head_rule)

    # Q[u] >= Q[v] + p_v + c_e z_e
    def tail_rule(m, e):
        u, v = int(tg.edge_src[e]), int(tg.edge_dst[e])
        return m.after[u] >= m.after[v] + float(dur[v]) + delay(m, e)
    m.tails = pyo.Constraint(m.E, rule=tail_rule)

    # C >= E[t] + p_t for sinks
    def finish_rule(m, t):
        if tg.successors[t]:
            return pyo.Constraint.Skip
        return m.C >= m.start[t] + float(dur[t])
    m.finish = pyo.Constraint(m.T, rule=finish_rule)

    # C >= E[a] + Q[b] + K sum_g w_g(a,b) x[g,d] + in (1 - x[g(a),d]) + out (1 - x[g(b),d])
    def energy_rule(m, r, d):
        a, b = data.pairs[r]
        w = data.weights[r] * K / sc
        entry, exit_ = float(data.entry[r] / sc), float(data.exit[r] / sc)
        return m.C >= ((m.start[a] if a >= 0 else 0) + (m.after[b] if b >= 0 else 0)
                       + (entry * (1 - m.x[tg.group[a], d]) if entry else 0)
                       + (exit_ * (1 - m.x[tg.group[b], d]) if exit_ else 0)
                       + sum(float(w[g]) * m.x[g, d] for g in np.flatnonzero(w).tolist()))
    m.energy = pyo.Constraint(m.R, m.D, rule=energy_rule)

    add_memory_and_symmetry(m)
    m.objective = pyo.Objective(expr=m.C, sense=pyo.minimize)
    return m


def set_start(m: pyo.ConcreteModel, data: RelaxationData, group_device: np.ndarray) -> None:
    """A placement as the warm start, with the heads and tails it implies."""
    group_device = start_assignment(m, group_device).argmax(axis=1)
    tg, sc = data.tg, data.scale
    dev = group_device[tg.group]
    cross = dev[tg.edge_src] != dev[tg.edge_dst]
    for e in m.X:
        m.z[e].value = float(cross[e])
    start = data.head.copy()
    for t in tg.topological_order:
        for s, c in tg.successors[t]:
            start[s] = max(start[s], start[t] + tg.duration_s[t] + (c if dev[s] != dev[t] else 0))
    after = data.tail.copy()
    for t in reversed(tg.topological_order):
        for s, c in tg.successors[t]:
            after[t] = max(after[t], after[s] + tg.duration_s[s] + (c if dev[s] != dev[t] else 0))
    for t in m.T:
        m.start[t].value = start[t] / sc
        m.after[t].value = after[t] / sc
    values = [data.lower_bound / sc]
    values += [(start[t] + tg.duration_s[t]) / sc for t in m.T if not tg.successors[t]]
    K = data.num_micro_batches
    devices = np.arange(data.num_devices)
    for r, (a, b) in enumerate(data.pairs):
        base = (start[a] if a >= 0 else 0.0) + (after[b] if b >= 0 else 0.0)
        load = np.bincount(group_device, weights=data.weights[r], minlength=data.num_devices)
        delays = (data.entry[r] * (devices != dev[a]) if a >= 0 else 0.0) + (
            data.exit[r] * (devices != dev[b]) if b >= 0 else 0.0)
        values.append(float((base + K * load + delays).max()) / sc)
    m.C.value = max(values)


@dataclass(frozen=True)
class RelaxationResult:
    bound: float
    """A proven lower bound on every plan's step time (-inf if none was proven)."""
    group_device: np.ndarray | None
    """The relaxation's best placement, a candidate plan."""


def solve_relaxation(problem: Problem, backend: Backend, incumbent: Incumbent,
                     deadline: float, proven: float = -math.inf) -> RelaxationResult:
    """The relaxation's proven bound, from the floor `proven` (a bound proven
    elsewhere: the solver's search starts above it), and its best placement: the
    partial models first (see the module docstring), each from the last one's bound,
    then the full model with what is left."""
    tg = one_micro_batch(problem.tg)
    order = integral_order(tg)
    bound = proven
    count = FIRST_INTEGRAL if tg.num_groups >= PARTIAL_MIN_GROUPS else tg.num_groups
    last = None
    while count < tg.num_groups:
        partial = _solve(problem, backend, incumbent, deadline, bound, PARTIAL_PAIRS,
                         order[:count])
        if partial is None:
            return RelaxationResult(bound, None)
        # A doubling that leaves the bound where the last partial model put it stops
        # the rounds, the full model's too: on Inception-V3's and T5-small's presets
        # with four micro-batches (4x4; 2x4, 4x4) no model after the first raised the
        # bound (85.37 ms from the first in 3 s; T5's floors, 186.4 and 130.5), and
        # they took 9-11 s of the minute that the plan's search needs.
        if last is not None and partial[0] <= last * (1 + 1e-9):
            return RelaxationResult(max(bound, partial[0]), None)
        last = partial[0]
        bound = max(bound, partial[0])
        count *= 2
    full = _solve(problem, backend, incumbent, deadline, bound, MAX_PAIRS, None)
    if full is None:
        return RelaxationResult(bound, None)
    return RelaxationResult(max(bound, full[0]), full[1])


def _solve(problem: Problem, backend: Backend, incumbent: Incumbent, deadline: float,
           proven: float, max_pairs: int, integral: np.ndarray | None
           ) -> tuple[float, np.ndarray | None] | None:
    """One model's proven bound and, when every x is binary, its placement; None when
    too little time is left to solve it."""
    if deadline - time.perf_counter() < 0.5:
        return None
    incumbent.stage = "model build (step-time relaxation)"
    data = relaxation_data(problem, incumbent.value, proven, max_pairs)
    model = build_relaxation(data, integral)
    set_start(model, data, incumbent.group_device)
    left = deadline - time.perf_counter()
    if left < 0.5:
        return None
    incumbent.stage = "solve (step-time relaxation)"
    # Its optimum is a bound, not a plan: a solver stopping within the plan's gap of
    # its own incumbent would give up to that gap of the bound away.
    options = SolveOptions(time_limit_s=left, gap=problem.config.gap * 1e-2,
                           threads=problem.config.threads)
    result = run_checked(backend, model, options, incumbent)
    placed = integral is None and result.has_solution
    return result.lower_bound * data.scale, unit_devices(model) if placed else None
