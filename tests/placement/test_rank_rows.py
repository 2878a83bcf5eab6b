"""The micro-batch rank rows of the step-time relaxation: with them its bound never
exceeds the brute-force optimum, rises above the relaxation's alone where the copies of
a stage must pass one at a time, and a variant that counts each copy's work twice is
caught exceeding the optimum (so the check can fail); one placement's bound holds for
that placement's best order."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from placement.milp import pipeline_bound, rank_rows
from placement.milp.backends import BACKENDS, SolveOptions
from placement.milp.max_load import canonical_devices
from placement.milp.rank_rows import placement_bound
from tests.placement.milp_cases import problem, search_step_time, training_dag


def bound(p, with_rows: bool) -> float:
    data = pipeline_bound.relaxation_data(p, upper_bound=1e6)
    model = pipeline_bound.build_relaxation(data)
    if with_rows:
        rank_rows.add_rank_rows(model, data.tg, data.num_micro_batches,
                                pipeline_bound.reach_or_self(data.tg), data.scale)
    result = BACKENDS["highs"].run(model, SolveOptions(time_limit_s=20, gap=0.0))
    assert result.status == "optimal"
    return result.lower_bound * data.scale


def case(seed: int):
    """Seed -> (problem, devices): 2-3 devices, 2-3 micro-batches, 3-5 ops whose
    dense edges (probability 0.7) leave articulation tasks for the anchor rows."""
    k = 2 + seed % 2
    p = problem(training_dag(seed, 3 + seed % 3, edge_prob=0.7), k, "makespan",
                num_micro_batches=2 + (seed // 2) % 2)
    return p, k


@functools.cache
def optimum(seed: int) -> float:
    """The brute-force optimum of `case(seed)`, which two tests ask for."""
    p, k = case(seed)
    return search_step_time(p.tg, k)


# Seeds whose brute force takes at most a few seconds.
@pytest.mark.parametrize("seed", [0, 1, 3, 4, 5, 6, 7, 9, 16, 18, 21, 33, 65])
def test_the_bound_is_at_most_the_brute_force_optimum(seed):
    p, _ = case(seed)
    assert bound(p, True) <= optimum(seed) * (1 + 1e-6)


@pytest.mark.parametrize("seed, brute_force, raised",
                         [(6, 74 / 3, 74 / 3), (33, 28.0, 28.0)])
def test_the_rows_raise_the_bound_where_copies_queue(seed, brute_force, raised):
    # Seed 6: two devices, three micro-batches, the relaxation alone proves 24, the rows
    # the optimum; seed 33: three devices, two micro-batches, 26.5 -> the optimum 28.
    p, _ = case(seed)
    assert optimum(seed) == pytest.approx(brute_force)
    assert bound(p, False) < raised - 0.1
    assert bound(p, True) == pytest.approx(raised, rel=1e-6)


def test_counting_each_copys_work_twice_is_caught(monkeypatch):
    # An over-strong variant: each anchor pair's work charged twice. On seed 6 it
    # claims more than the optimum, which the first test would reject.
    group_work = rank_rows._group_work

    def doubled(tg, inside, scale):
        return {g: 2 * w for g, w in group_work(tg, inside, scale).items()}

    monkeypatch.setattr(rank_rows, "_group_work", doubled)
    p, _ = case(6)
    assert bound(p, True) > optimum(6) * (1 + 1e-3)


@pytest.mark.parametrize("seed", [0, 3, 6, 7, 19])
def test_a_placements_bound_holds_for_its_best_order(seed):
    p, k = case(seed)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        group_device = canonical_devices(rng.integers(0, k, size=p.tg.num_groups))
        best_order = search_step_time(
            p.tg, k, fits=lambda gd: np.array_equal(gd, group_device))
        plain = placement_bound(p, group_device, BACKENDS["highs"], 20,
                                with_rank_rows=False)
        ranked = placement_bound(p, group_device, BACKENDS["highs"], 20)
        assert plain <= ranked * (1 + 1e-9)
        assert ranked <= best_order * (1 + 1e-6)
