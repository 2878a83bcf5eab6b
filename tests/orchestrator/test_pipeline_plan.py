"""The job's planning stage: the policy's plans, and status lines that say who made
each, with value, bound and gap."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from orchestrator.pipeline import (TIMED_STEPS_FILE, micro_batch_phrase, parse_args,
                                   plan_candidates, plan_stage, plan_status,
                                   saved_timed_steps, timing_stage)
from orchestrator.runtime.device_kind import DeviceKind
from orchestrator.train.resources import JobDevices
from placement.scaling.timed_step import TimedStep
from placement.errors import UserError
from tests.placement.milp_cases import CLUSTER
from tests.placement.test_policy import MILP_SOLVERS, capped


@pytest.mark.solver
def test_the_planning_stage_plans_with_the_milp_and_reports_it():
    # A case whose best candidate (22.0) HiGHS proves optimal. Which stage reaches it
    # first is the host's pace: HiGHS, or on a loaded host the searches before its
    # round (the rotated contiguous splits, HEFT with staggered ranks, the order
    # search), whose plan the line then names as HiGHS's proven optimum.
    plans = plan_candidates(capped(3, 5, 0.7), CLUSTER, [2], time_limit_s=20.0)
    made_by = plans[2].solver
    line = plan_status(2, plans[2])
    assert f"by {made_by}, optimal" in line and "gap 0.0%" in line
    if made_by not in MILP_SOLVERS:
        assert re.search(r"(highs|cbc|glpk) found no plan better than .* and proved it "
                         "optimal", line), line


def test_a_plan_not_made_by_the_milp_says_why():
    plans = plan_candidates(capped(5, 5, 0.7), CLUSTER, [2], time_limit_s=1.0)
    assert plans[2].solver.startswith("heuristic:")
    assert "planning budget of 1 s was spent" in plan_status(2, plans[2])


def test_status_lines_say_one_micro_batch_and_four_micro_batches():
    assert [micro_batch_phrase(k) for k in (1, 4)] == ["1 micro-batch", "4 micro-batches"]


def test_the_plan_time_limit_must_be_positive():
    with pytest.raises(UserError, match="--plan-time-limit 0"):
        parse_args(["--plan-time-limit", "0"], "biglstm")


def test_a_resumed_job_keeps_the_plans_and_timed_steps_its_sweep_was_ranked_with(tmp_path):
    # The trials still to run carry the first run's candidates: planning again on a
    # loaded host may give another plan (another micro-batch count), which those
    # candidates' trials could not run.
    devices = JobDevices(nodes=[], kind=DeviceKind.CPU, num_gpus=2, cluster=CLUSTER,
                         requested=False)
    first = parse_args(["--storage", str(tmp_path), "--plan-time-limit", "1"], "biglstm")
    plans = plan_stage(first, capped(5, 5, 1.0), devices)
    timed = TimedStep(mp_degree=2, dp_degree=1, num_micro_batches=plans[2].num_micro_batches,
                      batches=(8.0, 16.0), compute_s=(0.01, 0.012), allreduce_s=(0.0, 0.0),
                      optimizer_s=0.001, rounds=3)
    (tmp_path / TIMED_STEPS_FILE).write_text(json.dumps([timed.to_dict()]))
    resumed = dataclasses.replace(first, resume=True)
    # Another graph: planning it would give other plans; timing biglstm with these
    # plans could not run at all.
    assert plan_stage(resumed, capped(6, 7, 1.0), devices) == plans
    assert timing_stage(resumed, None, None, plans, devices, None, None) == {2: timed}


def test_timed_steps_an_older_version_saved_are_timed_again_not_a_key_error(tmp_path):
    timed = TimedStep(mp_degree=1, dp_degree=2, num_micro_batches=1, batches=(4.0, 8.0),
                      compute_s=(0.01, 0.012), allreduce_s=(0.002, 0.002),
                      optimizer_s=0.001, rounds=3)
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(json.dumps([timed.to_dict()]))
    before = {k: v for k, v in timed.to_dict().items() if k not in ("dp_degree", "allreduce_s")}
    old.write_text(json.dumps([before]))
    assert saved_timed_steps(new) == {1: timed}
    assert saved_timed_steps(old) is None
