"""`orchestrator layerwise`: the JSON it prints, the plan it writes, the errors it gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from placement.cluster import V100
from placement.io import save_graph
from placement.layerwise import LayerwisePlan
from placement.layerwise.examples import vgg16

ROOT = Path(__file__).resolve().parents[2]


def run_json(capsys, *argv):
    assert main(["layerwise", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_the_layerwise_plan_baselines_and_search_time(capsys, tmp_path):
    out = run_json(capsys, "--model", "vgg16", "--analytic", "--devices", "4",
                   "--out", str(tmp_path / "plan.json"))
    lw = out["layerwise"]
    assert set(out["baselines"]) == {"data_parallel", "model_parallel", "one_weird_trick"}
    assert out["search_seconds"] > 0
    assert len(lw["configs"]) == 22 and lw["configs"]["conv1_1"]["degree"] >= 1
    for base in out["baselines"].values():
        assert lw["step_time_s"] <= base["step_time_s"]
    assert out["baselines"]["data_parallel"]["configs"]["fc6"]["sample"] == 4
    assert out["search"]["residual_nodes"] == 1
    saved = LayerwisePlan.from_dict(json.loads((tmp_path / "plan.json").read_text()))
    assert saved.step_time_s == pytest.approx(lw["step_time_s"])


def test_a_graph_file_gives_the_same_plan_as_the_model(capsys, tmp_path):
    path = tmp_path / "vgg.json"
    save_graph(vgg16(32 * 8, V100), path)
    from_file = run_json(capsys, "--graph", str(path), "--devices", "8")
    from_model = run_json(capsys, "--model", "vgg16", "--analytic", "--devices", "8")
    assert from_file["layerwise"]["configs"] == from_model["layerwise"]["configs"]
    assert from_file["layerwise"]["step_time_s"] == pytest.approx(
        from_model["layerwise"]["step_time_s"])


def test_sixteen_devices_of_a_dgx1_take_two_nodes(capsys):
    out = run_json(capsys, "--model", "vgg16", "--analytic", "--devices", "16",
                   "--batch-size", "256")
    assert out["layerwise"]["num_devices"] == 16
    assert out["baselines"]["data_parallel"]["configs"]["conv1_1"]["devices"] == list(range(16))


def test_human_output_lists_strategies_and_configurations(capsys):
    assert main(["layerwise", "--model", "vgg16", "--analytic", "--devices", "4"]) == 0
    text = capsys.readouterr().out
    for word in ("layerwise", "data_parallel", "model_parallel", "one_weird_trick", "conv1_1"):
        assert word in text


@pytest.mark.parametrize("argv, message", [
    (["--model", "vgg16", "--analytic", "--devices", "0"], "give at least 1 device"),
    (["--model", "resnet", "--analytic", "--devices", "4"], "choose one of vgg16"),
    (["--model", "vgg16", "--analytic", "--devices", "4", "--batch-size", "0"],
     "at least 1 sample"),
    (["--model", "vgg16", "--analytic", "--devices", "4", "--task-overhead-us", "-1"],
     "--task-overhead-us"),
    (["--graph", "/no/such/graph.json", "--devices", "4"],
     "argument --graph: /no/such/graph.json: no such file"),
    (["--graph", str(ROOT / "examples" / "branchy.json"), "--devices", "2"],
     "no layer facts"),
    (["--devices", "4"], "one of the arguments --model --graph is required"),
    (["--model", "vgg16", "--devices", "4", "--cluster", "nope"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_status_2(capsys, argv, message):
    try:
        status = main(["layerwise", *argv])
    except SystemExit as exit_:
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_model_names_go_through_the_profiler_when_it_is_installed(capsys):
    pytest.importorskip("orchestrator.profile")
    out = run_json(capsys, "--model", "vgg16", "--devices", "4")
    assert out["source"].startswith("profiled")
    assert out["layerwise"]["graph"] == "vgg16-paper"
    assert out["search"]["residual_nodes"] == 1
    assert out["layerwise"]["step_time_s"] <= out["baselines"]["data_parallel"]["step_time_s"]
