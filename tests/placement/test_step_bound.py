"""The window bound on step time: never above the optimum, and above the analytic
bound where the graph's work cannot all run in parallel; its heads and tails, which see
that joined inputs serialize or pay their transfer, never above a real schedule's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.graph import Edge, Op, OpGraph
from placement.simulate import list_schedule, step_time_lower_bound
from placement.step_bound import (
    energetic_bound,
    heads_tails,
    join_heads_tails,
    step_time_bound,
    window_bound,
)
from tests.placement.milp_cases import problem, random_dag, search_step_time, training_dag
from tests.placement.test_coarsen import chain


@pytest.mark.parametrize("seed", range(8))
def test_the_bound_is_at_most_the_brute_force_optimum(seed):
    p = problem(training_dag(seed, 3 + seed % 3), 2 + seed % 2, "makespan",
                num_micro_batches=1 + seed % 2)
    assert step_time_bound(p.tg, p.num_devices) <= search_step_time(
        p.tg, p.num_devices) + 1e-9


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), num_ops=st.integers(1, 25), k=st.integers(1, 4),
       micro=st.integers(1, 3))
def test_no_placement_beats_the_bound(seed, num_ops, k, micro):
    p = problem(random_dag(seed, num_ops), k, "makespan", num_micro_batches=micro)
    group_device = np.random.default_rng(seed).integers(0, k, size=p.tg.num_groups)
    lower = step_time_bound(p.tg, k)
    # The energetic check only from a small graph's bound (its time is cubic).
    bound = energetic_bound(p.tg, k, lower) if p.tg.num_tasks <= 80 else lower
    assert list_schedule(p.tg, group_device, k).step_time_s >= bound - 1e-9


def test_work_that_must_wait_raises_the_bound():
    # A 10 s op feeding three 1 s ops, 2 devices: the analytic bound is the critical
    # path, 11; the three short ops all wait for the long one, so at least 1.5 s of
    # work per device follows second 10. The optimum is 12.
    graph = OpGraph(ops=(Op(id=0, name="long", forward_s={"any": 10.0}),
                         *(Op(id=i, name=f"short{i}", forward_s={"any": 1.0})
                           for i in (1, 2, 3))),
                    edges=tuple(Edge(src=0, dst=i, cost_s=0.0) for i in (1, 2, 3)))
    tg = problem(graph, 2, "makespan").tg
    assert step_time_lower_bound(tg, 2) == pytest.approx(11.0)
    assert window_bound(tg, 2) == pytest.approx(11.5)
    assert search_step_time(tg, 2) == pytest.approx(12.0)


def test_a_group_on_its_one_device_raises_the_bound():
    # Two micro-batches of a 4-op chain with backward on 2 devices: each op's four
    # tasks share a device, after the chain's head and before its tail.
    tg = problem(chain(4), 2, "makespan", num_micro_batches=2).tg
    assert step_time_lower_bound(tg, 2) == pytest.approx(6.0)
    assert window_bound(tg, 2) > 6.0 + 1e-9
    assert window_bound(tg, 2) <= search_step_time(tg, 2) + 1e-9


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), num_ops=st.integers(1, 25), k=st.integers(1, 4),
       micro=st.integers(1, 3), colocate=st.booleans())
def test_no_schedule_starts_a_task_before_its_head_or_ends_within_its_tail(
        seed, num_ops, k, micro, colocate):
    p = problem(random_dag(seed, num_ops, colocate=colocate), k, "makespan",
                num_micro_batches=micro)
    head, tail = join_heads_tails(p.tg)
    group_device = np.random.default_rng(seed).integers(0, k, size=p.tg.num_groups)
    s = list_schedule(p.tg, group_device, k)
    slack = 1e-9 * max(1.0, s.step_time_s)
    assert (s.start_s >= head - slack).all()
    assert (s.step_time_s - s.start_s >= tail - slack).all()


@pytest.mark.parametrize("seed", range(6))
def test_the_join_bound_is_at_most_the_optimum_of_graphs_with_joins(seed):
    # Dense random DAGs with backward tasks: every task with several inputs is a join.
    p = problem(training_dag(seed, 3 + seed % 2, edge_prob=0.9), 2, "makespan")
    assert window_bound(p.tg, 2) <= search_step_time(p.tg, 2) + 1e-9


def test_a_join_that_must_serialize_or_pay_raises_the_bound_to_the_optimum():
    # Two 5 s ops feeding a 1 s op over 3 s transfers, 2 devices. Transfer-free heads
    # give the join a head of 5 and the old bound 6 (the critical path). Its inputs
    # either share its device (one after the other: start >= 10) or one sends (start
    # >= 8), so the optimum is 9 and the join's head 8 proves it.
    graph = OpGraph(ops=(Op(id=0, name="a", forward_s={"any": 5.0}),
                         Op(id=1, name="b", forward_s={"any": 5.0}),
                         Op(id=2, name="join", forward_s={"any": 1.0})),
                    edges=(Edge(src=0, dst=2, cost_s=3.0), Edge(src=1, dst=2, cost_s=3.0)))
    tg = problem(graph, 2, "makespan").tg
    plain_head, _ = heads_tails(tg)
    head, _ = join_heads_tails(tg)
    assert plain_head[2] == pytest.approx(5.0)
    assert head[2] == pytest.approx(8.0)
    assert step_time_lower_bound(tg, 2) == pytest.approx(6.0)
    assert window_bound(tg, 2) == pytest.approx(9.0)
    assert search_step_time(tg, 2) == pytest.approx(9.0)


@pytest.mark.parametrize("seed", range(12))
def test_the_energetic_bound_is_at_most_the_brute_force_optimum(seed):
    k = 2 + seed % 3
    p = problem(random_dag(seed, 6 + seed % 5), k, "makespan")
    lower = step_time_bound(p.tg, k)
    assert lower <= energetic_bound(p.tg, k, lower) <= search_step_time(p.tg, k) + 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_the_energetic_bound_holds_with_two_micro_batches(seed):
    p = problem(training_dag(seed, 3 + seed % 3), 2, "makespan", num_micro_batches=2)
    lower = step_time_bound(p.tg, 2)
    assert energetic_bound(p.tg, 2, lower) <= search_step_time(p.tg, 2) + 1e-9


@pytest.mark.parametrize("seed", [6, 18, 19])
def test_work_sticking_into_an_interval_raises_the_bound(seed):
    # Random DAGs where tasks that cannot lie wholly inside an interval still must run
    # part of their time there: the window bound misses it, the optimum does not (seed
    # 6: window 24.5, energetic 25.0, the optimum 25).
    k = 2 + seed % 3
    p = problem(random_dag(seed, 6 + seed % 5), k, "makespan")
    lower = step_time_bound(p.tg, k)
    bound = energetic_bound(p.tg, k, lower)
    assert bound > lower + 0.1
    assert bound <= search_step_time(p.tg, k) + 1e-9
