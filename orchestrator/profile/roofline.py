"""Projected op times on a GPU: a roofline per kernel with per-kind efficiency factors.

Each aten kernel k of an op (forward or backward) takes

    t_k = max(F_k / (eta_c * P), B_k / (eta_m * W), t_launch)

where F_k is its FLOPs, B_k the bytes it reads and writes, P the device's peak (for a
GEMM or convolution the peak of the step's matmul precision: fp32, TF32 or bf16 tensor
cores; fp32 for every other kernel),
W its memory bandwidth (see Williams et al. 2009, "Roofline", eq. 1), eta_c the
fraction of peak a GEMM/convolution of the op's kind reaches, eta_m the fraction of
bandwidth a streaming kernel reaches, and t_launch the floor a kernel launch puts on
any kernel in eager PyTorch. The op's time is the sum over its kernels (kernels of one
op run one after another on one stream).

The factors are not fitted to the published throughputs we compare against in
docs/benchmarks.md (that would make the comparison circular); they come from
microbenchmarks published for these parts:
- GEMMs (`linear`): cuBLAS fp32 SGEMM reaches ~90% of peak on large square matrices on
  V100/A100; the GEMMs of training (one dimension = batch or batch x time) sit lower:
  0.75.
- LSTM cells (`lstm`): per-time-step GEMMs of batch x 4H with small batch: 0.6.
- Convolutions (`conv2d`): cuDNN fp32 convolutions of ImageNet CNNs reach 55-75% of
  peak (DeepBench, NVIDIA cuDNN release notes); Inception's many small 1x1 and
  asymmetric kernels sit at the low end: 0.6.
- Attention (`attention`, batched matmuls of a few hundred rows): 0.5; everything else
  that does FLOPs: 0.5.
- Streaming kernels: ~80% of HBM peak in STREAM-like copies (BabelStream on V100 and
  A100): eta_m = 0.8.
- t_launch = 5 us, the usual launch-to-launch gap of eager PyTorch kernels.

The optimizer step is part of a training step: SGD with momentum reads each parameter,
its gradient and its momentum and writes the parameter and the momentum back (5 passes
over the parameter bytes, 3 FLOPs per element), in one multi-tensor kernel per op's
parameters (`optimizer_kernels`), which the projection adds to the op's backward, where
its parameters' gradients become final.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from orchestrator.profile.costs import Kernel
from placement.cluster import DeviceKind


def _default_compute() -> dict[str, float]:
    return {"linear": 0.75, "lstm": 0.6, "conv2d": 0.6, "attention": 0.5}


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    compute: Mapping[str, float] = field(default_factory=_default_compute)
    """eta_c by op kind (Op.attrs['layer_kind']) for GEMM/convolution kernels."""
    compute_other: float = 0.5
    """eta_c for every other kernel that does FLOPs."""
    memory: float = 0.8
    """eta_m: fraction of peak memory bandwidth streaming kernels reach."""
    launch_s: float = 5e-6
    """t_launch: floor on one kernel's time, seconds."""

    def __post_init__(self) -> None:
        for name, eta in [*self.compute.items(), ("compute_other", self.compute_other),
                          ("memory", self.memory)]:
            if not 0 < eta <= 1:
                raise ValueError(f"efficiency {name}={eta} must be in (0, 1]")
        if self.launch_s < 0:
            raise ValueError(f"launch_s={self.launch_s} must be >= 0")

    def to_dict(self) -> dict[str, object]:
        return {"compute": dict(self.compute), "compute_other": self.compute_other,
                "memory": self.memory, "launch_s": self.launch_s}


def kernel_time_s(k: Kernel, kind: str, device: DeviceKind, eff: Efficiency,
                  precision: str = "fp32") -> float:
    """t_k of one kernel on `device` (roofline eq. 1 with the launch floor)."""
    eta_c = eff.compute.get(kind, eff.compute_other) if k.matmul else eff.compute_other
    peak = device.matmul_peak_flops(precision) if k.matmul else device.peak_flops
    compute_s = k.flops / (eta_c * peak)
    memory_s = k.bytes / (eff.memory * device.memory_bandwidth_bytes_per_s)
    return max(compute_s, memory_s, eff.launch_s)


def op_time_s(kernels: Iterable[Kernel], kind: str, device: DeviceKind,
              eff: Efficiency, precision: str = "fp32") -> float:
    return sum(kernel_time_s(k, kind, device, eff, precision) for k in kernels)


#: SGD with momentum per parameter element: p, grad and momentum read, p and momentum
#: written; buf = m * buf + g, p -= lr * buf.
OPTIMIZER_PASSES = 5
OPTIMIZER_FLOPS_PER_ELEMENT = 3


def optimizer_kernels(param_bytes: float, element_bytes: int = 4) -> list[Kernel]:
    """The optimizer step's kernel over parameters of `param_bytes` (none without)."""
    if param_bytes <= 0:
        return []
    return [Kernel(flops=OPTIMIZER_FLOPS_PER_ELEMENT * param_bytes / element_bytes,
                   bytes=OPTIMIZER_PASSES * param_bytes, matmul=False)]
