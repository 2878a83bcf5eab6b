"""The TorchTrainer of a worker job, for `fit` and for a sweep trial alike (Ray Train
v2's ScalingPolicy pattern: decisions are data until here, only this module turns them
into Ray calls), and `fit`, which runs one on the connected cluster."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ray.train import (CheckpointConfig, FailureConfig, RunConfig, ScalingConfig,
                       TrainingFailedError, UserCallback)
from ray.train.torch import TorchConfig, TorchTrainer

from orchestrator.train.capacity import check_fits, cluster_nodes, worker_resources
from orchestrator.train.config import TrainConfig
from orchestrator.train.errors import user_errors_raised
from orchestrator.train.job import WorkerJob
from orchestrator.train.leaks import reclaiming_leaked_groups
from orchestrator.train.resources import acquire, load_node_types, plan_worker_request
from orchestrator.train.sync import process_group_backend
from orchestrator.train.worker import STATE_FILE, train_loop_per_worker
from placement.errors import UserError
from placement.plan import Plan


def torch_trainer(job: WorkerJob, *, name: str, storage_path: str, max_failures: int = 0,
                  num_to_keep: int = 2, callbacks: Sequence[UserCallback] = ()) -> TorchTrainer:
    """`job`'s workers as a TorchTrainer: dp_degree workers of `worker_resources`, the
    process group the device kind needs, checkpoints kept `num_to_keep` deep under
    `storage_path`/`name`."""
    cfg = job.train
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=job.to_dict(),
        scaling_config=ScalingConfig(num_workers=cfg.dp_degree,
                                     use_gpu=cfg.device_kind.ray_gpus,
                                     resources_per_worker=worker_resources(cfg)),
        torch_config=TorchConfig(backend=process_group_backend(cfg.device_kind)),
        run_config=RunConfig(name=name, storage_path=storage_path,
                             failure_config=FailureConfig(max_failures=max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=num_to_keep),
                             callbacks=list(callbacks)),
    )


def fit(cfg: TrainConfig, worker_plan: Plan, *, storage: str | Path, name: str,
        max_failures: int = 0, resume_from: str | Path | None = None) -> dict:
    """Run training on the connected Ray cluster; returns rank 0's result.

    `resume_from`: a checkpoint directory of an earlier run, at any dp and mp degree
    (checkpoints hold the whole model, not per-device shards). A user's error raised in
    a worker (missing data, a bad batch, a GPU node without CUDA) is raised here as
    itself."""
    types = load_node_types() if cfg.device_kind.cuda else None
    if types:
        # An autoscaling cluster starts GPU nodes only when asked (train/resources.py).
        acquire(plan_worker_request(types, cfg.dp_degree, cfg.mp_degree))
    check_fits(cfg, cluster_nodes())
    if resume_from is not None and not (Path(resume_from) / STATE_FILE).is_file():
        raise UserError(f"{resume_from}: not a checkpoint of this tool (no {STATE_FILE}): "
                        "give a checkpoint_* directory of an earlier run")
    # Train V2 resumes its own runs by name; an earlier run's checkpoint is handed to
    # the workers, which load it when their run has none yet.
    job = WorkerJob(train=cfg, plan=worker_plan,
                    marker_dir=str(Path(storage) / name / "markers"),
                    resume_from=None if resume_from is None else str(resume_from))
    trainer = torch_trainer(job, name=name, storage_path=str(Path(storage).resolve()),
                            max_failures=max_failures)
    with user_errors_raised(TrainingFailedError), reclaiming_leaked_groups():
        return trainer.fit().return_value
