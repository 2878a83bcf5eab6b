"""`jobs/train.py`: flags, what is refused before Ray starts (one line, exit 2), and the
projection each trial ranks by."""

from __future__ import annotations

import pytest
import ray

from orchestrator.job_args import DEFAULT_LR, check_job, parse_args
from orchestrator.pipeline import main
from orchestrator.train.job import Projection
from orchestrator.train.noise_scale import NoiseScaleEstimator
from orchestrator.train.worker import _projection
from placement.scaling.efficiency import EpochCurve, NoiseScaleModel, examples_to_target

MODELS = "tests.orchestrator.user_models"


@pytest.mark.parametrize("model, argv, message", [
    (None, ["--model", f"{MODELS}:mlp_pair"], "names no batch size: pass --batch-size N"),
    (None, ["--model", "no_such_pkg.mod:build"], "cannot load model builder"),
    (None, ["--model", f"{MODELS}:mlp_wrong_shape"], "tensor 0 is torch.float32 [8, 4]"),
    (None, ["--model", f"{MODELS}:mlp", "--curve", "/no/curve.csv"],
     "argument --curve: /no/curve.csv: no such file"),
    (None, ["--model", f"{MODELS}:mlp", "--noise-scale", "-3"], "noise scale -3.0: must be"),
    (None, ["--model", f"{MODELS}:mlp", "--calibration-steps", "0"],
     "--calibration-steps 0: must be >= 1"),
    (None, ["--model", "gnmt", "--data", "/no/such/wmt16"], "argument --data: /no/such/wmt16: no such directory"),
    (None, ["--model", f"{MODELS}:mlp", "--batch-size", "0"], "--batch-size 0: must be >= 1"),
    ("biglstm", ["--model", "gnmt"], "unrecognized arguments: --model gnmt"),
    (None, ["--model", f"{MODELS}:mlp", "--granularity", "ops"],
     "argument --granularity: invalid choice: 'ops'"),
])
def test_bad_input_is_one_line_and_status_2_before_ray_starts(model, argv, message,
                                                               tmp_path, capsys):
    try:
        code = main(model, [*argv, "--storage", str(tmp_path / "out")], prog="jobs/x.py")
    except SystemExit as exit_:  # argparse's misuse exit
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("jobs/x.py: error: ") and message in err
    assert not ray.is_initialized()


def test_the_granularity_flag_reaches_the_job_arguments():
    assert parse_args(["--model", "gnmt", "--granularity", "aten"]).granularity == "aten"
    assert parse_args(["--model", "gnmt"]).granularity == "module"


@pytest.mark.parametrize("argv, lr", [
    (["--model", "biglstm"], DEFAULT_LR),
    # VGG-16 without batch norm carries its own: 0.01 at batch 16, linear to its 4.
    (["--model", "vgg16"], 0.0025),
    (["--model", "vgg16", "--batch-size", "16"], 0.01),
    (["--model", "biglstm", "--batch-size", "16"], 2 * DEFAULT_LR)])
def test_the_sweep_scales_the_models_own_learning_rate_from_its_batch(argv, lr, tmp_path):
    inputs = check_job(parse_args([*argv, "--storage", str(tmp_path)]))
    assert inputs.base_lr == pytest.approx(lr)


def test_a_storage_that_holds_a_sweep_needs_resume(tmp_path, capsys):
    (tmp_path / "sweep").mkdir()
    assert main(argv=["--model", f"{MODELS}:mlp", "--storage", str(tmp_path)]) == 2
    assert "pass --resume to continue it" in capsys.readouterr().err
    assert not ray.is_initialized()


def projected_steps(projection: Projection, global_batch: int) -> float:
    """Steps to target the workers project (at a 1 s median step: its time in seconds)."""
    return _projection(projection, NoiseScaleEstimator(), global_batch,
                       [1.0])["projected_time_s"]


@pytest.mark.parametrize("global_batch", [8, 96, 1024])
def test_each_trial_projects_the_jobs_efficiency_at_its_batch(global_batch):
    noise = NoiseScaleModel(b_noise=300.0, min_epochs=2.0)
    expected = examples_to_target(2.0 * 5e4, 300.0, global_batch) / global_batch
    assert projected_steps(Projection.at_batch(noise, 5e4, global_batch),
                           global_batch) == pytest.approx(expected)
    curve = EpochCurve(global_batch=(8, 128), epochs_at=(1.0, 4.0))
    assert projected_steps(Projection.at_batch(curve, 5e4, global_batch), global_batch) == \
        pytest.approx(curve.epochs(global_batch) * 5e4 / global_batch)
