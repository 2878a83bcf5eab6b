"""The worker loop in Ray Train's local mode (in-process, no Ray): fast checks that the
plan's execution and the micro-batching leave the training trajectory unchanged."""

import dataclasses
import statistics
import time

import numpy as np
import pytest
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from orchestrator.train.config import TrainConfig
from orchestrator.train.job import WorkerJob
from orchestrator.train.planning import plan_worker, profile_worker_batch, worker_batch_size
from orchestrator.train.worker import train_loop_per_worker
from placement.cluster import preset
from placement.errors import UserError


_PROFILES: dict = {}


def _profile(cfg: TrainConfig):
    """One profile per model and worker batch for the whole module (plans made from it
    differ by degree and micro-batch count). The project's models at module level on
    the meta device, times projected, none measured: these tests need a plan that
    splits the model, not one that predicts its step, and timing every op was most of
    their time. The rest on the CPU the worker runs on: a model of one's own may read
    its data when built (no meta tensor holds any), and an operator-level capture
    follows the device's code path (transformers' attention adds a `contiguous` on a
    meta tensor that it skips on a CPU one)."""
    key = (cfg.model, cfg.preset, worker_batch_size(cfg), cfg.granularity)
    if key not in _PROFILES:
        own_model = ":" in cfg.model
        _PROFILES[key] = profile_worker_batch(
            cfg, device="cpu" if own_model or cfg.granularity != "module" else "meta")
    return _PROFILES[key]


#: Seconds a test's plan may take: these tests need a plan that splits, not the best one.
SPLIT_PLAN_TIME_S = 3.0


def split_plan(cfg: TrainConfig):
    """A plan over every one of the worker's devices: max-load balances the ops over
    them, where a step-time plan of a model this small on CPU threads keeps it on one
    device (and a test of the split would then run none). Balanced on a DGX-1's
    projected times, which every profile carries: a profile measured on this shared
    CPU moves with its load, and one slow op could tip the split to one side."""
    return plan_worker(cfg, graph=_profile(cfg), objective="max-load",
                       time_limit_s=SPLIT_PLAN_TIME_S, cluster=preset("dgx1-v100"))


def run_local(cfg: TrainConfig, tmp_path, plan=None) -> dict:
    return run_local_job(WorkerJob(train=cfg, plan=plan or split_plan(cfg)), tmp_path)


def run_local_job(job: WorkerJob, tmp_path) -> dict:
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=job.to_dict(),
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name=f"local-{time.monotonic_ns()}", storage_path=str(tmp_path)))
    return trainer.fit().return_value


@pytest.mark.parametrize("model, batch, micro", [
    ("biglstm", 8, 1), ("biglstm", 8, 4), ("gnmt", 8, 4), ("inception_v3", 4, 1),
    ("inception_v3", 4, 4)])
def test_two_devices_and_micro_batches_follow_the_single_device_run(model, batch, micro,
                                                                    tmp_path):
    single = run_local(TrainConfig(model=model, steps=3, global_batch=batch), tmp_path)
    hybrid_cfg = TrainConfig(model=model, steps=3, global_batch=batch, mp_degree=2,
                             num_micro_batches=micro)
    split = split_plan(hybrid_cfg)
    assert set(split.assignment.values()) == {0, 1}
    hybrid = run_local(hybrid_cfg, tmp_path, plan=split)
    assert hybrid["losses"] == pytest.approx(single["losses"], rel=1e-5)
    assert single["losses"][-1] < single["losses"][0]
    for name, value in single["final_params"].items():
        np.testing.assert_allclose(hybrid["final_params"][name], value, rtol=1e-5, atol=1e-6)


def test_bad_configs_are_refused():
    with pytest.raises(UserError, match="multiple of 4"):
        TrainConfig(model="biglstm", dp_degree=2, num_micro_batches=2, global_batch=6)
    with pytest.raises(UserError, match="mp-degree=0"):
        TrainConfig(model="biglstm", mp_degree=0)


@pytest.mark.parametrize("interval_s, reported", [(3600.0, [4, 6]), (0.0, [1, 2, 3, 4, 5, 6])])
def test_reports_at_checkpoints_and_once_the_interval_has_passed(monkeypatch, tmp_path,
                                                                 interval_s, reported):
    import ray.train

    from orchestrator.train import worker

    calls = []
    real_report = ray.train.report

    def spy(metrics, checkpoint=None):
        calls.append((metrics["step"], checkpoint is not None))
        real_report(metrics, checkpoint=checkpoint)

    monkeypatch.setattr(ray.train, "report", spy)
    monkeypatch.setattr(worker, "REPORT_INTERVAL_S", interval_s)
    run_local(TrainConfig(model="biglstm", steps=6, global_batch=8, checkpoint_every=4),
              tmp_path)
    assert [step for step, _ in calls] == reported
    assert [step for step, with_checkpoint in calls if with_checkpoint] == [4, 6]


def test_a_transformers_model_of_ones_own_trains_split_like_one_device(tmp_path):
    """examples/gpt2.py (the README's model of your own: GPT-2 from a config, its own
    loss, captured with torch.export since fx cannot trace it) through the worker, at
    mp 2 on a plan that really splits it (max-load: a step-time plan of so small a
    model keeps it on one device), against one device."""
    pytest.importorskip("transformers")
    single_cfg = TrainConfig(model="examples.gpt2:build", steps=3, global_batch=8)
    split_cfg = dataclasses.replace(single_cfg, mp_degree=2, num_micro_batches=2)
    split = split_plan(split_cfg)
    assert set(split.assignment.values()) == {0, 1}
    single = run_local(single_cfg, tmp_path)
    hybrid = run_local(split_cfg, tmp_path, plan=split)
    assert hybrid["losses"] == pytest.approx(single["losses"], rel=1e-5)
    for name, value in single["final_params"].items():
        np.testing.assert_allclose(hybrid["final_params"][name], value, rtol=1e-5, atol=1e-6)


def test_a_plan_of_aten_operators_trains_split_like_one_device(tmp_path):
    """A plan of a graph of ATen operators (a transformers BERT: one op per operator,
    59 ops against 26 layer calls): the worker cuts the model at the plan's
    granularity (its executor refuses op ids its own cut lacks), and two devices
    train it as one device runs the layer-level plan."""
    pytest.importorskip("transformers")
    single_cfg = TrainConfig(model="tests.orchestrator.hf_models:bert", steps=3,
                             global_batch=8)
    split_cfg = dataclasses.replace(single_cfg, mp_degree=2, num_micro_batches=2,
                                    granularity="aten")
    split = split_plan(split_cfg)
    assert split.granularity == "aten"
    assert all(sum(device == d for device in split.assignment.values()) > 10
               for d in (0, 1))
    single = run_local(single_cfg, tmp_path)
    hybrid = run_local(split_cfg, tmp_path, plan=split)
    assert single["losses"][-1] < single["losses"][0]
    assert hybrid["losses"] == pytest.approx(single["losses"], rel=1e-5)
    for name, value in single["final_params"].items():
        np.testing.assert_allclose(hybrid["final_params"][name], value, rtol=1e-5, atol=1e-6)


def test_a_trial_times_its_step_first_and_trains_as_without(monkeypatch, tmp_path):
    """WorkerJob.time_batches: the worker times its own step at those batches before
    its first step, reports it with every step's report, and trains exactly as it
    would have without the timing."""
    import ray.train

    from orchestrator.train.job import PROBE, TIMED_HERE
    from orchestrator.train.worker import PROBE_EVERY
    from placement.scaling.timed_step import TimedStep

    reports = []
    real_report = ray.train.report

    def spy(metrics, checkpoint=None):
        reports.append(metrics)
        real_report(metrics, checkpoint=checkpoint)

    monkeypatch.setattr(ray.train, "report", spy)
    cfg = TrainConfig(model="biglstm", steps=PROBE_EVERY + 1, global_batch=8, mp_degree=2)
    plan = split_plan(cfg)
    plain = run_local(cfg, tmp_path, plan=plan)
    assert all(TIMED_HERE not in m for m in reports)
    # A run that does not time itself (a final or user run) never pauses to probe.
    assert all(PROBE not in m for m in reports)
    reports.clear()
    timed = run_local_job(WorkerJob(train=cfg, plan=plan, time_batches=(4.0, 8.0)), tmp_path)
    assert reports and all(TIMED_HERE in m for m in reports)
    own = TimedStep.from_dict(reports[-1][TIMED_HERE])
    assert (own.mp_degree, own.dp_degree, own.batches) == (2, 1, (4, 8))
    assert own.step_s(8) > 0
    # The host-speed probe after the timing's rounds and between the steps (every
    # PROBE_EVERY-th, outside the step's clock): real work, about a millisecond.
    assert 1e-4 < own.probe_s < 0.05, own.probe_s
    assert 1e-4 < reports[-1][PROBE] < 0.05, reports[-1]
    assert all(PROBE not in m for m in reports if m["step"] <= PROBE_EVERY)
    # The step right after the probe is timed but not measured: the median of the
    # steps between the warm-up and the probe.
    assert len(timed["step_times_s"]) == PROBE_EVERY + 1
    assert reports[-1]["measured_step_s"] == pytest.approx(
        statistics.median(timed["step_times_s"][1:PROBE_EVERY]))
    assert timed["losses"] == plain["losses"]
    for name, value in plain["final_params"].items():
        np.testing.assert_array_equal(timed["final_params"][name], value)
