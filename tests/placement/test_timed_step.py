"""The timed worker step: medians of alternating rounds, and the step it predicts at a
batch (exact where timed, linear between, refused outside)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.scaling.timed_step import TimedStep, timed_step


def line(mp=2, batches=(8, 16, 64), compute=(0.020, 0.024, 0.040), optimizer=0.001,
         allreduce=None):
    return TimedStep(mp_degree=mp, dp_degree=2, num_micro_batches=4, batches=batches,
                     compute_s=compute, allreduce_s=allreduce or (0.0,) * len(batches),
                     optimizer_s=optimizer, rounds=5)


def test_the_step_is_the_timed_median_where_timed_and_linear_between():
    t = line()
    assert t.compute_at(8) == 0.020 and t.compute_at(64) == 0.040
    assert t.compute_at(12) == pytest.approx(0.022)  # halfway from 8 to 16
    assert t.compute_at(40) == pytest.approx(0.032)  # halfway from 16 to 64
    assert t.step_s(16) == pytest.approx(0.025)
    with pytest.raises(ValueError, match="outside the timed batches"):
        t.compute_at(4)
    with pytest.raises(ValueError, match="outside the timed batches"):
        t.compute_at(128)
    assert TimedStep.from_dict(t.to_dict()) == t


def test_the_step_adds_the_timed_allreduce_at_its_batch():
    t = line(allreduce=(0.002, 0.004, 0.010))
    assert t.allreduce_at(12) == pytest.approx(0.003)
    assert t.step_s(40) == pytest.approx(0.032 + 0.007 + 0.001)
    with pytest.raises(ValueError, match="outside the timed batches"):
        t.allreduce_at(4)
    assert TimedStep.from_dict(t.to_dict()) == t


def test_bad_timings_are_refused():
    with pytest.raises(ValueError, match="must increase"):
        line(batches=(16, 8, 64))
    with pytest.raises(ValueError, match="one length"):
        line(compute=(0.02, 0.03))
    with pytest.raises(ValueError, match="one length"):
        line(allreduce=(0.001, 0.001))
    with pytest.raises(ValueError, match="must be > 0"):
        line(compute=(0.02, 0.0, 0.03))
    with pytest.raises(ValueError, match=">= 0"):
        line(allreduce=(0.001, -0.001, 0.001))
    with pytest.raises(ValueError, match="same number"):
        timed_step(1, 1, 1, {8: [(0.01, 0.0, 0.001, 0.011)], 16: []})


def test_medians_of_the_rounds_hand_computed():
    # Round 2 hit a neighbour's burst at both batches: the medians leave it out, and its
    # steps got half a core where the others got one to two.
    samples = {16: [(0.010, 0.003, 0.001, 0.028), (0.050, 0.020, 0.009, 0.0395),
                    (0.012, 0.002, 0.002, 0.016)],
               8: [(0.008, 0.001, 0.001, 0.015), (0.030, 0.010, 0.001, 0.0205),
                   (0.009, 0.002, 0.003, 0.021)]}
    t = timed_step(2, 3, 4, samples)
    assert t.batches == (8, 16)
    assert t.compute_s == (0.009, 0.012)
    assert t.allreduce_s == (0.002, 0.003)
    assert t.optimizer_s == 0.0015  # median of all six updates
    assert (t.rounds, t.mp_degree, t.dp_degree, t.num_micro_batches) == (3, 2, 3, 4)
    assert t.cores_used == pytest.approx((1.5, 1.0))  # medians of (1.5, 0.5, 1.5), (2, .5, 1)
    assert t.cores_at(12) == pytest.approx(1.25)
    assert TimedStep.from_dict(t.to_dict()) == t
    saved_before = {k: v for k, v in t.to_dict().items() if k != "cores_used"}
    assert TimedStep.from_dict(saved_before).cores_at(12) is None


@settings(deadline=None, max_examples=50)
@given(st.lists(st.floats(1e-4, 1.0), min_size=2, max_size=5),
       st.floats(0.0, 1.0))
def test_between_two_timed_batches_the_step_lies_between_their_times(times, at):
    batches = tuple(8 * 2**i for i in range(len(times)))
    t = line(batches=batches, compute=tuple(times))
    for i in range(len(batches) - 1):
        b = batches[i] + at * (batches[i + 1] - batches[i])
        lo, hi = sorted(times[i:i + 2])
        assert lo - 1e-12 <= t.compute_at(b) <= hi + 1e-12
