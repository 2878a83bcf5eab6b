"""The layer-wise cost model (Jia et al. 2018, Section 4) on hand-computed values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from placement.cluster import V100, ClusterSpec, DeviceKind, Link, preset
from placement.errors import UserError
from placement.graph import Edge, Op, OpGraph
from placement.layerwise import (
    CostConfig,
    LayerCosts,
    LayerwisePlan,
    ParallelConfig,
    baseline_choice,
    compare,
    configurations,
)
from placement.layerwise.cost import (
    Topology,
    compute_s,
    requirement_axes,
    requirement_halos,
    ring_allreduce_s,
    sync_s,
    transfer_fractions,
    transfer_table,
)
from placement.layerwise.examples import inception_v3, vgg16
from placement.layerwise.layers import layer_of
from placement.layerwise.search import brute_force

INTRA = Link(latency_s=1e-6, bandwidth_bytes_per_s=1e9)
INTER = Link(latency_s=1e-5, bandwidth_bytes_per_s=1e8)
DEVICE = DeviceKind(name="test", memory_bytes=1e10, peak_flops=1e12, peak_tensor_flops=1e12,
                    memory_bandwidth_bytes_per_s=1e11)
#: Two devices per node, so 4 devices span two nodes.
CLUSTER = ClusterSpec(name="test", device=DEVICE, devices_per_node=2, num_nodes=2,
                      intra_node=INTRA, inter_node=INTER)
TOPO = Topology.of(CLUSTER, 4)


def op(op_id, kind, shape, *, time=1e-3, params=0.0, out_bytes=1e6, **attrs):
    return Op(id=op_id, name=f"{kind}{op_id}", forward_s={"any": time / 3},
              backward_s={"any": 2 * time / 3}, param_bytes=params, output_bytes=out_bytes,
              attrs={"layer_kind": kind, "output_shape": shape, **attrs})


def conv(op_id, shape=(8, 4, 8, 8), kernel=1, **kw):
    return op(op_id, "conv2d", list(shape), weight_shape=[shape[1], 4, kernel, kernel], **kw)


def tx(producer, pconfig, consumer, qconfig, num_bytes=1e6, topo=TOPO):
    p, q = layer_of(producer, "test"), layer_of(consumer, "test")
    req = requirement_axes(p, q)
    fr = transfer_fractions([pconfig], tuple(d if d in p.dims else None for d in p.axes),
                            [qconfig], req, requirement_halos(p, q, req), topo)
    return float(transfer_table(num_bytes, fr, topo)[0, 0])


def test_compute_time_splits_all_but_the_fixed_task_cost():
    assert compute_s(1e-3, 4, 1e-5) == pytest.approx(1e-5 + (1e-3 - 1e-5) / 4)
    assert compute_s(1e-3, 1, 1e-5) == pytest.approx(1e-3)
    assert compute_s(4e-6, 8, 1e-5) == pytest.approx(4e-6)   # all of it is overhead


def test_ring_allreduce_alpha_beta():
    # 2 (r - 1) steps of latency + (8 MB / 4) / 1 GB/s.
    assert ring_allreduce_s(8e6, 4, INTRA) == pytest.approx(6 * (1e-6 + 2e6 / 1e9))
    assert ring_allreduce_s(8e6, 1, INTRA) == 0.0


def test_sync_uses_the_inter_node_link_when_replicas_span_nodes():
    layer = layer_of(conv(0, params=8e6), "test")
    # n2c2: task k = 2n + c, so channel 0's replicas are devices 0 and 2 (two nodes).
    assert sync_s(layer, ParallelConfig(sample=2, channel=2), TOPO) == pytest.approx(
        2 * (1e-5 + 2e6 / 1e8))
    # c2h2: task k = 2c + h, so channel 0's replicas are devices 0 and 1 (one node).
    assert sync_s(layer, ParallelConfig(channel=2, height=2), TOPO) == pytest.approx(
        2 * (1e-6 + 2e6 / 1e9))
    assert sync_s(layer, ParallelConfig(channel=4), TOPO) == 0.0


def test_transfer_moves_only_the_bytes_a_consumer_task_lacks():
    producer, linear = conv(0), op(1, "linear", [8, 10], weight_shape=[10, 256])
    # Same layout: nothing moves (forward or backward).
    assert tx(producer, ParallelConfig(sample=2), conv(1), ParallelConfig(sample=2)) == 0.0
    # n2 -> c2 on one node: each device holds half and needs all, fetches the other half;
    # the gradient goes back the same way.
    assert tx(producer, ParallelConfig(sample=2), linear, ParallelConfig(channel=2)) == \
        pytest.approx(2 * (1e-6 + 0.5e6 / 1e9))
    # n4 -> c4 over two nodes: device 0 gets 1/4 from its node and 1/2 from the other.
    assert tx(producer, ParallelConfig(sample=4), linear, ParallelConfig(channel=4)) == \
        pytest.approx(2 * (1e-6 + 0.25e6 / 1e9 + 1e-5 + 0.5e6 / 1e8))
    # n2 -> h2: device 0 needs the top half of every sample, holds it for half of them.
    assert tx(producer, ParallelConfig(sample=2), conv(1), ParallelConfig(height=2)) == \
        pytest.approx(2 * (1e-6 + 0.25e6 / 1e9))


def test_spatial_splits_pay_for_their_halos():
    producer = conv(0)                                  # 8 rows
    # A 3x3 convolution's tile of rows [0, 4) reads row 4 too: 1/8 of the tensor.
    assert tx(producer, ParallelConfig(height=2), conv(1, kernel=3),
              ParallelConfig(height=2)) == pytest.approx(2 * (1e-6 + 1e6 / 8 / 1e9))
    assert tx(producer, ParallelConfig(height=2), conv(1, kernel=1),
              ParallelConfig(height=2)) == 0.0


def test_channelwise_layers_follow_channels_but_convolutions_read_them_all():
    producer = conv(0)
    pool = op(1, "pool", [8, 4, 8, 8], kernel_size=1)
    assert tx(producer, ParallelConfig(channel=2), pool, ParallelConfig(channel=2)) == 0.0
    assert tx(producer, ParallelConfig(channel=2), conv(1), ParallelConfig(channel=2)) == \
        pytest.approx(2 * (1e-6 + 0.5e6 / 1e9))


def test_configurations_per_kind():
    def count(o, n=4):
        return len(configurations(layer_of(o, "test"), n))
    assert count(conv(0)) == 15                         # exponents (a,b,c,d), sum <= 2
    assert count(op(0, "linear", [8, 10])) == 6         # (n, c): 11 12 14 21 22 41
    assert count(op(0, "loss", [], input_shapes=[[8, 10]])) == 3
    assert count(op(0, "pool", [8, 4, 1, 1])) == 6      # 1x1 pixels never split
    assert count(op(0, "linear", [2, 10])) == 5         # n <= 2: 11 12 14 21 22
    unknown = layer_of(op(0, "other", "?"), "test")
    assert unknown.dims == ("sample",) and unknown.shape == (None,)
    assert [c.label for c in configurations(unknown, 8)] == ["1", "n2", "n4", "n8"]
    # 6 devices: degrees 1, 2, 3, 6 with products dividing 6; channels (4) stop at 3.
    assert count(op(0, "linear", [8, 4]), 6) == 8      # 11 21 12 31 13 61 32 23


def _tiny_graph():
    ops = (conv(0, params=4e6, time=2e-3), conv(1, params=4e6),
           op(2, "linear", [8, 10], params=8e6, weight_shape=[10, 256]),
           op(3, "loss", [], input_shapes=[[8, 10]]))
    edges = tuple(Edge(src=i, dst=i + 1, bytes=1e6) for i in range(3))
    return OpGraph(ops=ops, edges=edges, name="tiny")


def test_baselines_choose_what_their_names_say():
    costs = LayerCosts(_tiny_graph(), CLUSTER, CostConfig(num_devices=4))

    def labels(name):
        return [costs.configs[i][c].label for i, c in enumerate(baseline_choice(costs, name))]
    assert labels("data_parallel") == ["n4", "n4", "n4", "n4"]
    assert labels("model_parallel") == ["c4", "c4", "c4", "1"]
    assert labels("one_weird_trick") == ["n4", "n4", "c4", "1"]


def test_search_on_real_cost_tables_matches_brute_force_and_the_plan_adds_up():
    graph = _tiny_graph()
    config = CostConfig(num_devices=2)
    costs = LayerCosts(graph, CLUSTER, config)
    best, _ = brute_force(costs.node_costs(), costs.edges)
    result = compare(graph, CLUSTER, config)
    plan = result.layerwise
    assert plan.step_time_s == pytest.approx(best)
    assert plan.step_time_s == pytest.approx(plan.compute_s + plan.sync_s + plan.transfer_s)
    assert plan.compute_s == pytest.approx(sum(c.compute_s for c in plan.layers))
    assert plan.sync_s == pytest.approx(sum(c.sync_s for c in plan.layers))
    for p in result.baselines.values():
        assert plan.step_time_s <= p.step_time_s + 1e-12


def test_hand_computed_step_time_of_data_parallelism():
    graph = _tiny_graph()
    costs = LayerCosts(graph, CLUSTER, CostConfig(num_devices=2, task_overhead_s=0.0))
    compute, sync, transfer = costs.breakdown(baseline_choice(costs, "data_parallel"))
    assert compute == pytest.approx((2e-3 + 1e-3 + 1e-3 + 1e-3) / 2)
    # Devices 0 and 1 share a node: ring of 2 over the intra-node link per layer.
    assert sync == pytest.approx(sum(2 * (1e-6 + b / 2 / 1e9) for b in (4e6, 4e6, 8e6)))
    assert transfer == 0.0


def test_plan_round_trips_through_json(tmp_path):
    plan = compare(_tiny_graph(), CLUSTER, CostConfig(num_devices=4)).layerwise
    path = tmp_path / "plan.json"
    plan.save(path)
    assert LayerwisePlan.from_dict(json.loads(path.read_text())) == plan
    with pytest.raises(UserError, match="not a layer-wise plan"):
        LayerwisePlan.from_dict({"format": "other"})


def test_graphs_without_layer_facts_are_refused_with_the_fix():
    bare = OpGraph(ops=(Op(id=0, name="a", forward_s={"any": 1.0}),), edges=())
    with pytest.raises(UserError, match="orchestrator profile"):
        LayerCosts(bare, CLUSTER, CostConfig(num_devices=2))
    with pytest.raises(UserError, match="fewer devices"):
        compare(_tiny_graph(), CLUSTER, CostConfig(num_devices=8))


@pytest.mark.parametrize("build, params", [(vgg16, 138_357_544),
                                           (inception_v3, 27_161_264)])
def test_analytic_models_match_published_parameter_counts_and_reduce_fully(build, params):
    # Parameter counts: VGG-16 configuration D; torchvision's inception_v3 (with aux).
    graph = build(32, V100)
    assert sum(o.param_bytes for o in graph.ops) == 4 * params
    cluster = preset("dgx1-v100")
    result = compare(graph, cluster, CostConfig(num_devices=4))
    assert result.search.residual_nodes == 1
    dp = result.baselines["data_parallel"]
    assert result.layerwise.step_time_s <= dp.step_time_s
    assert {c.config.label for c in dp.layers} == {"n4"}
    assert np.isfinite(result.layerwise.step_time_s)
