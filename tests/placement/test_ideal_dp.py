"""The ideal DP against brute force over contiguous splits, and the peer's figures."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.graph import Edge, Op, OpGraph
from placement.heuristics import contiguous_split
from placement.ideal_dp import ideal_split, join_roots, joined_sequence, side_inputs
from placement.io import load_graph
from placement.simulate import device_loads, max_load
from tests.placement.max_load_cases import (
    brute_max_load,
    fits,
    is_contiguous,
    max_load_problem,
    peer_host_work,
    training_dag,
)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), num_ops=st.integers(3, 7), k=st.integers(2, 3),
       colocate=st.booleans(), tight=st.booleans())
def test_ideal_dp_is_the_optimum_over_all_contiguous_splits(seed, num_ops, k, colocate,
                                                             tight):
    graph = training_dag(seed, num_ops, colocate=colocate)
    total = sum(op.param_bytes for op in graph.ops)
    # A tight cap leaves a little more than an even share: it binds on most graphs.
    cap = total / k * 1.3 if tight else None
    try:
        p = max_load_problem(graph, k, memory_cap=cap)
    except ValueError:  # InfeasiblePlacementError: a group too big for the cap
        return
    result = ideal_split(p.tg, k, p.group_memory, p.memory_cap)
    reference = brute_max_load(p, contiguous=True)
    if result is None:
        assert reference == np.inf
        return
    assert result.exact
    assert fits(p, result.group_device) and is_contiguous(p, result.group_device)
    assert result.value == max_load(p.tg, result.group_device, k)
    assert result.value == pytest.approx(reference, rel=1e-12)


def test_ideal_dp_beats_the_contiguous_split_of_one_order():
    """A diamond: the best split puts the two branches on two devices, which no
    interval of the one topological order the contiguous DP uses can do with the
    ops that follow."""
    found = 0
    for seed in range(200):
        p = max_load_problem(training_dag(seed, 7, edge_prob=0.35), 3)
        order_value = max_load(p.tg, contiguous_split(p.tg, 3, p.group_memory,
                                                       p.memory_cap), 3)
        result = ideal_split(p.tg, 3, p.group_memory, p.memory_cap)
        assert result.value <= order_value
        found += result.value < order_value
    assert found >= 5


def test_too_many_ideals_fall_back_to_the_contiguous_split_and_say_so():
    p = max_load_problem(training_dag(3, 7, edge_prob=0.0), 2)  # 2^7 ideals
    result = ideal_split(p.tg, 2, p.group_memory, p.memory_cap, max_ideals=50)
    assert not result.exact
    assert result.value == max_load(p.tg, contiguous_split(p.tg, 2, p.group_memory,
                                                            p.memory_cap), 2)
    assert ideal_split(p.tg, 2, p.group_memory, p.memory_cap).exact


@pytest.mark.parametrize("name, host, reference, exact", [
    ("bert24_training", False, 41.7458125, True),
    ("resnet50_training", True, 78.63181250000001, True),
    # Without the peer program's CPU, 6 accelerators alone do no better than the split
    # of one topological order.
    ("resnet50_training", False, 80.45488671875, True),
    # gnmt's forward graph has over 2 million ideals; the peer program first merges
    # its 126 zero-time nodes into neighbours, which we do not.
    ("gnmt_training", False, 107.0044140625, False),
])
def test_ideal_dp_reproduces_the_peer_figures(peer_graphs, name, host, reference, exact):
    path = peer_graphs / f"{name}.json"
    p = max_load_problem(load_graph(path), 6)
    result = ideal_split(p.tg, 6, p.group_memory, p.memory_cap,
                         host_work=peer_host_work(path, p) if host else None)
    assert result.exact is exact
    assert result.value == pytest.approx(reference, rel=1e-12)
    assert np.bincount(result.group_device).size <= 7


def test_a_dp_past_its_deadline_gives_the_fallback_marked_not_exact():
    p = max_load_problem(training_dag(5, 7), 2)
    result = ideal_split(p.tg, 2, p.group_memory, p.memory_cap, deadline=0.0)
    assert not result.exact
    assert result.value == max_load(p.tg, contiguous_split(p.tg, 2, p.group_memory,
                                                            p.memory_cap), 2)


def _chain_with_side_inputs(length: int):
    """A chain of ops, each fed by a cheap source of its own (a weight's transpose):
    without joining them each pending source doubles the ideals of a cut."""
    ops = [Op(id=i, name=f"op{i}", forward_s={"any": 5.0 + i % 3},
              backward_s={"any": 9.0}, transfer_s=2.0) for i in range(length)]
    ops += [Op(id=length + i, name=f"weight{i}.t", forward_s={"any": 0.1},
               backward_s={"any": 0.1}, transfer_s=3.0) for i in range(length)]
    edges = [Edge(src=i, dst=i + 1) for i in range(length - 1)]
    edges += [Edge(src=length + i, dst=i) for i in range(length)]
    return OpGraph(ops=tuple(ops), edges=tuple(edges), name="side-inputs", time_unit="unit")


def test_side_inputs_join_their_consumer_so_the_dp_stays_exact():
    p = max_load_problem(_chain_with_side_inputs(12), 3)
    result = ideal_split(p.tg, 3, p.group_memory, p.memory_cap, max_ideals=200)
    assert result.exact and result.num_ideals == 13


def test_joining_side_inputs_loses_nothing_against_brute_force():
    p = max_load_problem(_chain_with_side_inputs(4), 2)
    result = ideal_split(p.tg, 2, p.group_memory, p.memory_cap)
    assert result.value == pytest.approx(brute_max_load(p, contiguous=True), rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_moving_side_inputs_to_their_neighbour_never_raises_a_device_load(seed):
    """The exact presolve of the max-load MILP: every placement, with each side input
    moved to its root's device, loads no device more (so the joined model loses
    nothing), and the joined sequence is a topological order of the groups."""
    p = max_load_problem(_chain_with_side_inputs(4), 3)
    root = join_roots(side_inputs(p.tg, p.group_memory, p.memory_cap))
    assert (root != np.arange(p.tg.num_groups)).sum() == 4
    seq = joined_sequence(p.tg, root)
    assert sorted(seq) == list(range(p.tg.num_groups))
    rng = np.random.default_rng(seed)
    for _ in range(50):
        gd = rng.integers(0, 3, p.tg.num_groups)
        before = device_loads(p.tg, gd, 3)
        after = device_loads(p.tg, gd[root], 3)
        assert (after <= before + 1e-12).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
def test_side_inputs_never_raise_a_load_on_random_training_graphs(seed):
    """The same on random training DAGs, with colocation (brute force over every
    placement)."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 4))
    p = max_load_problem(training_dag(seed, int(rng.integers(4, 8)),
                                      edge_prob=float(rng.uniform(0.2, 0.7)),
                                      colocate=bool(seed % 2)), k)
    root = join_roots(side_inputs(p.tg, p.group_memory, p.memory_cap))
    for gd in itertools.product(range(k), repeat=p.tg.num_groups):
        gd = np.array(gd)
        assert (device_loads(p.tg, gd[root], k) <= device_loads(p.tg, gd, k) + 1e-9).all()


def test_a_send_within_its_own_group_does_not_make_a_side_input():
    """A group whose task sends only to its own group's tasks saves nothing by joining,
    so that send must not count towards its work. Colocated a -> b (a's transfer 10)
    feed c (b's transfer 1): counted, a's send made the group a side input of c, and
    the joined optimum was 20 where the true one is 12."""
    ops = (Op(id=0, name="a", forward_s={"any": 1.0}, backward_s={"any": 1.0},
              transfer_s=10.0, colocation="pair"),
           Op(id=1, name="b", forward_s={"any": 4.0}, backward_s={"any": 4.0},
              transfer_s=1.0, colocation="pair"),
           Op(id=2, name="c", forward_s={"any": 5.0}, backward_s={"any": 5.0}))
    p = max_load_problem(OpGraph(ops=ops, edges=(Edge(src=0, dst=1), Edge(src=1, dst=2)),
                                 name="inner-send", time_unit="unit"), 2)
    assert brute_max_load(p, contiguous=False) == pytest.approx(12.0)
    root = join_roots(side_inputs(p.tg, p.group_memory, p.memory_cap))
    assert (root == np.arange(p.tg.num_groups)).all()


def _main_chain_with_a_pendant() -> OpGraph:
    """A chain m0 -> m1 -> m2 -> m3 (each 8 of work, transfers 1) and a pendant chain
    u0 -> u1 -> m3 (each 6 of work, transfers 2, 4 with the gradient's return: no side
    inputs). The topological order
    takes u0 and u1 first (the higher ids), so every split of it pays u1's transfer."""
    ops = tuple(Op(id=i, name=f"m{i}", forward_s={"any": 4.0}, backward_s={"any": 4.0},
                   transfer_s=1.0) for i in range(4)) + tuple(
        Op(id=i, name=f"u{i - 4}", forward_s={"any": 3.0}, backward_s={"any": 3.0},
           transfer_s=2.0) for i in (4, 5))
    edges = tuple(Edge(src=i, dst=i + 1) for i in range(3)) + (
        Edge(src=4, dst=5), Edge(src=5, dst=3))
    return OpGraph(ops=ops, edges=edges, name="pendant", time_unit="unit")


def test_the_joined_sequence_puts_a_pendant_chain_next_to_its_consumer():
    p = max_load_problem(_main_chain_with_a_pendant(), 2)
    root = join_roots(side_inputs(p.tg, p.group_memory, p.memory_cap))
    assert (root == np.arange(p.tg.num_groups)).all()
    seq = joined_sequence(p.tg, root)
    group = p.tg.group_of_op
    assert seq == [group[op] for op in (0, 1, 2, 4, 5, 3)]
    plain = contiguous_split(p.tg, 2, p.group_memory, p.memory_cap)
    joined = contiguous_split(p.tg, 2, p.group_memory, p.memory_cap, seq)
    assert max_load(p.tg, plain, 2) == pytest.approx(30.0)
    assert max_load(p.tg, joined, 2) == pytest.approx(brute_max_load(p, contiguous=False))
    assert max_load(p.tg, joined, 2) == pytest.approx(26.0)
