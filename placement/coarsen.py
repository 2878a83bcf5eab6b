"""Coarsening an op graph for the planners, and expanding a coarse plan back.

A *cluster* is a set of placement groups (TaskGraph groups: colocation classes, each
forward op with its backward) that the coarse graph keeps on one device. `contract`
turns clusters into a coarse OpGraph: each cluster becomes one coarse op per phase
(forward ops, explicit backward ops), or, when the cluster is not convex, one per convex
piece of it (so the coarse graph is always a DAG), whose time is the sum of its members' times,
and whose edges carry the largest transfer among the fine edges they stand for. Every
coarse op keeps the fine ops it stands for, so a coarse placement expands back.

A coarse plan is a restriction of the fine problem: every coarse placement is a fine
placement, and running a coarse op's members back to back is one fine schedule. So a
coarse solution is always a valid fine plan, and the fine simulator can only find it
faster (it lets other tasks interleave); the coarse optimum is no fine bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from placement.graph import Edge, GraphError, Op, OpGraph
from placement.heuristics import group_sequence
from placement.tasks import TaskGraph


@dataclass(frozen=True, eq=False)
class Coarsening:
    fine: OpGraph
    graph: OpGraph
    """The coarse graph; coarse ops of one cluster share a colocation group."""
    members: Mapping[int, tuple[int, ...]]
    """Coarse op id -> the fine op ids it stands for."""

    def expand(self, assignment: Mapping[int, int]) -> dict[int, int]:
        """A coarse op -> device assignment as the fine one."""
        return {fine: dev for op, dev in assignment.items() for fine in self.members[op]}


def group_graph(tg: TaskGraph) -> tuple[list[set[int]], list[set[int]], list[int]]:
    """Per group: neighbour groups later and earlier in the group sequence (task edges
    in either direction), and each group's position in that sequence."""
    seq = group_sequence(tg)
    pos = [0] * tg.num_groups
    for i, g in enumerate(seq):
        pos[g] = i
    later: list[set[int]] = [set() for _ in range(tg.num_groups)]
    earlier: list[set[int]] = [set() for _ in range(tg.num_groups)]
    for a, b in zip(tg.group[tg.edge_src].tolist(), tg.group[tg.edge_dst].tolist()):
        if a == b:
            continue
        a, b = (a, b) if pos[a] < pos[b] else (b, a)
        later[a].add(b)
        earlier[b].add(a)
    return later, earlier, seq


def chain_clusters(tg: TaskGraph, max_work_s: float = np.inf) -> list[list[int]]:
    """Groups merged along linear chains of the group graph (g's only later neighbour
    is h and h's only earlier neighbour is g), cut where a cluster's work would pass
    `max_work_s` so that the coarse graph can still be balanced."""
    later, earlier, seq = group_graph(tg)
    work = tg.group_work_s
    clusters: list[list[int]] = []
    cluster_of = [-1] * tg.num_groups
    for g in seq:
        (p,) = earlier[g] if len(earlier[g]) == 1 else (None,)
        if p is not None and later[p] == {g}:
            c = cluster_of[p]
            if work[clusters[c]].sum() + work[g] <= max_work_s:
                clusters[c].append(g)
                cluster_of[g] = c
                continue
        cluster_of[g] = len(clusters)
        clusters.append([g])
    return clusters


def chain_branches(tg: TaskGraph) -> list[tuple[int, ...]]:
    """Per group: the groups of its `chain_clusters` cluster (an Inception module's
    branch, a stem), which a local search may move together."""
    branch: list[tuple[int, ...]] = [()] * tg.num_groups
    for cluster in chain_clusters(tg):
        for g in cluster:
            branch[g] = tuple(cluster)
    return branch


def interval_clusters(tg: TaskGraph, num_clusters: int) -> list[list[int]]:
    """The group sequence cut into `num_clusters` intervals of about equal work (an
    interval of a topological order is convex, so contracting it keeps a DAG)."""
    if num_clusters < 1:
        raise ValueError(f"num_clusters={num_clusters} must be >= 1")
    seq = group_sequence(tg)
    work = tg.group_work_s[seq]
    target = max(work.sum() / num_clusters, 1e-300)
    cut = np.minimum(((np.cumsum(work) - work / 2) // target).astype(np.int64),
                     num_clusters - 1)
    clusters: dict[int, list[int]] = {}
    for g, c in zip(seq, cut.tolist()):
        clusters.setdefault(c, []).append(g)
    return list(clusters.values())


def refine_clusters(tg: TaskGraph, clusters: Sequence[Sequence[int]],
                    max_work_s: float) -> list[list[int]]:
    """Split every cluster whose work passes `max_work_s` into sequence intervals."""
    seq_pos = {g: i for i, g in enumerate(group_sequence(tg))}
    out: list[list[int]] = []
    for cluster in clusters:
        current: list[int] = []
        work = 0.0
        for g in sorted(cluster, key=seq_pos.__getitem__):
            w = float(tg.group_work_s[g])
            if current and work + w > max_work_s:
                out.append(current)
                current, work = [], 0.0
            current.append(g)
            work += w
        out.append(current)
    return out


def contract(tg: TaskGraph, clusters: Sequence[Sequence[int]]) -> Coarsening:
    """The coarse graph of `clusters` (each a list of groups of `tg`; together a
    partition of the groups): one coarse op per cluster and phase where that keeps a
    DAG, else per convex piece of it (see `_pieces`); a cluster's pieces share one
    colocation group, so the cluster is still placed as one unit."""
    fine = tg.graph
    seen = sorted(g for c in clusters for g in c)
    if seen != list(range(tg.num_groups)):
        raise ValueError("clusters must partition the groups: each group exactly once")
    cluster_of_op: dict[int, int] = {}
    for c, groups in enumerate(clusters):
        for g in groups:
            for op in tg.group_ops[g]:
                cluster_of_op[op] = c
    try:
        return _contract(fine, {op.id: (cluster_of_op[op.id], op.is_backward, 0)
                                for op in fine.ops})
    except GraphError:
        # A cluster that is not convex (a path leaves it and comes back, as through a
        # colocation group that spans time steps) closes a cycle: split it.
        return _contract(fine, _pieces(fine, cluster_of_op))


def _pieces(fine: OpGraph, cluster_of_op: Mapping[int, int]) -> dict[int, tuple]:
    """Per op: (cluster, phase, level), where an op's level is the most changes of
    (cluster, phase) along any path into it. Every edge between two pieces raises the
    level, so contracting the pieces cannot close a cycle."""
    key = {op.id: (cluster_of_op[op.id], op.is_backward) for op in fine.ops}
    level: dict[int, int] = {}
    for v in fine.topological_order:
        level[v] = max((level[u] + (key[u] != key[v]) for u in fine.predecessors[v]),
                       default=0)
    return {op: (*key[op], level[op]) for op in key}


def _contract(fine: OpGraph, piece_of_op: Mapping[int, tuple]) -> Coarsening:
    """Each piece (cluster, phase, level) of `piece_of_op` as one coarse op; raises
    GraphError when that closes a cycle."""
    kinds = sorted({k for op in fine.ops for k in (*op.forward_s, *op.backward_s)})
    by_key: dict[tuple, list[Op]] = {}
    for op in fine.ops:
        by_key.setdefault(piece_of_op[op.id], []).append(op)
    coarse_id = {key: i for i, key in enumerate(by_key)}
    coarse_of_op = {op.id: coarse_id[key] for key, ops in by_key.items() for op in ops}

    fine_succ = fine.successors
    ops = []
    for key, members in by_key.items():
        cluster, backward = key[0], key[1]
        leaving = [op for op in members
                   if any(coarse_of_op[s] != coarse_id[key] for s in fine_succ[op.id])]
        transfers = [op.transfer_s for op in leaving if op.transfer_s is not None]
        ops.append(Op(
            id=coarse_id[key], name=f"cluster{cluster}" + (".backward" if backward else ""),
            forward_s=_sum_times(members, kinds, backward=False),
            backward_s=_sum_times(members, kinds, backward=True),
            is_backward=backward,
            output_bytes=max((op.output_bytes for op in leaving), default=0.0),
            param_bytes=sum(op.param_bytes for op in members),
            frozen_bytes=sum(op.frozen_bytes for op in members),
            activation_bytes=sum(op.activation_bytes for op in members),
            colocation=f"cluster{cluster}",
            transfer_s=max(transfers) if transfers else None,
        ))
    edges: dict[tuple[int, int], list[Edge]] = {}
    for e in fine.edges:
        a, b = coarse_of_op[e.src], coarse_of_op[e.dst]
        if a != b:
            edges.setdefault((a, b), []).append(e)
    coarse_edges = []
    for (a, b), es in edges.items():
        costs = [e.cost_s for e in es if e.cost_s is not None]
        told = any(e.grad_bytes is not None for e in es)
        coarse_edges.append(Edge(src=a, dst=b, bytes=max(e.bytes for e in es),
                                 cost_s=max(costs) if costs else None,
                                 grad_bytes=max(e.gradient_bytes for e in es) if told
                                 else None))
    graph = OpGraph(ops=tuple(ops), edges=tuple(coarse_edges), name=f"{fine.name}.coarse",
                    time_unit=fine.time_unit, metadata=dict(fine.metadata))
    members = {coarse_id[key]: tuple(op.id for op in ops_) for key, ops_ in by_key.items()}
    return Coarsening(fine=fine, graph=graph, members=members)


def _sum_times(ops: Sequence[Op], kinds: Sequence[str], *, backward: bool) -> dict[str, float]:
    if not any(op.backward_s if backward else op.forward_s for op in ops):
        return {}
    return {k: sum(op.time_s(k, backward) for op in ops) for k in kinds}
