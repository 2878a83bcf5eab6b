"""Every flag that takes a path is checked while the flags are parsed: a missing, wrong
kind of, unreadable, malformed or unwritable path is one line naming the flag and the
fix, exit status 2, no traceback, and nothing (profiling, Ray) runs first."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import ray

from orchestrator import pipeline
from orchestrator.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
GRAPH = str(ROOT / "examples" / "branchy.json")
MLP = "tests.orchestrator.user_models:mlp"


@pytest.fixture
def files(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "notjson.json").write_text("not json{\n")
    (tmp_path / "notplan.json").write_text('{"a": 1}\n')
    (tmp_path / "curve.csv").write_text("global_batch,epochs\n32,many\n")
    return tmp_path


def refused(argv: list[str], files: Path, capsys, job: bool = False) -> str:
    """Run the CLI (or the job) on `argv` and return its one stderr line."""
    argv = [a.format(t=files) for a in argv]
    try:
        code = (pipeline.main(argv=argv, prog="jobs/train.py") if job
                else cli_main(argv))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and out == ""
    assert not ray.is_initialized()
    return err


#: Each failure class of a path, with the flags it is tried on.
CASES = {
    "missing input": [
        (["train", "--model", MLP, "--plan", "{t}/missing.json"],
         "argument --plan: {t}/missing.json: no such file: check the path"),
        (["plan", "--graph", "{t}/missing.json", "--devices", "2"],
         "argument --graph: {t}/missing.json: no such file"),
        (["crossover", "--graph", GRAPH, "--cluster", "cpu", "--out", "{t}/xo",
          "--curve", "{t}/missing.csv"], "argument --curve: {t}/missing.csv: no such file"),
        (["crossover", "--graph", GRAPH, "--cluster", "cpu", "--out", "{t}/xo",
          "--plans", "{t}/missing"], "argument --plans: {t}/missing: no such directory"),
    ],
    "directory for a file": [
        (["train", "--model", MLP, "--plan", "{t}/folder"],
         "argument --plan: {t}/folder is a directory: give a file"),
        (["layerwise", "--graph", "{t}/folder", "--devices", "2"],
         "argument --graph: {t}/folder is a directory: give a file"),
        (["profile", "--model", MLP, "--out", "{t}/folder"],
         "argument --out: {t}/folder is a directory: give the path of a file"),
        (["plan", "--graph", GRAPH, "--devices", "2", "--gantt", "{t}/folder"],
         "argument --gantt: {t}/folder is a directory"),
    ],
    "file for a folder": [
        (["train", "--model", MLP, "--data", "{t}/notjson.json"],
         "argument --data: {t}/notjson.json is a file, not a directory: give the folder"),
        (["train", "--model", MLP, "--storage", "{t}/notjson.json"],
         "argument --storage: {t}/notjson.json is a file: give a folder"),
        (["crossover", "--graph", GRAPH, "--cluster", "cpu", "--out", "{t}/notjson.json/xo"],
         "argument --out: {t}/notjson.json/xo: {t}/notjson.json is a file, so the folder "
         "cannot be created"),
    ],
    "malformed input": [
        (["train", "--model", MLP, "--plan", "{t}/notjson.json"],
         "argument --plan: {t}/notjson.json: not a plan file (JSONDecodeError"),
        (["train", "--model", MLP, "--plan", "{t}/notplan.json"],
         "argument --plan: {t}/notplan.json: not a plan file (KeyError: 'objective'): write it "
         "with 'orchestrator plan --out'"),
        (["plan", "--graph", "{t}/notjson.json", "--devices", "2"],
         "argument --graph: {t}/notjson.json: not valid JSON"),
        (["crossover", "--graph", GRAPH, "--cluster", "cpu", "--out", "{t}/xo",
          "--curve", "{t}/curve.csv"], "argument --curve: {t}/curve.csv: row 1"),
    ],
    "output in a missing folder": [
        (["profile", "--model", MLP, "--out", "{t}/missing/dir/g.json"],
         "argument --out: {t}/missing/dir/g.json: the folder {t}/missing/dir does not exist: "
         "create it (mkdir -p {t}/missing/dir)"),
        (["plan", "--graph", GRAPH, "--devices", "2", "--out", "{t}/missing/p.json"],
         "argument --out: {t}/missing/p.json: the folder {t}/missing does not exist"),
        (["layerwise", "--graph", GRAPH, "--devices", "2", "--out", "{t}/missing/l.json"],
         "argument --out: {t}/missing/l.json: the folder {t}/missing does not exist"),
    ],
}


@pytest.mark.parametrize("argv, message", [
    pytest.param(argv, message, id=f"{failure}-{argv[0]}-{argv[-2]}")
    for failure, cases in CASES.items() for argv, message in cases])
def test_each_failure_class_of_a_cli_path(argv, message, files, capsys):
    assert message.format(t=files) in refused(argv, files, capsys)


def test_an_unreadable_input(files, capsys):
    plan = files / "secret.json"
    plan.write_text("{}")
    plan.chmod(0)
    if os.access(plan, os.R_OK):
        pytest.skip("running as root: a file without read permission is still readable")
    assert "argument --plan: " in refused(["train", "--model", MLP, "--plan", str(plan)],
                                          files, capsys)


def test_an_output_where_nothing_can_be_written(files, capsys):
    try:
        tempfile.TemporaryFile(dir="/sys").close()
    except OSError:
        pass
    else:
        pytest.skip("/sys takes new files here")
    err = refused(["profile", "--model", MLP, "--out", "/sys/g.json"], files, capsys)
    assert "argument --out: /sys/g.json: cannot write in /sys" in err


@pytest.mark.parametrize("argv, message", [
    (["--data", "{t}/missing"], "argument --data: {t}/missing: no such directory"),
    (["--storage", "{t}/notjson.json"], "argument --storage: {t}/notjson.json is a file"),
    (["--curve", "{t}/notjson.json"], "argument --curve: the curve in {t}/notjson.json"),
])
def test_the_job_refuses_bad_paths(argv, message, files, capsys):
    err = refused(["--model", MLP, *argv], files, capsys, job=True)
    assert err.startswith("jobs/train.py: error: ") and message.format(t=files) in err


def test_the_job_checks_paths_before_starting_ray(files):
    """As a user runs it: a storage that is a file is refused before any Ray session."""
    ray_tmp = files / "ray"
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run([sys.executable, "jobs/bigLSTM.py", "--storage",
                          str(files / "notjson.json")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"jobs/bigLSTM.py: error: argument --storage: {files}/notjson.json is a file: give "
        "a folder (it is created if missing) (see 'jobs/bigLSTM.py --help')"]
    assert not ray_tmp.exists()
