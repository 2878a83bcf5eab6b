"""Optimal configuration per node of a cost graph by elimination (Jia et al. 2018,
Section 5, Algorithm 1), exact for every graph it can finish.

The problem: nodes i with a cost vector n_i[c] over their configurations, directed
edges (u, v) with a table e[c_u, c_v]; minimise sum_i n_i[c_i] + sum_e e[c_u, c_v].

- Edge elimination: parallel edges (u, v) merge into one whose table is their sum.
- Node elimination: a node j with exactly one in-edge (i, j) and one out-edge (j, k)
  folds into an edge (i, k) with e'[c_i, c_k] = min_cj e1[c_i, c_j] + n_j[c_j] +
  e2[c_j, c_k], remembering the argmin (the paper's Theorem 1: optimal strategies of
  the reduced graph extend to optimal strategies of the original).
- Leaf elimination (our addition, exact by the same argument): a node with a single
  edge folds into its neighbour's cost vector, n_i[c_i] += min_cj e[c_i, c_j] +
  n_j[c_j]. It removes extra sinks such as Inception's auxiliary head and leaves a
  series-parallel graph as one node.
- What remains (nothing else applies) is solved exactly by dynamic programming over
  it (variable elimination, cheapest-first order), which on a residual of two nodes
  is the paper's exhaustive search of one table. Its time and memory grow as the
  largest table it builds, |C|^(width + 1) with `width` the residual's induced width;
  past `max_table_entries` it stops with a user error rather than run for hours.
- Undo: the eliminations, replayed backwards, recover every node's configuration.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from placement.errors import UserError

#: Largest table the residual search may build (float64 entries: 8 bytes each).
MAX_TABLE_ENTRIES = 50_000_000


class ResidualTooLargeError(UserError):
    pass


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    cost: float
    choice: tuple[int, ...]
    """Configuration index per node."""
    num_node_eliminations: int
    num_edge_eliminations: int
    num_leaf_eliminations: int
    residual_nodes: int
    """Nodes left when no elimination applied (solved by DP over the residual)."""
    residual_largest_table: int
    """Entries of the largest table that DP built (1 when nothing was left)."""
    seconds: float


class _Graph:
    """Mutable multigraph of cost tables; edges keyed by an id, tables as [src, dst]."""

    def __init__(self, node_costs: Sequence[np.ndarray],
                 edges: Sequence[tuple[int, int, np.ndarray]]) -> None:
        self.node = {i: np.asarray(c, dtype=float).copy() for i, c in enumerate(node_costs)}
        self.edge: dict[int, tuple[int, int, np.ndarray]] = {}
        self.incident: dict[int, set[int]] = {i: set() for i in self.node}
        self._next = 0
        for u, v, t in edges:
            assert u != v and t.shape == (len(self.node[u]), len(self.node[v])), (u, v)
            self.add_edge(u, v, np.asarray(t, dtype=float))

    def add_edge(self, u: int, v: int, table: np.ndarray) -> int:
        eid = self._next
        self._next += 1
        self.edge[eid] = (u, v, table)
        self.incident[u].add(eid)
        self.incident[v].add(eid)
        return eid

    def remove_edge(self, eid: int) -> tuple[int, int, np.ndarray]:
        u, v, t = self.edge.pop(eid)
        self.incident[u].discard(eid)
        self.incident[v].discard(eid)
        return u, v, t

    def remove_node(self, j: int) -> None:
        assert not self.incident[j]
        del self.node[j], self.incident[j]

    def oriented(self, eid: int, j: int) -> tuple[int, np.ndarray]:
        """The edge's other end i and its table as [c_i, c_j]."""
        u, v, t = self.edge[eid]
        return (u, t) if v == j else (v, t.T)


def solve(node_costs: Sequence[np.ndarray], edges: Sequence[tuple[int, int, np.ndarray]],
          max_table_entries: int = MAX_TABLE_ENTRIES) -> SearchResult:
    """The minimum of sum n_i[c_i] + sum e[c_u, c_v] and a choice that attains it."""
    start = time.perf_counter()
    g = _Graph(node_costs, edges)
    undo: list[tuple] = []
    counts = {"node": 0, "edge": 0, "leaf": 0}
    _reduce(g, undo, counts)
    choice: dict[int, int] = {}
    largest = _solve_residual(g, choice, max_table_entries)
    residual_nodes = len(g.node)
    for step in reversed(undo):
        if step[0] == "node":
            _, j, i, k, arg = step
            choice[j] = int(arg[choice[i], choice[k]])
        else:
            _, j, i, arg = step
            choice[j] = int(arg[choice[i]])
    result = tuple(choice[i] for i in range(len(node_costs)))
    return SearchResult(
        cost=evaluate(node_costs, edges, result), choice=result,
        num_node_eliminations=counts["node"], num_edge_eliminations=counts["edge"],
        num_leaf_eliminations=counts["leaf"], residual_nodes=residual_nodes,
        residual_largest_table=largest, seconds=time.perf_counter() - start)


def _merge_parallel(g: _Graph, j: int, counts: dict[str, int]) -> set[int]:
    """Edge elimination around node j: one edge per neighbour pair and direction.
    Returns the neighbours whose degree dropped."""
    touched: set[int] = set()
    by_pair: dict[tuple[int, int], list[int]] = {}
    for eid in g.incident[j]:
        u, v, _ = g.edge[eid]
        by_pair.setdefault((u, v), []).append(eid)
    for (u, v), eids in by_pair.items():
        if len(eids) > 1:
            table = sum(g.remove_edge(e)[2] for e in eids)
            g.add_edge(u, v, table)
            counts["edge"] += len(eids) - 1
            touched.update((u, v))
    touched.discard(j)
    return touched


def _reduce(g: _Graph, undo: list[tuple], counts: dict[str, int]) -> None:
    """Apply edge, node and leaf eliminations until none applies."""
    work = set(g.node)
    while work:
        j = work.pop()
        if j not in g.node:
            continue
        work.update(_merge_parallel(g, j, counts))
        eids = list(g.incident[j])
        if len(eids) == 1:
            i, t = g.oriented(eids[0], j)          # t[c_i, c_j]
            total = t + g.node[j][None, :]
            arg = total.argmin(axis=1)
            g.node[i] = g.node[i] + total[np.arange(len(arg)), arg]
            g.remove_edge(eids[0])
            g.remove_node(j)
            undo.append(("leaf", j, i, arg))
            counts["leaf"] += 1
            work.add(i)
            continue
        if len(eids) != 2:
            continue
        ins = [e for e in eids if g.edge[e][1] == j]
        outs = [e for e in eids if g.edge[e][0] == j]
        if len(ins) != 1 or len(outs) != 1:
            continue
        i, _, a = g.edge[ins[0]]                   # a[c_i, c_j]
        _, k, b = g.edge[outs[0]]                  # b[c_j, c_k]
        if i == k:
            continue
        total = a[:, :, None] + g.node[j][None, :, None] + b[None, :, :]
        arg = total.argmin(axis=1)
        table = np.take_along_axis(total, arg[:, None, :], axis=1)[:, 0, :]
        g.remove_edge(ins[0])
        g.remove_edge(outs[0])
        g.remove_node(j)
        g.add_edge(i, k, table)
        undo.append(("node", j, i, k, arg))
        counts["node"] += 1
        work.update((i, k))


def _solve_residual(g: _Graph, choice: dict[int, int], max_table_entries: int) -> int:
    """Exact DP (variable elimination) over what the eliminations left; fills `choice`
    for the residual nodes and returns the largest table's number of entries."""
    sizes = {j: len(c) for j, c in g.node.items()}
    factors: list[tuple[tuple[int, ...], np.ndarray]] = [((j,), c) for j, c in g.node.items()]
    factors += [((u, v), t) for u, v, t in g.edge.values()]
    steps = []
    largest = 1
    remaining = set(g.node)
    while remaining:
        def table_size(x: int) -> int:
            scope = set().union(*(s for s, _ in factors if x in s))
            return int(np.prod([sizes[v] for v in scope]))
        x = min(remaining, key=lambda v: (table_size(v), v))
        size = table_size(x)
        if size > max_table_entries:
            raise ResidualTooLargeError(
                f"the layer graph does not reduce: {len(remaining)} layers are left after "
                f"node and edge elimination and the next DP table would need {size:,} "
                f"entries (limit {max_table_entries:,}): use fewer devices (fewer "
                "configurations per layer) or coarsen the graph's cross-connections")
        largest = max(largest, size)
        mine = [f for f in factors if x in f[0]]
        factors = [f for f in factors if x not in f[0]]
        scope = tuple(sorted(set().union(*(s for s, _ in mine))))
        total = sum(_expand(s, t, scope) for s, t in mine)
        axis = scope.index(x)
        rest = scope[:axis] + scope[axis + 1:]
        steps.append((x, rest, total.argmin(axis=axis)))
        factors.append((rest, total.min(axis=axis)))
        remaining.discard(x)
    for x, rest, arg in reversed(steps):
        choice[x] = int(arg[tuple(choice[v] for v in rest)])
    return largest


def _expand(scope: tuple[int, ...], table: np.ndarray, target: tuple[int, ...]) -> np.ndarray:
    """`table` over `scope` as an array broadcastable over `target` (a sorted superset)."""
    order = sorted(range(len(scope)), key=lambda a: target.index(scope[a]))
    t = table.transpose(order)
    shape = [1] * len(target)
    for a in order:
        shape[target.index(scope[a])] = table.shape[a]
    return t.reshape(shape)


def evaluate(node_costs: Sequence[np.ndarray], edges: Sequence[tuple[int, int, np.ndarray]],
             choice: Sequence[int]) -> float:
    return (sum(float(c[choice[i]]) for i, c in enumerate(node_costs))
            + sum(float(t[choice[u], choice[v]]) for u, v, t in edges))


def brute_force(node_costs: Sequence[np.ndarray],
                edges: Sequence[tuple[int, int, np.ndarray]]) -> tuple[float, tuple[int, ...]]:
    """Reference: every combination of configurations (tests only: exponential)."""
    best = min(itertools.product(*(range(len(c)) for c in node_costs)),
               key=lambda ch: evaluate(node_costs, edges, ch))
    return evaluate(node_costs, edges, best), best
