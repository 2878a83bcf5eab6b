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
