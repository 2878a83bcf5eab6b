"""Max-load lower bounds that charge the transfers a split cannot avoid.

A device's max-load is its work plus the cost of every sender *cut* by its set S of
groups (a sender's tasks in S with a successor outside, or outside with a successor
in S: `simulate.device_loads`). The LP relaxation of the MILP only sees total work / k,
which on operator graphs whose transfers outweigh their work is far below any plan.

The path cut bound: take a path g_1 .. g_n of groups in which each consecutive pair
shares senders, each sender charged to one pair only, c_i the cost of the senders of
pair (g_i, g_(i+1)). In any placement, cut the path into segments (maximal runs on one
device): a segment's device pays its work and, for each end pair that crosses, c_i
(those senders are cut, and both end devices pay them). So with every load at most L,
every segment costs at most L, and the k loads sum to at least the total work W plus
twice the c_i of every crossing pair:

    k L >= W + T(L),   T(L) = least 2 * sum of crossing c_i over the path's
                              segmentations whose segments all cost at most L.

T is non-increasing in L, so the least L that passes is found by bisection, and T(L)
is a dynamic program over the path. Hand-written: this is a bound of the model's own
load function, which no solver or graph library computes.

The heavy group bound: the device holding group u has load work(S) + cut(S), at
least the least such value over every S holding u, a minimum s-t cut.
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np

from placement.coarsen import group_graph
from placement.ideal_dp import merged_senders
from placement.tasks import TaskGraph

#: Bisection steps: the bound is then within 2^-40 of the least L that passes.
BISECTION_STEPS = 40
#: Groups (the heaviest) whose own device's least load `heavy_group_bound` computes.
HEAVY_GROUPS = 3
#: Relative slack on the feasibility checks, so rounding never rejects a real plan.
SLACK = 1e-9


def path_cut_bound(tg: TaskGraph, num_devices: int, lower: float, upper: float) -> float:
    """A proven lower bound on the max-load of any placement onto `num_devices`, at
    least `lower` (a known bound); `upper` is the value of some placement (that L
    passes, so the bisection stays in [lower, upper])."""
    if num_devices <= 1 or not upper > lower:
        return lower
    work, costs = heaviest_path(tg)
    total = float(tg.duration_s.sum())

    def passes(bound: float) -> bool:
        return num_devices * bound * (1 + SLACK) >= total + crossing_cost(work, costs, bound)

    if passes(lower):
        return lower
    lo, hi = lower, upper
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if passes(mid):
            hi = mid
        else:
            lo = mid
    return lo


def heaviest_path(tg: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    """The path of most work through groups joined by senders, ordered by the group
    sequence (so the arcs are acyclic): per path group its work, and per consecutive
    pair the cost of the senders it is charged (each sender charged once)."""
    later, _, seq = group_graph(tg)
    work = tg.group_work_s
    best = work.copy()
    parent = np.full(tg.num_groups, -1)
    for g in seq:
        for h in later[g]:
            if best[g] + work[h] > best[h]:
                best[h], parent[h] = best[g] + work[h], g
    path = [int(np.argmax(best))]
    while parent[path[-1]] >= 0:
        path.append(int(parent[path[-1]]))
    path.reverse()
    senders = merged_senders(tg, np.arange(tg.num_groups))
    on_path = {g: i for i, g in enumerate(path)}
    costs = np.zeros(max(0, len(path) - 1))
    for unit, targets, cost in zip(senders.unit.tolist(), senders.targets,
                                   senders.cost.tolist()):
        # The first path pair inside the sender's groups gets it.
        members = sorted(on_path[g] for g in (unit, *targets) if g in on_path)
        pair = next((i for i, j in zip(members, members[1:]) if j == i + 1), None)
        if pair is not None:
            costs[pair] += cost
    return work[path], costs


def crossing_cost(work: np.ndarray, costs: np.ndarray, bound: float) -> float:
    """T(bound): the least 2 * sum of c_i over the crossing pairs of a segmentation of
    the path whose segments each cost at most `bound` (inf when none does)."""
    n = len(work)
    prefix = np.concatenate([[0.0], np.cumsum(work)])
    left = np.concatenate([[0.0], costs])  # a segment starting at i pays c_(i-1)
    limit = bound * (1 + SLACK)
    # best[j]: the least cost of segmenting groups 0..j-1, a segment ending at j-1.
    best = np.full(n + 1, math.inf)
    best[0] = 0.0
    for j in range(1, n + 1):
        right = costs[j - 1] if j < n else 0.0
        first = int(np.searchsorted(prefix, prefix[j] - limit, side="left"))
        starts = np.arange(first, j)
        if not len(starts):
            continue
        fits = prefix[j] - prefix[starts] + left[starts] + right <= limit
        if fits.any():
            best[j] = float(best[starts[fits]].min()) + 2 * right
    return float(best[n])


def heavy_group_bound(tg: TaskGraph, lower: float,
                      num_groups: int = HEAVY_GROUPS) -> float:
    """A proven lower bound from the heaviest groups' own devices, at least `lower`:
    the device holding group u has load work(S) + cut(S) for its set S of groups, so
    at least the least such value over all S holding u. That minimum is a minimum s-t
    cut (u the source; every other group v pays its work on an arc to the sink; each
    sender a hyperedge by Lawler's gadget, its cost on the middle arc), solved by
    networkx. A group alone, S = {u}, caps it: groups whose cap is at most `lower`
    are skipped (on most graphs all are, and no cut is computed)."""
    senders = merged_senders(tg, np.arange(tg.num_groups))
    work = tg.group_work_s
    alone = work.copy()
    for unit, targets, cost in zip(senders.unit.tolist(), senders.targets,
                                   senders.cost.tolist()):
        alone[[unit, *targets]] += cost
    candidates = [u for u in np.argsort(-work)[:num_groups].tolist() if alone[u] > lower]
    if not candidates:
        return lower
    graph = nx.DiGraph()
    for v in range(tg.num_groups):
        graph.add_edge(v, "sink", capacity=float(work[v]))
    for s, (unit, targets, cost) in enumerate(zip(senders.unit.tolist(), senders.targets,
                                                  senders.cost.tolist())):
        graph.add_edge(("in", s), ("out", s), capacity=cost)
        for v in (unit, *targets):
            graph.add_edge(v, ("in", s))  # no capacity: never cut
            graph.add_edge(("out", s), v)
    best = lower
    for u in candidates:
        graph.remove_edge(u, "sink")
        cut, _ = nx.minimum_cut(graph, u, "sink")
        graph.add_edge(u, "sink", capacity=float(work[u]))
        best = max(best, float(work[u]) + cut)
    return best
