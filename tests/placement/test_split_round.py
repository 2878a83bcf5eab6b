"""The rotated contiguous splits as step-time starts (`makespan.split_round`): on a
chain whose first and last ops share a weight, the wrap-around split is what beats
every baseline placer, and the round offers the best rotation under the simulator."""

from __future__ import annotations

import time

import pytest

from placement import heuristics
from placement.graph import Edge, Op, OpGraph
from placement.ideal_dp import join_roots, side_inputs
from placement.milp import makespan as mk
from placement.milp.incumbent import Incumbent
from placement.problem import best_heuristic, heuristic_placements
from placement.sequences import joined_sequences
from placement.simulate import evaluate_order, list_schedule
from tests.placement.milp_cases import problem


def tied_chain(num_ops: int, head_s: float, cost: float) -> OpGraph:
    """A chain with backward times whose first op (an embedding) and last op (an
    output layer of `head_s`, the heaviest) share one weight, as T5's do."""
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"any": head_s if i == num_ops - 1 else 2.0},
                   backward_s={"any": 2 * head_s if i == num_ops - 1 else 4.0},
                   colocation="tied" if i in (0, num_ops - 1) else None)
                for i in range(num_ops))
    edges = tuple(Edge(src=i, dst=i + 1, cost_s=cost) for i in range(num_ops - 1))
    return OpGraph(ops=ops, edges=edges, name="tied", time_unit="unit")


def every_rotation(p) -> float:
    """The least step time over every rotation of both joined sequences, each split
    by `contiguous_split` and list-scheduled at each stagger."""
    tg, k = p.tg, p.num_devices
    root = join_roots(side_inputs(tg, p.group_memory, p.memory_cap))
    values = []
    for seq in joined_sequences(tg, root):
        for r in range(len(seq)):
            gd = heuristics.contiguous_split(tg, k, p.group_memory, p.memory_cap,
                                             seq[r:] + seq[:r])
            values += [list_schedule(tg, gd, k, stagger_s=s).step_time_s
                       for s in mk._staggers(p)]
    return min(values)


@pytest.mark.parametrize("num_ops, head_s, cost, k", [(10, 8.0, 1.0, 3), (12, 10.0, 1.0, 4),
                                                      (9, 6.0, 0.5, 3)])
def test_the_wrap_around_split_beats_every_baseline(num_ops, head_s, cost, k):
    p = problem(tied_chain(num_ops, head_s, cost), k, "makespan", num_micro_batches=4)
    name, gd, value = best_heuristic(p)
    incumbent = Incumbent(gd, value, name)
    mk.split_round(p, incumbent, time.perf_counter() + 30)
    assert incumbent.source == "heuristic:rotated contiguous split"
    assert all(incumbent.value < p.evaluate(g) for g in heuristic_placements(p).values())
    # Fewer groups than rotations tried: every rotation was scored.
    assert incumbent.value == pytest.approx(every_rotation(p))
    # The order offered with the plan gives its value.
    assert evaluate_order(p.tg, incumbent.group_device,
                          incumbent.order).step_time_s == pytest.approx(incumbent.value)


def test_one_micro_batch_is_left_to_the_other_rounds():
    p = problem(tied_chain(10, 8.0, 1.0), 3, "makespan")
    name, gd, value = best_heuristic(p)
    incumbent = Incumbent(gd, value, name)
    mk.split_round(p, incumbent, time.perf_counter() + 30)
    assert incumbent.source == name and incumbent.value == value
