"""Where a step's time went: the parts of each step sum to its wall time."""

import itertools

import pytest
import torch
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
    # Process CPU read at the data and the optimizer marks: 0.3 s over the first step's
    # 0.6 s from data to optimizer, then 0.165, 0.22 and 0.165 s over 0.11 s.
    cpu = FakeClock([0, 0.3, 0, 0.165, 0, 0.22, 0, 0.165])
    steps = StepClock(clock, cpu_clock=cpu)
    for _ in range(4):
        steps.start()
        for part in ("data", "compute", "allreduce", "optimizer", "idle", "reporting"):
            steps.mark(part)
        steps.finish()
    medians = steps.medians()
    assert WARMUP_STEPS == 1
    assert medians["time_compute_s"] == pytest.approx(0.1)  # not the first step's 0.1+0.2
    assert medians["measured_step_s"] == pytest.approx(0.1 + 0.0 + 0.01)
    assert set(medians) == {f"time_{p}_s" for p in PARTS} | {"measured_step_s", "cores_used"}
    assert steps.cores == pytest.approx([0.5, 1.5, 2.0, 1.5])
    assert medians["cores_used"] == pytest.approx(1.5)  # not the warm-up's half a core
    assert set(MODELLED) <= set(PARTS)


def test_a_step_not_counted_is_timed_but_left_out_of_the_medians():
    # Three steps of compute 0.1 s, then one of 0.4 s started as not counted (the
    # worker's step right after a host-speed probe), then one more of 0.1 s.
    computes = [0.1, 0.1, 0.1, 0.4, 0.1]
    clock = FakeClock([x for c in computes for x in (0, 0.01, c, 0.0, 0.01, 0.0, 0.0)])
    cpu = FakeClock([0, 0.11] * 3 + [0, 0.84] + [0, 0.11])
    steps = StepClock(clock, cpu_clock=cpu)
    parts = []
    for i in range(len(computes)):
        steps.start(counted=i != 3)
        for part in ("data", "compute", "allreduce", "optimizer", "idle", "reporting"):
            steps.mark(part)
        parts.append(steps.finish())
    assert parts[3]["compute"] == pytest.approx(0.4)  # timed all the same
    assert len(steps.steps) == len(steps.cores) == 4
    medians = steps.medians()
    # The counted steps after the warm-up: 0.11 s at one core each; the one left out
    # took 0.42 s at two.
    assert medians["measured_step_s"] == pytest.approx(0.11)
    assert max(steps.cores) == pytest.approx(1.0)
    assert medians["time_compute_s"] == pytest.approx(0.1)


class LaggingDevice:
    """A device timer whose device finishes each part `lag_s[part]` seconds after the
    host's mark (a GPU the host has run ahead of), on the host's own clock."""

    def __init__(self, clock: FakeClock, lags_s: list[float]) -> None:
        self.clock = clock
        self.lags_s = iter(lags_s)

        self.latest = 0.0

    def record(self) -> list[float]:
        done = self.clock.now + next(self.lags_s)
        self.latest = max(self.latest, done)
        return [done]

    def synchronize(self) -> None:
        self.clock.now = max(self.clock.now, self.latest)

    def elapsed_s(self, start: list[float], end: list[float]) -> list[float]:
        return [e - s for s, e in zip(start, end)]


def test_a_part_ends_when_the_device_finishes_it_not_when_the_host_queued_it():
    # Host: data 1 ms, compute queued in 2 ms, allreduce wait 1 ms, then the synchronize
    # the optimizer part holds takes 40 ms. The device finishes compute 30 ms after
    # the host queued it and the allreduce 38 ms after the host's mark.
    clock = FakeClock([0.0, 0.001, 0.002, 0.001, 0.040, 0.0, 0.0])
    steps = StepClock(clock, device_timer=LaggingDevice(clock, [0.0, 0.0, 0.030, 0.038,
                                                                0.0, 0.0, 0.0]))
    steps.start()
    for part in ("data", "compute", "allreduce", "optimizer", "idle", "reporting"):
        steps.mark(part)
    parts = steps.finish()
    assert parts["data"] == pytest.approx(0.001)
    assert parts["compute"] == pytest.approx(0.032)  # host 2 ms + the device's 30 ms
    assert parts["allreduce"] == pytest.approx(0.009)  # ends 38 ms after the host's mark
    assert parts["optimizer"] == pytest.approx(0.002)  # what is left of the 40 ms wait
    assert sum(parts.values()) == pytest.approx(0.044)  # still the step's wall time
    assert steps.medians()["measured_step_s"] == pytest.approx(0.043)


@given(st.lists(st.floats(0.0, 1.0), min_size=len(PARTS) * 2, max_size=len(PARTS) * 2),
       st.lists(st.floats(0.0, 1.0), min_size=len(PARTS) * 2, max_size=len(PARTS) * 2))
def test_with_a_device_timer_the_parts_still_sum_to_the_wall_time(ticks, lags):
    clock = FakeClock(ticks)
    # Per step: the start's record, then one per mark. The device is idle at the start,
    # and the optimizer part ends in a synchronize: no lag at the start and from then on.
    lags = [lag if i % len(PARTS) in (1, 2, 3) else 0.0 for i, lag in enumerate(lags)]
    device = LaggingDevice(clock, lags)
    steps = StepClock(clock, device_timer=device)
    begun = None
    for _ in range(2):
        steps.start()
        begun = clock.now if begun is None else begun
        for part in ("data", "compute", "allreduce"):
            steps.mark(part)
        device.synchronize()
        steps.mark("optimizer")
        steps.mark("reporting")
        steps.finish()
    assert all(v >= 0 for parts in steps.steps for v in parts.values())
    assert sum(sum(p.values()) for p in steps.steps) == pytest.approx(clock.now - begun,
                                                                       abs=1e-9)


def test_cpu_devices_need_no_device_timer():
    from orchestrator.train.step_breakdown import device_timer

    assert device_timer([torch.device("cpu"), torch.device("cpu")]) is None
