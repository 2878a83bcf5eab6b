"""The elimination search against brute force (Jia et al. 2018, Algorithm 1)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.layerwise.search import (
    ResidualTooLargeError,
    brute_force,
    evaluate,
    solve,
)


@st.composite
def series_parallel(draw, max_nodes: int = 8):
    """A two-terminal series-parallel DAG (parallel edges allowed) with cost tables."""
    edges = [(0, 1)]
    num_nodes = 2
    for _ in range(draw(st.integers(0, 10))):
        u, v = edges.pop(draw(st.integers(0, len(edges) - 1)))
        op = draw(st.sampled_from(["series", "parallel", "parallel-path"]))
        if op == "parallel":
            edges += [(u, v), (u, v)]
        elif num_nodes < max_nodes:
            w = num_nodes
            num_nodes += 1
            edges += [(u, w), (w, v)] + ([(u, v)] if op == "parallel-path" else [])
        else:
            edges.append((u, v))
    return _with_costs(draw, num_nodes, edges)


@st.composite
def any_dag(draw, max_nodes: int = 7):
    """A random DAG, often not series-parallel: the residual DP must stay exact."""
    n = draw(st.integers(1, max_nodes))
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), max_size=12)) if pairs else []
    return _with_costs(draw, n, edges)


def _with_costs(draw, num_nodes, edges):
    sizes = [draw(st.integers(2, 4)) for _ in range(num_nodes)]
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    nodes = [rng.integers(0, 20, s).astype(float) for s in sizes]
    tables = [(u, v, rng.integers(0, 20, (sizes[u], sizes[v])).astype(float))
              for u, v in edges]
    return nodes, tables


@settings(max_examples=150, deadline=None)
@given(series_parallel())
def test_series_parallel_graphs_reduce_to_one_layer_and_match_brute_force(problem):
    nodes, edges = problem
    result = solve(nodes, edges)
    best, _ = brute_force(nodes, edges)
    assert result.cost == pytest.approx(best)
    # Undo recovers a configuration for every layer that attains the reported cost.
    assert evaluate(nodes, edges, result.choice) == pytest.approx(result.cost)
    assert result.residual_nodes == 1


@settings(max_examples=150, deadline=None)
@given(any_dag())
def test_graphs_that_do_not_reduce_are_still_solved_exactly(problem):
    nodes, edges = problem
    result = solve(nodes, edges)
    best, _ = brute_force(nodes, edges)
    assert result.cost == pytest.approx(best)
    assert evaluate(nodes, edges, result.choice) == pytest.approx(result.cost)


def test_node_elimination_folds_a_chain_into_one_edge_and_undo_recovers_the_middle():
    # 0 -> 1 -> 2 with the middle node's cheap configuration only reachable through
    # the edges: the optimum (1, 0, 1) costs 0 + 5 + 0 + 1 + 0 = 6.
    nodes = [np.array([0.0, 0.0]), np.array([5.0, 4.0]), np.array([1.0, 1.0])]
    a = np.array([[0.0, 9.0], [0.0, 9.0]])
    b = np.array([[9.0, 0.0], [9.0, 0.0]])
    result = solve(nodes, [(0, 1, a), (1, 2, b)])
    assert result.cost == 6.0
    assert result.choice[1] == 0
    assert evaluate(nodes, [(0, 1, a), (1, 2, b)], result.choice) == 6.0


def test_parallel_edges_merge_by_summing_their_tables():
    nodes = [np.zeros(2), np.zeros(2)]
    e1 = np.array([[0.0, 5.0], [5.0, 1.0]])
    e2 = np.array([[3.0, 0.0], [0.0, 0.0]])
    result = solve(nodes, [(0, 1, e1), (0, 1, e2)])
    assert result.num_edge_eliminations == 1
    assert result.cost == 1.0 and result.choice == (1, 1)


def test_a_graph_that_does_not_reduce_is_reported_and_bounded():
    # K4 as a DAG: every node has degree 3, so no elimination applies.
    nodes = [np.arange(3.0) for _ in range(4)]
    edges = [(u, v, np.ones((3, 3))) for u in range(4) for v in range(u + 1, 4)]
    result = solve(nodes, edges)
    assert result.residual_nodes == 4
    assert result.residual_largest_table == 3 ** 4
    assert result.cost == 6.0
    with pytest.raises(ResidualTooLargeError, match="does not reduce"):
        solve(nodes, edges, max_table_entries=10)


def test_long_chains_are_fast_and_linear():
    rng = np.random.default_rng(1)
    n, k = 200, 30
    nodes = [rng.random(k) for _ in range(n)]
    edges = [(i, i + 1, rng.random((k, k))) for i in range(n - 1)]
    result = solve(nodes, edges)
    # A chain's optimum by a plain Viterbi pass.
    best = nodes[0].copy()
    for i in range(1, n):
        best = (best[:, None] + edges[i - 1][2]).min(axis=0) + nodes[i]
    assert result.cost == pytest.approx(best.min())
    assert math.isclose(evaluate(nodes, edges, result.choice), result.cost)


def test_layerwise_imports_neither_torch_nor_ray():
    code = ("import sys, placement.layerwise, placement.layerwise.examples; "
            "bad = [m for m in ('torch', 'ray') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
