"""Time to accuracy of data-parallel (DP) and hybrid DP x MP training, and the
cross-over: the smallest cluster at which giving each worker several devices wins.

T(num_gpus, mp_degree, global_batch) = steps(global_batch) x step time, with
steps = epochs(global_batch) x dataset_size / global_batch and step time = the worker's
simulated compute + the allreduce it waits for + the optimizer update.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from placement.cluster import ClusterSpec
from placement.errors import UserError
from placement.scaling.comm import ALGORITHMS, allreduce_s, exposed_allreduce_s
from placement.scaling.efficiency import StatisticalEfficiency, steps_per_run
from placement.scaling.step import WorkerStep, optimizer_s


@dataclass(frozen=True, kw_only=True)
class HybridConfig:
    """One way to train on `num_gpus = dp_degree * mp_degree` devices."""

    dp_degree: int
    """Workers (data-parallel replicas)."""
    mp_degree: int
    """Devices per worker (model-parallel group, one node)."""
    global_batch: float
    """Samples per optimizer step across all workers."""
    num_micro_batches: int
    """Pipeline slots per worker step."""

    def __post_init__(self) -> None:
        if self.dp_degree < 1 or self.mp_degree < 1 or self.num_micro_batches < 1:
            raise ValueError(f"dp_degree={self.dp_degree}, mp_degree={self.mp_degree} and "
                             f"num_micro_batches={self.num_micro_batches} must all be >= 1")
        if not self.global_batch > 0:
            raise ValueError(f"global_batch={self.global_batch} must be > 0")

    @property
    def num_gpus(self) -> int:
        return self.dp_degree * self.mp_degree

    @property
    def worker_batch(self) -> float:
        return self.global_batch / self.dp_degree


@dataclass(frozen=True, kw_only=True)
class ScalingParams:
    overlap_fraction: float = 0.5
    """Share of the allreduce that may run during the backward pass (0..1). 0.5 is an
    assumption until the executor measures it."""
    allreduce_algorithm: str = "best"
    """'ring', 'hierarchical', or 'best' (the faster, as NCCL would pick)."""
    optimizer_passes: float = 7.0
    """Sweeps over a device's parameter bytes per update (Adam: 7)."""

    def __post_init__(self) -> None:
        if not 0 <= self.overlap_fraction <= 1:
            raise UserError(f"overlap fraction {self.overlap_fraction}: must lie in [0, 1]")
        if self.allreduce_algorithm not in ALGORITHMS:
            raise UserError(f"allreduce algorithm {self.allreduce_algorithm!r}: choose one of "
                            f"{', '.join(ALGORITHMS)}")
        if self.optimizer_passes < 0:
            raise UserError(f"optimizer passes {self.optimizer_passes}: must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Projection:
    """The predicted time to accuracy of one HybridConfig, with its terms."""

    config: HybridConfig
    compute_s: float
    allreduce_s: float
    exposed_allreduce_s: float
    optimizer_s: float
    step_s: float
    epochs: float
    steps: float
    time_to_accuracy_s: float
    memory_bytes: float
    fits_memory: bool

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["config"]["num_gpus"] = self.config.num_gpus
        return out


def step_time_s(compute_s: float, exposed_allreduce: float, optimizer: float) -> float:
    """A synchronous step: compute, then the gradient exchange it could not hide, then
    the update."""
    return compute_s + exposed_allreduce + optimizer


def time_to_accuracy_s(steps: float, step_s: float) -> float:
    return steps * step_s


def project(worker: WorkerStep, dp_degree: int, cluster: ClusterSpec,
            efficiency: StatisticalEfficiency, dataset_size: float,
            params: ScalingParams) -> Projection:
    """Predict training `dp_degree` copies of `worker` to the target."""
    config = HybridConfig(dp_degree=dp_degree, mp_degree=worker.mp_degree,
                          global_batch=dp_degree * worker.batch,
                          num_micro_batches=worker.num_micro_batches)
    ar = allreduce_s(dp_degree, worker.gradient_bytes, cluster, worker.mp_degree,
                     params.allreduce_algorithm)
    exposed = exposed_allreduce_s(ar, worker.backward_s, params.overlap_fraction)
    opt = optimizer_s(worker.param_bytes, cluster.device.memory_bandwidth_bytes_per_s,
                      params.optimizer_passes)
    step = step_time_s(worker.compute_s, exposed, opt)
    epochs = efficiency.epochs(config.global_batch)
    steps = steps_per_run(epochs, dataset_size, config.global_batch)
    return Projection(
        config=config, compute_s=worker.compute_s, allreduce_s=ar, exposed_allreduce_s=exposed,
        optimizer_s=opt, step_s=step, epochs=epochs, steps=steps,
        time_to_accuracy_s=time_to_accuracy_s(steps, step), memory_bytes=worker.memory_bytes,
        fits_memory=worker.memory_bytes <= cluster.device.memory_bytes,
    )


def gpu_grid(max_gpus: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to `max_gpus`."""
    if max_gpus < 1:
        raise UserError(f"--max-gpus {max_gpus}: must be at least 1 (e.g. --max-gpus 4096)")
    return tuple(2**i for i in range(int(math.log2(max_gpus)) + 1))


@dataclass(frozen=True, kw_only=True)
class CrossoverRow:
    num_gpus: int
    dp: Projection | None
    """Fastest data-parallel configuration that fits in memory (None: none fits)."""
    hybrid: Projection | None
    """Fastest hybrid configuration (mp_degree > 1) that fits (None: none fits)."""

    @property
    def speedup(self) -> float | None:
        if self.dp is None or self.hybrid is None:
            return None
        return self.dp.time_to_accuracy_s / self.hybrid.time_to_accuracy_s

    @property
    def hybrid_wins(self) -> bool:
        """Hybrid is faster, or it fits where no data-parallel configuration does."""
        if self.hybrid is None:
            return False
        return self.dp is None or self.hybrid.time_to_accuracy_s < self.dp.time_to_accuracy_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_gpus": self.num_gpus,
            "dp_time_s": None if self.dp is None else self.dp.time_to_accuracy_s,
            "hybrid_time_s": None if self.hybrid is None else self.hybrid.time_to_accuracy_s,
            "best_mp_degree": None if self.hybrid is None else self.hybrid.config.mp_degree,
            "speedup": self.speedup,
            "hybrid_wins": self.hybrid_wins,
            "dp": None if self.dp is None else self.dp.to_dict(),
            "hybrid": None if self.hybrid is None else self.hybrid.to_dict(),
        }


@dataclass(frozen=True, kw_only=True)
class CrossoverResult:
    rows: tuple[CrossoverRow, ...]
    projections: tuple[Projection, ...]
    """Every configuration evaluated, those that do not fit in memory included."""

    @property
    def crossover_num_gpus(self) -> int | None:
        """The smallest num_gpus at which hybrid wins; None if it never does."""
        return next((r.num_gpus for r in self.rows if r.hybrid_wins), None)

    def best_by_mp(self, num_gpus: int) -> dict[int, Projection]:
        """Per mp_degree, its fastest configuration that fits at `num_gpus`."""
        return _best_by_mp(p for p in self.projections if p.config.num_gpus == num_gpus)

    def to_dict(self) -> dict[str, Any]:
        return {
            "crossover_num_gpus": self.crossover_num_gpus,
            "rows": [r.to_dict() for r in self.rows],
            "configs": [p.to_dict() for p in self.projections],
        }


def _fastest(projections: Iterable[Projection]) -> Projection | None:
    fits = [p for p in projections if p.fits_memory]
    return min(fits, key=lambda p: p.time_to_accuracy_s, default=None)


def _best_by_mp(projections: Iterable[Projection]) -> dict[int, Projection]:
    by_mp: dict[int, list[Projection]] = {}
    for p in projections:
        by_mp.setdefault(p.config.mp_degree, []).append(p)
    best = {m: _fastest(ps) for m, ps in sorted(by_mp.items())}
    return {m: p for m, p in best.items() if p is not None}


def crossover(workers: Sequence[WorkerStep], cluster: ClusterSpec,
              efficiency: StatisticalEfficiency, dataset_size: float, max_gpus: int,
              params: ScalingParams = ScalingParams()) -> CrossoverResult:
    """For each num_gpus in 1, 2, 4, ..., max_gpus: the fastest DP-only configuration
    (workers of mp_degree 1) and the fastest hybrid one (any other worker), over every
    worker step given (one per mp_degree and per-worker batch)."""
    if not dataset_size > 0:
        raise UserError(f"dataset size {dataset_size}: must be > 0 samples per epoch")
    rows, projections = [], []
    for n in gpu_grid(max_gpus):
        here = [project(w, n // w.mp_degree, cluster, efficiency, dataset_size, params)
                for w in workers
                if n % w.mp_degree == 0 and w.mp_degree <= cluster.devices_per_node]
        projections += here
        rows.append(CrossoverRow(
            num_gpus=n,
            dp=_fastest(p for p in here if p.config.mp_degree == 1),
            hybrid=_fastest(p for p in here if p.config.mp_degree > 1)))
    return CrossoverResult(rows=tuple(rows), projections=tuple(projections))
