"""The block decomposition: a training graph of modules in sequence splits into parts
(each forward block with the backward block of the same ops) whose optimal placements,
relabelled and joined, are an optimal placement of the whole graph."""

from __future__ import annotations

import time

import numpy as np
import pytest

from placement.milp.block_bound import blocks
from placement import heuristics
from placement.milp.solve import solve_plan
from placement.milp.block_bound import sub_graph
from placement.milp.backends import BACKENDS
from placement.milp.decompose import (
    _free_crossings,
    _relabel,
    block_starts,
    chained_graph,
    decomposed_placement,
    largest_part,
    part_gain,
    parts_of,
)
from tests.placement.milp_cases import placements, problem, search_step_time
from tests.placement.test_block_bound import modules


def canonical(group_device: np.ndarray) -> np.ndarray:
    """Devices renumbered by first use, as `placements` lists them."""
    first = {d: i for i, d in enumerate(dict.fromkeys(group_device.tolist()))}
    return np.array([first[d] for d in group_device.tolist()], dtype=np.int64)


def optimum_of(tg, k: int, group_device: np.ndarray) -> float:
    target = canonical(group_device)
    return search_step_time(tg, k, fits=lambda gd: bool((gd == target).all()))


def best_placement(tg, k: int) -> np.ndarray:
    return min(placements(tg, k), key=lambda gd: optimum_of(tg, k, gd))


def test_parts_pair_each_forward_block_with_its_backward_block():
    tg = problem(modules(1, 3, training=True), 2, "makespan").tg
    block_tasks = blocks(tg)
    parts = parts_of(tg, block_tasks)
    # The first fork alone, three modules, the loss turn's block and their mirrors;
    # the first fork's forward and backward share only its articulation group.
    assert len(block_tasks) == 9
    assert parts == [[0], [1, 7], [2, 6], [3, 5], [4], [8]]
    for part in parts:
        sub, tasks = chained_graph(tg, block_tasks, part)
        # Chained: every task of a later block follows every task of an earlier one.
        assert sub.num_tasks == len(tasks) == len(set(tasks))
        assert len(sub.topological_order) == sub.num_tasks


@pytest.mark.parametrize("seed", range(4))
def test_optimal_parts_give_an_optimal_plan(seed):
    k = 2
    tg = problem(modules(seed, 2, training=True), k, "makespan").tg
    gd = decomposed_placement(tg, k, time.perf_counter() + 60,
                              lambda part, until, starts: best_placement(part, k))
    assert gd is not None
    assert optimum_of(tg, k, gd) == pytest.approx(search_step_time(tg, k))


@pytest.mark.parametrize("seed", range(3))
def test_block_starts_hold_the_heft_placement_of_each_block(seed):
    k = 3
    tg = problem(modules(seed, 3, training=True), k, "makespan").tg
    block_tasks = blocks(tg)
    for part in (p for p in parts_of(tg, block_tasks) if len(p) > 1):
        sub, tasks = chained_graph(tg, block_tasks, part)
        starts = block_starts(sub, tasks, [block_tasks[i] for i in part], k)
        whole = heuristics.heft(sub, k, np.zeros(sub.num_groups), 1.0)
        assert np.array_equal(starts[0], whole)
        assert all(((gd >= 0) & (gd < k)).all() and len(gd) == sub.num_groups
                   for gd in starts)
        assert len({gd.tobytes() for gd in starts}) == len(starts)
        # Each block's own HEFT placement is among the starts, lifted to the part.
        index = {t: i for i, t in enumerate(tasks)}
        for i in part:
            local = [index[t] for t in block_tasks[i]]
            block = sub_graph(sub, local)
            groups = list(dict.fromkeys(sub.group[local].tolist()))
            own = heuristics.heft(block, k, np.zeros(block.num_groups), 1.0)
            assert any(np.array_equal(gd[groups], own) for gd in starts)


def test_largest_part_counts_a_forward_backward_pair_or_the_whole_graph():
    tg = problem(modules(1, 3, training=True), 2, "makespan").tg
    block_tasks = blocks(tg)
    pairs = [len(set(block_tasks[a]) | set(block_tasks[b])) for a, b in
             ([1, 7], [2, 6], [3, 5])]
    assert largest_part(tg) == max(pairs) < tg.num_tasks
    # One module: its forward and backward blocks (each with the articulation tasks at
    # its ends) hold every task of the graph between them.
    one = problem(modules(1, 1, training=True), 2, "makespan").tg
    assert largest_part(one) == one.num_tasks


def test_relabel_agrees_with_placed_groups_or_says_none():
    to = _relabel(np.array([0, 1, 1]), [2, -1, -1], 3)
    assert to[0] == 2 and sorted(to.tolist()) == [0, 1, 2]
    assert _relabel(np.array([0, 1]), [2, 2], 3) is None
    assert _relabel(np.array([0, 0]), [1, 2], 3) is None


def test_the_parts_lift_the_blocks_bound_and_stay_below_the_optimum():
    # Each block and each part at its brute-force optimum: the blocks' sum plus what
    # the parts add never exceeds the whole graph's optimum, and somewhere the parts
    # add something (a forward block and its backward block on one placement).
    k = 2
    gains = []
    for seed in range(6):
        tg = problem(modules(seed, 2, training=True), k, "makespan").tg
        block_tasks = blocks(tg)
        values = [search_step_time(sub_graph(tg, ts), k) for ts in block_tasks]
        blocks_sum = sum(values) - sum(float(tg.duration_s[ts[-1]]) for ts in block_tasks[:-1])
        gain = part_gain(tg, values, lambda part, lower: search_step_time(part, k))
        assert gain >= 0
        assert blocks_sum + gain <= search_step_time(tg, k) + 1e-9
        gains.append(gain)
    assert max(gains) > 0


def test_a_part_bound_frees_only_the_transfers_between_its_blocks():
    tg = problem(modules(1, 2, training=True), 3, "makespan").tg
    block_tasks = blocks(tg)
    for part in (p for p in parts_of(tg, block_tasks) if len(p) > 1):
        sub, tasks = chained_graph(tg, block_tasks, part)
        freed = _free_crossings(sub, tasks, [block_tasks[i] for i in part])
        inside = set()
        for i in part:
            local = {tasks.index(t) for t in block_tasks[i]}
            inside |= {e for e, (u, v) in enumerate(zip(sub.edge_src.tolist(),
                                                        sub.edge_dst.tolist()))
                       if u in local and v in local}
        for e in range(len(sub.edge_src)):
            expected = sub.edge_transfer_s[e] if e in inside else 0.0
            assert freed.edge_transfer_s[e] == expected


@pytest.mark.skipif(not BACKENDS["highs"].is_available(), reason="highs not installed")
def test_the_solve_places_the_parts_without_a_warning():
    # The whole one-micro-batch solve, whose decomposition round orders the assembled
    # placement: a failure there left HEFT's plan with a warning.
    p = problem(modules(0, 2, training=True), 2, "makespan", time_limit_s=4.0)
    plan = solve_plan(p, "highs")
    assert not any("warning" in n for n in plan.notes), plan.notes
