"""The group orders the max-load stages walk: program order and the shorter of two."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.graph import Edge, Op, OpGraph
from placement.heuristics import contiguous_split
from placement.ideal_dp import join_roots, joined_sequence, side_inputs
from placement.sequences import joined_sequences, program_order, sender_span
from placement.simulate import max_load
from tests.placement.max_load_cases import brute_max_load, max_load_problem, training_dag


def _is_topological(tg, order) -> bool:
    pos = np.empty(tg.num_tasks, dtype=np.int64)
    pos[list(order)] = np.arange(tg.num_tasks)
    return bool((pos[tg.edge_src] < pos[tg.edge_dst]).all())


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), num_ops=st.integers(3, 9))
def test_program_order_is_the_least_id_topological_order(seed, num_ops):
    """Ops numbered topologically (as a profile numbers them): the order is the ids'
    own, forward tasks then backward ones; a random shuffle of ids stays topological."""
    p = max_load_problem(training_dag(seed, num_ops), 2)
    order = program_order(p.tg)
    assert sorted(order) == list(range(p.tg.num_tasks))
    assert _is_topological(p.tg, order)
    forward = [t for t in order if not p.tg.tasks[t].backward]
    assert [p.tg.tasks[t].op_id for t in forward] == list(range(num_ops))


def _encoder_decoder() -> OpGraph:
    """An encoder e0 -> e1 -> e2 and a decoder whose input d (a source, id 3) feeds
    layers x1 and x2, which also read e2 (cross-attention). The depth-first order pops
    d first (the last source ready; with two consumers it is no pendant to move), so
    d's tensor crosses the whole encoder; program order runs the encoder first."""
    def op(i, name, work, transfer):
        return Op(id=i, name=name, forward_s={"any": work}, backward_s={"any": work},
                  transfer_s=transfer)
    ops = (op(0, "e0", 6.0, 1.0), op(1, "e1", 6.0, 1.0), op(2, "e2", 6.0, 1.0),
           op(3, "d", 6.0, 5.0), op(4, "x1", 6.0, 1.0), op(5, "x2", 6.0, 1.0))
    edges = (Edge(src=0, dst=1), Edge(src=1, dst=2), Edge(src=2, dst=4),
             Edge(src=2, dst=5), Edge(src=3, dst=4), Edge(src=3, dst=5), Edge(src=4, dst=5))
    return OpGraph(ops=ops, edges=edges, name="encoder-decoder", time_unit="unit")


def test_the_sequence_of_shorter_senders_comes_first():
    p = max_load_problem(_encoder_decoder(), 2)
    tg = p.tg
    root = join_roots(side_inputs(tg, p.group_memory, p.memory_cap))
    depth_first = joined_sequence(tg, root)
    program = joined_sequence(tg, root, program_order(tg))
    group = tg.group_of_op
    assert depth_first[0] == group[3]
    assert program == [group[op] for op in range(6)]
    assert sender_span(tg, root, program) < sender_span(tg, root, depth_first)
    assert joined_sequences(tg, root) == [program, depth_first]
    # Its contiguous split is the optimum here; the depth-first one's pays d's tensor.
    best = contiguous_split(tg, 2, p.group_memory, p.memory_cap, program)
    other = contiguous_split(tg, 2, p.group_memory, p.memory_cap, depth_first)
    assert max_load(tg, best, 2) == pytest.approx(brute_max_load(p, contiguous=False))
    assert max_load(tg, best, 2) < max_load(tg, other, 2)


def test_sender_span_counts_positions_from_first_to_last_member():
    """A chain a -> b -> c with a also feeding c: a's sender spans 2 and b's 1; their
    gradients come back on the same senders (a backward task sends nothing)."""
    ops = tuple(Op(id=i, name=n, forward_s={"any": 1.0}, backward_s={"any": 1.0},
                   transfer_s=1.0) for i, n in enumerate("abc"))
    edges = (Edge(src=0, dst=1), Edge(src=1, dst=2), Edge(src=0, dst=2))
    p = max_load_problem(OpGraph(ops=ops, edges=edges, name="chain", time_unit="unit"), 2)
    identity = np.arange(p.tg.num_groups)
    seq = [p.tg.group_of_op[op] for op in range(3)]
    # a -> {b, c} 2, b -> {c} 1.
    assert sender_span(p.tg, identity, seq) == 3
    assert sender_span(p.tg, identity, seq[::-1]) == 3
