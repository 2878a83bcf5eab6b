"""The Ray Tune sweep over global batch x mp_degree: each trial is a short real
TorchTrainer run whose workers report throughput, loss, gradient noise scale and the
projected time to accuracy; ASHA stops the bad ones early.

Train V2 pattern (RAY_NOTES.md): a Tune *function* trainable builds the TorchTrainer
and passes `TuneReportCallback` in its RunConfig, so the workers' reports reach Tune.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import Searcher

from orchestrator.runtime.device_kind import DeviceKind
from orchestrator.search import CorrectedSearcher, RecordedTrial
from orchestrator.train.capacity import NodeResources, check_fits
from orchestrator.train.cluster import DRIVER_RESOURCE, DRIVER_RESOURCE_AMOUNT
from orchestrator.train.config import TrainConfig
from orchestrator.train.errors import user_error_in
from orchestrator.train.job import Projection, WorkerJob
from orchestrator.train.leaks import reclaiming_leaked_groups
from orchestrator.train.trainer import torch_trainer
from placement.errors import UserError
from placement.plan import Plan
from placement.scaling.efficiency import StatisticalEfficiency
from placement.sweep_space import Candidate

METRIC = "projected_time_s"
#: Ray Train's switch for its preemption watcher (ray.train.v2._internal.constants).
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
EXPERIMENT = "sweep"


def driver_resources(nodes: Sequence[NodeResources], largest_trial_cpus: float) -> dict:
    """What a trial's driver function asks for, refusing a sweep that would wait forever
    for the 0.01 CPU its driver needs next to a trial's workers."""
    if any(n.custom.get(DRIVER_RESOURCE, 0) >= 1 for n in nodes):
        return {DRIVER_RESOURCE: 1}
    if sum(n.cpus for n in nodes) - largest_trial_cpus < 0.01:
        raise UserError(
            f"a trial's workers take every CPU of the cluster, leaving none for the trial's "
            f"driver: start Ray with --resources '{{\"{DRIVER_RESOURCE}\": "
            f"{DRIVER_RESOURCE_AMOUNT}}}' on the head node, or use --num-gpus below the total")
    return {"CPU": 0.01}


def feasible(candidates: Sequence[Candidate], nodes: Sequence[NodeResources], *,
             model: str, preset: str,
             device_kind: DeviceKind) -> tuple[list[Candidate], list[str]]:
    """The candidates the cluster can hold, and a reason for each one it cannot."""
    kept, pruned = [], []
    for c in candidates:
        try:
            check_fits(train_config(c, model=model, preset=preset, steps=1,
                                    device_kind=device_kind, data=None), list(nodes))
        except UserError as err:
            pruned.append(f"{c.key()}: {err}")
        else:
            kept.append(c)
    return kept, pruned


def train_config(c: Candidate, *, model: str, preset: str, steps: int,
                 device_kind: DeviceKind, data: str | None) -> TrainConfig:
    """The training run of a candidate (a trial's, or the final one's)."""
    return TrainConfig(model=model, preset=preset, dp_degree=c.dp_degree,
                       mp_degree=c.mp_degree, global_batch=c.global_batch,
                       num_micro_batches=c.num_micro_batches, steps=steps, lr=c.lr,
                       checkpoint_every=steps, data=data, device_kind=device_kind)


@dataclass(frozen=True, kw_only=True)
class SweepJob:
    """The inputs every trial of a sweep shares (only the candidate differs)."""

    model: str
    preset: str
    steps: int
    """Optimizer steps of each trial."""
    data: str | None
    device_kind: DeviceKind
    plans: Mapping[int, Plan]
    """The worker's plan for each mp_degree."""
    efficiency: StatisticalEfficiency
    dataset_size: float
    """Samples an epoch."""
    storage: str
    """The job's storage, an absolute path: the sweep goes to its EXPERIMENT folder, the
    trials' TorchTrainer runs to its `trials` folder."""
    time_batches: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    """The worker batches at which each mp_degree's trials time their own step (those
    timed before the sweep); an mp_degree without any times none."""

    def worker_job(self, c: Candidate) -> WorkerJob:
        """A trial's training run: the candidate's, projecting its time to accuracy."""
        cfg = train_config(c, model=self.model, preset=self.preset, steps=self.steps,
                           device_kind=self.device_kind, data=self.data)
        return WorkerJob(train=cfg, plan=self.plans[c.mp_degree],
                         projection=Projection.at_batch(self.efficiency, self.dataset_size,
                                                        c.global_batch),
                         time_batches=tuple(self.time_batches.get(c.mp_degree, ())))


def _trial(config: dict, *, job: SweepJob) -> None:
    """Tune function trainable: one short TorchTrainer run of the trial's candidate."""
    # Ray Train's preemption watcher is an actor its controller starts beside each new
    # worker group: seconds of CPU importing Ray Train, spent just as a trial takes
    # its few seconds of measured steps. Where the cores are the devices that start-up
    # was in the steps the trial measured (docs/benchmarks.md "Sweep"). A trial's worker
    # group is never restarted, so the watcher has nothing to do for it. Ray Train
    # passes this variable from the process that calls `fit` (this trial's own) to the
    # controller.
    os.environ[PREEMPTION_WATCHER_ENV] = "0"
    trainer = torch_trainer(job.worker_job(Candidate.from_dict(config["candidate"])),
                            name=f"train-{tune.get_context().get_trial_id()}",
                            storage_path=str(Path(job.storage) / "trials"), num_to_keep=1,
                            callbacks=[TuneReportCallback()])
    with reclaiming_leaked_groups():
        trainer.fit()


def run_sweep(candidates: Sequence[Candidate], job: SweepJob, *, max_trials: int,
              max_concurrent: int, time_budget_s: float | None, resume: bool,
              driver: dict) -> tune.ResultGrid:
    """Run (or, with `resume`, continue) the sweep of at most `max_trials` of the
    `candidates`, in the order CorrectedSearcher picks; finished trials are never
    re-run. Trials rank by the time to accuracy their workers project."""
    path = Path(job.storage) / EXPERIMENT
    # The job's fixed inputs travel by reference, so only the candidate is a trial's
    # configuration (what the dashboard and the console table show).
    trainable = tune.with_resources(tune.with_parameters(_trial, job=job), driver)
    searcher = CorrectedSearcher(candidates, max_trials, metric=METRIC,
                                 max_concurrent=max_concurrent)
    if resume and tune.Tuner.can_restore(str(path)):
        resync_saved_searcher(path, searcher)
        return tune.Tuner.restore(str(path), trainable=trainable, resume_errored=True,
                                  restart_errored=False).fit()
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            # The searcher alone limits the trials (both their number and how many run
            # at once): Tune's own limits keep state of their own, which --resume could
            # find older than the trials' record (orchestrator/search.py).
            search_alg=searcher, num_samples=-1,
            # max_t past the last step: a trial that runs to its end finishes by itself
            # (its TorchTrainer returns and releases its workers) instead of being
            # stopped by ASHA at its last report.
            scheduler=ASHAScheduler(metric=METRIC, mode="min", time_attr="step",
                                    max_t=job.steps + 1, grace_period=max(1, job.steps // 2)),
            time_budget_s=time_budget_s),
        run_config=tune.RunConfig(name=EXPERIMENT, storage_path=job.storage, verbose=1),
    )
    return tuner.fit()


def resync_saved_searcher(experiment: Path, searcher: CorrectedSearcher) -> None:
    """Overwrite the searcher states saved under `experiment` (the files Tune restores
    the searcher from) with `searcher` resynced to the trials the experiment recorded:
    Tune restores the trials from that record, and the searcher must agree with it."""
    recorded = [RecordedTrial(trial_id=t.trial_id, finished=t.status == Trial.TERMINATED,
                              config=t.config, last_result=t.last_result or {})
                for t in tune.ExperimentAnalysis(str(experiment)).trials]
    searcher.resync(recorded)
    for saved in experiment.glob(Searcher.CKPT_FILE_TMPL.format("*")):
        staged = saved.with_name(f".{saved.name}.resynced")
        searcher.save(str(staged))
        staged.replace(saved)


#: Where a resumed sweep moves the folders of trials its experiment state never recorded.
UNRECORDED = "unrecorded-trials"


def set_aside_unrecorded_trials(experiment: Path, recorded: set[str]) -> list[Path]:
    """Move the trial folders under `experiment` that are none of the `recorded` trials'
    into `experiment/UNRECORDED`, and return where they went. A driver killed between a
    trial's start and Tune's next save of its experiment state leaves such a folder; the
    resumed sweep runs that candidate again under a new trial, so the old folder is a
    partial run no record points to, which TensorBoard would still show as a trial.
    Moved, not deleted: it may hold the only logs of what the killed driver was doing."""
    kept = {Path(p).resolve() for p in recorded}
    moved = []
    for folder in sorted(experiment.glob("_trial_*")):
        if folder.is_dir() and folder.resolve() not in kept:
            target = experiment / UNRECORDED / folder.name
            target.parent.mkdir(exist_ok=True)
            folder.rename(target)
            moved.append(target)
    return moved


def best_result(results: Sequence[tune.Result], where: str | Path) -> tune.Result:
    """The trial of least projected time to accuracy. A sweep in which no trial got as
    far as a report is refused, with the first trial error, rather than crowning a trial
    that has no figure."""
    reported = [r for r in results
                if math.isfinite((r.metrics or {}).get(METRIC, math.nan))]
    if reported:
        return min(reported, key=lambda r: r.metrics[METRIC])
    errors = [user_error_in(r.error) or r.error for r in results if r.error is not None]
    first = (f", the first with {type(errors[0]).__name__}: "
             f"{next(iter(str(errors[0]).strip().splitlines()), '')[:200]}" if errors else "")
    raise UserError(f"no trial of the sweep reported a result ({len(errors)} of "
                    f"{len(results)} failed{first}): each trial's error.txt is under {where}; "
                    f"fix the cause and run again with --resume")


def max_concurrent_trials(candidates: Sequence[Candidate], nodes: Sequence[NodeResources],
                          device_kind: DeviceKind) -> int:
    """Trials that fit side by side: the cluster's devices over the largest trial's."""
    total = sum((n.gpus if device_kind.ray_gpus else n.cpus) for n in nodes)
    largest = max(c.dp_degree * c.mp_degree for c in candidates)
    return max(1, int(total // largest))

