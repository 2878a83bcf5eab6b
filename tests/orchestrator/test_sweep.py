"""Choosing the sweep's winner from Tune's results."""

import math

import pytest
from ray.tune import Result

from orchestrator.sweep import METRIC, best_result
from placement.errors import UserError


def result(projected: float | None, error: Exception | None = None) -> Result:
    metrics = {} if projected is None else {METRIC: projected, "step": 3}
    return Result(metrics=metrics, checkpoint=None, error=error, path="/storage/sweep/_trial")


def test_the_least_projected_time_wins_and_trials_without_a_figure_are_passed_over():
    results = [result(30.0), result(None, RuntimeError("worker died")), result(math.nan),
               result(12.5), result(math.inf), result(20.0)]
    assert best_result(results, "/storage/sweep").metrics[METRIC] == 12.5


def test_a_sweep_without_any_report_is_one_line_naming_the_first_error():
    results = [result(None, RuntimeError("The worker group startup timed out\nTraceback ...")),
               result(None, ValueError("bad"))]
    with pytest.raises(UserError) as err:
        best_result(results, "/storage/sweep")
    message = str(err.value)
    assert "\n" not in message
    assert "2 of 2 failed" in message
    assert "RuntimeError: The worker group startup timed out" in message
    assert "/storage/sweep" in message and "--resume" in message


def test_a_resumed_sweep_sets_aside_the_trial_folders_no_record_points_to(tmp_path):
    from orchestrator.sweep import UNRECORDED, set_aside_unrecorded_trials

    experiment = tmp_path / "sweep"
    recorded = [experiment / "_trial_a1_mp1", experiment / "_trial_c3_mp2"]
    orphan = experiment / "_trial_b2_mp2"
    for folder in (*recorded, orphan):
        folder.mkdir(parents=True)
        (folder / "result.json").write_text("{}")
    (experiment / "experiment_state-x.json").write_text("{}")

    moved = set_aside_unrecorded_trials(experiment, {str(p) for p in recorded})

    assert moved == [experiment / UNRECORDED / orphan.name]
    assert (moved[0] / "result.json").read_text() == "{}"  # moved, not lost
    assert sorted(experiment.glob("_trial_*")) == recorded
    assert (experiment / "experiment_state-x.json").is_file()
    assert set_aside_unrecorded_trials(experiment, {str(p) for p in recorded}) == []
