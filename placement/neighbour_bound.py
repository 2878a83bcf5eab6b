"""A step-time bound for a heavy group that either takes its dear neighbours onto its
device or pays their transfers.

The window bound (`placement.step_bound`) charges a placement group's tasks on its
one device between their heads and tails, but with transfer-free heads: on T5 the
tied embedding and LM head (0.81 of a device's share of work) sit between the
decoder's forward and backward, and the loss after them receives the logits (10.5 ms
per micro-batch on a V100 link) and sends their gradient back. A plan either puts the
loss on the LM head's device, whose window then holds the loss's work too, or pays
both transfers between each micro-batch's LM head forward and backward, which
delays the backward's head. Either way the device's step is longer than the window
bound says; which is shorter depends on the graph, so the bound takes the least.

For a group g and its *dear neighbours* N (the groups reached from g over edges of the
largest transfers, at most MAX_NEIGHBOURS), every plan puts some S of N on g's
device and the rest elsewhere. Given S, each edge between g + S and N - S crosses
devices and delays its head by its transfer; every other edge may not cross, so it
costs nothing. The heads E_t and tails Q_t of that graph (longest chains, the task's
own time in neither) are at most the plan's start times and times after finish, and
the copies of the tasks of g + S run one at a time on one device, each inside
[E_t, C - Q_t]:

    C >= a + K * work{t in g + S: E_t >= a, Q_t >= b} + b   for all thresholds a, b

(the single-machine bound with heads and tails, one micro-batch's tasks counted K
times: the micro-batches are copies with no edges between them). The bound for g is
the least over the 2^|N| choices of S, and the bound is the largest over the groups
tried. With N empty it is the window bound of g alone, with transfer-free heads.
"""

from __future__ import annotations

import itertools

import numpy as np

from placement.tasks import TaskGraph, one_micro_batch

#: Groups tried (those of most work), and the most dear neighbours of each: the
#: bound solves 2^MAX_NEIGHBOURS longest-path problems per group.
MAX_GROUPS = 4
MAX_NEIGHBOURS = 4
#: An edge is dear when its transfer is at least this share of the group's work per
#: micro-batch (on T5 the logits cost 0.56 of the LM head's 18.9 ms; a layer's
#: activations 0.17 ms).
DEAR_SHARE = 0.1


def neighbour_bound(tg: TaskGraph) -> float:
    """The largest bound over the MAX_GROUPS groups of most work (see the module
    docstring); 0 for an empty graph."""
    if tg.num_tasks == 0:
        return 0.0
    one = one_micro_batch(tg)
    heavy = np.argsort(-one.group_work_s, kind="stable")[:MAX_GROUPS]
    return max(group_bound(one, tg.num_micro_batches, int(g)) for g in heavy.tolist())


def dear_neighbours(tg: TaskGraph, g: int) -> list[int]:
    """The groups reached from g over dear edges, nearest first (breadth-first, the
    dearest edge first), at most MAX_NEIGHBOURS."""
    threshold = DEAR_SHARE * float(tg.group_work_s[g]) / tg.num_micro_batches
    dear = tg.edge_transfer_s >= max(threshold, 1e-300)
    src, dst = tg.group[tg.edge_src[dear]], tg.group[tg.edge_dst[dear]]
    cost = tg.edge_transfer_s[dear]
    found: list[int] = []
    frontier = [g]
    while frontier and len(found) < MAX_NEIGHBOURS:
        reached: dict[int, float] = {}
        for u in frontier:
            for a, b, c in ((src, dst, cost), (dst, src, cost)):
                for v, w in zip(b[a == u].tolist(), c[a == u].tolist()):
                    if v != g and v not in found:
                        reached[v] = max(reached.get(v, 0.0), w)
        frontier = sorted(reached, key=lambda v: -reached[v])[:MAX_NEIGHBOURS - len(found)]
        found += frontier
    return found


def group_bound(tg: TaskGraph, num_micro_batches: int, g: int) -> float:
    """The least over the choices S of g's dear neighbours of the single-machine
    bound of g + S, on `tg`, one micro-batch's tasks."""
    neighbours = dear_neighbours(tg, g)
    into: list[list[int]] = [[] for _ in range(tg.num_tasks)]
    out: list[list[int]] = [[] for _ in range(tg.num_tasks)]
    for e, (u, v) in enumerate(zip(tg.edge_src.tolist(), tg.edge_dst.tolist())):
        into[v].append(e)
        out[u].append(e)
    best = np.inf
    for mask in itertools.product((False, True), repeat=len(neighbours)):
        mine = [g, *(n for n, on in zip(neighbours, mask) if on)]
        away = [n for n, on in zip(neighbours, mask) if not on]
        best = min(best, one_device_bound(tg, num_micro_batches, mine, away, (into, out)))
    return float(best)


def one_device_bound(tg: TaskGraph, num_micro_batches: int, mine: list[int],
                     away: list[int], edges: tuple[list[list[int]], list[list[int]]]
                     ) -> float:
    """The single-machine bound of the groups `mine` on one device when the groups
    `away` sit on others (`edges`: each task's incoming and outgoing edge ids)."""
    group = tg.group
    src_mine, dst_mine = np.isin(group[tg.edge_src], mine), np.isin(group[tg.edge_dst], mine)
    src_away, dst_away = np.isin(group[tg.edge_src], away), np.isin(group[tg.edge_dst], away)
    crossing = (src_mine & dst_away) | (src_away & dst_mine)
    delay = np.where(crossing, tg.edge_transfer_s, 0.0).tolist()
    dur = tg.duration_s.tolist()
    src, dst = tg.edge_src.tolist(), tg.edge_dst.tolist()
    into, out = edges
    head = [0.0] * tg.num_tasks
    after = [0.0] * tg.num_tasks
    for t in tg.topological_order:
        head[t] = max((head[src[e]] + dur[src[e]] + delay[e] for e in into[t]), default=0.0)
    for t in reversed(tg.topological_order):
        after[t] = max((after[dst[e]] + dur[dst[e]] + delay[e] for e in out[t]), default=0.0)
    tasks = np.flatnonzero(np.isin(group, mine))
    return _single_machine(np.array(head)[tasks], np.array(after)[tasks],
                           num_micro_batches * tg.duration_s[tasks])


def _single_machine(head: np.ndarray, after: np.ndarray, work: np.ndarray) -> float:
    """max over thresholds a, b of a + work{head >= a, after >= b} + b: the preemptive
    single-machine bound with heads and tails (Jackson's), which every schedule of
    these tasks on one device meets."""
    best = 0.0
    for a in np.unique(head).tolist():
        inside = head >= a
        by_after = np.argsort(-after[inside], kind="stable")
        b = after[inside][by_after]
        best = max(best, float((a + np.cumsum(work[inside][by_after]) + b).max()))
    return best
