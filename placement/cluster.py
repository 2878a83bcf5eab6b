"""Cluster topology: device kinds, links inside and across nodes, and named presets.

A worker's model-parallel devices always share one node (a Ray placement-group bundle
never spans nodes), so the placer only needs the intra-node link; the scaling model
uses the inter-node link for the data-parallel allreduce.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, replace

from placement.errors import UserError


class UnknownPresetError(UserError):
    pass


@dataclass(frozen=True, kw_only=True)
class DeviceKind:
    name: str
    """Key into an op's per-kind times (e.g. 'v100', 'cpu')."""
    memory_bytes: float
    """Memory one device offers for parameters, optimizer state and activations: for a
    GPU, its nominal memory less `usable_memory_bytes`'s headroom."""
    peak_flops: float
    """Dense fp32 peak, FLOP/s (what the profiler's roofline projects against)."""
    peak_tensor_flops: float
    """Dense fp16/bf16 tensor-core peak, FLOP/s (mixed precision); = peak_flops on CPU."""
    memory_bandwidth_bytes_per_s: float
    peak_tf32_flops: float | None = None
    """Dense TF32 tensor-core peak, FLOP/s; None where the part has no TF32 (V100, CPU):
    fp32 matmuls then run at `peak_flops`."""
    nominal_memory_bytes: float | None = None
    """The datasheet's memory per device; None: `memory_bytes` is all there is (CPU)."""

    def __post_init__(self) -> None:
        for field_name in ("memory_bytes", "peak_flops", "peak_tensor_flops",
                           "memory_bandwidth_bytes_per_s"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"device {self.name}: {field_name} must be > 0")

    def matmul_peak_flops(self, precision: str) -> float:
        """The dense peak a GEMM or convolution reaches at `precision` (see PRECISIONS)."""
        if precision not in PRECISIONS:
            raise UserError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
        if precision == "bf16":
            return self.peak_tensor_flops
        if precision == "tf32":
            return self.peak_tf32_flops or self.peak_flops
        return self.peak_flops


#: Matmul precisions of a training step: plain fp32, fp32 with TF32 tensor cores
#: (torch.backends.cuda.matmul.allow_tf32; cuDNN convolutions use TF32 by default), and
#: bf16 autocast.
PRECISIONS = ("fp32", "tf32", "bf16")


@dataclass(frozen=True, kw_only=True)
class Link:
    latency_s: float
    """Alpha of the alpha-beta model: fixed cost of one message."""
    bandwidth_bytes_per_s: float
    """Beta^-1: bytes per second one device can send over this link, one direction."""

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.bandwidth_bytes_per_s <= 0:
            raise ValueError(
                f"link latency {self.latency_s} s must be >= 0 and bandwidth "
                f"{self.bandwidth_bytes_per_s} B/s > 0"
            )

    def transfer_s(self, num_bytes: float) -> float:
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    name: str
    device: DeviceKind
    devices_per_node: int
    """GPUs (or CPU cores acting as devices) in one node."""
    num_nodes: int = 1
    intra_node: Link
    """Device-to-device link inside a node (NVLink, PCIe, shared memory)."""
    inter_node: Link
    """One device's share of the node's network (InfiniBand, EFA, Ethernet)."""

    def __post_init__(self) -> None:
        if self.devices_per_node < 1 or self.num_nodes < 1:
            raise ValueError(
                f"cluster {self.name}: devices_per_node={self.devices_per_node} and "
                f"num_nodes={self.num_nodes} must both be >= 1"
            )

    @property
    def num_devices(self) -> int:
        return self.devices_per_node * self.num_nodes

    def with_nodes(self, num_nodes: int) -> ClusterSpec:
        return replace(self, num_nodes=num_nodes)


GB = 1e9
GIB = 2**30
TERA = 1e12

#: Memory a training process loses on every GPU before the model gets any: the CUDA
#: context with cuBLAS/cuDNN loaded (300-600 MB on V100/A100 with CUDA 12 and lazy
#: module loading) and NCCL's communicators (a 4 MiB buffer per channel and protocol
#: for each peer, a few hundred MB on an 8-GPU node). The allreduce's own buffer is a
#: copy of the device's gradients, so it scales with the parameters and is counted
#: there: the planner's 4 bytes of state per parameter byte (PlanConfig.
#: param_state_factor) are SGD's weights, gradients and momentum plus that flat bucket.
GPU_RESERVED_BYTES = 1 * GIB
#: Share of what is left that the caching allocator cannot hand out as one block
#: (blocks split and cached per stream and size class): PyTorch's own OOM reports
#: commonly show 5-10% of memory "reserved but unallocated" at a training peak.
GPU_FRAGMENTATION = 0.10


def usable_memory_bytes(nominal_bytes: float) -> float:
    """What a plan may put on a GPU of `nominal_bytes`: the rest after the context, NCCL
    and fragmentation headroom."""
    return (nominal_bytes - GPU_RESERVED_BYTES) * (1 - GPU_FRAGMENTATION)


def _gpu(*, nominal_memory_bytes: float, **figures) -> DeviceKind:
    return DeviceKind(memory_bytes=usable_memory_bytes(nominal_memory_bytes),
                      nominal_memory_bytes=nominal_memory_bytes, **figures)


# NVIDIA Tesla V100 SXM2 datasheet (2018): 15.7 TFLOP/s fp32, 125 TFLOP/s tensor
# (fp16; no TF32, and bf16 has no tensor-core path: counted at the fp16 figure, an
# optimistic bound), 900 GB/s HBM2; 16 GB or 32 GB.
V100 = _gpu(name="v100", nominal_memory_bytes=32 * GIB, peak_flops=15.7 * TERA,
            peak_tensor_flops=125 * TERA, memory_bandwidth_bytes_per_s=900 * GB)
V100_16GB = dataclasses.replace(V100, nominal_memory_bytes=16 * GIB,
                                memory_bytes=usable_memory_bytes(16 * GIB))
# NVIDIA A100 Tensor Core GPU datasheet (SXM4 40 GB): 19.5 TFLOP/s fp32, 156 TFLOP/s
# TF32, 312 TFLOP/s fp16/bf16 dense, 1,555 GB/s HBM2.
A100 = _gpu(name="a100", nominal_memory_bytes=40 * GIB, peak_flops=19.5 * TERA,
            peak_tf32_flops=156 * TERA, peak_tensor_flops=312 * TERA,
            memory_bandwidth_bytes_per_s=1555 * GB)
# NVIDIA H100 Tensor Core GPU datasheet (SXM5 80 GB): 67 TFLOP/s fp32, 494.5 TFLOP/s
# TF32 dense, 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3.
H100 = _gpu(name="h100", nominal_memory_bytes=80 * GIB, peak_flops=67 * TERA,
            peak_tf32_flops=494.5 * TERA, peak_tensor_flops=989 * TERA,
            memory_bandwidth_bytes_per_s=3350 * GB)


def _dgx1_v100() -> ClusterSpec:
    # NVIDIA DGX-1 with Tesla V100 system architecture white paper (WP-08437-002):
    # hybrid cube-mesh, each GPU pair joined by one or two NVLink 2 links of 25 GB/s per
    # direction; we use 25 GB/s (the single-link pairs bound a bundle's transfers);
    # four 100 Gb/s InfiniBand EDR ports per node -> 50 GB/s per node, 6.25 GB/s per GPU.
    return ClusterSpec(
        name="dgx1-v100", device=V100, devices_per_node=8,
        intra_node=Link(latency_s=5e-6, bandwidth_bytes_per_s=25 * GB),
        inter_node=Link(latency_s=5e-6, bandwidth_bytes_per_s=50 * GB / 8),
    )


def _dgx_a100() -> ClusterSpec:
    # NVIDIA DGX A100 system architecture white paper (WP-10083-001): NVSwitch, 600 GB/s
    # bidirectional NVLink 3 per GPU (300 GB/s per direction); eight 200 Gb/s HDR
    # InfiniBand ports for compute -> 25 GB/s per GPU.
    return ClusterSpec(
        name="dgx-a100", device=A100, devices_per_node=8,
        intra_node=Link(latency_s=3e-6, bandwidth_bytes_per_s=300 * GB),
        inter_node=Link(latency_s=5e-6, bandwidth_bytes_per_s=25 * GB),
    )


def _dgx_h100() -> ClusterSpec:
    # NVIDIA DGX H100 user guide / H100 datasheet: NVLink 4, 900 GB/s bidirectional per
    # GPU (450 GB/s per direction) through NVSwitch; eight 400 Gb/s NDR ConnectX-7
    # ports -> 50 GB/s per GPU.
    return ClusterSpec(
        name="dgx-h100", device=H100, devices_per_node=8,
        intra_node=Link(latency_s=3e-6, bandwidth_bytes_per_s=450 * GB),
        inter_node=Link(latency_s=5e-6, bandwidth_bytes_per_s=50 * GB),
    )


def _p3_16xlarge() -> ClusterSpec:
    # AWS EC2 P3 instance page: 8x V100 16 GB, NVLink in DGX-1's hybrid cube-mesh (the
    # same 25 GB/s single-link pairs bound a bundle), 25 Gbps network per instance ->
    # 3.125 GB/s per node, 0.39 GB/s per GPU; no EFA.
    return ClusterSpec(
        name="p3.16xlarge", device=V100_16GB, devices_per_node=8,
        intra_node=Link(latency_s=5e-6, bandwidth_bytes_per_s=25 * GB),
        inter_node=Link(latency_s=30e-6, bandwidth_bytes_per_s=25e9 / 8 / 8),
    )


def _p4d_24xlarge() -> ClusterSpec:
    # AWS EC2 P4d instance page: 8x A100 40 GB, NVSwitch 600 GB/s, 400 Gbps EFA per
    # instance -> 50 GB/s per node, 6.25 GB/s per GPU.
    return ClusterSpec(
        name="p4d.24xlarge", device=A100, devices_per_node=8,
        intra_node=Link(latency_s=3e-6, bandwidth_bytes_per_s=300 * GB),
        inter_node=Link(latency_s=15e-6, bandwidth_bytes_per_s=50 * GB / 8),
    )


#: Bandwidth of a "transfer" that hands over a pointer: high enough that only the
#: link's latency counts.
SHARED_MEMORY_BYTES_PER_S = 1e15


def _cpu() -> ClusterSpec:
    # The local machine, each core acting as one device (the CPU testbed of DESIGN.md).
    # Order-of-magnitude figures for one x86 core with AVX2 (16 fp32 FLOP/cycle at
    # ~3 GHz); the profiler measures real op times, so these only matter for
    # projection. A tensor handed between device threads is not copied: what it costs
    # is the consumer's wake-up, measured at 80-170 us (median per step) on the 2-core
    # development box with both threads busy, whatever the tensor's size.
    cores = os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    core = DeviceKind(name="cpu", memory_bytes=memory / cores, peak_flops=48e9,
                      peak_tensor_flops=48e9, memory_bandwidth_bytes_per_s=10 * GB)
    return ClusterSpec(
        name="cpu", device=core, devices_per_node=cores,
        intra_node=Link(latency_s=100e-6, bandwidth_bytes_per_s=SHARED_MEMORY_BYTES_PER_S),
        inter_node=Link(latency_s=50e-6, bandwidth_bytes_per_s=1 * GB),
    )


_PRESETS = {
    "dgx1-v100": _dgx1_v100,
    "dgx-a100": _dgx_a100,
    "dgx-h100": _dgx_h100,
    "p3.16xlarge": _p3_16xlarge,
    "p4d.24xlarge": _p4d_24xlarge,
    "cpu": _cpu,
}

PRESET_NAMES = tuple(_PRESETS)


def preset(name: str, num_nodes: int = 1) -> ClusterSpec:
    """The named cluster preset with `num_nodes` nodes."""
    try:
        factory = _PRESETS[name]
    except KeyError:
        raise UnknownPresetError(
            f"unknown cluster preset {name!r}: choose one of {', '.join(PRESET_NAMES)}"
        ) from None
    return factory().with_nodes(num_nodes)
