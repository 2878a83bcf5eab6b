"""`orchestrator train`: bad input found before Ray starts, each one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray

from orchestrator.cli import main
from orchestrator.train.config import TrainConfig
from orchestrator.train.planning import plan_worker

MLP = "tests.orchestrator.user_models:mlp"


@pytest.fixture(scope="module")
def mlp_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("plans") / "plan_mp2.json"
    plan_worker(TrainConfig(model=MLP, mp_degree=2, num_micro_batches=2,
                            global_batch=8)).save(path)
    return str(path)


@pytest.fixture(scope="module")
def relabelled_plan(mlp_plan, tmp_path_factory):
    """The module-granularity plan claiming to place ATen operators: its op ids are
    not the model's at that granularity."""
    path = tmp_path_factory.mktemp("plans") / "plan_mp2_aten.json"
    path.write_text(json.dumps({**json.loads(Path(mlp_plan).read_text()),
                                "granularity": "aten"}))
    return str(path)


@pytest.mark.parametrize("argv, message", [
    (["--model", "no_such_pkg.mod:build"], "cannot load model builder 'no_such_pkg.mod:build'"),
    (["--model", "tests.orchestrator.user_models:mlp_pair"],
     "names no batch size: pass --global-batch N"),
    (["--model", "tests.orchestrator.user_models:mlp_wrong_shape"],
     "tensor 0 is torch.float32 [8, 4] but make_batch gives torch.float32 [8, 6]"),
    (["--model", "gnmt", "--data", "/no/such/wmt16"],
     "argument --data: /no/such/wmt16: no such directory"),
    (["--model", MLP, "--data", "."], "a model of your own reads no data layout"),
    (["--model", MLP, "--plan", "/no/plan.json"], "argument --plan: /no/plan.json: no such file"),
    (["--model", MLP, "--plan", "{plan}", "--mp", "1", "--micro-batches", "2"],
     "places the model on 2 device(s) but --mp is 1: use --mp 2"),
    (["--model", MLP, "--plan", "{plan}", "--mp", "2"],
     "schedules 2 micro-batch(es) but --micro-batches is 1"),
    (["--model", "biglstm", "--plan", "{plan}", "--mp", "2", "--micro-batches", "2"],
     "is a plan of graph 'mlp-tiny', not of 'biglstm-tiny'"),
    (["--model", "tests.orchestrator.user_models:mlp_shallow", "--plan", "{plan}", "--mp",
      "2", "--micro-batches", "2"], "op(s) but mlp-tiny traces to"),
    (["--model", MLP, "--plan", "{plan}", "--mp", "2", "--micro-batches", "2",
      "--granularity", "aten"], "--plan places ops of --granularity module, not aten"),
    (["--model", MLP, "--plan", "{aten_plan}", "--mp", "2", "--micro-batches", "2"],
     "places 4 op(s) but mlp-tiny traces to 6 at --granularity aten"),
    (["--model", MLP, "--granularity", "ops"], "argument --granularity: invalid choice"),
    (["--model", "tests.orchestrator.user_models:mlp_fixed_batch"],
     "mlp_fixed_batch fails on a batch of 4 samples (it ran on 8): mat1 and mat2 shapes"),
    (["--model", "tests.orchestrator.user_models:mlp_fixed_batch", "--granularity", "aten"],
     "cannot capture mlp_fixed_batch for a batch of any size: the step fixes its samples "
     "dimension to 8"),
])
def test_bad_input_is_one_line_and_status_2_before_ray_starts(argv, message, mlp_plan,
                                                               relabelled_plan, capsys,
                                                               tmp_path):
    argv = [a.format(plan=mlp_plan, aten_plan=relabelled_plan) for a in argv]
    try:
        code = main(["train", *argv, "--steps", "2", "--storage", str(tmp_path)])
    except SystemExit as exit_:  # a flag refused while argparse parses it
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert not ray.is_initialized()


BERT = "tests.orchestrator.hf_models:bert"


def test_an_aten_plan_profiled_on_the_meta_device_is_one_the_worker_runs():
    """transformers' BERT at `aten` granularity: the worker captures it on its CPU. A
    meta-device capture had two `contiguous` ops more (its attention kernel's layout),
    so a plan of it named op ids the worker lacked, and the check, comparing it with a
    meta capture too, let it through (and refused a CPU profile's plan: the op counts
    are tests/test_gpu_check.py's). It must pass the check and run a step in the
    worker's executor."""
    pytest.importorskip("transformers")
    import torch

    from orchestrator.models import build
    from orchestrator.train.checks import check_plan
    from orchestrator.train.planning import profile_worker_batch
    from orchestrator.train.worker_executor import build_executor

    cfg = TrainConfig(model=BERT, granularity="aten", mp_degree=2, num_micro_batches=1,
                      global_batch=4)
    plan = plan_worker(cfg, graph=profile_worker_batch(cfg, device="meta"),
                       time_limit_s=2)
    check_plan(plan, cfg, build(BERT, "tiny"), "plan.json")
    planned = build_executor(BERT, preset="tiny", seed=0, plan=plan,
                             devices=[torch.device("cpu")] * 2, num_micro_batches=1)
    loss = planned.executor.step(planned.spec.make_batch(4), 4)
    assert torch.isfinite(torch.tensor(loss))
