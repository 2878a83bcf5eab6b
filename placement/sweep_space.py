"""The sweep's search space: every mp_degree that fits the job, each with the global
batches around its own predicted best, and the prediction for each: the worker's step
as timed on this host with the job's dp workers side by side, allreduce included
(placement/scaling/timed_step.py), or the scaling model's where nothing was timed."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from placement.cluster import ClusterSpec
from placement.scaling.crossover import (HybridConfig, Projection, ScalingParams, project,
                                         time_to_accuracy_s)
from placement.scaling.efficiency import StatisticalEfficiency
from placement.scaling.step import WorkerStep
from placement.scaling.timed_step import TimedStep

#: Global batches the space scans per mp_degree, as multiples of the preset's batch.
BATCH_MULTIPLES = (1, 2, 4, 8)
#: Batches kept on each side of an mp_degree's predicted best.
NUM_NEIGHBOURS = 1

#: The worker step model of one mp_degree: its WorkerStep at a per-worker batch.
StepModel = Callable[[float], WorkerStep]

#: What a candidate's predicted step is made of (`Candidate.step_source`).
MODELLED = "scaling model"
TIMED = "executor step timed here, its dp workers side by side"


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One point of the search space, with the scaling model's prediction for it."""

    config: HybridConfig
    lr: float
    """Learning rate for this global batch (linear scaling from the preset's)."""
    predicted_step_s: float
    """The predicted step time, before any correction from measured trials."""
    predicted_time_s: float
    """The predicted time to accuracy, before any correction."""
    predicted_parts_s: Mapping[str, float] = field(default_factory=dict)
    """`predicted_step_s` by part: compute, allreduce (the share not hidden by the
    backward) and optimizer, in seconds."""
    step_source: str = MODELLED
    """What `predicted_step_s` is made of: `MODELLED` or `TIMED`."""
    predicted_cores: float | None = None
    """The cores the timed worker kept busy at this worker batch (`TIMED` only)."""

    @property
    def mp_degree(self) -> int:
        return self.config.mp_degree

    @property
    def dp_degree(self) -> int:
        return self.config.dp_degree

    @property
    def global_batch(self) -> int:
        return int(self.config.global_batch)

    @property
    def num_micro_batches(self) -> int:
        return self.config.num_micro_batches

    def key(self) -> str:
        return f"mp{self.mp_degree}-b{self.global_batch}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Candidate:
        return cls(**{**d, "config": HybridConfig(**d["config"])})


def linear_lr(base_lr: float, base_batch: int, global_batch: int) -> float:
    """Goyal et al. 2017's linear scaling rule: lr proportional to the global batch."""
    return base_lr * global_batch / base_batch


def _scanned(step_model: StepModel, mp_degree: int, num_gpus: int, cluster: ClusterSpec,
             base_batch: int, efficiency: StatisticalEfficiency, dataset_size: float,
             params: ScalingParams) -> list[Projection]:
    """The scaling model's projection of every scanned batch of one mp_degree that
    divides into its workers' micro-batches and fits a device's memory, by global batch."""
    dp = num_gpus // mp_degree
    out = []
    for multiple in BATCH_MULTIPLES:
        gb = base_batch * multiple
        worker = step_model(gb / dp)
        if gb % (dp * worker.num_micro_batches):
            continue
        p = project(worker, dp, cluster, efficiency, dataset_size, params)
        if p.fits_memory:
            out.append(p)
    return out


def _candidate(p: Projection, timed: TimedStep | None, base_batch: int,
               base_lr: float) -> Candidate:
    """A scanned point with its prediction: the timed step at its worker batch (its
    allreduce timed too), or the scaling model's step where `timed` is None."""
    cores = None
    if timed is None:
        parts, source = {"compute": p.compute_s, "allreduce": p.exposed_allreduce_s,
                         "optimizer": p.optimizer_s}, MODELLED
    else:
        assert timed.dp_degree == p.config.dp_degree, (timed.dp_degree, p.config)
        batch = p.config.worker_batch
        parts, source = {"compute": timed.compute_at(batch),
                         "allreduce": timed.allreduce_at(batch),
                         "optimizer": timed.optimizer_s}, TIMED
        cores = timed.cores_at(batch)
    step = sum(parts.values())
    gb = int(p.config.global_batch)
    return Candidate(config=p.config, lr=linear_lr(base_lr, base_batch, gb),
                     predicted_step_s=step, predicted_time_s=time_to_accuracy_s(p.steps, step),
                     predicted_parts_s=parts, step_source=source, predicted_cores=cores)


def scanned_worker_batches(step_models: Mapping[int, StepModel], cluster: ClusterSpec, *,
                           base_batch: int, num_gpus: int, efficiency: StatisticalEfficiency,
                           dataset_size: float,
                           params: ScalingParams = ScalingParams()) -> dict[int, list[float]]:
    """Per mp_degree that fits `num_gpus`, the worker batches the space may hold: what
    to time before `sweep_space` is built from the timings."""
    out = {}
    for m, model in sorted(step_models.items()):
        if m > num_gpus:
            continue
        batches = [p.config.worker_batch for p in _scanned(
            model, m, num_gpus, cluster, base_batch, efficiency, dataset_size, params)]
        if batches:
            out[m] = batches
    return out


def sweep_space(step_models: Mapping[int, StepModel], cluster: ClusterSpec, *, base_batch: int,
                num_gpus: int, efficiency: StatisticalEfficiency, dataset_size: float,
                base_lr: float, params: ScalingParams = ScalingParams(),
                timed: Mapping[int, TimedStep] | None = None) -> list[Candidate]:
    """For every mp_degree that fits `num_gpus` and has a batch that fits memory, its
    predicted best global batch and `NUM_NEIGHBOURS` scanned batches on each side; all
    of them by predicted time to accuracy. A best at the edge of the scan keeps its one
    neighbour: the space does not extrapolate past what was scanned. `timed[m]`, where
    given, predicts mp_degree m's steps (it must cover `scanned_worker_batches`, timed
    with num_gpus // m workers)."""
    out: list[Candidate] = []
    for m, model in sorted(step_models.items()):
        if m > num_gpus:
            continue
        options = [_candidate(p, (timed or {}).get(m), base_batch, base_lr) for p in _scanned(
            model, m, num_gpus, cluster, base_batch, efficiency, dataset_size, params)]
        if not options:
            continue
        best = min(range(len(options)), key=lambda i: options[i].predicted_time_s)
        out += options[max(0, best - NUM_NEIGHBOURS):best + NUM_NEIGHBOURS + 1]
    return sorted(out, key=lambda c: c.predicted_time_s)


def best_per_mp_degree(candidates: Sequence[Candidate]) -> dict[int, Candidate]:
    """Each mp_degree's candidate of least predicted time to accuracy."""
    best: dict[int, Candidate] = {}
    for c in candidates:
        if c.mp_degree not in best or c.predicted_time_s < best[c.mp_degree].predicted_time_s:
            best[c.mp_degree] = c
    return best
