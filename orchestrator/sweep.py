"""The Ray Tune sweep over global batch x mp_degree: each trial is a short real
TorchTrainer run whose workers report throughput, loss, gradient noise scale and the
projected time to accuracy; ASHA stops the bad ones early.

Train V2 pattern (RAY_NOTES.md): a Tune *function* trainable builds the TorchTrainer
and passes `TuneReportCallback` in its RunConfig, so the workers' reports reach Tune.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

from ray import tune
from ray.train import CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler

from orchestrator.search import CorrectedSearcher
from orchestrator.train.config import TrainConfig
from orchestrator.train.sync import process_group_backend
from orchestrator.train.errors import user_error_in
from orchestrator.train.launch import (
    DRIVER_RESOURCE,
    DRIVER_RESOURCE_AMOUNT,
    NodeResources,
    check_fits,
    worker_resources,
)
from orchestrator.train.worker import train_loop_per_worker
from placement.errors import UserError
from placement.plan import Plan
from placement.scaling.efficiency import StatisticalEfficiency
from placement.sweep_space import Candidate

METRIC = "projected_time_s"
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
             model: str, preset: str, use_gpu: bool) -> tuple[list[Candidate], list[str]]:
    """The candidates the cluster can hold, and a reason for each one it cannot."""
    kept, pruned = [], []
    for c in candidates:
        try:
            check_fits(train_config(c, model=model, preset=preset, steps=1,
                                     use_gpu=use_gpu, data=None), list(nodes))
        except UserError as err:
            pruned.append(f"{c.key()}: {err}")
        else:
            kept.append(c)
    return kept, pruned


def train_config(c: Candidate, *, model: str, preset: str, steps: int, use_gpu: bool,
                 data: str | None) -> TrainConfig:
    """The training run of a candidate (a trial's, or the final one's)."""
    return TrainConfig(model=model, preset=preset, dp_degree=c.dp_degree,
                       mp_degree=c.mp_degree, global_batch=c.global_batch,
                       num_micro_batches=c.num_micro_batches, steps=steps, lr=c.lr,
                       checkpoint_every=steps, data=data, use_gpu=use_gpu)


def trial_projection(efficiency: StatisticalEfficiency, dataset_size: float,
                     global_batch: int) -> dict:
    """What a trial's workers project its time to accuracy from. They take McCandlish's
    (E_min, B_noise); at the trial's one global batch B, E_min = the epochs the job's
    efficiency (a curve, a noise scale or a model's defaults) needs at B, with
    B_noise = inf, gives exactly those epochs."""
    return {"dataset_size": dataset_size, "min_epochs": efficiency.epochs(global_batch),
            "b_noise": math.inf}


def _trial(config: dict, *, job: dict) -> None:
    """Tune function trainable: one short TorchTrainer run of the trial's candidate."""
    c = Candidate.from_dict(config["candidate"])
    cfg = dataclasses.replace(
        train_config(c, model=job["model"], preset=job["preset"], steps=job["steps"],
                     use_gpu=job["use_gpu"], data=job["data"]), fake_gpus=job["fake_gpus"])
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"train": cfg.to_dict(), "plan": job["plans"][str(c.mp_degree)],
                           "projection": trial_projection(job["efficiency"],
                                                          job["dataset_size"],
                                                          c.global_batch)},
        scaling_config=ScalingConfig(num_workers=c.dp_degree, use_gpu=cfg.use_gpu,
                                     resources_per_worker=worker_resources(cfg)),
        torch_config=TorchConfig(backend=job["backend"]),
        run_config=RunConfig(name=f"train-{tune.get_context().get_trial_id()}",
                             storage_path=job["storage"],
                             checkpoint_config=CheckpointConfig(num_to_keep=1),
                             callbacks=[TuneReportCallback()]),
    )
    trainer.fit()


def run_sweep(candidates: Sequence[Candidate], plans: dict[int, Plan], *, max_trials: int,
              model: str, preset: str, steps: int, storage: str | Path, use_gpu: bool,
              fake_gpus: bool, data: str | None, efficiency: StatisticalEfficiency,
              dataset_size: float, max_concurrent: int, time_budget_s: float | None,
              resume: bool, driver: dict) -> tune.ResultGrid:
    """Run (or, with `resume`, continue) the sweep of at most `max_trials` of the
    `candidates`, in the order CorrectedSearcher picks; finished trials are never
    re-run. Trials rank by time to accuracy from `efficiency` over `dataset_size`
    samples an epoch."""
    storage = str(Path(storage).resolve())
    path = Path(storage) / EXPERIMENT
    job = {
        "model": model, "preset": preset, "steps": steps, "use_gpu": use_gpu, "data": data,
        "plans": {str(m): p.to_dict() for m, p in plans.items()},
        "efficiency": efficiency, "dataset_size": dataset_size,
        "storage": str(Path(storage) / "trials"),
        "fake_gpus": fake_gpus,
        "backend": process_group_backend(use_gpu=use_gpu, fake_gpus=fake_gpus),
    }
    # The job's fixed inputs travel by reference, so only the candidate is a trial's
    # configuration (what the dashboard and the console table show).
    trainable = tune.with_resources(tune.with_parameters(_trial, job=job), driver)
    if resume and tune.Tuner.can_restore(str(path)):
        return tune.Tuner.restore(str(path), trainable=trainable, resume_errored=True,
                                  restart_errored=False).fit()
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=CorrectedSearcher(candidates, max_trials, metric=METRIC),
            num_samples=max_trials,
            # max_t past the last step: a trial that runs to its end finishes by itself
            # (its TorchTrainer returns and releases its workers) instead of being
            # stopped by ASHA at its last report.
            scheduler=ASHAScheduler(metric=METRIC, mode="min", time_attr="step",
                                    max_t=steps + 1, grace_period=max(1, steps // 2)),
            max_concurrent_trials=max_concurrent, time_budget_s=time_budget_s),
        run_config=tune.RunConfig(name=EXPERIMENT, storage_path=storage, verbose=1),
    )
    return tuner.fit()


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
                          use_gpu: bool) -> int:
    """Trials that fit side by side: the cluster's devices over the largest trial's."""
    total = sum((n.gpus if use_gpu else n.cpus) for n in nodes)
    largest = max(c.dp_degree * c.mp_degree for c in candidates)
    return max(1, int(total // largest))

