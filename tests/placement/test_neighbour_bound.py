"""The neighbour bound (`placement.neighbour_bound`): a heavy group either holds its
dear neighbours or pays their transfers, and the least of those choices bounds every
plan's step time."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from placement.graph import Edge, Op, OpGraph
from placement.neighbour_bound import (
    dear_neighbours,
    group_bound,
    neighbour_bound,
    one_device_bound,
)
from placement.step_bound import step_time_bound
from placement.tasks import one_micro_batch
from tests.placement.milp_cases import problem, search_step_time, training_dag


def head_and_loss(head_s: float, logits_s: float) -> OpGraph:
    """T5's end in small: a chain of layers, a heavy output layer tied to the first
    op, and a light loss that receives the output layer's dear logits."""
    times = [1.0, 2.0, 2.0, head_s, 0.5]
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"any": t}, backward_s={"any": 2 * t},
                   colocation="tied" if i in (0, 3) else None) for i, t in enumerate(times))
    edges = tuple(Edge(src=i, dst=i + 1, cost_s=logits_s if i == 3 else 0.5)
                  for i in range(len(times) - 1))
    return OpGraph(ops=ops, edges=edges, name="head_and_loss", time_unit="unit")


def over_strong(tg) -> float:
    """The largest instead of the least over the choices: wrong, as a plan picks the
    choice that suits it."""
    one = one_micro_batch(tg)
    edges = _edges(one)
    best = 0.0
    for g in range(one.num_groups):
        near = dear_neighbours(one, g)
        for mask in itertools.product((False, True), repeat=len(near)):
            mine = [g, *(n for n, on in zip(near, mask) if on)]
            away = [n for n, on in zip(near, mask) if not on]
            best = max(best, one_device_bound(one, tg.num_micro_batches, mine, away, edges))
    return best


def _edges(tg):
    into = [[] for _ in range(tg.num_tasks)]
    out = [[] for _ in range(tg.num_tasks)]
    for e, (u, v) in enumerate(zip(tg.edge_src.tolist(), tg.edge_dst.tolist())):
        into[v].append(e)
        out[u].append(e)
    return into, out


CASES = [(seed, 5, k, micro) for seed in range(6) for k, micro in ((2, 2), (3, 2))]


def test_the_bound_holds_where_the_largest_choice_overshoots():
    # Against the brute-force optimum: the bound never exceeds it, and the
    # over-strong variant does somewhere, so the cases can tell the two apart.
    missed = []
    for seed, num_ops, k, micro in CASES:
        tg = problem(training_dag(seed, num_ops), k, "makespan",
                     num_micro_batches=micro).tg
        optimum = search_step_time(tg, k)
        assert neighbour_bound(tg) <= optimum * (1 + 1e-9), (seed, k)
        missed.append(over_strong(tg) > optimum * (1 + 1e-6))
    assert any(missed)


@pytest.mark.parametrize("k", [2, 3])
def test_a_dear_loss_raises_the_bound_over_the_window_bound(k):
    tg = problem(head_and_loss(6.0, 4.0), k, "makespan", num_micro_batches=2).tg
    one = one_micro_batch(tg)
    heavy = int(np.argmax(one.group_work_s))
    loss = int(one.group[one.tasks.index(next(t for t in one.tasks if t.op_id == 4))])
    assert dear_neighbours(one, heavy) == [loss]
    bound = neighbour_bound(tg)
    assert bound == pytest.approx(group_bound(one, 2, heavy))
    assert step_time_bound(tg, k) < bound <= search_step_time(tg, k) * (1 + 1e-9)
