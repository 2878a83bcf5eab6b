"""The typed job that crosses Ray to the workers: its JSON round trip, what a worker
built from it sees, and the one TorchTrainer builder's process-group rule."""

import json
import time

import pytest
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from orchestrator.runtime.device_kind import DeviceKind
from orchestrator.train.config import TrainConfig
from orchestrator.train.job import Projection, WorkerJob
from orchestrator.train.planning import plan_worker
from orchestrator.train.sync import GPU_BACKEND
from orchestrator.train.trainer import torch_trainer
from orchestrator.train.worker import HybridWorker
from placement.scaling.efficiency import NoiseScaleModel
from tests.orchestrator.test_train_local import _profile


def real_job(tmp_path, **train) -> WorkerJob:
    """A job whose plan the planner made for a profiled tiny BigLSTM on 2 devices."""
    cfg = TrainConfig(model="biglstm", mp_degree=2, num_micro_batches=2, global_batch=8,
                      steps=2, lr=0.02, clip_grad_norm=1.5, checkpoint_every=2,
                      inject_failures=((7, "raise"), (9, "kill")), **train)
    plan = plan_worker(cfg, solver="heuristic", time_limit_s=5.0, graph=_profile(cfg))
    efficiency = NoiseScaleModel(b_noise=300.0, min_epochs=2.0)
    return WorkerJob(train=cfg, plan=plan,
                     projection=Projection.at_batch(efficiency, 5e4, cfg.global_batch),
                     marker_dir=str(tmp_path / "markers"), resume_from=None)


@pytest.mark.parametrize("kind", list(DeviceKind))
def test_the_job_comes_back_equal_through_strict_json(kind, tmp_path):
    job = real_job(tmp_path, device_kind=kind)
    text = json.dumps(job.to_dict(), allow_nan=False)
    back = WorkerJob.from_dict(json.loads(text))
    assert back == job
    assert back.train.device_kind is kind
    assert back.train.inject_failures == ((7, "raise"), (9, "kill"))
    assert back.plan.assignment == job.plan.assignment and back.plan.order == job.plan.order


def _what_the_worker_sees(config: dict) -> dict:
    worker = HybridWorker(WorkerJob.from_dict(config))
    return {"cfg": worker.cfg, "projection": worker.projection,
            "marker_dir": worker.marker_dir, "assignment": worker.executor.assignment,
            "num_devices": len(worker.devices), "start": worker.start,
            "lr": worker.optimizer.param_groups[0]["lr"]}


def test_a_worker_built_from_the_job_sees_its_values(tmp_path):
    job = real_job(tmp_path)
    seen = TorchTrainer(
        _what_the_worker_sees, train_loop_config=job.to_dict(),
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name=f"job-{time.monotonic_ns()}",
                             storage_path=str(tmp_path))).fit().return_value
    assert seen["cfg"] == job.train and seen["projection"] == job.projection
    assert seen["marker_dir"] == job.marker_dir and seen["start"] == 0
    assert seen["assignment"] == dict(job.plan.assignment)
    assert seen["num_devices"] == 2 and seen["lr"] == 0.02


@pytest.mark.parametrize("kind, backend, gpu_bundle", [
    (DeviceKind.CPU, "gloo", None), (DeviceKind.FAKE_GPU, "gloo", 2),
    (DeviceKind.GPU, GPU_BACKEND, 2)])
def test_one_builder_gives_fit_and_trials_their_process_group(kind, backend, gpu_bundle,
                                                               tmp_path):
    job = real_job(tmp_path, device_kind=kind, dp_degree=2)
    trainer = torch_trainer(job, name="t", storage_path=str(tmp_path), num_to_keep=1)
    assert trainer.backend_config.backend == backend
    assert trainer.scaling_config.num_workers == 2
    assert trainer.scaling_config.use_gpu == (gpu_bundle is not None)
    assert trainer.scaling_config.resources_per_worker.get("GPU") == gpu_bundle
    assert trainer.train_loop_config == job.to_dict()
    assert trainer.run_config.checkpoint_config.num_to_keep == 1
