"""The step-time (makespan) MILP, DLPlacer's objective, and its solve loop.

Model (Pal et al. 2019, sec. 3, with the strengthening below), over tasks t of one
training step and placement units u (clusters of groups):
  x[u,d]   unit u on device d (binary), devices numbered by their first unit;
  S[t]     start time, within its window [head_t, UB - tail_t] where head/tail are the
           longest task chains before/after t and UB the incumbent's step time;
  z[e]     edge e crosses devices (>= x[u,d] - x[v,d]), delaying its head by c_e;
  y[i,j]   i runs before j, only for pairs that are unordered by the graph and whose
           windows overlap (other pairs are ordered already: this, and each pair's own
           big-M from the windows, is what keeps the model small and tight);
  same[u,v] units u and v share a device (>= x[u,d] + x[v,d] - 1).
Valid inequalities: C >= each device's busy time, C >= the lower bound.

The model sees the simulator's machine: task times carry the split overhead and the
1/K of each micro-batch (`placement.tasks.build_tasks`). The one thing it leaves out is
the co-run slowdown of devices that share a host (CPU threads): with it the model is a
relaxation, so its bound still holds, and its placement is judged by the simulator
and kept when better, never thrown away for disagreeing with the solver's claim.

Large graphs of one micro-batch are solved on a coarse task graph (chain clusters,
each cluster's tasks of one phase and micro-batch run back to back), then expanded;
every plan is refined with local search under the exact simulator (`placement.refine`:
moves of the critical chain's groups, the full single-move and swap neighbourhood,
then kicks; with several micro-batches, moves and kicks of groups and of their whole
branches (`placement.coarsen.chain_branches`), without the full neighbourhood),
which orders a placement by list schedule or, with several micro-batches, by
dispatch in time (`placement.simulate.dispatch_schedule`), at a micro-batch stagger
from STAGGER_FRACTIONS, the way and the stagger chosen per placement (`Ordering`),
and whose order is justified (`placement.refine.justified`) when the step has one
micro-batch. With several micro-batches HEFT's placements with staggered ranks are
starts too (`staggered_heft_round`).
A coarse model's bound says nothing about the fine graph; with several micro-batches a relaxation without order decisions
(`placement.milp.pipeline_bound`) gives one that sees fill, drain and transfers; on a
graph of modules in sequence the blocks between articulation tasks, each solved alone
(`block_round`, `placement.milp.block_bound`), give one that sees each module's queues
and transfers, and their spans become valid inequalities of the fine model; the same
blocks, forward and backward of the same ops joined into parts, are placed one part at
a time (`decompose_round`, `placement.milp.decompose`), a plan the search on the whole
graph reaches only slowly. Last,
the tasks of the best placement found, which only the list schedule's upward ranks had
ordered, are reordered by a local search over the critical chain's device arcs
(`order_search_round`) and then by the MILP (`order_round`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyomo.environ as pyo

from placement import heuristics
from placement.coarsen import chain_branches, chain_clusters, contract, interval_clusters
from placement.ideal_dp import join_roots, side_inputs
from placement.milp.backends import Backend, SolveOptions
from placement.milp.block_bound import BlockBound, block_bound
from placement.milp.decompose import decomposed_placement, largest_part, part_gain
from placement.milp.energy_relaxation import solve_energy_relaxation
from placement.milp.incumbent import (
    HEURISTIC,
    Incumbent,
    believable,
    placement_fits,
    refined,
    run_checked,
    worth_a_round,
)
from placement.milp.max_load import add_memory_and_symmetry, canonical_devices, unit_devices
from placement.milp.pipeline_bound import solve_relaxation
from placement.neighbour_bound import neighbour_bound
from placement.refine import (Leaders, chain_search, chain_sweep, justified, kicked_search,
                              local_search, order_search, ordered_move_search,
                              schedule_search)
from placement.simulate import (
    OrderError,
    Schedule,
    busy_time,
    critical_chain,
    dispatch_schedule,
    evaluate_order,
    list_schedule,
    order_by_start,
)
from placement.problem import Problem
from placement.sequences import joined_sequences
from placement.step_bound import heads_tails
from placement.tasks import Task, TaskGraph, max_load_send_s

#: Most unordered task pairs with overlapping windows a model may carry; beyond it the
#: graph is coarsened further (each pair is one binary and two big-M rows).
MAX_PAIRS = 5000
#: Shares of the time left that a fine or a coarse MILP round may use; local search
#: on the fine graph gets REFINE_SHARE before the round and ORDER_REFINE_SHARE of what
#: is left after it, and the order round (the MILP on the best placement's order) the
#: rest.
FINE_SHARE = 0.6
COARSE_SHARE = 0.6
REFINE_SHARE = 0.2
ORDER_REFINE_SHARE = 0.5
#: Micro-batch staggers the list schedule tries, as fractions of one micro-batch's
#: work per device (measured on the paper presets of the job models: 0.05-0.2 cut
#: their 4-micro-batch steps by up to a fifth against none).
STAGGER_FRACTIONS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4)
#: Share of the time left that the step-time relaxation (`pipeline_bound`) may use
#: when the step has several micro-batches, the case its fill and drain rows are for:
#: its first partial model proves Inception-V3 4x4's 84.93 ms in 5-10 s (load 1-4.5),
#: about a quarter of what is left of a minute by then.
RELAXATION_SHARE = 0.3
#: Share of the time left that the group energy model may use before it (it proves
#: GNMT's four-micro-batch bound on four V100s in about 2 s, its build included, 3 s
#: under a load of 4 on two cores, where 0.05 of the time left, 2.3 s, fell short).
ENERGY_SHARE = 0.1
#: Share of the time left that the blocks' bound (`placement.milp.block_bound`) may
#: use, the most seconds one block's MILP may take, and the most order decisions it may
#: have: Inception-V3's blocks of 13 tasks (41 decisions) close within 1.5 s on two
#: devices, and on the layered DAGs on four no block of more than 74 gained anything
#: over its window bound in 2 s.
BLOCK_SHARE = 0.2
#: Share of the time left that the block decomposition (`decompose_round`) may use: on
#: the layered DAGs of 500 and 1,000 ops its parts (with kicks) reached 2,851 and 5,910
#: in 57 s and 5,950 (1,000 ops) in 36 s, where the whole graph's search had reached
#: 3,042 and 6,297 in 60 s. The whole graph's search after it gained 0.0-0.3% there in
#: a minute (its moves cost a simulation of the whole graph), so the parts take most of
#: the time: with 0.8 instead of 0.5 the 1,000-op plan went from 5,898 to 5,786. Parts
#: that run out of starts hand their time back. Where one part holds at least
#: ONE_PART of the tasks (GNMT's paper preset: one part, its forward and backward passes,
#: holds them all; the layered DAGs' largest 20-55%, Inception-V3's 34%) the parts'
#: search is the whole graph's, and the search of placements and orders from its best
#: placements after it (SCHEDULE_SHARE) finds GNMT's best plans on two V100s, so it takes
#: 0.3 (with the order search alone after it, 0.8 reached 365.9 ms where 0.5 reached
#: 363.0): ONE_PART_SHARE. With 0.9, and no whole-graph search after a plan of
#: several parts (it gained nothing on the layered DAGs, 7 s at 1,000 ops, nor on
#: Inception-V3's rows of table 5), the order search keeps about its 2 s.
DECOMPOSE_SHARE = 0.9
ONE_PART = 0.75
ONE_PART_SHARE = 0.3
#: Share of the time left that the search over placements and orders together
#: (`placement.refine.schedule_search`) from the best placements of a whole-graph
#: placement search with one micro-batch may use (`order_search_round`): on GNMT's
#: paper preset on two V100s it took HEFT's plan (383.8 ms) to 361.3-361.8 in 10 s of
#: CPU time in four runs of four, and runners-up of the placement search to 358.3 in
#: 0.5 s, where the placement search and the order search of its best placements had
#: reached 363.0-366.2 in a minute. With a CPU-bound process beside it, 0.5 gave 358.7
#: and 361.2 ms, 0.7 359.9 and 359.4; the step-time MILP, which has less time after it
#: (none on GNMT's preset), had found nothing better there.
SCHEDULE_SHARE = 0.7
#: Share of the time left that the order search on the best placement
#: (`placement.refine.order_search`) may use before the order MILP: on GNMT's paper
#: preset on two V100s it took the plan from 373.2 to 364.1 ms, where the order MILP
#: had found nothing (CP-SAT proves 357.8 the optimum there; the optimal placement's
#: list schedule gives 391.0, its justification 381.1, the search 358.8 in 20 s).
ORDER_SEARCH_SHARE = 0.5
#: How many of the best placements the local search scored in full (not the moves whose
#: dispatch stopped early, worse than the placement they left) get the order search,
#: and in how many groups each differs from the others: it judges placements by their
#: justified list schedule, which misses the orders the order search finds, so the best
#: order may lie on a runner-up. On GNMT's paper preset on two V100s the fourth (382.3
#: ms justified) reached 363.0 where the best (373.2) reached 364.6, with 1 s each;
#: runners-up one move from the best reached no better.
ORDER_SEARCH_PLACEMENTS = 4
ORDER_SEARCH_APART = 4
#: Share of the time left that the rotated contiguous splits (`split_round`) may use,
#: and the rotations of each sequence they try (on T5-small's 658 groups each costs
#: about 0.35 s: a split and six list schedules of 5,280 tasks).
SPLIT_SHARE = 0.15
SPLIT_ROTATIONS = 12
BLOCK_SECONDS = 3.0
BLOCK_MAX_PAIRS = 100
#: Most tasks of a part (a forward block with its backward block) whose MILP bound
#: `block_round` tries after the blocks': the layered DAGs' parts of 14-16 tasks
#: (8-30 order decisions) prove 1.1-1.7 above their blocks' sum in under 1 s each.
PART_MAX_TASKS = 40
#: Relative margin taken off a block MILP's proven bound.
SPAN_SLACK = 1e-7


@dataclass(frozen=True, kw_only=True)
class MakespanData:
    tg: TaskGraph
    num_devices: int
    unit_of_task: np.ndarray
    num_units: int
    unit_memory: np.ndarray
    memory_cap: float
    upper_bound: float
    lower_bound: float
    head: np.ndarray
    tail: np.ndarray
    pairs: tuple[tuple[int, int], ...]
    spans: tuple[tuple[int, int, float], ...]
    """Valid inequalities start(b) - start(a) >= s (`BlockBound.spans`)."""
    scale: float
    """Model time unit in the graph's unit: the model sees times / scale, about 1000
    for the horizon, so that solver tolerances (~1e-6 absolute) stay negligible."""


def makespan_data(tg: TaskGraph, unit_of_group: np.ndarray, num_devices: int,
                  unit_memory: np.ndarray, memory_cap: float, upper_bound: float,
                  lower_bound: float, *, same_unit_only: bool = False,
                  spans: tuple[tuple[int, int, float], ...] = ()) -> MakespanData:
    """`same_unit_only` keeps the order decisions within a unit: for a model whose
    units are devices pinned apart (`order_round`); `spans` are valid inequalities
    on `tg`'s start times (`BlockBound.spans`)."""
    head, tail = heads_tails(tg)
    unit_of_task = unit_of_group[tg.group]
    pairs = order_pairs(tg, head, tail, upper_bound)
    if same_unit_only:
        pairs = tuple((i, j) for i, j in pairs if unit_of_task[i] == unit_of_task[j])
    return MakespanData(
        tg=tg, num_devices=num_devices, unit_of_task=unit_of_task,
        num_units=int(unit_of_group.max()) + 1, unit_memory=unit_memory,
        memory_cap=memory_cap, upper_bound=upper_bound, lower_bound=lower_bound,
        head=head, tail=tail, pairs=pairs, spans=spans,
        scale=max(upper_bound, 1e-300) / 1000)


def order_pairs(tg: TaskGraph, head: np.ndarray, tail: np.ndarray,
                upper_bound: float) -> tuple[tuple[int, int], ...]:
    """Task pairs (i < j) that need an order decision: neither reaches the other and
    their windows [head, UB - tail + p] overlap (else any schedule that finishes by UB
    orders them already). Zero-length tasks count too: a device runs its tasks in a
    sequence, so one cannot sit inside another's interval."""
    latest_finish = upper_bound - tail + tg.duration_s
    overlap = ((latest_finish[:, None] >= head[None, :])
               & (latest_finish[None, :] >= head[:, None]))
    related = _reachability(tg)
    need = np.triu(overlap & ~related & ~related.T, 1)
    return tuple(zip(*(x.tolist() for x in np.nonzero(need))))


def _reachability(tg: TaskGraph) -> np.ndarray:
    """reach[i, j]: a path leads from task i to task j."""
    reach = np.zeros((tg.num_tasks, tg.num_tasks), dtype=bool)
    for t in reversed(tg.topological_order):
        for s, _ in tg.successors[t]:
            reach[t] |= reach[s]
            reach[t, s] = True
    return reach


def build_makespan(data: MakespanData) -> pyo.ConcreteModel:
    tg = data.tg
    sc = data.scale
    head, tail, dur = data.head / sc, data.tail / sc, tg.duration_s / sc
    ub = data.upper_bound / sc
    m = pyo.ConcreteModel(name="makespan")
    m.T = pyo.Set(initialize=range(tg.num_tasks), doc="tasks")
    m.U = pyo.Set(initialize=range(data.num_units), doc="placement units")
    m.D = pyo.Set(initialize=range(data.num_devices), doc="devices")
    crossing = [e for e in range(len(tg.edge_src)) if tg.edge_transfer_s[e] > 0
                and data.unit_of_task[tg.edge_src[e]] != data.unit_of_task[tg.edge_dst[e]]]
    m.E = pyo.Set(initialize=range(len(tg.edge_src)), doc="edges")
    m.X = pyo.Set(initialize=crossing, doc="edges that may cross devices")
    m.P = pyo.Set(dimen=2, initialize=data.pairs, doc="unordered overlapping task pairs")
    unit_pairs = sorted({tuple(sorted((int(data.unit_of_task[i]), int(data.unit_of_task[j]))))
                         for i, j in data.pairs
                         if data.unit_of_task[i] != data.unit_of_task[j]})
    m.UP = pyo.Set(dimen=2, initialize=unit_pairs, doc="unit pairs that may share a device")
    m.p = pyo.Param(m.T, initialize=dict(enumerate(dur.tolist())))
    m.head = pyo.Param(m.T, initialize=dict(enumerate(head.tolist())))
    m.tail = pyo.Param(m.T, initialize=dict(enumerate(tail.tolist())))
    m.c = pyo.Param(m.E, initialize=dict(enumerate((tg.edge_transfer_s / sc).tolist())))
    m.unit = pyo.Param(m.T, initialize=dict(enumerate(data.unit_of_task.tolist())))
    m.memory = pyo.Param(m.U, initialize=dict(enumerate(data.unit_memory.tolist())))
    m.memory_cap = pyo.Param(initialize=data.memory_cap, mutable=True)
    m.UB = pyo.Param(initialize=ub, mutable=True)

    m.x = pyo.Var(m.U, m.D, within=pyo.Binary)
    m.prefix = pyo.Var(m.U, m.D, bounds=(0, None))
    m.S = pyo.Var(m.T, bounds=lambda m, t: (head[t], max(head[t], ub - tail[t])))
    m.z = pyo.Var(m.X, bounds=(0, 1))
    m.y = pyo.Var(m.P, within=pyo.Binary)
    m.same = pyo.Var(m.UP, bounds=(0, 1))
    m.C = pyo.Var(bounds=(data.lower_bound / sc, None))

    # sum_d x[u,d] = 1
    def assign_rule(m, u):
        return sum(m.x[u, d] for d in m.D) == 1
    m.assign = pyo.Constraint(m.U, rule=assign_rule)

    # z[e] >= x[unit(src),d] - x[unit(dst),d]
    def cross_rule(m, e, d):
        return m.z[e] >= m.x[m.unit[tg.edge_src[e]], d] - m.x[m.unit[tg.edge_dst[e]], d]
    m.cross = pyo.Constraint(m.X, m.D, rule=cross_rule)

    # S[v] >= S[u] + p[u] + c[e] z[e] for e = u->v
    def precedence_rule(m, e):
        u, v = int(tg.edge_src[e]), int(tg.edge_dst[e])
        delay = m.c[e] * m.z[e] if e in m.X else 0
        return m.S[v] >= m.S[u] + m.p[u] + delay
    m.precedence = pyo.Constraint(m.E, rule=precedence_rule)

    # same[u,v] >= x[u,d] + x[v,d] - 1
    def same_rule(m, u, v, d):
        return m.same[u, v] >= m.x[u, d] + m.x[v, d] - 1
    m.same_def = pyo.Constraint(m.UP, m.D, rule=same_rule)

    def big_m(i, j):
        # The most S[i] + p[i] - S[j] can be, from the windows: a per-pair big-M.
        return max(0.0, ub - tail[i] + dur[i] - head[j])

    def apart(m, i, j):
        ui, uj = m.unit[i], m.unit[j]
        return 0 if ui == uj else 1 - m.same[min(ui, uj), max(ui, uj)]

    # S[j] >= S[i] + p[i] - M_ij (1 - y[i,j]) - M_ij (1 - same)
    def before_rule(m, i, j):
        mij = big_m(i, j)
        return m.S[j] >= m.S[i] + m.p[i] - mij * (1 - m.y[i, j]) - mij * apart(m, i, j)
    m.before = pyo.Constraint(m.P, rule=before_rule)

    # S[i] >= S[j] + p[j] - M_ji y[i,j] - M_ji (1 - same)
    def after_rule(m, i, j):
        mji = big_m(j, i)
        return m.S[i] >= m.S[j] + m.p[j] - mji * m.y[i, j] - mji * apart(m, i, j)
    m.after = pyo.Constraint(m.P, rule=after_rule)

    # C >= S[t] + p[t] for tasks without successors
    def finish_rule(m, t):
        if tg.successors[t]:
            return pyo.Constraint.Skip
        return m.C >= m.S[t] + m.p[t]
    m.finish = pyo.Constraint(m.T, rule=finish_rule)

    # Valid inequality: C >= sum_t p[t] x[unit(t),d] (a device's busy time)
    unit_work = np.bincount(data.unit_of_task, weights=dur, minlength=data.num_units)

    def busy_rule(m, d):
        return m.C >= sum(float(unit_work[u]) * m.x[u, d] for u in m.U)
    m.busy = pyo.Constraint(m.D, rule=busy_rule)

    # Valid inequalities: S[b] - S[a] >= s (from time 0 for a = -1, to C for b = -1).
    m.W = pyo.Set(initialize=range(len(data.spans)), doc="spans between articulation tasks")

    def span_rule(m, w):
        a, b, span = data.spans[w]
        return ((m.C if b < 0 else m.S[b]) - (m.S[a] if a >= 0 else 0)) >= span / sc
    m.span = pyo.Constraint(m.W, rule=span_rule)

    add_memory_and_symmetry(m)

    m.objective = pyo.Objective(expr=m.C, sense=pyo.minimize)
    return m


def set_start(m: pyo.ConcreteModel, data: MakespanData, unit_device: np.ndarray,
              start: np.ndarray) -> None:
    """Load a placement and its schedule's start times as a warm start."""
    unit_device = canonical_devices(unit_device)
    tg = data.tg
    onehot = np.zeros((data.num_units, data.num_devices))
    onehot[np.arange(data.num_units), unit_device] = 1
    prefix = np.cumsum(onehot, axis=0)
    for u in m.U:
        for d in m.D:
            m.x[u, d].value = onehot[u, d]
            m.prefix[u, d].value = prefix[u, d]
    dev = unit_device[data.unit_of_task]
    for t in m.T:
        # Clip to the window: the start times come from a float schedule whose last
        # bits may differ from the window's own arithmetic.
        lb, ub = m.S[t].bounds
        m.S[t].value = min(max(float(start[t]) / data.scale, lb), ub)
    for e in m.X:
        m.z[e].value = float(dev[tg.edge_src[e]] != dev[tg.edge_dst[e]])
    for u, v in m.UP:
        m.same[u, v].value = float(unit_device[u] == unit_device[v])
    for i, j in m.P:
        m.y[i, j].value = float(start[i] < start[j] or (start[i] == start[j] and i < j))
    m.C.value = max(float((start + tg.duration_s).max()), data.lower_bound) / data.scale


def solution(m: pyo.ConcreteModel,
             data: MakespanData) -> tuple[np.ndarray, np.ndarray] | None:
    """Placement and start times from the model; None when the solver left any of
    them without a value (a partial solution file)."""
    unit_device = unit_devices(m)
    start = [m.S[t].value for t in m.T]
    if unit_device is None or None in start or m.C.value is None:
        return None
    return unit_device, np.array(start, dtype=float) * data.scale


# ---- the solve loop -------------------------------------------------------------------

def coarse_task_graph(tg: TaskGraph, clusters: Sequence[Sequence[int]]
                      ) -> tuple[TaskGraph, list[list[int]]]:
    """Contract each cluster's tasks of one phase and micro-batch into one coarse task
    (its members run back to back; a cluster that is not convex becomes several coarse
    tasks, see `contract`); returns the coarse graph and each coarse task's fine tasks
    in topological order."""
    coarse = contract(tg, clusters)
    coarse_of_op = {f: c for c, fs in coarse.members.items() for f in fs}
    cluster_of_op = {op: c for c, groups in enumerate(clusters)
                     for g in groups for op in tg.group_ops[g]}
    position = np.empty(tg.num_tasks, dtype=np.int64)
    position[list(tg.topological_order)] = np.arange(tg.num_tasks)
    index: dict[Task, int] = {}
    members: list[list[int]] = []
    for t in sorted(range(tg.num_tasks), key=position.__getitem__):
        task = tg.tasks[t]
        key = Task(coarse_of_op[task.op_id], task.backward, task.micro_batch)
        if key not in index:
            index[key] = len(members)
            members.append([])
        members[index[key]].append(t)
    tasks = sorted(index, key=index.__getitem__)
    coarse_of_task = np.empty(tg.num_tasks, dtype=np.int64)
    for c, ts in enumerate(members):
        coarse_of_task[ts] = c
    edge_cost: dict[tuple[int, int], float] = {}
    for s, d, cost in zip(coarse_of_task[tg.edge_src].tolist(),
                          coarse_of_task[tg.edge_dst].tolist(), tg.edge_transfer_s.tolist()):
        if s != d:
            edge_cost[(s, d)] = max(edge_cost.get((s, d), 0.0), cost)
    src = np.array([k[0] for k in edge_cost], dtype=np.int64)
    dst = np.array([k[1] for k in edge_cost], dtype=np.int64)
    cost = np.array(list(edge_cost.values()), dtype=np.float64)
    send = max_load_send_s(tasks, src, dst, cost, gradients_summed=(
        any(t.backward for t in tasks) and not tg.graph.has_explicit_backward))
    group_ops = tuple(tuple(sorted({coarse_of_op[op] for g in groups
                                    for op in tg.group_ops[g]})) for groups in clusters)
    group = np.array([cluster_of_op[coarse.members[t.op_id][0]] for t in tasks],
                     dtype=np.int64)
    coarse_tg = TaskGraph(
        graph=coarse.graph, tasks=tuple(tasks),
        duration_s=np.array([tg.duration_s[ts].sum() for ts in members]),
        group=group, group_ops=group_ops, edge_src=src, edge_dst=dst,
        edge_transfer_s=cost, send_s=send, num_micro_batches=tg.num_micro_batches,
        corun_slowdown=tg.corun_slowdown)
    coarse_tg.topological_order  # noqa: B018 - asserts the contraction stayed acyclic
    return coarse_tg, members


def solve_makespan(problem: Problem, backend: Backend, incumbent: Incumbent,
                   deadline: float) -> tuple[float, str]:
    """Improve `incumbent` (a heuristic plan) by coarse MILP, expansion and local search;
    returns (proven bound, status)."""
    result = _search(problem, backend, incumbent, deadline)
    if incumbent.order is not None:
        gd = incumbent.group_device
        for fraction, order in zip(STAGGER_FRACTIONS * 2, _orderings(problem)):
            made = _schedule(problem.tg, gd, problem.num_devices, order, False).order
            if (order.stagger_s or order.dispatch) and [list(ts) for ts in made] == [
                    list(ts) for ts in incumbent.order]:
                how = "dispatch in time" if order.dispatch else "list schedule"
                incumbent.notes.append(
                    f"its order is the {how}'s with micro-batch m's ranks lowered "
                    f"by m x {fraction:g} of one micro-batch's work per device")
                break
    return result


def _staggers(problem: Problem) -> list[float]:
    """The micro-batch staggers (seconds) the list schedule tries; only 0 with one
    micro-batch, where a stagger changes nothing."""
    tg = problem.tg
    if tg.num_micro_batches == 1:
        return [0.0]
    per_device_s = float(tg.duration_s.sum()) / tg.num_micro_batches / problem.num_devices
    return [f * per_device_s for f in STAGGER_FRACTIONS]


class Ordering(NamedTuple):
    """How a placement's order is made: by `dispatch_schedule` or `list_schedule`, at
    a micro-batch stagger."""

    dispatch: bool
    stagger_s: float


#: The list schedule without a stagger, the one way with one micro-batch.
PLAIN_ORDER = Ordering(False, 0.0)


def _orderings(problem: Problem) -> list[Ordering]:
    """The ways of ordering a placement that the search chooses from: the list
    schedule at each stagger, and with several micro-batches the dispatch too."""
    several = problem.tg.num_micro_batches > 1
    return [Ordering(dispatch, s) for dispatch in ((False, True) if several else (False,))
            for s in _staggers(problem)]


def _best_ordering(problem: Problem, gd: np.ndarray) -> tuple[Ordering, Schedule]:
    """Of `_orderings`, the one whose schedule of `gd` is shortest, and that schedule."""
    tg, k = problem.tg, problem.num_devices
    return min(((o, _schedule(tg, gd, k, o, False)) for o in _orderings(problem)),
               key=lambda x: x[1].step_time_s)


def _search(problem: Problem, backend: Backend, incumbent: Incumbent,
            deadline: float) -> tuple[float, str]:
    tg, k = problem.tg, problem.num_devices
    # How the search orders a placement, re-chosen for the best placement before each
    # local search.
    rule = PLAIN_ORDER
    # Justified orders, with one micro-batch only: there they cut gnmt 2x1's step from
    # 382.2 to 373.2 ms; with several the stagger orders the micro-batches, and the
    # threefold cost of a justified score left inception_v3 4x4 7% behind (113.8 ms
    # against 106.1) in the same minute.
    justify = tg.num_micro_batches == 1

    def schedule_of(gd: np.ndarray):
        return _schedule(tg, gd, k, rule, justify)

    def offer(gd: np.ndarray, source: str) -> None:
        # The order goes with the plan: a stagger or a justification made it, not the
        # plain list schedule.
        schedule = schedule_of(gd)
        incumbent.offer(gd, schedule.step_time_s, source,
                        [list(ts) for ts in schedule.order])

    def pick_order() -> None:
        nonlocal rule
        rule = _best_ordering(problem, incumbent.group_device)[0]
        offer(incumbent.group_device, incumbent.source)

    def score(gd: np.ndarray) -> tuple[float, np.ndarray]:
        value = _score(tg, gd, k, rule, justify)
        leaders.note(gd, value[0])
        return value

    def chain_score(gd: np.ndarray, below: tuple[float, float] | None
                    ) -> tuple[tuple[float, float], list[int]] | None:
        return _chain_score(tg, gd, k, rule, justify, below, leaders)

    def refine(share: float) -> None:
        # The chain moves first (cheap), then the full neighbourhood, until neither
        # improves: each escapes the other's local optima. With branches, the chain
        # moves alone, then kicks.
        incumbent.stage = "local search"
        until = time.perf_counter() + share * max(0.0, deadline - time.perf_counter())
        pick_order()
        while time.perf_counter() < until:
            before = incumbent.value
            gd, _ = chain_search(incumbent.group_device, chain_score, num_devices=k,
                                 group_memory=problem.group_memory,
                                 memory_cap=problem.memory_cap, deadline=until,
                                 branches=branches)
            offer(gd, refined(incumbent.source))
            if branches is not None:
                # On Inception-V3 4x4 the full neighbourhood took a descended plan
                # from 98.5 to 97.9 ms in 21 s, where kicks reached 95.6-96.0 in 15 s.
                break
            gd, _ = local_search(incumbent.group_device, score, num_devices=k,
                                 group_memory=problem.group_memory,
                                 memory_cap=problem.memory_cap, deadline=until)
            offer(gd, refined(incumbent.source))
            if incumbent.value >= before:
                break
        # What is left of the share goes to kicks from the best placement.
        gd, _ = kicked_search(incumbent.group_device, chain_score, num_devices=k,
                              group_memory=problem.group_memory,
                              memory_cap=problem.memory_cap, deadline=until, rng=rng,
                              good_enough=good_enough, branches=branches,
                              **kick_descent)
        offer(gd, refined(incumbent.source))

    def runners_up() -> list[tuple[np.ndarray, Schedule]]:
        return [(gd, schedule_of(gd)) for gd in leaders.placements()]

    def reserve() -> float:
        # Time kept for packaging the plan (and for a solver that overran its clock).
        return min(2.0, 0.05 * problem.config.time_limit_s)

    rng = np.random.default_rng(0)
    # With several micro-batches the chain moves try whole branches too: on
    # Inception-V3 4x4 they took a plan no single move improved from 100.15 to 99.75 ms.
    branches = chain_branches(tg) if tg.num_micro_batches > 1 else None
    # After each gain the descent starts again from the chain's head, trying every
    # critical group and branch once more (about 5 s on Inception-V3 4x4), where the
    # sweep goes on from the moved group: from a placement the descent had left at
    # 98.5 ms, 15 s of kicks reached 95.6-96.0 ms with the sweep, 96.2-98.5 with the
    # descent (three seeds each, load 1.6).
    kick_descent = {} if branches is None else {"descent": chain_sweep}
    leaders = Leaders(ORDER_SEARCH_PLACEMENTS, ORDER_SEARCH_APART)
    # Proven without a solver, so it stands whatever a solver later answers.
    incumbent.proven_bound = max(incumbent.proven_bound, neighbour_bound(tg))
    # A plan within the gap of the bound needs no more kicks.
    good_enough = (max(problem.lower_bound(), incumbent.proven_bound)
                   / (1 - problem.config.gap))

    # The blocks' bound first: the decomposition's parts take half the time left,
    # which cut inception_v3 2x1's bound from 204.5 to 203.6 when the blocks came after.
    blocks = block_round(problem, backend, incumbent, deadline)
    # After a plan from several parts the whole graph's search gains 0.0-0.3% in a
    # minute (a move costs a simulation of the whole graph), so its time went to the
    # parts (DECOMPOSE_SHARE).
    parts_placed = tg.num_micro_batches == 1 and decompose_round(problem, incumbent,
                                                                 deadline)
    staggered_heft_round(problem, incumbent)
    # Local search first hands the MILP a better incumbent (tighter windows), but
    # must leave it time.
    if not parts_placed:
        refine(REFINE_SHARE)
        # With one micro-batch the search's best placements, judged by their best
        # orders found rather than their list schedules, and the placements near them.
        if tg.num_micro_batches == 1:
            order_search_round(problem, incumbent, deadline, rng, runners_up(),
                               SCHEDULE_SHARE, move_groups=True)
    # After the search, so that a split only replaces a better searched plan: on
    # Inception-V3 4x4 a split beat HEFT but the search from it stopped at 115.5 ms
    # where the search from HEFT reached 112.4 (load 4-5).
    split_round(problem, incumbent, deadline)
    if tg.corun_slowdown > 1:
        incumbent.notes.append(
            f"the step-time MILP leaves out the x{tg.corun_slowdown:.3g} co-run slowdown "
            "of devices sharing a host: the simulator judges its plans, and its bound is "
            "that of the relaxation")
    relaxed_bound = max(_relaxation_round(problem, backend, incumbent, deadline),
                        blocks.value, incumbent.proven_bound)
    if incumbent.value - relaxed_bound <= problem.config.gap * incumbent.value:
        return relaxed_bound, "optimal"
    incumbent.stage = "coarsening"
    clusters, label = _level(tg, k, problem, incumbent)
    if clusters == []:
        incumbent.notes.append(f"the step-time model is too large to solve ({label}, "
                               f"more than {MAX_PAIRS}): kept local search's plan")
        refine(1.0 - reserve() / max(deadline - time.perf_counter(), 1e-9))
        return relaxed_bound, "time_limit"
    bound, status = -math.inf, "time_limit"
    if clusters is not None and tg.num_micro_batches > 1:
        # A coarse model proves nothing, and with several micro-batches its plans
        # never won (the 4-micro-batch rows of benchmarks.md table 5): on Inception-V3
        # 4x4 its 12 clusters took 12 s of a minute, which the search uses better.
        incumbent.notes.append(f"with {tg.num_micro_batches} micro-batches the step-time "
                               f"model runs on the fine graph only (here {label}): not "
                               "solved")
    elif worth_a_round(problem, deadline):
        if clusters is None:
            ctg, members = tg, [[t] for t in range(tg.num_tasks)]
            unit_of_group = np.arange(tg.num_groups)
        else:
            ctg, members = coarse_task_graph(tg, clusters)
            unit_of_group = np.arange(len(clusters))
        share = FINE_SHARE if clusters is None else COARSE_SHARE
        round_deadline = time.perf_counter() + share * (deadline - time.perf_counter())
        bound, status = _makespan_round(problem, backend, incumbent, ctg, members,
                                        unit_of_group, clusters, label, round_deadline,
                                        blocks.spans)
    if status != "optimal":
        if not parts_placed:
            refine(ORDER_REFINE_SHARE)
        searched = order_search_round(problem, incumbent, deadline, rng, runners_up())
        if worth_a_round(problem, deadline):
            order_round(problem, backend, incumbent, deadline)
        if tg.num_micro_batches > 1:
            ordered_move_round(problem, incumbent, deadline - reserve(), searched)
        # The search takes what the order round leaves: it may prove its order early,
        # or not run at all on an order model over the cap.
        refine(1.0 - reserve() / max(deadline - time.perf_counter(), 1e-9))
    return max(bound, relaxed_bound), status


def _schedule(tg: TaskGraph, gd: np.ndarray, k: int, order: Ordering, justify: bool,
              cutoff_s: float = math.inf) -> Schedule | None:
    """`gd`'s schedule made the `order` way; None, where a dispatch makes it, once its
    step is sure to end after `cutoff_s`."""
    if order.dispatch:
        return dispatch_schedule(tg, gd, k, stagger_s=order.stagger_s, cutoff_s=cutoff_s)
    schedule = list_schedule(tg, gd, k, stagger_s=order.stagger_s)
    return justified(tg, gd, k, schedule) if justify else schedule


def _last_finishes(schedule, k: int) -> np.ndarray:
    last = np.zeros(k)
    np.maximum.at(last, schedule.device, schedule.finish_s)
    return last


def _score(tg: TaskGraph, gd: np.ndarray, k: int, order: Ordering, justify: bool
           ) -> tuple[float, np.ndarray]:
    """The step time and, to pick moves and break ties, each device's last finish."""
    schedule = _schedule(tg, gd, k, order, justify)
    return schedule.step_time_s, _last_finishes(schedule, k) + 1e-9 * busy_time(tg, gd, k)


def _chain_score(tg: TaskGraph, gd: np.ndarray, k: int, order: Ordering, justify: bool,
                 below: tuple[float, float] | None = None, leaders: Leaders | None = None
                 ) -> tuple[tuple[float, float], list[int]] | None:
    """(step time, sum of the devices' last finishes) and the critical chain's groups;
    None, the chain not traced, when the key is not below `below` (`refine.ChainScore`),
    and a dispatch stops as soon as its step is sure to end after below's. The step
    times of the schedules made to the end go to `leaders` too."""
    schedule = _schedule(tg, gd, k, order, justify,
                         math.inf if below is None else below[0])
    if schedule is None:
        return None
    key = (schedule.step_time_s, float(_last_finishes(schedule, k).sum()))
    if leaders is not None:
        leaders.note(gd, key[0])
    if below is not None and not key < below:
        return None
    return key, list(dict.fromkeys(tg.group[critical_chain(tg, schedule)].tolist()))


def _fits(problem: Problem, gd: np.ndarray) -> bool:
    return bool(np.bincount(gd, weights=problem.group_memory,
                            minlength=problem.num_devices).max() <= problem.memory_cap)


def staggered_heft_round(problem: Problem, incumbent: Incumbent) -> None:
    """Offer the best, by its best order (`_best_ordering`), of HEFT's placements with
    micro-batch m's ranks lowered by m x each of the staggers (`heuristics.heft`);
    several micro-batches only. On Inception-V3's paper preset on four V100s with four
    micro-batches (a minute's search from HEFT reached 103-108 ms) a stagger of 0.2
    puts the stem's first four ops on one device and its last three on another, the
    pipeline the search then takes to 97-99 ms."""
    tg, k = problem.tg, problem.num_devices
    if tg.num_micro_batches == 1:
        return
    incumbent.stage = "staggered heft"
    for fraction, stagger_s in zip(STAGGER_FRACTIONS[1:], _staggers(problem)[1:]):
        gd = heuristics.heft(tg, k, problem.group_memory, problem.memory_cap, stagger_s)
        if not _fits(problem, gd):
            continue
        schedule = _best_ordering(problem, gd)[1]
        incumbent.offer(gd, schedule.step_time_s,
                        f"heuristic:heft staggered by {fraction:g}",
                        [list(ts) for ts in schedule.order])


def split_round(problem: Problem, incumbent: Incumbent, deadline: float) -> None:
    """Offer the best, by its best order (`_best_ordering`), of the max-load-optimal
    contiguous splits (`heuristics.contiguous_split`) of evenly spaced rotations of the
    joined group sequences (`placement.sequences.joined_sequences`), within SPLIT_SHARE
    of the time left; several micro-batches only. A rotation puts both ends of the
    sequence on one device. Where the first and last ops share a weight (T5's tied
    embedding and output layer) every unrotated split puts that weight's device at the
    head of the pipeline, holding most of the work; the wrap-around split makes it the
    pipeline's last stage too, which runs its forward and backward in the middle of the
    step while the first stage's run at its start and end (T5-small on four V100s with
    four micro-batches: 155 ms where the baselines and local search reached 201)."""
    tg, k = problem.tg, problem.num_devices
    if tg.num_micro_batches == 1:
        return
    incumbent.stage = "contiguous splits"
    until = time.perf_counter() + SPLIT_SHARE * max(0.0, deadline - time.perf_counter())
    root = join_roots(side_inputs(tg, problem.group_memory, problem.memory_cap))
    # Both sequences' rotations in turn, so that a short share still tries each.
    sequences = joined_sequences(tg, root)
    rotations = sorted((r, i) for i, seq in enumerate(sequences)
                       for r in range(0, len(seq), max(1, len(seq) // SPLIT_ROTATIONS)))
    best = None
    for r, i in rotations:
        if time.perf_counter() > until:
            break
        seq = sequences[i]
        gd = heuristics.contiguous_split(tg, k, problem.group_memory, problem.memory_cap,
                                         seq[r:] + seq[:r])
        if not _fits(problem, gd):
            continue
        schedule = _best_ordering(problem, gd)[1]
        if best is None or schedule.step_time_s < best[1].step_time_s:
            best = (gd, schedule)
    if best is not None:
        incumbent.offer(best[0], best[1].step_time_s, "heuristic:rotated contiguous split",
                        [list(ts) for ts in best[1].order])


def decompose_round(problem: Problem, incumbent: Incumbent, deadline: float) -> bool:
    """Offer the placement assembled from the parts between articulation tasks
    (`placement.milp.decompose`), each part placed from its HEFT starts
    (`block_starts`) by chain sweeps and kicks under its own simulation, within
    DECOMPOSE_SHARE of the time left (ONE_PART_SHARE where one part is nearly the whole
    graph); one micro-batch only (with several no task is an articulation task).
    Returns whether a placement of several parts became the incumbent."""
    tg, k = problem.tg, problem.num_devices
    incumbent.stage = "block decomposition"
    one_part = largest_part(tg) >= ONE_PART * tg.num_tasks
    share = ONE_PART_SHARE if one_part else DECOMPOSE_SHARE
    until = time.perf_counter() + share * max(0.0, deadline - time.perf_counter())
    rng = np.random.default_rng(0)
    # Where the parts are small against the graph their searches run out of time
    # before they stall (a 78-task part of the 1,000-op layered DAG: 233.8 after its
    # 1.2 s, 224.5 after 8 s), so they judge placements by the plain list schedule, at
    # under half a justified one's cost (the 1,000-op DAG's parts 5,708 and 5,726
    # against 5,730 and 5,752 in two pairs of runs); the assembled placement is
    # justified all the same. One part is the whole graph's search, which justified
    # orders serve (see `_search`).
    justify = one_part

    def place_part(part: TaskGraph, part_until: float, starts: list[np.ndarray]
                   ) -> np.ndarray:
        # Each start is searched until its kicks stop paying (the search's local
        # optimum), then the next; the best wins.
        scored = sorted(((_score(part, g, k, PLAIN_ORDER, justify)[0], i)
                         for i, g in enumerate(starts)))
        best, best_value = starts[scored[0][1]], scored[0][0]
        for _, i in scored:
            if time.perf_counter() >= part_until:
                break
            gd, value = _search_part(part, k, starts[i], part_until, rng, justify)
            if value < best_value:
                best, best_value = gd, value
        return best

    gd = decomposed_placement(tg, k, until, place_part)
    if gd is None:
        return False
    used = np.bincount(gd, weights=problem.group_memory, minlength=k)
    if used.max() > problem.memory_cap * (1 + 1e-9):
        incumbent.notes.append("the block decomposition's placement breaks the memory "
                               "cap; not offered")
        return False
    schedule = _schedule(tg, gd, k, PLAIN_ORDER, True)
    return incumbent.offer(gd, schedule.step_time_s, "heuristic:block decomposition",
                           [list(ts) for ts in schedule.order]) and not one_part


def _search_part(part: TaskGraph, k: int, gd: np.ndarray, until: float,
                 rng: np.random.Generator, justify: bool) -> tuple[np.ndarray, float]:
    """A part's placement from `gd` by chain sweeps (`placement.refine.chain_sweep`)
    and kicks under the part's own list schedule (`justify`: justified), and its step
    time under it (the full
    neighbourhood of `local_search` gained nothing more on the layered DAGs' parts in
    the same time). Memory is checked on the assembled placement: a part's share of it
    is unknown."""
    zero = np.zeros(part.num_groups)

    def chain_score(g: np.ndarray, below: tuple[float, float] | None):
        return _chain_score(part, g, k, PLAIN_ORDER, justify, below)

    gd, _, _ = chain_sweep(gd, chain_score(gd, None), chain_score, k, zero, 1.0, until)
    return kicked_search(gd, chain_score, num_devices=k, group_memory=zero, memory_cap=1.0,
                         deadline=until, rng=rng, descent=chain_sweep)


def _relaxation_round(problem: Problem, backend: Backend, incumbent: Incumbent,
                      deadline: float) -> float:
    """The larger of the group energy model's (`placement.milp.energy_relaxation`) and
    the step-time relaxation's proven bounds (-inf when they do not run); the
    relaxation's placement, list-scheduled, is offered as a plan."""
    if problem.tg.num_micro_batches == 1 or not worth_a_round(problem, deadline):
        return -math.inf
    until = time.perf_counter() + ENERGY_SHARE * (deadline - time.perf_counter())
    energy = solve_energy_relaxation(problem, backend, incumbent, until)
    until = time.perf_counter() + RELAXATION_SHARE * (deadline - time.perf_counter())
    relaxation = solve_relaxation(problem, backend, incumbent, until, energy)
    gd = relaxation.group_device
    if gd is not None and placement_fits(problem, gd, incumbent, backend):
        value = list_schedule(problem.tg, gd, problem.num_devices).step_time_s
        incumbent.offer(gd, value, f"{backend.name} (step-time relaxation)")
    return max(relaxation.bound, energy)


def block_round(problem: Problem, backend: Backend, incumbent: Incumbent,
                deadline: float) -> BlockBound:
    """The blocks' bound (`placement.milp.block_bound`) with each block's least step
    time bounded by this module's MILP on the block alone, within BLOCK_SHARE of the
    time left."""
    k = problem.num_devices
    until = time.perf_counter() + BLOCK_SHARE * max(0.0, deadline - time.perf_counter())
    incumbent.stage = "block bound"

    def block_optimum(block: TaskGraph, lower: float) -> float:
        group_device = heuristics.heft(block, k, np.zeros(block.num_groups), 1.0)
        schedule = list_schedule(block, group_device, k)
        upper = schedule.step_time_s
        left = min(BLOCK_SECONDS, until - time.perf_counter())
        if upper <= lower * (1 + 1e-9) or left < 0.1:
            return lower
        # No memory cap: dropping it only admits more plans, so the bound still holds.
        data = makespan_data(block, np.arange(block.num_groups), k,
                             np.zeros(block.num_groups), 1.0, upper, lower)
        if len(data.pairs) > BLOCK_MAX_PAIRS:
            return lower
        model = build_makespan(data)
        set_start(model, data, group_device, schedule.start_s)
        result = run_checked(backend, model, SolveOptions(
            time_limit_s=left, gap=problem.config.gap * 1e-2,
            threads=problem.config.threads), incumbent)
        if result.status not in ("optimal", "time_limit"):
            return lower
        # Within the solver's tolerance of the block's optimum, never above it: the
        # spans go into the fine model, which every real schedule must satisfy.
        return min(upper, max(lower, result.lower_bound * data.scale * (1 - SPAN_SLACK)))

    bound = block_bound(problem.tg, k, block_optimum)
    if not bound.block_values:
        return bound

    def part_optimum(part: TaskGraph, lower: float) -> float:
        # A part of more tasks has more order decisions than a block may (on the
        # layered DAGs a part of 32 tasks has 120), and building its model to find
        # that out takes time in the square of its tasks.
        return lower if part.num_tasks > PART_MAX_TASKS else block_optimum(part, lower)

    return BlockBound(bound.value + part_gain(problem.tg, bound.block_values, part_optimum),
                      bound.spans, bound.block_values)


def order_search_round(problem: Problem, incumbent: Incumbent, deadline: float,
                       rng: np.random.Generator,
                       runners_up: Sequence[tuple[np.ndarray, Schedule]] = (),
                       share: float = ORDER_SEARCH_SHARE, move_groups: bool = False
                       ) -> list[tuple[np.ndarray, Schedule, str]]:
    """Offer the incumbent's placement, then each of `runners_up` (placements with a
    schedule of theirs), with the order `order_search` finds from its own (with
    `move_groups`, the placement and order `placement.refine.schedule_search` finds),
    all within `share` of the time left, split evenly (what one leaves goes to the
    next). The order search, a descent, may be the better of the two in a couple of
    seconds: on Inception-V3's paper preset on two V100s (tasks of 1 ms on average), in
    this round at the end, the annealing left the plan at 211.2 ms where the order
    search had reached 211.1 (one run each, box idle). Returns each placement with the
    schedule found for it and its source."""
    tg = problem.tg
    incumbent.stage = "order search"
    until = time.perf_counter() + share * max(0.0, deadline - time.perf_counter())
    gd = incumbent.group_device
    searched = []
    candidates = [(gd, _incumbent_schedule(problem, incumbent), incumbent.source)] + [
        (other, own, f"{HEURISTIC}local search") for other, own in runners_up
        if not np.array_equal(other, gd)]
    for i, (gd, schedule, source) in enumerate(candidates):
        left = until - time.perf_counter()
        candidate_until = time.perf_counter() + left / (len(candidates) - i)
        if move_groups:
            gd, found = schedule_search(tg, gd, schedule, group_memory=problem.group_memory,
                                        memory_cap=problem.memory_cap,
                                        deadline=candidate_until, rng=rng)
            how = "schedule search"
        else:
            if tg.num_micro_batches > 1:
                # The search's orders are dispatches, which it does not justify (a
                # justified score cost inception_v3 4x4 the minute's gain): from the
                # justified order the search took that row's best placement from 99.4
                # to 98.7 ms in 6 s, where from the dispatch it reached 99.4.
                schedule = justified(tg, gd, problem.num_devices, schedule, dispatch=True)
            found = order_search(tg, gd, schedule, rng=rng, deadline=candidate_until)
            how = "order search"
        incumbent.offer(gd, found.step_time_s, f"{source} + {how}",
                        [list(ts) for ts in found.order])
        searched.append((gd, found, f"{source} + {how}"))
    return searched


def ordered_move_round(problem: Problem, incumbent: Incumbent, deadline: float,
                       plans: Sequence[tuple[np.ndarray, Schedule, str]] = ()) -> None:
    """Offer the incumbent's plan, then each of `plans` (placements with their orders,
    best first), after the moves of `placement.refine.ordered_move_search` (each
    placement judged by the best order found near the plan's own), until no move helps
    or `deadline`. With several micro-batches the incumbent's order comes from the
    order search, and the placement searches, which judge a move by a fresh dispatch,
    find no move that beats it."""
    incumbent.stage = "ordered moves"
    starts = [(incumbent.group_device, _incumbent_schedule(problem, incumbent),
               incumbent.source)] + sorted(
        ((gd, schedule, source) for gd, schedule, source in plans
         if not np.array_equal(gd, incumbent.group_device)),
        key=lambda p: p[1].step_time_s)
    for gd, schedule, source in starts:
        if time.perf_counter() >= deadline:
            break
        gd, found = ordered_move_search(problem.tg, gd, schedule,
                                        group_memory=problem.group_memory,
                                        memory_cap=problem.memory_cap, deadline=deadline)
        incumbent.offer(gd, found.step_time_s, f"{source} + ordered moves",
                        [list(ts) for ts in found.order])


def _incumbent_schedule(problem: Problem, incumbent: Incumbent) -> Schedule:
    """The incumbent's schedule: its order's, else its placement's list schedule."""
    if incumbent.order is not None:
        return evaluate_order(problem.tg, incumbent.group_device, incumbent.order)
    return list_schedule(problem.tg, incumbent.group_device, problem.num_devices)


def order_round(problem: Problem, backend: Backend, incumbent: Incumbent,
                deadline: float) -> None:
    """The second half of a decomposition: keep the incumbent's placement and let the
    MILP choose each device's task order, which the list schedule fixes by upward
    rank. With the units pinned to distinct devices only pairs on one device are order
    decisions, a fraction of the full model's. Its bound holds for this placement
    alone, so it proves nothing about the problem and is dropped."""
    tg, k = problem.tg, problem.num_devices
    placed = incumbent.source
    schedule = _incumbent_schedule(problem, incumbent)
    device = canonical_devices(incumbent.group_device)
    num_used = int(device.max()) + 1
    incumbent.stage = "model build (order)"
    data = makespan_data(tg, device, k, np.bincount(device, weights=problem.group_memory,
                                                    minlength=num_used),
                         problem.memory_cap, incumbent.value, problem.lower_bound(),
                         same_unit_only=True)
    if len(data.pairs) > MAX_PAIRS:
        incumbent.notes.append(f"the order model of the best placement has "
                               f"{len(data.pairs)} order decisions (more than {MAX_PAIRS}): "
                               "kept its list schedule")
        return
    model = build_makespan(data)
    set_start(model, data, np.arange(num_used), schedule.start_s)
    for u in model.U:
        for d in model.D:
            model.x[u, d].fix(float(u == d))
    # The last step before the deadline: keep a margin for solvers that overrun their
    # clock a little under load, and for packaging the plan.
    left = deadline - time.perf_counter() - min(2.0, 0.1 * problem.config.time_limit_s)
    if left < 0.5:
        return
    options = SolveOptions(time_limit_s=left, gap=problem.config.gap,
                           threads=problem.config.threads,
                           cutoff=incumbent.value / data.scale)
    incumbent.stage = "solve (order)"
    result = run_checked(backend, model, options, incumbent)
    found = solution(model, data) if result.has_solution else None
    if found is None:
        return
    unit_device, start = found
    group_device = unit_device[device]
    order = _expand_order(tg, [[t] for t in range(tg.num_tasks)], group_device[tg.group],
                          start, k)
    try:
        value = evaluate_order(tg, group_device, order).step_time_s
    except OrderError:
        return
    incumbent.offer(group_device, value, f"{backend.name} order on the {placed} placement",
                    order)


def _level(tg: TaskGraph, k: int, problem: Problem,
           incumbent: Incumbent) -> tuple[list[list[int]] | None, str]:
    """What to solve: the fine graph (None) when its model has at most MAX_PAIRS order
    decisions, else the finest clustering (chains, then ever fewer intervals) whose
    coarse model does; nothing (an empty list) when none does, as a model that large
    takes minutes to build and hand to the solver."""
    def pairs(ctg: TaskGraph) -> int:
        head, tail = heads_tails(ctg)
        return len(order_pairs(ctg, head, tail, incumbent.value))

    if pairs(tg) <= MAX_PAIRS:
        return None, "fine"
    candidates = [chain_clusters(tg, float(tg.duration_s.sum()) / k / 4)]
    candidates += [interval_clusters(tg, n) for n in (60, 40, 24, 12)]
    for clusters in candidates:
        count = pairs(coarse_task_graph(tg, clusters)[0])
        if count <= MAX_PAIRS:
            return clusters, f"{len(clusters)} clusters"
    return [], f"{count} order decisions on {len(clusters)} clusters"


def _cluster_memory(problem: Problem, clusters: list[list[int]]) -> np.ndarray:
    return np.array([problem.group_memory[list(c)].sum() for c in clusters])


def _makespan_round(problem: Problem, backend: Backend, incumbent: Incumbent,
                    ctg: TaskGraph, members: list[list[int]], unit_of_group: np.ndarray,
                    clusters: list[list[int]] | None, label: str,
                    deadline: float, spans: tuple[tuple[int, int, float], ...] = ()
                    ) -> tuple[float, str]:
    """One MILP on `ctg` (the fine graph when `clusters` is None, which alone gets
    the valid inequalities `spans`); returns its fine bound (-inf for a coarse model)
    and status."""
    tg, k = problem.tg, problem.num_devices
    unit_memory = (problem.group_memory if clusters is None
                   else _cluster_memory(problem, clusters))
    fine = clusters is None
    # Warm start: the incumbent itself on the fine graph; on the coarse one, the better
    # of HEFT and the incumbent projected (each cluster where most of its work sits).
    if fine:
        starts = [incumbent.group_device]
    else:
        starts = [heuristics.heft(ctg, k, unit_memory, problem.memory_cap),
                  _project(incumbent.group_device, clusters, tg, k)]
    schedules = [(list_schedule(ctg, gd, k), gd) for gd in starts
                 if np.bincount(gd, weights=unit_memory, minlength=k).max()
                 <= problem.memory_cap]
    schedule, start_device = min(schedules, key=lambda x: x[0].step_time_s)
    # Only plans that beat the incumbent matter: its value bounds the time windows.
    incumbent.stage = f"model build ({label})"
    data = makespan_data(ctg, unit_of_group, k, unit_memory, problem.memory_cap,
                         incumbent.value, problem.lower_bound(),
                         spans=spans if fine else ())
    model = build_makespan(data)
    if schedule.step_time_s <= incumbent.value:
        set_start(model, data, start_device, schedule.start_s)
    left = deadline - time.perf_counter() - min(2.0, 0.05 * problem.config.time_limit_s)
    options = SolveOptions(time_limit_s=max(left, 0.5), gap=problem.config.gap,
                           threads=problem.config.threads,
                           cutoff=incumbent.value / data.scale if fine else None)
    incumbent.stage = f"solve ({label})"
    result = run_checked(backend, model, options, incumbent)
    found = solution(model, data) if result.has_solution else None
    if result.has_solution and found is None:
        incumbent.notes.append(f"warning: {backend.name} returned a partial solution; "
                               "ignored it")
    # Devices that share a host slow each other down while both run; the model leaves
    # that out, so it is a relaxation: its claim may be lower than the simulator's, and
    # its bound still holds (a slowdown only delays tasks).
    relaxed = tg.corun_slowdown > 1
    trusted = True
    if found is not None:
        incumbent.stage = f"expansion ({label})"
        unit_device, start = found
        claimed = model.C.value * data.scale
        group_device = (unit_device if fine else _expand_groups(unit_device, clusters,
                                                                 tg.num_groups))
        if not placement_fits(problem, group_device, incumbent, backend):
            return (-math.inf, "time_limit")
        order = _expand_order(ctg, members, unit_device[ctg.group], start, k)
        try:
            value = evaluate_order(tg, group_device, order).step_time_s
        except OrderError:
            # Start times within the solver's tolerance can put a task just before
            # its zero-length predecessor; the placement stands, with a list schedule.
            value, order = math.inf, None
        if fine and order is not None and not relaxed:
            trusted = believable(claimed, value, incumbent, backend)
        if order is not None:
            incumbent.offer(group_device, value, f"{backend.name} ({label})", order)
        listed = list_schedule(tg, group_device, k).step_time_s
        incumbent.offer(group_device, listed, f"{backend.name} ({label}) + list schedule")
    if not trusted:
        return -math.inf, "time_limit"
    bound = result.lower_bound * data.scale if fine else -math.inf
    if fine and result.status == "optimal" and not relaxed:
        return max(bound, incumbent.value * (1 - problem.config.gap)), "optimal"
    return bound, "time_limit"


def _project(group_device: np.ndarray, clusters: list[list[int]], tg: TaskGraph,
             k: int) -> np.ndarray:
    """Each cluster on the device that holds most of its work in `group_device`."""
    return np.array([int(np.argmax(np.bincount(group_device[c], weights=tg.group_work_s[c],
                                                minlength=k))) for c in clusters],
                    dtype=np.int64)


def _expand_groups(unit_device: np.ndarray, clusters, num_groups: int) -> np.ndarray:
    group_device = np.empty(num_groups, dtype=np.int64)
    for c, groups in enumerate(clusters):
        group_device[list(groups)] = unit_device[c]
    return group_device


def _expand_order(ctg: TaskGraph, members, task_device: np.ndarray, start: np.ndarray,
                  k: int) -> list[list[int]]:
    """Per device, the coarse tasks by start time, each replaced by its fine tasks."""
    finish = start + ctg.duration_s
    coarse_order = order_by_start(ctg, task_device, start, finish, k)
    return [[f for c in tasks for f in members[c]] for tasks in coarse_order]
