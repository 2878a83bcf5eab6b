"""Re-ranking the sweep: the per-mp_degree correction and the order of the trials."""

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.scaling.crossover import HybridConfig
from placement.sweep_rank import (MIN_CORRECTED_SHARE, Correction, Measurement,
                                  fit_correction, next_candidate, ranked)
from placement.sweep_space import Candidate


def cand(mp: int, batch: int, time_s: float, step_s: float = 0.01) -> Candidate:
    return Candidate(config=HybridConfig(dp_degree=8 // mp, mp_degree=mp, global_batch=batch,
                                         num_micro_batches=1),
                     lr=0.1, predicted_step_s=step_s, predicted_time_s=time_s)


def test_fit_correction_hand_computed():
    fitted = fit_correction([Measurement(mp_degree=1, predicted_step_s=0.01, measured_step_s=0.02),
                             Measurement(mp_degree=1, predicted_step_s=0.01, measured_step_s=0.04),
                             Measurement(mp_degree=2, predicted_step_s=0.02, measured_step_s=0.01)])
    assert fitted.overheads_s == {1: pytest.approx(0.02), 2: pytest.approx(-0.01)}
    # Unmeasured: the median of the others.
    assert fitted.overhead_s(4) == pytest.approx(0.005)
    assert fitted.step_s(1, 0.01) == pytest.approx(0.03)
    assert fitted.step_s(2, 0.012) == pytest.approx(MIN_CORRECTED_SHARE * 0.012)
    assert fit_correction([]).step_s(1, 0.01) == 0.01
    assert Correction.from_dict(fitted.to_dict()) == fitted


def test_a_measurement_reorders_the_trials_not_yet_run():
    cands = [cand(1, 64, 10.0), cand(1, 32, 12.0), cand(2, 64, 11.0), cand(2, 32, 13.0)]
    # Coverage: the best of each mp_degree first, whatever was measured.
    assert next_candidate(cands, set(), Correction()).key() == "mp1-b64"
    assert next_candidate(cands, {"mp1-b64"}, Correction()).key() == "mp2-b64"
    tried = {"mp1-b64", "mp2-b64"}
    assert next_candidate(cands, tried, Correction()).key() == "mp1-b32"
    # mp 1 measured 10 ms a step slower than predicted (2x its 10 ms), mp 2 as predicted:
    # mp2-b32 (13 s) now ranks before mp1-b32 (24 s).
    slower_mp1 = fit_correction([
        Measurement(mp_degree=1, predicted_step_s=0.01, measured_step_s=0.02),
        Measurement(mp_degree=2, predicted_step_s=0.01, measured_step_s=0.01)])
    assert next_candidate(cands, tried, slower_mp1).key() == "mp2-b32"
    assert ranked(cands[1], slower_mp1).predicted_time_s == pytest.approx(24.0)
    assert next_candidate(cands, {c.key() for c in cands}, slower_mp1) is None


def reference_order(cands, measured_s):
    """The whole sequence by brute force: at each pick, recompute every candidate's
    corrected time from the raw measurements (measured - predicted per trial, median
    per mp_degree, the median of those for an unmeasured one) and sort them all."""
    order = []
    while len(order) < len(cands):
        per_mp = {}
        for c in order:
            per_mp.setdefault(c.mp_degree, []).append(measured_s[c.key()] - c.predicted_step_s)
        medians = {m: statistics.median(v) for m, v in per_mp.items()}
        shared = statistics.median(medians.values()) if medians else 0.0

        def corrected_time(c):
            step = max(c.predicted_step_s + medians.get(c.mp_degree, shared),
                       MIN_CORRECTED_SHARE * c.predicted_step_s)
            return c.predicted_time_s * step / c.predicted_step_s

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
