"""The transfer bounds (path cut, heavy group) against brute force: never above the
optimum, tight where the transfers decide the split."""

from __future__ import annotations

import numpy as np
import pytest

from placement.graph import Edge, Op, OpGraph
from placement.path_bound import heavy_group_bound, path_cut_bound
from placement.simulate import max_load_lower_bound
from tests.placement.max_load_cases import brute_max_load, max_load_problem, training_dag


def _bound(p) -> float:
    k = p.num_devices
    return path_cut_bound(p.tg, k, max_load_lower_bound(p.tg, k),
                          float(p.tg.duration_s.sum()))


@pytest.mark.parametrize("seed", range(40))
def test_never_above_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    num_ops, k = int(rng.integers(3, 7)), int(rng.integers(2, 4))
    graph = training_dag(seed, num_ops, edge_prob=float(rng.uniform(0.3, 0.9)),
                         colocate=bool(seed % 2))
    p = max_load_problem(graph, k)
    assert _bound(p) <= brute_max_load(p, contiguous=False) * (1 + 1e-9)


def _chain(works, costs) -> OpGraph:
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"any": w}) for i, w in enumerate(works))
    edges = tuple(Edge(src=i, dst=i + 1, cost_s=c) for i, c in enumerate(costs))
    return OpGraph(ops=ops, edges=edges, name="chain", time_unit="unit")


@pytest.mark.parametrize("works,costs,k", [
    ((1.0, 1.0), (0.1,), 2),            # split: 1.1 on each device
    ((4.0, 4.0, 4.0), (0.5, 3.0), 2),   # the cheap cut: 4.5 against total/k 6
    ((2.0, 2.0, 2.0, 2.0), (1.5, 0.2, 1.5), 3),
])
def test_tight_where_the_transfers_decide_the_split(works, costs, k):
    p = max_load_problem(_chain(works, costs), k)
    optimum = brute_max_load(p, contiguous=False)
    assert _bound(p) > max_load_lower_bound(p.tg, k) * (1 + 1e-6)
    assert _bound(p) == pytest.approx(optimum, rel=1e-8)


def _heavy(p) -> float:
    return heavy_group_bound(p.tg, 0.0)


@pytest.mark.parametrize("seed", range(40))
def test_the_heavy_group_bound_is_never_above_the_optimum(seed):
    rng = np.random.default_rng(100 + seed)
    num_ops, k = int(rng.integers(3, 7)), int(rng.integers(2, 4))
    graph = training_dag(seed, num_ops, edge_prob=float(rng.uniform(0.3, 0.9)),
                         colocate=bool(seed % 2))
    p = max_load_problem(graph, k)
    assert _heavy(p) <= brute_max_load(p, contiguous=False) * (1 + 1e-9)


def test_the_heavy_group_bound_is_tight_where_its_neighbours_must_join_it():
    """A heavy op whose one output feeds three light ones: splitting that output off
    costs it 5, so the optimum keeps all on one device (13), which the path bound
    (11: a path holds two of the ops) and total work / k miss."""
    ops = (Op(id=0, name="heavy", forward_s={"any": 10.0}, transfer_s=5.0),) + tuple(
        Op(id=i, name=f"light{i}", forward_s={"any": 1.0}) for i in (1, 2, 3))
    edges = tuple(Edge(src=0, dst=i) for i in (1, 2, 3))
    p = max_load_problem(OpGraph(ops=ops, edges=edges, name="star", time_unit="unit"), 2)
    optimum = brute_max_load(p, contiguous=False)
    assert _bound(p) < optimum - 1
    assert _heavy(p) == pytest.approx(optimum, rel=1e-12)
