"""The segment bound against brute force: never above the optimum (for any order of
the groups), above the path cut bound where a cheap cut of the path is cheap only
while the tensor that goes around it stays on one device, and the gap reading (F2)
raising it further."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.graph import Edge, Op, OpGraph
from placement.heuristics import group_sequence
from placement.path_bound import heavy_group_bound, path_cut_bound
from placement.segment_bound import segment_bound
from placement.simulate import max_load_lower_bound
from tests.placement.max_load_cases import brute_max_load, max_load_problem, training_dag


def _case(seed: int):
    """A random training DAG of 4-7 ops on 2-3 devices, its optimum, and an order of
    its groups: the group sequence, or for half the seeds a random permutation (the
    bound holds for any order)."""
    rng = np.random.default_rng(seed)
    num_ops, k = int(rng.integers(4, 8)), int(rng.integers(2, 4))
    graph = training_dag(seed, num_ops, edge_prob=float(rng.uniform(0.2, 0.7)),
                         colocate=bool(seed % 2))
    p = max_load_problem(graph, k)
    seq = group_sequence(p.tg)
    if rng.random() < 0.5:
        seq = [int(g) for g in rng.permutation(seq)]
    return p, seq, brute_max_load(p, contiguous=False)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([0, 1, 3]))
def test_never_above_the_brute_force_optimum(seed, gap_positions):
    p, seq, optimum = _case(seed)
    k = p.num_devices
    bound = segment_bound(p.tg, k, seq, max_load_lower_bound(p.tg, k), 2 * optimum,
                          gap_positions=gap_positions)
    assert bound <= optimum * (1 + 1e-9)


def test_the_gap_reading_raises_the_bound():
    """Seed 78 (6 ops, 2 devices): read without gaps the bound is 45.5, with them
    47.5, against an optimum of 52 (and a path cut bound of 39.5)."""
    p, seq, optimum = _case(78)
    k, lower = p.num_devices, max_load_lower_bound(p.tg, 2)
    without = segment_bound(p.tg, k, seq, lower, optimum, gap_positions=0)
    with_gaps = segment_bound(p.tg, k, seq, lower, optimum)
    assert without == pytest.approx(45.5, rel=1e-6)
    assert with_gaps == pytest.approx(47.5, rel=1e-6)
    assert with_gaps <= optimum


def _skip_block() -> OpGraph:
    """a -> b -> c -> d with a skip a -> d, each op 1: a's output (cost 1) goes to b
    and d, b's (0.1) to c, c's (1) to d. Cutting b -> c is cheap on the path, but then
    a's output crosses too: the optimum is 3.1 ({a, b} | {c, d}), where the path cut
    bound sees 2.1."""
    ops = (Op(id=0, name="a", forward_s={"any": 1.0}, transfer_s=1.0),
           Op(id=1, name="b", forward_s={"any": 1.0}, transfer_s=0.1),
           Op(id=2, name="c", forward_s={"any": 1.0}, transfer_s=1.0),
           Op(id=3, name="d", forward_s={"any": 1.0}))
    edges = (Edge(src=0, dst=1), Edge(src=1, dst=2), Edge(src=2, dst=3), Edge(src=0, dst=3))
    return OpGraph(ops=ops, edges=edges, name="skip", time_unit="unit")


def test_above_the_path_bound_where_a_tensor_goes_around_the_cheap_cut():
    p = max_load_problem(_skip_block(), 2)
    tg, optimum = p.tg, brute_max_load(p, contiguous=False)
    lower = max_load_lower_bound(tg, 2)
    old = path_cut_bound(tg, 2, heavy_group_bound(tg, lower), 2 * optimum)
    new = segment_bound(tg, 2, group_sequence(tg), lower, 2 * optimum)
    assert optimum == pytest.approx(3.1)
    assert old == pytest.approx(2.1, rel=1e-6)
    assert new == pytest.approx(optimum, rel=1e-6)


def test_a_deadline_past_keeps_the_known_bound():
    p = max_load_problem(_skip_block(), 2)
    lower = max_load_lower_bound(p.tg, 2)
    assert segment_bound(p.tg, 2, group_sequence(p.tg), lower, 10.0, deadline=0.0) == lower
