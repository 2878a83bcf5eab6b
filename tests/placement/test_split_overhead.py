"""The split overhead per micro-batch count (issue 16): what K micro-batches of a split
plan cost beyond 1/K of each op's time, in the task durations that the simulator and
the step-time MILP both schedule."""

import dataclasses

import numpy as np
import pytest

from placement.cluster import preset
from placement.graph import Edge, Op, OpGraph
from placement.planner import PlanConfig, make_problem
from placement.simulate import list_schedule
from placement.tasks import corun_slowdown, ratio_at, split_overhead

CPU = dataclasses.replace(preset("cpu"), devices_per_node=2)


def split_step_ratio(k: int, *, alpha: float, beta: float, plain: float) -> float:
    """A split step of K micro-batches as `ratio_at` models it: K * alpha + beta (the
    batch's share), over the plain step's time."""
    return (k * alpha + beta) / plain


def test_ratio_at_measured_counts_between_them_and_past_them():
    alpha, beta, plain = 3.0, 4.0, 5.0
    measured = {str(k): split_step_ratio(k, alpha=alpha, beta=beta, plain=plain)
                for k in (1, 2, 4)}
    for k in (1, 2, 4):
        assert ratio_at(measured, k) == pytest.approx(measured[str(k)])
    # Between and past the measured counts: the affine split step, exactly.
    for k in (3, 8, 16):
        assert ratio_at(measured, k) == pytest.approx(
            split_step_ratio(k, alpha=alpha, beta=beta, plain=plain))


def test_ratio_at_below_the_smallest_count_and_one_value_for_every_count():
    assert ratio_at({"2": 1.8, "4": 2.6}, 1) == 1.8
    assert ratio_at({"1": 1.3}, 4) == 1.3
    # A graph profiled before the ratios were measured per count.
    assert ratio_at(1.25, 1) == ratio_at(1.25, 4) == 1.25
    # Extrapolating a falling line never gives less than the plain step.
    assert ratio_at({"1": 3.0, "2": 2.0}, 8) == 1.0


def test_split_overhead_and_corun_slowdown_read_the_count_a_plan_runs():
    g = OpGraph(ops=(Op(id=0, name="a", forward_s={"cpu": 1.0}),), edges=(),
                metadata={"split_overhead": {"cpu": {"1": 1.2, "2": 1.8, "4": 3.0}},
                          "corun_slowdown": {"cpu": {"1": 1.1, "2": 1.3, "4": 1.2}}})
    assert [split_overhead(g, "cpu", 2, k) for k in (1, 2, 4)] == [1.2, 1.8, 3.0]
    assert [corun_slowdown(g, "cpu", 2, k) for k in (1, 2, 4)] == [1.1, 1.3, 1.2]
    # One device runs the whole module per micro-batch; an unmeasured kind pays none.
    assert split_overhead(g, "cpu", 1, 4) == corun_slowdown(g, "cpu", 1, 4) == 1.0
    assert split_overhead(g, "v100", 2, 4) == corun_slowdown(g, "v100", 2, 4) == 1.0


def chain(times: list[float], overhead: dict[str, float]) -> OpGraph:
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"cpu": t}, backward_s={"cpu": 2 * t})
                for i, t in enumerate(times))
    edges = tuple(Edge(src=i, dst=i + 1, bytes=0.0) for i in range(len(times) - 1))
    return OpGraph(ops=ops, edges=edges, metadata={"split_overhead": {"cpu": overhead}})


@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_planners_tasks_cost_the_split_step_of_their_micro_batch_count(k):
    """The problem every placer solves (the simulator's and the MILP's task durations)
    charges a split plan of K micro-batches the profiled split step at K: on one of
    two devices, the step is the plain step x the ratio at K, not x the ratio at 1."""
    overhead = {"1": 1.2, "2": 1.9, "4": 3.4}
    g = chain([1e-3, 2e-3, 3e-3], overhead)
    plain_step = sum(op.time_s("cpu") + op.time_s("cpu", backward=True) for op in g.ops)
    problem = make_problem(g, CPU, PlanConfig(num_devices=2, num_micro_batches=k))
    assert problem.tg.duration_s.sum() == pytest.approx(plain_step * overhead[str(k)])
    one_device = np.zeros(problem.tg.num_groups, dtype=int)
    assert list_schedule(problem.tg, one_device, 2).step_time_s == pytest.approx(
        plain_step * overhead[str(k)])
    # One device of one: the plain module per micro-batch, no split overhead.
    alone = make_problem(g, CPU, PlanConfig(num_devices=1, num_micro_batches=k))
    assert alone.tg.duration_s.sum() == pytest.approx(plain_step)
