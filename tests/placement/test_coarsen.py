"""Coarsening: clusters partition the groups, the coarse graph stays a DAG, and a
coarse plan expands to a fine plan at least as fast."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.coarsen import chain_clusters, contract, interval_clusters, refine_clusters
from placement.graph import Edge, Op, OpGraph
from placement.io import load_graph
from placement.milp.makespan import coarse_task_graph
from placement.simulate import evaluate_order, list_schedule
from tests.placement.milp_cases import problem, random_dag



def chain(n: int) -> OpGraph:
    return OpGraph(ops=tuple(Op(id=i, name=f"c{i}", forward_s={"any": 1.0},
                                backward_s={"any": 2.0}) for i in range(n)),
                   edges=tuple(Edge(src=i, dst=i + 1, cost_s=1.0) for i in range(n - 1)))


def test_a_linear_chain_merges_into_one_cluster_and_splits_at_the_work_cap():
    tg = problem(chain(6), 2, "makespan").tg
    assert chain_clusters(tg) == [list(range(6))]
    capped = chain_clusters(tg, max_work_s=6.0)  # each op: 1 forward + 2 backward
    assert capped == [[0, 1], [2, 3], [4, 5]]


def test_contract_sums_times_keeps_members_and_expands_back():
    tg = problem(chain(6), 2, "makespan").tg
    coarse = contract(tg, [[0, 1, 2], [3, 4, 5]])
    assert [op.time_s("any") for op in coarse.graph.ops] == [3.0, 3.0]
    assert [op.time_s("any", backward=True) for op in coarse.graph.ops] == [6.0, 6.0]
    assert sorted(f for fs in coarse.members.values() for f in fs) == list(range(6))
    fine = coarse.expand({0: 1, 1: 0})
    assert fine == {0: 1, 1: 1, 2: 1, 3: 0, 4: 0, 5: 0}


def test_a_cluster_that_is_not_convex_becomes_convex_pieces_of_one_unit():
    # 0 -> 1 -> 2 with 0 and 2 merged but 1 outside: one coarse op for {0, 2} would
    # close a cycle, so each becomes its own coarse op, both in the cluster's group.
    graph = OpGraph(ops=tuple(Op(id=i, name=str(i), forward_s={"any": 1.0})
                              for i in range(3)),
                    edges=(Edge(src=0, dst=1), Edge(src=1, dst=2)))
    tg = problem(graph, 2, "makespan").tg
    coarse = contract(tg, [[0, 2], [1]])
    assert sorted(coarse.members.values()) == [(0,), (1,), (2,)]
    colocation = {coarse.members[op.id]: op.colocation for op in coarse.graph.ops}
    assert colocation[(0,)] == colocation[(2,)] != colocation[(1,)]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), num_ops=st.integers(2, 12),
       num_clusters=st.integers(1, 4), k=st.integers(1, 3))
def test_any_clusters_give_an_acyclic_coarse_graph_no_slower(seed, num_ops, num_clusters, k):
    """Property: clusters drawn at random (most are not convex, as with a colocation
    group across time steps) still contract to a DAG whose schedules, expanded, run the
    fine graph no slower; each cluster stays one placement unit."""
    tg = problem(random_dag(seed, num_ops, colocate=seed % 2 == 0), k, "makespan").tg
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_clusters, size=tg.num_groups)
    clusters = [np.flatnonzero(labels == c).tolist() for c in np.unique(labels)]
    ctg, members = coarse_task_graph(tg, clusters)
    assert sorted(t for ts in members for t in ts) == list(range(tg.num_tasks))
    assert ctg.num_groups == len(clusters)
    _assert_expands_no_slower(tg, ctg, members, clusters, k, rng)


def test_clusters_must_partition_the_groups():
    tg = problem(chain(3), 2, "makespan").tg
    with pytest.raises(ValueError, match="partition"):
        contract(tg, [[0, 1]])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), num_ops=st.integers(2, 14),
       num_clusters=st.integers(1, 6), k=st.integers(1, 3))
def test_coarse_plans_expand_to_fine_plans_no_slower(seed, num_ops, num_clusters, k):
    """Property: interval clusters stay acyclic; a coarse schedule's order, expanded,
    runs the fine graph in at most the coarse step time (members run back to back in
    the coarse model; the fine simulator can only start them earlier)."""
    p = problem(random_dag(seed, num_ops), k, "makespan")
    tg = p.tg
    clusters = interval_clusters(tg, num_clusters)
    assert sorted(g for c in clusters for g in c) == list(range(tg.num_groups))
    ctg, members = coarse_task_graph(tg, clusters)
    assert ctg.duration_s.sum() == pytest.approx(tg.duration_s.sum())
    _assert_expands_no_slower(tg, ctg, members, clusters, k, np.random.default_rng(seed))


def _assert_expands_no_slower(tg, ctg, members, clusters, k, rng) -> None:
    unit_device = rng.integers(0, k, size=len(clusters))
    coarse = list_schedule(ctg, unit_device, k)
    group_device = np.empty(tg.num_groups, dtype=np.int64)
    for c, groups in enumerate(clusters):
        group_device[groups] = unit_device[c]
    order = [[f for c in tasks for f in members[c]] for tasks in coarse.order]
    fine = evaluate_order(tg, group_device, order)
    assert fine.step_time_s <= coarse.step_time_s * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), num_ops=st.integers(2, 20), cap=st.floats(1, 50))
def test_refined_clusters_respect_the_work_cap(seed, num_ops, cap):
    tg = problem(random_dag(seed, num_ops), 2, "max-load").tg
    clusters = refine_clusters(tg, chain_clusters(tg), cap)
    assert sorted(g for c in clusters for g in c) == list(range(tg.num_groups))
    for c in clusters:
        assert len(c) == 1 or tg.group_work_s[c].sum() <= cap


@pytest.mark.parametrize("name", ["gnmt_training", "inceptionv3_training"])
def test_peer_graphs_coarsen_to_a_dag_that_keeps_all_work(name, peer_graphs):
    p = problem(load_graph(peer_graphs / f"{name}.json"), 6, "makespan")
    tg = p.tg
    for clusters in (chain_clusters(tg, tg.duration_s.sum() / 24), interval_clusters(tg, 40)):
        ctg, members = coarse_task_graph(tg, clusters)
        assert len(ctg.tasks) < tg.num_tasks
        assert sorted(t for ts in members for t in ts) == list(range(tg.num_tasks))
        assert ctg.duration_s.sum() == pytest.approx(tg.duration_s.sum())
