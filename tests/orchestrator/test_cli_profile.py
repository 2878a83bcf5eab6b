"""`orchestrator profile`: the graph it writes, its summary, and one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from orchestrator.cli import main
from orchestrator.models import build
from placement.io import load_graph

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_cli(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_profile_writes_a_graph_and_a_summary(tmp_path, capsys):
    out = tmp_path / "g.json"
    code, stdout, _ = run_cli(["profile", "--model", "biglstm", "--preset", "tiny",
                               "--seq-chunk", "4", "--repeats", "1", "--quiet",
                               "--target", "v100", "--out", str(out)], capsys)
    assert code == 0
    graph = load_graph(out)
    assert graph.metadata["seq_chunk"] == 4 and graph.metadata["target"] == "v100"
    assert sum(op.name.startswith("lstm.") for op in graph.ops) == 4   # 2 layers x 2 chunks
    num_params = sum(p.numel() for p in build("biglstm", "tiny").module.parameters())
    assert f"{len(graph.ops)} ops" in stdout and f"parameters {num_params:,}" in stdout
    assert "predicted single-device step time on v100" in stdout


def untraceable(preset):
    class Gate(torch.nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    def make_batch(n):
        return (torch.randn(n, 3), torch.randn(n, 3))

    return torch.nn.Sequential(torch.nn.Linear(3, 3), Gate()), make_batch, \
        torch.nn.functional.mse_loss


def test_activation_checkpointing_that_the_split_step_drops_is_named(tmp_path, capsys):
    pytest.importorskip("transformers")
    code, stdout, _ = run_cli(["profile", "--model",
                               "tests.orchestrator.hf_models:gpt2_checkpointed", "--device",
                               "meta", "--quiet", "--out", str(tmp_path / "g.json")], capsys)
    assert code == 0
    assert load_graph(tmp_path / "g.json").metadata["checkpointed_layers"] == 2
    assert "note: activation checkpointing is on in 2 layers" in stdout


@pytest.mark.parametrize("argv,message", [
    (["--model", "resnet"], "choose one of biglstm, gnmt, inception_v3, vgg16"),
    (["--model", "gnmt", "--preset", "big"], "choose one of paper, tiny"),
    (["--model", "vgg16", "--target", "tpu"], "choose one of cpu, v100, a100, h100"),
    (["--model", "tests.orchestrator.test_cli_profile:untraceable"],
     "module 'model.1' (Gate) failed"),
    (["--model", "tests.orchestrator.user_models:mlp_dataset", "--device", "meta"],
     "cannot be built on the meta device (NotImplementedError: Cannot copy out of meta "
     "tensor; no data!): profile it where its tensors hold values, --device cpu"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, argv, message):
    code, out, err = run_cli(["profile", *argv, "--quiet", "--out",
                              str(tmp_path / "g.json")], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    if "Gate" in message:
        # Both fixes: the leaf for fx, and for torch.export the model's line it failed at.
        gate = Path(__file__).read_text().splitlines().index(
            "            return x if x.sum() > 0 else -x") + 1
        assert f"torch.export failed too at {Path(__file__)}:{gate}: " in err
        assert "leaf_module" in err and "control flow there depend on shapes" in err


def test_no_traceback_from_a_real_process(tmp_path):
    result = subprocess.run([sys.executable, "-m", "orchestrator", "profile", "--model",
                             "alexnet", "--out", str(tmp_path / "g.json")],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "unknown model 'alexnet'" in result.stderr


def test_plan_defaults_to_the_profiled_target(tmp_path, capsys):
    out = tmp_path / "g.json"
    code, stdout, _ = run_cli(["profile", "--model", "vgg16", "--repeats", "1", "--quiet",
                               "--out", str(out)], capsys)
    assert code == 0
    # A CPU profile says what splitting over this host's threads costs, as measured.
    md = load_graph(out).metadata
    split, corun = md["split_overhead"]["cpu"], md["corun_slowdown"]["cpu"]
    assert (f"split plans: x{split['1']:.2f} at K=1, x{split['2']:.2f} at K=2, "
            f"x{split['4']:.2f} at K=4 per task") in stdout
    assert f"devices side by side: x{corun['1']:.2f} at K=1" in stdout
    code, stdout, _ = run_cli(["plan", "--graph", str(out), "--devices", "2"], capsys)
    assert code == 0 and "device(s) of cpu" in stdout
