"""Real Ray Train runs on a fake 2-node cluster of 2 fake GPUs each (gloo, CPU threads).
Kept few: each TorchTrainer.fit() costs tens of seconds on this machine."""

import json
import time

import numpy as np
import pytest

from orchestrator.cli import main
from orchestrator.runtime.device_kind import DeviceKind
from orchestrator.train.config import TrainConfig
from orchestrator.train.capacity import ClusterTooSmallError
from orchestrator.train.cluster import ray_cluster
from orchestrator.train.trainer import fit
from tests.orchestrator.test_train_local import run_local, split_plan

pytestmark = pytest.mark.ray
FAKE = DeviceKind.FAKE_GPU


@pytest.fixture(scope="module")
def fake_cluster(tmp_path_factory):
    """The cluster, and the temporary directory its workers see (their TMPDIR: the
    nodes inherit this process's environment), to show what they leave there."""
    workers_tmp = tmp_path_factory.mktemp("workers-tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(workers_tmp))
        with ray_cluster("2x2"):
            yield workers_tmp


def fit_now(cfg, tmp_path, **kwargs):
    return fit(cfg, split_plan(cfg), storage=tmp_path, name=f"run-{time.monotonic_ns()}",
               **kwargs)


def assert_matches_one_device_and_one_node_per_worker(hybrid: dict, model: str, batch: int,
                                                      tmp_path) -> None:
    single = run_local(TrainConfig(model=model, global_batch=batch, steps=3), tmp_path)
    assert hybrid["losses"] == pytest.approx(single["losses"], rel=1e-5)
    nodes = {w["node_id"] for w in hybrid["workers"]}
    assert len(nodes) == 2, hybrid["workers"]
    assert all(len(w["devices"]) == 2 for w in hybrid["workers"])


def test_train_cli_dp2_mp2_on_its_own_fake_cluster(tmp_path, capsys):
    """The command a user runs; it starts (and stops) a 2-node fake-GPU cluster itself,
    so it runs before this module's shared cluster exists."""
    code = main(["train", "--model", "biglstm", "--dp", "2", "--mp", "2", "--global-batch",
                 "8", "--steps", "3", "--fake-cluster", "2x2", "--storage", str(tmp_path),
                 "--plan-time-limit", "3", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["losses"]) == len(result["step_times_s"]) == 3
    assert_matches_one_device_and_one_node_per_worker(result, "biglstm", 8, tmp_path)


def test_dp2_mp2_with_micro_batches_matches_one_device(fake_cluster, tmp_path):
    hybrid = fit_now(TrainConfig(model="inception_v3", dp_degree=2, mp_degree=2,
                                 num_micro_batches=4, global_batch=8, steps=3, device_kind=FAKE),
                     tmp_path)
    assert_matches_one_device_and_one_node_per_worker(hybrid, "inception_v3", 8, tmp_path)


def test_failed_workers_resume_from_their_checkpoint_and_lose_nothing(fake_cluster, tmp_path):
    """One run, two failures: an exception at step 3, then the process killed at step 5;
    each restart resumes from the last checkpoint."""
    common = dict(model="biglstm", mp_degree=2, num_micro_batches=2, global_batch=8,
                  steps=6, checkpoint_every=2)
    resumed = fit_now(TrainConfig(**common, device_kind=FAKE,
                                  inject_failures=((3, "raise"), (5, "kill"))),
                      tmp_path, max_failures=2)
    assert sorted(p.name for p in tmp_path.glob("*/markers/*")) == ["failed-at-3",
                                                                    "failed-at-5"]
    plain = run_local(TrainConfig(**common), tmp_path)
    assert resumed["losses"] == pytest.approx(plain["losses"], rel=1e-6)
    for name, value in plain["final_params"].items():
        np.testing.assert_allclose(resumed["final_params"][name], value, rtol=1e-6, atol=1e-7)


def test_requests_the_cluster_cannot_hold_are_refused_up_front(fake_cluster, tmp_path):
    with pytest.raises(ClusterTooSmallError, match="largest node has 2"):
        fit_now(TrainConfig(model="biglstm", mp_degree=4, device_kind=FAKE), tmp_path)
    with pytest.raises(ClusterTooSmallError, match="holds at most 2 worker"):
        fit_now(TrainConfig(model="biglstm", dp_degree=3, mp_degree=2, global_batch=6,
                            device_kind=FAKE), tmp_path)


def test_a_checkpoint_resumes_at_another_dp_and_mp(fake_cluster, tmp_path):
    common = dict(model="biglstm", global_batch=8, checkpoint_every=3)
    first = TrainConfig(**common, mp_degree=2, num_micro_batches=2, steps=3, device_kind=FAKE)
    fit_now(first, tmp_path / "first")
    checkpoint = max(p for p in (tmp_path / "first").glob("run-*/checkpoint_*") if p.is_dir())
    second = TrainConfig(**common, dp_degree=2, steps=6, device_kind=FAKE)
    resumed = fit_now(second, tmp_path / "second", resume_from=checkpoint)
    plain = run_local(TrainConfig(**common, steps=6), tmp_path)
    assert resumed["losses"] == pytest.approx(plain["losses"], rel=1e-5)
    # Each checkpoint was copied to the run's storage; no local copy is left behind.
    assert not list(fake_cluster.glob("ckpt-*"))
