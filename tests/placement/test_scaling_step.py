"""Worker step at a per-worker batch: the batch rule and the plan re-simulation."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.cluster import preset
from placement.errors import UserError
from placement.graph import Edge, Op, OpGraph
from placement.planner import PlanConfig, plan
from placement.scaling.step import BatchRule, fit_fixed_fraction, optimizer_s, worker_step

CLUSTER = preset("dgx1-v100")
MB = 1e6


def chain(n: int = 4, with_transfers: bool = True) -> OpGraph:
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"v100": 0.01 * (i + 1)},
                   backward_s={"v100": 0.02 * (i + 1)},
                   output_bytes=4 * MB if with_transfers else 0.0,
                   param_bytes=10 * MB * (i + 1), activation_bytes=8 * MB,
                   attrs={"gradient_bytes": 1 * MB} if i == 0 else {})
                for i in range(n))
    edges = tuple(Edge(src=i, dst=i + 1, bytes=ops[i].output_bytes) for i in range(n - 1))
    return OpGraph(ops=ops, edges=edges, name="chain", metadata={"batch": 32})


def test_batch_rule_hand_computed():
    rule = BatchRule(profiled_batch=32, min_efficient_batch=8)
    assert rule.compute_factor(32, 1) == 1.0
    assert rule.compute_factor(64, 1) == 2.0
    assert rule.compute_factor(4, 1) == 8 / 32  # the floor: 4 samples cost as 8
    assert rule.compute_factor(32, 8) == 8 * 8 / 32  # 8 micro-batches of 4 cost as 8 each
    assert rule.data_factor(16) == 0.5
    with pytest.raises(UserError, match="profiled batch"):
        BatchRule(profiled_batch=0)


@given(st.floats(1, 1e4), st.floats(1, 1e4), st.integers(1, 8), st.floats(0, 64))
def test_compute_grows_with_batch_and_is_linear_above_the_floor(a, b, k, floor):
    rule = BatchRule(profiled_batch=32, min_efficient_batch=floor)
    lo, hi = sorted((a, b))
    assert rule.compute_factor(lo, k) <= rule.compute_factor(hi, k)
    if lo / k >= floor:
        assert rule.compute_factor(hi, k) / rule.compute_factor(lo, k) == pytest.approx(hi / lo)


def test_resimulating_a_plan_at_its_own_batch_gives_its_step_time():
    g = chain()
    for m, k in ((1, 1), (2, 2), (4, 4)):
        p = plan(g, CLUSTER, PlanConfig(num_devices=m, num_micro_batches=k))
        w = worker_step(g, p, CLUSTER, 32, BatchRule(profiled_batch=32, min_efficient_batch=0))
        assert w.compute_s == pytest.approx(p.step_time)
        assert w.mp_degree == m and w.num_micro_batches == k


def test_single_device_worker_hand_computed():
    g = chain(with_transfers=False)
    p = plan(g, CLUSTER, PlanConfig(num_devices=1))
    rule = BatchRule(profiled_batch=32, min_efficient_batch=8)
    w = worker_step(g, p, CLUSTER, 64, rule)
    assert w.compute_s == pytest.approx(2 * (0.1 + 0.2))  # (fwd + bwd) x 2
    assert w.backward_s == pytest.approx(2 * 0.2)
    # the first op's gradient is sparse (1 MB), the others' are their parameters
    assert w.gradient_bytes == pytest.approx(1 * MB + (20 + 30 + 40) * MB)
    assert w.param_bytes == pytest.approx(100 * MB)
    assert w.memory_bytes == pytest.approx(4 * 100 * MB + 2 * 4 * 8 * MB)
    small = worker_step(g, p, CLUSTER, 2, rule)
    assert small.compute_s == pytest.approx(0.3 * 8 / 32)  # the floor


def test_frozen_parameters_are_not_allreduced_updated_or_given_state():
    """Fine-tuning: a frozen op's weights take memory once, with no gradient to
    allreduce and nothing for the optimizer."""
    g = chain(with_transfers=False)
    g = dataclasses.replace(g, ops=tuple(
        dataclasses.replace(op, frozen_bytes=op.param_bytes) if op.id in (1, 2) else op
        for op in g.ops))
    p = plan(g, CLUSTER, PlanConfig(num_devices=1))
    w = worker_step(g, p, CLUSTER, 32, BatchRule(profiled_batch=32, min_efficient_batch=8))
    assert w.gradient_bytes == pytest.approx(1 * MB + 40 * MB)
    assert w.param_bytes == pytest.approx((10 + 40) * MB)
    assert w.memory_bytes == pytest.approx(4 * 50 * MB + (20 + 30) * MB + 4 * 8 * MB)


def test_split_worker_holds_a_share_of_the_gradients():
    g = chain()
    one = worker_step(g, plan(g, CLUSTER, PlanConfig(num_devices=1)), CLUSTER, 32,
                      BatchRule(profiled_batch=32))
    two = worker_step(g, plan(g, CLUSTER, PlanConfig(num_devices=2, num_micro_batches=2)),
                      CLUSTER, 32, BatchRule(profiled_batch=32))
    assert two.gradient_bytes < one.gradient_bytes
    assert two.memory_bytes < one.memory_bytes


def test_a_plan_of_another_graph_is_refused():
    p = plan(chain(3), CLUSTER, PlanConfig(num_devices=1))
    with pytest.raises(UserError, match="does not match"):
        worker_step(chain(4), p, CLUSTER, 32, BatchRule(profiled_batch=32))


def test_optimizer_is_memory_bound():
    assert optimizer_s(900e9, 900e9, 7) == pytest.approx(7.0)


def test_fixed_fraction_is_the_intercept_of_the_line_through_two_profiles():
    # t(b) = 6 ms + 0.5 ms x b: at b = 8, 10 ms of which 6 fixed.
    f = fit_fixed_fraction(8, 0.010, 32, 0.022)
    assert f == pytest.approx(0.6)
    rule = BatchRule(profiled_batch=8, min_efficient_batch=0, fixed_fraction=f)
    for b in (8, 16, 64):
        assert 0.010 * rule.compute_factor(b, 1) == pytest.approx(0.006 + 0.0005 * b)
    # Two micro-batches each pay the fixed part.
    assert 0.010 * rule.compute_factor(64, 2) == pytest.approx(2 * (0.006 + 0.0005 * 32))
    assert fit_fixed_fraction(8, 0.010, 32, 0.050) == 0.0  # noise past linear: clipped
    assert fit_fixed_fraction(8, 0.010, 32, 0.009) == 1.0
    with pytest.raises(ValueError, match="fixed_fraction=1.5"):
        BatchRule(profiled_batch=8, fixed_fraction=1.5)
