"""A user's error raised in a Ray worker, task or trial is found behind Ray's wrappers
(the real exception classes Ray builds); a failure that is not the user's stays one."""

from __future__ import annotations

import pytest
from ray.exceptions import RayTaskError
from ray.train import ControllerError, WorkerGroupError
from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

from orchestrator.data.common import DataError
from orchestrator.sweep import best_result
from orchestrator.train.errors import user_error_in, user_errors_raised
from placement.errors import UserError
from tests.orchestrator.test_sweep import result


def worker_group_error(exc: BaseException) -> WorkerGroupError:
    """What Ray Train 2.60 raises from fit() when rank 1's train function raised `exc`."""
    return WorkerGroupError("[Rank 1] Traceback ...", {
        0: UserExceptionWithTraceback(RuntimeError("peer gone"), "Traceback ..."),
        1: UserExceptionWithTraceback(exc, "Traceback (most recent call last): ...")})


def task_error(exc: BaseException) -> RayTaskError:
    """What ray.get raises (and Tune keeps as a trial's error) for a task that raised."""
    return RayTaskError("_trial", "Traceback (most recent call last): ...",
                        exc).as_instanceof_cause()


def test_the_users_error_is_found_behind_each_wrapper():
    missing = DataError("/data/train.en: missing source text: check --data")
    assert user_error_in(worker_group_error(missing)) is missing
    assert user_error_in(task_error(missing)) is missing
    assert user_error_in(task_error(worker_group_error(missing))) is missing
    assert user_error_in(ControllerError(missing)) is missing


def test_a_failure_that_is_not_the_users_stays_as_it_is():
    crash = worker_group_error(ZeroDivisionError("bug"))
    assert user_error_in(crash) is None
    with pytest.raises(WorkerGroupError):
        with user_errors_raised(WorkerGroupError):
            raise crash
    with pytest.raises(DataError, match="^bad batch$"):
        with user_errors_raised(WorkerGroupError):
            raise worker_group_error(DataError("bad batch"))


def test_a_sweep_whose_trials_failed_on_bad_data_says_so_in_one_line():
    error = task_error(worker_group_error(DataError("batch 0 of worker 0 of the model's "
                                                    "data has 3 tensor(s)")))
    with pytest.raises(UserError) as err:
        best_result([result(None, error)], "/storage/sweep")
    message = str(err.value)
    assert "\n" not in message
    assert "the first with DataError: batch 0 of worker 0 of the model's data" in message
