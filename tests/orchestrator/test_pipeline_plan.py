"""The job's planning stage: the policy's plans, and status lines that say who made
each, with value, bound and gap."""

from __future__ import annotations

import pytest

from orchestrator.pipeline import parse_args, plan_candidates, plan_status
from placement.errors import UserError
from tests.placement.milp_cases import CLUSTER
from tests.placement.test_policy import MILP_SOLVERS, capped


@pytest.mark.solver
def test_the_planning_stage_plans_with_the_milp_and_reports_it():
    plans = plan_candidates(capped(5, 5, 0.7), CLUSTER, [2], time_limit_s=20.0)
    line = plan_status(2, plans[2])
    assert plans[2].solver in MILP_SOLVERS
    assert f"by {plans[2].solver}, optimal" in line
    assert "bound" in line and "gap 0.0%" in line


def test_a_plan_not_made_by_the_milp_says_why():
    plans = plan_candidates(capped(5, 5, 0.7), CLUSTER, [2], time_limit_s=1.0)
    assert plans[2].solver.startswith("heuristic:")
    assert "planning budget of 1 s was spent" in plan_status(2, plans[2])


def test_the_plan_time_limit_must_be_positive():
    with pytest.raises(UserError, match="--plan-time-limit 0"):
        parse_args(["--plan-time-limit", "0"], "biglstm")
