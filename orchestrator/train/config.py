"""What a training run is asked to do: one frozen, validated record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.runtime.device_kind import DeviceKind
from placement.errors import UserError

FAIL_MODES = ("raise", "kill")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    model: str
    """A model name of orchestrator.models (biglstm, gnmt, inception_v3, vgg16), or
    MODULE:FUNCTION of a model of your own (importable on every worker)."""
    preset: str = "tiny"
    granularity: str = "module"
    """What one op is when the run plans its worker itself (`orchestrator profile
    --granularity`); a given plan brings its own (`Plan.granularity`), which the
    workers cut the model by."""
    dp_degree: int = 1
    """Workers (data-parallel replicas)."""
    mp_degree: int = 1
    """Devices per worker (model-parallel group size)."""
    global_batch: int | None = None
    """Samples per optimizer step across all workers; None: the preset's batch (a
    model of your own without one needs it given)."""
    num_micro_batches: int = 1
    steps: int = 10
    """Optimizer steps to run (in total, across restarts)."""
    lr: float = 0.05
    """SGD learning rate for the global batch (momentum 0.9)."""
    seed: int = 0
    checkpoint_every: int = 5
    """Report a checkpoint every this many steps (and after the last)."""
    mixed_precision: bool = False
    """bf16 autocast of every op's forward."""
    clip_grad_norm: float | None = None
    """Clip the global gradient norm to this value; None: no clipping."""
    data: str | None = None
    """Dataset root in a built-in model's real layout; None: a small synthetic dataset
    (a model of your own brings its data in its ModelSpec, or is fed by make_batch)."""
    device_kind: DeviceKind = DeviceKind.CPU
    """What the workers' devices are: CPU cores, fake GPUs (CPU threads that Ray places
    as GPUs) or CUDA GPUs."""
    inject_failures: tuple[tuple[int, str], ...] = ()
    """Test hook: (step, 'raise' | 'kill') pairs; the rank-0 worker fails once at each
    step, raising an exception or killing its own process."""

    def __post_init__(self) -> None:
        for name in ("dp_degree", "mp_degree", "num_micro_batches", "steps",
                     "checkpoint_every"):
            if getattr(self, name) < 1:
                raise UserError(f"{name.replace('_', '-')}={getattr(self, name)}: must be >= 1")
        if self.global_batch is not None:
            per_worker, rest = divmod(self.global_batch, self.dp_degree)
            if rest or per_worker % self.num_micro_batches or per_worker == 0:
                raise UserError(
                    f"global batch {self.global_batch} does not split into {self.dp_degree} "
                    f"workers x {self.num_micro_batches} micro-batches: use a multiple of "
                    f"{self.dp_degree * self.num_micro_batches}")
        from orchestrator.profile.capture import GRANULARITIES

        if self.granularity not in GRANULARITIES:
            raise UserError(f"--granularity {self.granularity!r}: choose one of "
                            f"{', '.join(GRANULARITIES)}")
        if self.lr <= 0:
            raise UserError(f"--lr {self.lr}: must be > 0")
        for step, mode in self.inject_failures:
            if mode not in FAIL_MODES:
                raise UserError(f"failure mode {mode!r} at step {step}: choose one of "
                                f"{FAIL_MODES}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the device kind as its string, the failures as lists."""
        return {**asdict(self), "device_kind": str(self.device_kind),
                "inject_failures": [list(f) for f in self.inject_failures]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        return cls(**{**data, "device_kind": DeviceKind(data["device_kind"]),
                      "inject_failures": tuple(tuple(f) for f in data["inject_failures"])})
