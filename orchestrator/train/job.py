"""What crosses Ray to a training worker: one frozen, typed job, sent as its JSON-safe
`to_dict()` (Ray Train's train_loop_config) and rebuilt by `from_dict` in the worker."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.train.config import TrainConfig
from placement.plan import Plan, plan_from_dict
from placement.scaling.efficiency import StatisticalEfficiency, steps_per_run

#: The metric in which a sweep trial's rank 0 reports its own timing of its step (a
#: TimedStep's to_dict) with each of its steps' reports (`WorkerJob.time_batches`).
TIMED_HERE = "timed_here"
#: The metric in which a worker reports the median of the host-speed probes it ran
#: between its steps so far, in seconds (orchestrator/train/speed_probe.py).
PROBE = "probe_s"


@dataclass(frozen=True, kw_only=True)
class Projection:
    """What a worker projects its run's time to accuracy from: the epochs the job's
    statistical efficiency (a curve, a noise scale or a model's defaults) needs at the
    run's one global batch, over the dataset's samples. Every trial of a sweep keeps
    the job's efficiency: a noise scale measured in a few steps of a tiny run is too
    noisy to rank trials by, and trials of one worker cannot measure it at all."""

    epochs: float
    """Epochs to the target at the run's global batch."""
    dataset_size: float
    """Samples an epoch."""

    @classmethod
    def at_batch(cls, efficiency: StatisticalEfficiency, dataset_size: float,
                 global_batch: int) -> Projection:
        return cls(epochs=efficiency.epochs(global_batch), dataset_size=dataset_size)

    def time_to_accuracy_s(self, global_batch: int, step_s: float) -> float:
        return steps_per_run(self.epochs, self.dataset_size, global_batch) * step_s


@dataclass(frozen=True, kw_only=True)
class WorkerJob:
    """One training run as every worker of it sees it."""

    train: TrainConfig
    plan: Plan
    """The worker's placement of its ops on its mp_degree devices."""
    projection: Projection | None = None
    """Set for a sweep trial, whose workers report a projected time to accuracy."""
    marker_dir: str | None = None
    """Where the failure-injection test hook remembers the failures it made."""
    resume_from: str | None = None
    """A checkpoint directory of an earlier run, loaded when this run has none yet."""
    time_batches: tuple[float, ...] = ()
    """Worker batches at which a sweep trial times its own step before its first one
    (orchestrator/train/step_timing.py `time_in_worker`); empty: none."""

    def to_dict(self) -> dict[str, Any]:
        return {"train": self.train.to_dict(), "plan": self.plan.to_dict(),
                "projection": None if self.projection is None else {
                    "epochs": self.projection.epochs,
                    "dataset_size": self.projection.dataset_size},
                "marker_dir": self.marker_dir, "resume_from": self.resume_from,
                "time_batches": list(self.time_batches)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkerJob:
        projection = data["projection"]
        return cls(train=TrainConfig.from_dict(data["train"]),
                   plan=plan_from_dict(data["plan"]),
                   projection=None if projection is None else Projection(**projection),
                   marker_dir=data["marker_dir"], resume_from=data["resume_from"],
                   time_batches=tuple(data["time_batches"]))
