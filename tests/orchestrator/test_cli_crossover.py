"""`orchestrator crossover`: JSON shape, files written, plans read, and one-line errors."""

import json

import pytest

from orchestrator.cli import main
from placement.graph import Edge, Op, OpGraph
from placement.io import save_graph
from placement.planner import PlanConfig, plan
from placement.cluster import preset

MB = 1e6


def branchy_graph() -> OpGraph:
    """A stem, two parallel branches and a head, in seconds at batch 32."""
    spec = [("stem", 0.01, 20), ("a", 0.03, 40), ("b", 0.03, 40), ("head", 0.01, 20)]
    ops = tuple(Op(id=i, name=n, forward_s={"v100": t}, backward_s={"v100": 2 * t},
                   output_bytes=2 * MB, param_bytes=p * MB, activation_bytes=4 * MB)
                for i, (n, t, p) in enumerate(spec))
    edges = (Edge(src=0, dst=1, bytes=2 * MB), Edge(src=0, dst=2, bytes=2 * MB),
             Edge(src=1, dst=3, bytes=2 * MB), Edge(src=2, dst=3, bytes=2 * MB))
    return OpGraph(ops=ops, edges=edges, name="branchy", metadata={"batch": 32})


@pytest.fixture()
def graph_file(tmp_path):
    path = tmp_path / "g.json"
    save_graph(branchy_graph(), path)
    return path


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # a flag refused while argparse parses it
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_json_shape_and_files(tmp_path, graph_file, capsys):
    out_dir = tmp_path / "out"
    code, out, err = run(capsys, "crossover", "--graph", str(graph_file), "--cluster",
                         "dgx1-v100", "--noise-scale", "512", "--max-gpus", "64",
                         "--mp-degrees", "2", "--out", str(out_dir), "--json")
    assert code == 0, err
    report = json.loads(out)
    cross = report["crossover_num_gpus"]
    assert cross is None or cross in (2, 4, 8, 16, 32, 64)
    assert [r["num_gpus"] for r in report["rows"]] == [1, 2, 4, 8, 16, 32, 64]
    for r in report["rows"]:
        assert {"num_gpus", "dp_time_s", "hybrid_time_s", "best_mp_degree", "speedup"} <= set(r)
    first = report["rows"][0]
    assert first["hybrid_time_s"] is None and first["dp_time_s"] > 0
    later = report["rows"][-1]
    assert later["best_mp_degree"] == 2
    assert later["speedup"] == pytest.approx(later["dp_time_s"] / later["hybrid_time_s"])
    assert json.loads((out_dir / "crossover.json").read_text())["rows"] == report["rows"]
    assert (out_dir / "crossover.png").stat().st_size > 0
    assert report["inputs"]["statistical_efficiency"].startswith("noise scale")


def test_table_and_plans_dir(tmp_path, graph_file, capsys):
    plans = tmp_path / "plans"
    plans.mkdir()
    p = plan(branchy_graph(), preset("dgx1-v100"), PlanConfig(num_devices=2, num_micro_batches=1))
    p.save(plans / "plan_mp2.json")
    curve = tmp_path / "curve.csv"
    curve.write_text("global_batch,epochs\n32,10\n1024,12\n8192,40\n")
    code, out, err = run(capsys, "crossover", "--graph", str(graph_file), "--cluster",
                         "dgx1-v100", "--curve", str(curve), "--plans", str(plans),
                         "--mp-degrees", "2", "--max-gpus", "16", "--out", str(tmp_path / "o"))
    assert code == 0, err
    assert "cross-over" in out and "num_gpus" in out
    report = json.loads((tmp_path / "o" / "crossover.json").read_text())
    assert report["inputs"]["plans"]["2"]["num_micro_batches"] == 1  # read, not recomputed


@pytest.mark.parametrize("curve_text, words", [
    ("256,10\n", "at least two"),
    ("256,10\n128,12\n", "strictly increasing"),
    ("256,10\n512,-3\n", "negative"),
])
def test_bad_curves_are_one_line_errors(tmp_path, graph_file, capsys, curve_text, words):
    curve = tmp_path / "c.csv"
    curve.write_text(curve_text)
    code, out, err = run(capsys, "crossover", "--graph", str(graph_file), "--cluster",
                         "dgx1-v100", "--curve", str(curve), "--out", str(tmp_path / "o"))
    assert code == 2 and words in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("extra, words", [
    (["--cluster", "dgx-9000"], "unknown cluster preset"),
    (["--cluster", "dgx1-v100", "--max-gpus", "0"], "--max-gpus 0"),
    (["--cluster", "dgx1-v100"], "--noise-scale"),  # no statistical efficiency known
])
def test_other_bad_input_is_one_line(tmp_path, graph_file, capsys, extra, words):
    code, out, err = run(capsys, "crossover", "--graph", str(graph_file), *extra,
                         "--out", str(tmp_path / "o"))
    assert code == 2 and words in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err



def test_model_is_profiled_then_projected(tmp_path, capsys):
    pytest.importorskip("torch")
    code, out, err = run(capsys, "crossover", "--model", "gnmt", "--preset", "tiny",
                         "--cluster", "dgx1-v100", "--mp-degrees", "2", "--max-gpus", "8",
                         "--plan-time-limit", "5",
                         "--out", str(tmp_path / "o"), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["inputs"]["model"] == "gnmt"
    assert report["inputs"]["statistical_efficiency"].startswith("default gnmt")
    assert [r["num_gpus"] for r in report["rows"]] == [1, 2, 4, 8]
