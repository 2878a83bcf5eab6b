"""`orchestrator train --model MODULE:FUNCTION` on local Ray: a model of your own with
its own data function trains as on one device, and a data error raised in a worker
comes back as one line and exit 2. One Ray instance for the module."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main
from orchestrator.train.config import TrainConfig
from orchestrator.train.cluster import ray_cluster
from tests.orchestrator.test_train_local import run_local

pytestmark = pytest.mark.ray

MODELS = "tests.orchestrator.user_models"


@pytest.fixture(scope="module")
def local_ray():
    with ray_cluster(None):
        yield


def test_a_user_model_with_a_data_function_trains_on_two_workers_as_on_one(
        local_ray, tmp_path, capsys):
    model = f"{MODELS}:mlp_stream"
    code = main(["train", "--model", model, "--dp", "2", "--global-batch", "16", "--steps",
                 "3", "--storage", str(tmp_path), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    single = run_local(TrainConfig(model=model, global_batch=16, steps=3), tmp_path)
    assert result["losses"] == pytest.approx(single["losses"], rel=1e-5)
    assert len(result["workers"]) == 2


def test_a_data_error_in_a_worker_is_one_line_and_status_2(local_ray, tmp_path, capsys):
    code = main(["train", "--model", f"{MODELS}:mlp_short_stream", "--steps", "3",
                 "--max-failures", "0", "--storage", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.strip() == ("orchestrator train: error: the model's data function ended "
                           "before step 3: yield a batch for every step (cycle over the "
                           "epochs)")


def split_in_two(plan: dict) -> dict:
    """The plan with its later half of ops moved to device 1, each device running its
    tasks in one topological order of the step (op ids follow the captured graph:
    forwards by id, then backwards in reverse). The planner may rightly keep a 6-op MLP
    on one device (the measured cost of splitting it outweighs its work); the test is
    about the workers running an operator-level split."""
    tasks = sorted((task for device in plan["order_tasks"] for task in device),
                   key=lambda t: (t[1] == "backward", -t[0] if t[1] == "backward" else t[0],
                                  t[2]))
    half = len(plan["assignment"]) // 2
    assignment = {op: int(int(op) >= half) for op in plan["assignment"]}
    order_tasks = [[t for t in tasks if assignment[str(t[0])] == d] for d in (0, 1)]
    return {**plan, "assignment": assignment, "order_tasks": order_tasks,
            "order": [[t[0] for t in device] for device in order_tasks]}


def test_train_runs_a_plan_of_aten_operators_made_by_profile_and_plan(local_ray, tmp_path,
                                                                      capsys):
    """The user's path at operator granularity: profile --granularity aten, plan on two
    devices, train --plan; the workers cut the model as the plan's graph was cut."""
    model, graph, plan_file = f"{MODELS}:mlp", tmp_path / "graph.json", tmp_path / "plan.json"
    assert main(["profile", "--model", model, "--granularity", "aten", "--repeats", "1",
                 "--out", str(graph)]) == 0
    assert main(["plan", "--graph", str(graph), "--devices", "2", "--micro-batches", "2",
                 "--objective", "max-load", "--out", str(plan_file)]) == 0
    placed = json.loads(plan_file.read_text())
    assert placed["granularity"] == "aten"
    plan_file.write_text(json.dumps(split_in_two(placed)))
    capsys.readouterr()
    code = main(["train", "--model", model, "--plan", str(plan_file), "--mp", "2",
                 "--micro-batches", "2", "--global-batch", "8", "--steps", "2",
                 "--storage", str(tmp_path / "run"), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    single = run_local(TrainConfig(model=model, global_batch=8, steps=2), tmp_path)
    assert result["losses"] == pytest.approx(single["losses"], rel=1e-5)
