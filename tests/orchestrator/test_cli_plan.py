import json
import subprocess
import sys

import pytest

from orchestrator.cli import main
from placement.io import FORMAT_NAME
from tests.conftest import REPO

EXAMPLE = str(REPO / "examples" / "branchy.json")


def graph_file(tmp_path, ops, edges):
    path = tmp_path / f"g{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps({"format": FORMAT_NAME, "version": 1, "ops": ops,
                                "edges": edges}))
    return str(path)


def op(i, t=1.0, **extra):
    return {"id": i, "name": f"op{i}", "forward_s": {"v100": t}, **extra}


def run_cli(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def bad_inputs(tmp_path):
    malformed = tmp_path / "malformed.json"
    malformed.write_text("{oops")
    return {
        "malformed JSON": (["--graph", str(malformed), "--devices", "2"], "not valid JSON"),
        "cycle": (["--graph", graph_file(tmp_path, [op(0), op(1)],
                                         [{"src": 0, "dst": 1}, {"src": 1, "dst": 0}]),
                   "--devices", "2"], "cycle"),
        "unknown op id": (["--graph", graph_file(tmp_path, [op(0)], [{"src": 0, "dst": 5}]),
                           "--devices", "2"], "names op 5"),
        "negative time": (["--graph", graph_file(tmp_path, [op(0, -1.0)], []),
                           "--devices", "2"], "must be finite and >= 0"),
        "zero devices": (["--graph", EXAMPLE, "--devices", "0"], "at least 1 device"),
        "colocation too big": (
            ["--graph", graph_file(tmp_path, [op(0, activation_bytes=3e10, colocation="a"),
                                              op(1, activation_bytes=3e10, colocation="a")],
                                   []), "--devices", "2"], "must share a device"),
        "memory never fits": (
            ["--graph", graph_file(tmp_path, [op(i, activation_bytes=2.5e10) for i in range(4)],
                                   []), "--devices", "2"], "use at least 4 devices"),
        "unknown preset": (["--graph", EXAMPLE, "--devices", "2", "--cluster", "tpu"],
                           "invalid choice: 'tpu'"),
        "unknown solver": (["--graph", EXAMPLE, "--devices", "2", "--solver", "gurobi"],
                           "solver 'gurobi' is unknown"),
    }


@pytest.mark.parametrize("case", ["malformed JSON", "cycle", "unknown op id", "negative time",
                                  "zero devices", "colocation too big", "memory never fits",
                                  "unknown preset", "unknown solver"])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, case):
    argv, message = bad_inputs(tmp_path)[case]
    code, out, err = run_cli(["plan", *argv], capsys)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert message in err


def test_no_traceback_from_a_real_process(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    result = subprocess.run([sys.executable, "-m", "orchestrator", "plan", "--graph", str(bad),
                             "--devices", "2"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "not valid JSON" in result.stderr


def test_json_output_has_the_plan(capsys, peer_graphs, tmp_path):
    gantt = tmp_path / "plan.png"
    out_file = tmp_path / "plan.json"
    code, out, _ = run_cli(["plan", "--graph", str(peer_graphs / "gnmt_training.json"),
                            "--devices", "6", "--objective", "max-load", "--json",
                            "--time-limit", "5",
                            "--gantt", str(gantt), "--out", str(out_file)], capsys)
    assert code == 0
    result = json.loads(out)
    for key in ("objective", "value", "lower_bound", "gap", "solver", "status",
                "solve_seconds", "assignment", "order"):
        assert key in result
    assert result["value"] <= 107.0044140625 + 1e-6  # the peer's contiguous optimum
    assert set(map(int, result["assignment"])) == {n for d in result["order"] for n in d}
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(out_file.read_text())["value"] == result["value"]


def test_human_table(capsys):
    code, out, _ = run_cli(["plan", "--graph", EXAMPLE, "--devices", "2"], capsys)
    assert code == 0
    assert "lower bound" in out and "device" in out
