"""Cluster presets against the instances cluster.yaml starts, and the memory a plan may
use on a real GPU."""

import pytest

from placement.cluster import (GIB, GPU_FRAGMENTATION, GPU_RESERVED_BYTES, preset,
                               usable_memory_bytes)


@pytest.mark.parametrize("name,nominal_gib,kind", [
    ("p3.16xlarge", 16, "v100"), ("p4d.24xlarge", 40, "a100"), ("dgx1-v100", 32, "v100"),
    ("dgx-a100", 40, "a100"), ("dgx-h100", 80, "h100")])
def test_gpu_presets_leave_headroom_below_the_datasheet_memory(name, nominal_gib, kind):
    device = preset(name).device
    assert device.name == kind and device.nominal_memory_bytes == nominal_gib * GIB
    # Context and NCCL first, then the allocator's fragmentation share of the rest.
    assert device.memory_bytes == pytest.approx(
        (nominal_gib * GIB - GPU_RESERVED_BYTES) * (1 - GPU_FRAGMENTATION))
    assert device.memory_bytes < nominal_gib * GIB - 2 * GIB


def test_p3_16xlarge_is_eight_16_gb_v100s():
    p3 = preset("p3.16xlarge")
    assert p3.devices_per_node == 8
    assert usable_memory_bytes(16 * GIB) == p3.device.memory_bytes < 14 * GIB
    # 25 Gbps per instance shared by 8 GPUs.
    assert p3.inter_node.bandwidth_bytes_per_s == pytest.approx(25e9 / 8 / 8)


def test_the_cpu_preset_keeps_its_whole_share():
    cpu = preset("cpu").device
    assert cpu.nominal_memory_bytes is None and cpu.matmul_peak_flops("bf16") == cpu.peak_flops


def test_a_plan_that_fits_the_datasheet_but_not_the_usable_memory_is_refused():
    """15 GiB of activations fit a 16 GB V100's nominal memory, not what a training
    process has left of it: refused, naming the device count that fits."""
    from placement.graph import Op, OpGraph
    from placement.planner import InfeasiblePlacementError, PlanConfig, plan

    ops = tuple(Op(id=i, name=str(i), forward_s={"v100": 1.0}, backward_s={"v100": 1.0},
                   activation_bytes=5 * GIB) for i in range(3))
    with pytest.raises(InfeasiblePlacementError, match="use at least 2 devices"):
        plan(OpGraph(ops=ops, edges=()), preset("p3.16xlarge"), PlanConfig(num_devices=1))
    assert plan(OpGraph(ops=ops, edges=()), preset("p3.16xlarge"),
                PlanConfig(num_devices=2)).num_devices == 2
