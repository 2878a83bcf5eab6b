"""The window bound on step time: never above the optimum, and above the analytic
bound where the graph's work cannot all run in parallel."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.graph import Edge, Op, OpGraph
from placement.simulate import list_schedule, step_time_lower_bound
from placement.step_bound import step_time_bound, window_bound
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
    assert list_schedule(p.tg, group_device, k).step_time_s >= (
        step_time_bound(p.tg, k) - 1e-9)


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
