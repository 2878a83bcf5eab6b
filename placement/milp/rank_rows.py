"""Rows of the step-time relaxation that see the micro-batches pass one at a time.

The relaxation (`placement.milp.pipeline_bound`) gives all K micro-batch copies of a
task t one head E[t] and one tail Q[t]. But the copies of an op share its group's
device and run there in turn, and so does the work of each copy between two tasks. So,
over the copies of t in the order they run (one device: start order = finish order),

  E[t,j]  a lower bound on the start of the (j+1)-th copy of t, E[t,0] = E[t];
  Q[t,j]  on the time after the finish of the (j+1)-th copy from the last, Q[t,0] = Q[t];

  E[t,j] >= E[t,j-1] + p_t                          (the copies run in turn)
  E[v,j] >= E[u,j] + p_u + c_e z_e  for edges u->v  (the first j+1 copies of v have
                                                     j+1 distinct copies of u as inputs,
                                                     the last of which starts at E[u,j]
                                                     or later)
  E[t,j] >= E[a,0] + (j+1) sum_g w_g(a,t) x[g,d]    for anchor pairs a before t, devices d
  C >= E[t,j] + p_t + Q[t,K-1-j]                    (the (j+1)-th copy to start is the
                                                     (K-j)-th from the last to finish)

and the tails alike (Q[u,j] >= Q[v,j] + p_v + c_e z_e; Q[a,j] >= Q[t,0] + (j+1) sum_g
w'_g(a,t) x[g,d]). w_g(a,t) is the time of g's tasks that are a or follow it and
precede t, in one micro-batch (w': follow a, are t or precede it): the first j+1 copies
of t wait for j+1 micro-batches' copies of that work, each started after the first copy
of a, and device d runs its share of them one at a time: energetic precedence (the
head adjustment of disjunctive scheduling) with the micro-batches counted.

`placement_bound` solves the relaxation with these rows for one fixed placement, a
linear program: a bound on every order of that placement, which says how much of a
plan's gap a better order could close and how much only another placement can. Over
all placements the rows do not pay within a minute (see docs/benchmarks.md, table 5):
their strength needs the module groups placed integrally, where the partial models
place only the heaviest, so the solve path does not use them.

Anchors are the articulation tasks of one micro-batch (comparable to every other task:
the joins between Inception's modules, its stem); pairs at most ANCHOR_SPAN anchors
apart, and every pair from the first anchor or to the last. On Inception-V3's paper
preset on four V100s with four micro-batches a placement the relaxation's full model
returned (88.4 ms by its own rows) gets 97.4 ms with these (pairs up to three apart
give all of it; every pair of anchors gives no more): its stem and modules pass the
micro-batches one at a time, which one head per task did not see.
"""

from __future__ import annotations

import math

import numpy as np
import pyomo.environ as pyo

from placement.milp.backends import Backend, SolveOptions
from placement.milp.max_load import canonical_devices
from placement.milp.pipeline_bound import build_relaxation, reach_or_self, relaxation_data
from placement.problem import Problem
from placement.tasks import TaskGraph

#: Anchor pairs further apart than this many anchors get no rows (besides those from the
#: first anchor or to the last): see the module docstring.
ANCHOR_SPAN = 3


def anchor_pairs(tg: TaskGraph, reach: np.ndarray) -> list[tuple[int, int]]:
    """(a, t) pairs of articulation tasks of `tg` (one micro-batch), a before t, at most
    ANCHOR_SPAN apart in topological order or from the first or to the last."""
    comparable = (reach | reach.T).all(axis=1)
    anchors = [t for t in tg.topological_order if comparable[t]]
    last = len(anchors) - 1
    return [(anchors[i], anchors[j]) for i in range(last + 1) for j in range(i + 1, last + 1)
            if j - i <= ANCHOR_SPAN or i == 0 or j == last]


def _group_work(tg: TaskGraph, inside: np.ndarray, scale: float) -> dict[int, float]:
    work = np.bincount(tg.group[inside], weights=tg.duration_s[inside],
                       minlength=tg.num_groups) / scale
    return {int(g): float(work[g]) for g in np.flatnonzero(work)}


def add_rank_rows(m: pyo.ConcreteModel, tg: TaskGraph, num_micro_batches: int,
                  reach: np.ndarray, scale: float) -> None:
    """Add the rows above to a relaxation model `m` of `pipeline_bound.build_relaxation`
    (its x, z, start, after and C, in units of `scale`) over `tg`, one micro-batch's
    tasks; `reach[i, j]`: i == j or a path leads from i to j."""
    K = num_micro_batches
    if K == 1:
        return
    dur = tg.duration_s / scale
    n = tg.num_tasks
    m.J = pyo.Set(initialize=range(1, K), doc="copies after the first, in running order")
    m.rank_start = pyo.Var(m.T, m.J, bounds=lambda m, t, j: (
        pyo.value(m.start[t].lb) + j * float(dur[t]), None))
    m.rank_after = pyo.Var(m.T, m.J, bounds=lambda m, t, j: (
        pyo.value(m.after[t].lb) + j * float(dur[t]), None))

    def start(t: int, j: int):
        return m.start[t] if j == 0 else m.rank_start[t, j]

    def after(t: int, j: int):
        return m.after[t] if j == 0 else m.rank_after[t, j]

    # E[t,j] >= E[t,j-1] + p_t and Q[t,j] >= Q[t,j-1] + p_t
    m.rank_turn = pyo.Constraint(m.T, m.J, [0, 1], rule=lambda m, t, j, tail: (
        after(t, j) >= after(t, j - 1) + float(dur[t]) if tail
        else start(t, j) >= start(t, j - 1) + float(dur[t])))

    def delay(e: int):
        return float(tg.edge_transfer_s[e] / scale) * m.z[e] if e in m.X else 0

    # E[v,j] >= E[u,j] + p_u + c_e z_e and Q[u,j] >= Q[v,j] + p_v + c_e z_e
    def edge_rule(m, e, j, tail):
        u, v = int(tg.edge_src[e]), int(tg.edge_dst[e])
        if tail:
            return after(u, j) >= after(v, j) + float(dur[v]) + delay(e)
        return start(v, j) >= start(u, j) + float(dur[u]) + delay(e)
    m.rank_edge = pyo.Constraint(m.E, m.J, [0, 1], rule=edge_rule)

    # C >= E[t,j] + p_t + Q[t,K-1-j]
    m.rank_span = pyo.Constraint(m.T, range(K), rule=lambda m, t, j: (
        m.C >= start(t, j) + float(dur[t]) + after(t, K - 1 - j)))

    # E[t,j] >= E[a,0] + (j+1) sum_g w_g(a,t) x[g,d]; Q[a,j] >= Q[t,0] + (j+1) sum_g w'_g x
    strict = reach & ~np.eye(n, dtype=bool)
    rows = []
    for a, t in anchor_pairs(tg, reach):
        rows.append((False, a, t, _group_work(tg, reach[a] & strict[:, t], scale)))
        rows.append((True, a, t, _group_work(tg, strict[a] & reach[:, t], scale)))
    m.P = pyo.Set(initialize=range(len(rows)), doc="anchor pairs (a, t), heads and tails")

    def precedence_rule(m, r, j, d):
        tail, a, t, work = rows[r]
        load = (j + 1) * sum(w * m.x[g, d] for g, w in work.items())
        if tail:
            return after(a, j) >= m.after[t] + load
        return start(t, j) >= m.start[a] + load
    m.rank_precedence = pyo.Constraint(m.P, range(K), m.D, rule=precedence_rule)


def placement_bound(problem: Problem, group_device: np.ndarray, backend: Backend,
                    time_limit_s: float, with_rank_rows: bool = True) -> float:
    """A lower bound on the step time of every order of the placement `group_device`:
    the relaxation with x fixed to it (with the rows above unless `with_rank_rows` is
    False); -inf when the solver proves none in `time_limit_s`."""
    data = relaxation_data(problem, upper_bound=problem.evaluate(group_device))
    model = build_relaxation(data)
    if with_rank_rows:
        add_rank_rows(model, data.tg, data.num_micro_batches, reach_or_self(data.tg),
                      data.scale)
    device = canonical_devices(group_device)
    for g in model.U:
        for d in model.D:
            model.x[g, d].fix(float(device[g] == d))
    result = backend.run(model, SolveOptions(time_limit_s=time_limit_s, gap=0.0))
    if result.status != "optimal":
        return -math.inf
    return result.lower_bound * data.scale
