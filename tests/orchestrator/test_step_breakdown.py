"""Where a step's time went: the parts of each step sum to its wall time."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.train.step_breakdown import MODELLED, PARTS, WARMUP_STEPS, StepClock


class FakeClock:
    def __init__(self, ticks):
        self.now = 0.0
        self.ticks = iter(ticks)

    def __call__(self) -> float:
        self.now += next(self.ticks)
        return self.now


@given(st.lists(st.floats(0.0, 1.0), min_size=(len(PARTS)) * 3, max_size=(len(PARTS)) * 3))
def test_each_steps_parts_sum_to_its_wall_time(ticks):
    clock = FakeClock(ticks)
    steps = StepClock(clock)
    order = [p for p in PARTS if p != "idle"]
    ends = []
    for _ in range(3):
        steps.start()
        begun = clock.now
        for part in order[:3]:
            steps.mark(part)
        steps.mark("idle")
        steps.mark("reporting")
        steps.finish()
        ends.append((begun, clock.now))
    # The time from one step's end to the next's end is the next step's wall time.
    walls = [ends[0][1] - ends[0][0]] + [b[1] - a[1] for a, b in itertools.pairwise(ends)]
    assert len(steps.steps) == 3
    for parts, wall in zip(steps.steps, walls):
        assert set(parts) == set(PARTS)
        assert sum(parts.values()) == pytest.approx(wall, abs=1e-9)


def test_medians_leave_out_the_warm_up_and_name_each_part():
    clock = FakeClock([0, 0.5, 0.1, 0.2, 0.3, 0.0, 0.0] + [0, 0.01, 0.1, 0.0, 0.01, 0.0, 0.0] * 3)
    steps = StepClock(clock)
    for _ in range(4):
        steps.start()
        for part in ("data", "compute", "allreduce", "optimizer", "idle", "reporting"):
            steps.mark(part)
        steps.finish()
    medians = steps.medians()
    assert WARMUP_STEPS == 1
    assert medians["time_compute_s"] == pytest.approx(0.1)  # not the first step's 0.1+0.2
    assert medians["measured_step_s"] == pytest.approx(0.1 + 0.0 + 0.01)
    assert set(medians) == {f"time_{p}_s" for p in PARTS} | {"measured_step_s"}
    assert set(MODELLED) <= set(PARTS)
