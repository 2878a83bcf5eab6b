"""Re-ranking the sweep: the per-mp_degree shrunk ratio and the order of the trials."""

import statistics

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from placement.scaling.crossover import HybridConfig
from placement.scaling.timed_step import TimedStep
from placement.sweep_rank import (PRIOR_TRIALS, Correction, Measurement, fit_correction,
                                  next_candidate, ranked)
from placement.sweep_space import Candidate


def cand(mp: int, batch: int, time_s: float, step_s: float = 0.01) -> Candidate:
    return Candidate(config=HybridConfig(dp_degree=8 // mp, mp_degree=mp, global_batch=batch,
                                         num_micro_batches=1),
                     lr=0.1, predicted_step_s=step_s, predicted_time_s=time_s)


def test_fit_correction_hand_computed():
    assert PRIOR_TRIALS == 2  # the figures below are worked out for it
    fitted = fit_correction([Measurement(mp_degree=1, predicted_step_s=0.01, measured_step_s=0.02),
                             Measurement(mp_degree=1, predicted_step_s=0.01, measured_step_s=0.04),
                             Measurement(mp_degree=2, predicted_step_s=0.02, measured_step_s=0.01)])
    # mp 1: ratios 2 and 4, median 3, two trials against the prior's two: 1 + 2 x 2/4.
    # mp 2: one trial at 0.5: 1 - 0.5 x 1/3.
    assert fitted.ratios == {1: pytest.approx(2.0), 2: pytest.approx(5 / 6)}
    assert fitted.trials == {1: 2, 2: 1}
    # Unmeasured: all three trials' median ratio, 2, shrunk by 3 / 5.
    assert fitted.ratio(4) == pytest.approx(1.6)
    assert fitted.step_s(1, 0.01) == pytest.approx(0.02)
    assert fitted.step_s(4, 0.01) == pytest.approx(0.016)
    assert (fitted.calibrated(2), fitted.calibrated(4)) == (True, False)
    assert (fitted.source(1), fitted.source(2), fitted.source(4)) == (
        "2 mp 1 trials", "1 mp 2 trial", "3 trials of other mp_degrees")
    assert fit_correction([]).step_s(1, 0.01) == 0.01
    assert fit_correction([]).source(1) == "none (no trial yet)"
    assert Correction.from_dict(fitted.to_dict()) == fitted


def test_trials_that_keep_measuring_the_same_miss_take_over_from_the_timing():
    """One trial moves the prediction by a third of its miss; ten that agree, by 10/12."""
    def corrected(n: int) -> float:
        return fit_correction([Measurement(mp_degree=1, predicted_step_s=0.01,
                                           measured_step_s=0.013)] * n).step_s(1, 0.01)

    assert corrected(1) == pytest.approx(0.011)
    assert corrected(10) == pytest.approx(0.0125)
    assert [corrected(n) for n in range(1, 8)] == sorted(corrected(n) for n in range(1, 8))


def test_a_measurement_reorders_the_trials_not_yet_run():
    cands = [cand(1, 64, 10.0), cand(1, 32, 12.0), cand(2, 64, 11.0), cand(2, 32, 13.0)]
    # Coverage: the best of each mp_degree first, whatever was measured.
    assert next_candidate(cands, set(), Correction()).key() == "mp1-b64"
    assert next_candidate(cands, {"mp1-b64"}, Correction()).key() == "mp2-b64"
    tried = {"mp1-b64", "mp2-b64"}
    assert next_candidate(cands, tried, Correction()).key() == "mp1-b32"
    # mp 1 measured 2.5x its prediction, mp 2 as predicted: mp 1's ratio is 1 + 1.5 / 3 = 1.5,
    # and mp2-b32 (13 s) now ranks before mp1-b32 (18 s).
    slower_mp1 = fit_correction([
        Measurement(mp_degree=1, predicted_step_s=0.01, measured_step_s=0.025),
        Measurement(mp_degree=2, predicted_step_s=0.01, measured_step_s=0.01)])
    assert next_candidate(cands, tried, slower_mp1).key() == "mp2-b32"
    assert ranked(cands[1], slower_mp1).predicted_time_s == pytest.approx(18.0)
    assert ranked(cands[1], slower_mp1).overhead_s == pytest.approx(0.005)
    assert next_candidate(cands, {c.key() for c in cands}, slower_mp1) is None


def reference_order(cands, measured_s):
    """The whole sequence by brute force: at each pick, recompute every candidate's
    corrected time from the raw measurements (measured / predicted per trial, their median
    per mp_degree or over all trials for an unmeasured one, pulled towards 1 by n / (n + 2))
    and sort them all."""
    order = []
    while len(order) < len(cands):
        per_mp, every = {}, []
        for c in order:
            r = measured_s[c.key()] / c.predicted_step_s
            per_mp.setdefault(c.mp_degree, []).append(r)
            every.append(r)

        def pulled(rs):
            return 1 + (statistics.median(rs) - 1) * len(rs) / (len(rs) + 2) if rs else 1.0

        def corrected_time(c):
            return c.predicted_time_s * pulled(per_mp.get(c.mp_degree, every))

        corrected = sorted((corrected_time(c), c.key(), c) for c in cands if c not in order)
        covered = {c.mp_degree for c in order}
        uncovered = [c for c in cands if c.mp_degree not in covered]
        if uncovered:
            firsts = {m: min((c for c in uncovered if c.mp_degree == m),
                             key=lambda c: c.predicted_time_s) for m in {c.mp_degree for c in uncovered}}
            corrected = [t for t in corrected if t[2] in firsts.values()]
        order.append(corrected[0][2])
    return [c.key() for c in order]


@settings(deadline=None, max_examples=60)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([16, 32, 64, 128]),
                          st.floats(1.0, 100.0), st.floats(0.005, 0.05),
                          st.floats(0.001, 0.08)),
                min_size=1, max_size=8, unique_by=lambda t: (t[0], t[1])))
# Two unmeasured mp_degrees tied at 1.0 s under one shared ratio: the tie must survive the
# correction (x 0.05 / 0.05 and x 0.03125 / 0.03125 once rounded apart) and break by key.
@example(spec=[(1, 16, 2.0, 0.03125, 0.0625), (1, 32, 1.0, 0.0234375, 0.0625),
               (2, 16, 1.0, 0.05, 0.0625), (4, 16, 1.0, 0.03125, 0.0625)])
def test_the_searchers_order_is_the_brute_force_corrected_order(spec):
    cands = [cand(mp, b, time_s, step_s) for mp, b, time_s, step_s, _ in spec]
    truth = {f"mp{mp}-b{b}": measured for mp, b, _, _, measured in spec}
    order, measurements = [], []
    while (c := next_candidate(cands, set(order), fit_correction(measurements))) is not None:
        order.append(c.key())
        measurements.append(Measurement(mp_degree=c.mp_degree, predicted_step_s=c.predicted_step_s,
                                        measured_step_s=truth[c.key()]))
    assert order == reference_order(cands, truth)
    num_mps = len({c.mp_degree for c in cands})
    assert {k.split("-")[0] for k in order[:num_mps]} == {f"mp{c.mp_degree}" for c in cands}


def timing(mp: int, dp: int, batches, compute_s) -> TimedStep:
    """A trial's own timing of its step: no allreduce, an update of 2 ms."""
    return TimedStep(mp_degree=mp, dp_degree=dp, num_micro_batches=1, batches=tuple(batches),
                     compute_s=tuple(compute_s), allreduce_s=(0.0,) * len(batches),
                     optimizer_s=0.002, rounds=5)


def test_an_mp_degree_timed_in_its_trials_ranks_from_those_timings():
    first = timing(2, 4, (8.0, 16.0), (0.010, 0.018))   # steps 12 and 20 ms
    second = timing(2, 4, (8.0, 16.0), (0.012, 0.022))  # steps 14 and 24 ms
    fitted = fit_correction([
        # Against their own timings at their own worker batch: 15 / 20 and 14 / 14.
        Measurement(mp_degree=2, predicted_step_s=0.010, measured_step_s=0.015,
                    retimed=first, worker_batch=16.0),
        Measurement(mp_degree=2, predicted_step_s=0.010, measured_step_s=0.014,
                    retimed=second, worker_batch=8.0),
        # An mp 2 trial that timed nothing: left out of mp 2's ratio once others timed.
        Measurement(mp_degree=2, predicted_step_s=0.010, measured_step_s=0.030),
        Measurement(mp_degree=1, predicted_step_s=0.010, measured_step_s=0.020)])
    # mp 2: ratios 0.75 and 1, median 0.875, in full: both figures of each ratio are
    # one trial's.
    assert fitted.ratio(2) == pytest.approx(0.875)
    assert fitted.trials == {1: 1, 2: 2}
    # The base is the median of the two timings at the candidate's worker batch, 20 and
    # 24 ms at 16, 16 and 19 ms halfway between the timed batches.
    assert fitted.base_s(2, 0.5, 16.0) == pytest.approx(0.022)
    assert fitted.step_s(2, 0.5, 16.0) == pytest.approx(0.022 * 0.875)
    assert fitted.step_s(2, 0.5, 12.0) == pytest.approx(0.0175 * 0.875)
    # mp 1 timed nothing in its trial: its ratio is against the step that ranked it.
    assert fitted.step_s(1, 0.010) == pytest.approx(0.010 * 4 / 3)
    # Unmeasured: every trial's ratio against the step that ranked it (1.5, 1.4, 3, 2),
    # median 1.75, shrunk by 4 / 6.
    assert fitted.ratio(4) == pytest.approx(1.5)
    assert (fitted.source(1), fitted.source(2)) == (
        "1 mp 1 trial", "2 mp 2 trials, timed in their workers")
    assert Correction.from_dict(fitted.to_dict()) == fitted
    with pytest.raises(ValueError, match="worker_batch"):
        fitted.step_s(2, 0.5)
    c = cand(2, 64, 10.0, step_s=0.025)  # dp 4: 16 samples a worker
    r = ranked(c, fitted)
    assert (r.base_step_s, r.predicted_step_s) == (pytest.approx(0.022),
                                                   pytest.approx(0.022 * 0.875))
    assert r.predicted_time_s == pytest.approx(10.0 * 0.022 * 0.875 / 0.025)
    assert r.overhead_s == pytest.approx(0.022 * 0.875 - 0.025)


def test_a_measurement_with_its_own_timing_needs_its_worker_batch():
    with pytest.raises(ValueError, match="worker_batch"):
        Measurement(mp_degree=2, predicted_step_s=0.01, measured_step_s=0.01,
                    retimed=timing(2, 4, (8.0,), (0.01,)))


def test_a_trials_measured_step_is_carried_to_another_batch_by_its_own_timing():
    # A recorded mp 2 trial (docs/benchmarks.md "Sweep"): timed 11.7 ms at worker batch
    # 32 and 14.7 at 64 in its workers, measured 17.6 at 64. Its mp_degree's trial at 32
    # is ranked at 17.6 x 11.7 / 14.7: the trial's level, the timing's shape.
    own = timing(2, 1, (32.0, 64.0), (0.0097, 0.0127))
    fitted = fit_correction([Measurement(mp_degree=2, predicted_step_s=0.0153,
                                         measured_step_s=0.0176, retimed=own,
                                         worker_batch=64.0)])
    assert fitted.step_s(2, 0.0153, 64.0) == pytest.approx(0.0176)
    assert fitted.step_s(2, 0.0153, 32.0) == pytest.approx(0.0176 * 11.7 / 14.7)


def test_a_trials_level_is_carried_from_the_hosts_speed_then_to_its_speed_now():
    # Two mp 2 trials measured 15 and 14 ms against their own timings' 20 and 14 ms
    # (ratios 0.75 and 1) while the host-speed probe took 1.5 and 1.0 ms between their
    # steps. The driver's probe takes 1.2 ms right before it ranks: each ratio is carried
    # to that speed, 0.75 x 1.2 / 1.5 = 0.6 and 1 x 1.2 = 1.2, median 0.9.
    first = timing(2, 4, (8.0, 16.0), (0.010, 0.018))
    second = timing(2, 4, (8.0, 16.0), (0.012, 0.022))
    trials = [Measurement(mp_degree=2, predicted_step_s=0.010, measured_step_s=0.015,
                          retimed=first, worker_batch=16.0, probe_s=0.0015),
              Measurement(mp_degree=2, predicted_step_s=0.010, measured_step_s=0.014,
                          retimed=second, worker_batch=8.0, probe_s=0.0010)]
    fitted = fit_correction(trials, probe_s=0.0012)
    assert fitted.ratio(2) == pytest.approx(0.9)
    assert fitted.step_s(2, 0.5, 16.0) == pytest.approx(0.022 * 0.9)
    assert fitted.trial_probe_s == {2: pytest.approx(0.00125)}
    assert fitted.source(2) == ("2 mp 2 trials, timed in their workers, host-speed probe "
                                "1.250 ms then, 1.200 now")
    assert Correction.from_dict(fitted.to_dict()) == fitted
    # A host twice as slow now as when the one trial ran: twice its step.
    one = fit_correction(trials[:1], probe_s=0.003)
    assert one.step_s(2, 0.5, 16.0) == pytest.approx(2 * 0.015)
    # Without the driver's probe, or with a trial that probed nothing, the level is the
    # trials' as measured, whatever the speed.
    assert fit_correction(trials).ratio(2) == pytest.approx(0.875)
    unprobed = [trials[0], Measurement(mp_degree=2, predicted_step_s=0.010,
                                       measured_step_s=0.014, retimed=second,
                                       worker_batch=8.0)]
    assert fit_correction(unprobed, probe_s=0.0012).ratio(2) == pytest.approx(0.875)
    assert fit_correction(unprobed, probe_s=0.0012).trial_probe_s == {}
    # An mp_degree ranked against its uncorrected step is not carried: its ratio is
    # shrunk against another process's timing (the module's docstring).
    plain = fit_correction([Measurement(mp_degree=1, predicted_step_s=0.01,
                                        measured_step_s=0.02, probe_s=0.002)], probe_s=0.001)
    assert plain.ratio(1) == pytest.approx(1 + 1 / 3)
    with pytest.raises(ValueError, match="probe_s"):
        Measurement(mp_degree=2, predicted_step_s=0.01, measured_step_s=0.01, probe_s=0.0)
