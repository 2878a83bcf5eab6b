"""The sweep's Tune search algorithm, driven as Tune drives it (no Ray needed)."""

import pytest
from ray.tune.search import Searcher

from orchestrator.search import MEASURED, CorrectedSearcher
from placement.scaling.crossover import HybridConfig
from placement.sweep_space import Candidate


def cand(mp: int, batch: int, time_s: float) -> Candidate:
    return Candidate(config=HybridConfig(dp_degree=2 // mp, mp_degree=mp, global_batch=batch,
                                         num_micro_batches=1),
                     lr=0.1, predicted_step_s=0.01, predicted_time_s=time_s)


CANDIDATES = [cand(1, 64, 10.0), cand(1, 32, 12.0), cand(2, 64, 11.0), cand(2, 32, 13.0)]


def test_each_trial_carries_the_prediction_that_ranked_it_and_a_measure_reorders(tmp_path):
    s = CorrectedSearcher(CANDIDATES, max_trials=3, metric="projected_time_s")
    first = s.suggest("t1")
    assert first["candidate"]["config"]["mp_degree"] == 1 and first["order"] == 1
    assert first["ranked"]["overhead_s"] == 0.0
    s.on_trial_complete("t1", {MEASURED: 0.04})  # mp 1 runs 4x its prediction
    second = s.suggest("t2")
    assert Candidate.from_dict(second["candidate"]).key() == "mp2-b64"
    # Shared until mp 2 reports: ratio 1 + 3 x 1/3.
    assert second["ranked"]["overhead_s"] == pytest.approx(0.01)
    assert second["ranked"]["predicted_step_s"] == pytest.approx(0.02)
    s.on_trial_complete("t2", {MEASURED: 0.01})
    # Saved and restored (as Tune does on --resume), the order goes on.
    s.save(str(tmp_path / "searcher.pkl"))
    restored = CorrectedSearcher([], max_trials=0, metric="projected_time_s")
    restored.restore(str(tmp_path / "searcher.pkl"))
    third = restored.suggest("t3")
    # mp1-b32 corrected to 12 s x 2 = 24 s, mp2-b32 to 13 s.
    assert Candidate.from_dict(third["candidate"]).key() == "mp2-b32"
    assert third["ranked"]["correction"]["ratios"] == {"1": pytest.approx(2.0),
                                                       "2": pytest.approx(1.0)}
    assert restored.suggest("t4") == Searcher.FINISHED


def test_a_failed_trial_teaches_nothing():
    s = CorrectedSearcher(CANDIDATES, max_trials=4, metric="projected_time_s")
    s.suggest("t1")
    s.on_trial_complete("t1", None, error=True)
    assert s.measurements == []
    assert s.suggest("t2")["ranked"]["overhead_s"] == 0.0


def test_a_trials_record_keeps_the_prediction_that_ranked_it():
    from orchestrator.sweep_trials import trial_record

    s = CorrectedSearcher(CANDIDATES, max_trials=4, metric="projected_time_s")
    s.suggest("t1")
    s.on_trial_complete("t1", {MEASURED: 0.04})
    config = s.suggest("t2")
    s.on_trial_complete("t2", {MEASURED: 0.011})
    metrics = {MEASURED: 0.011, "projected_time_s": 99.0, "loss": 4.0, "step": 30,
               "time_compute_s": 0.01}
    t = trial_record(config, metrics)
    assert (t["key"], t["order"], t["calibrated"]) == ("mp2-b64", 2, False)
    assert t["predicted_step_s"] == pytest.approx(0.02)  # 10 ms x mp 1's shrunk ratio, 2
    assert t["error"] == pytest.approx(0.011 / 0.02 - 1)
    assert t["step_source"] == CANDIDATES[2].step_source  # what the prediction is made of
    # mp2-b32 at 13 s x 1.033 ranks before mp1-b32 at 12 s x 2, by mp 2's own ratio.
    third = trial_record(s.suggest("t3"), metrics)
    assert (third["key"], third["calibrated"], third["correction_from"]) == (
        "mp2-b32", True, "1 mp 2 trial")
    assert third["predicted_step_s"] == pytest.approx(0.01 * (1 + 0.1 / 3))


def _mp1_own_timing(probe_s: float | None = None):
    """A trial's own timing of mp 1 at dp 2: worker batches 16 and 32 (global 32 and
    64), steps 15 and 25 ms."""
    from placement.scaling.timed_step import TimedStep

    return TimedStep(mp_degree=1, dp_degree=2, num_micro_batches=1, batches=(16.0, 32.0),
                     compute_s=(0.015, 0.025), allreduce_s=(0.0, 0.0), optimizer_s=0.0,
                     rounds=5, probe_s=probe_s)


def test_a_trials_own_timing_ranks_the_rest_of_its_mp_degree():
    from ray.tune.utils import flatten_dict

    from orchestrator.train.job import TIMED_HERE

    own = _mp1_own_timing()
    s = CorrectedSearcher(CANDIDATES, max_trials=4, metric="projected_time_s")
    assert Candidate.from_dict(s.suggest("t1")["candidate"]).key() == "mp1-b64"
    # Flattened, as Tune hands a searcher its results.
    s.on_trial_complete("t1", flatten_dict({MEASURED: 0.02, TIMED_HERE: own.to_dict()}))
    s.suggest("t2")
    s.on_trial_complete("t2", {MEASURED: 0.04})  # mp 2: ratio 4, shrunk to 2
    third = s.suggest("t3")
    # mp1-b32 from its trial's own timing at worker batch 16, 15 ms, times mp 1's 20 / 25
    # in full (both figures the trial's own): 12 ms, 12 s x 1.2 = 14.4 s against
    # mp2-b32's 13 s x 2.
    assert Candidate.from_dict(third["candidate"]).key() == "mp1-b32"
    assert third["ranked"]["base_step_s"] == pytest.approx(0.015)
    assert third["ranked"]["predicted_step_s"] == pytest.approx(0.012)
    assert third["ranked"]["predicted_time_s"] == pytest.approx(14.4)


def test_the_driver_probes_the_host_before_each_ranking_and_records_the_level_carried_to_it():
    from ray.tune.utils import flatten_dict

    from orchestrator.sweep_trials import trial_record
    from orchestrator.train.job import PROBE, TIMED_HERE

    own = _mp1_own_timing(probe_s=0.0011)
    # The host as the driver's probe finds it before each ranking: 1 ms, 1 ms, then twice
    # as slow as when mp1-b64 ran (its own probe between its steps: 1 ms).
    probes = iter([0.001, 0.001, 0.002])
    s = CorrectedSearcher(CANDIDATES, max_trials=3, metric="projected_time_s",
                          probe=lambda: next(probes))
    first = s.suggest("t1")
    assert first["at_speed"]["probe_s"] == 0.001
    assert first["at_speed"]["predicted_step_s"] == first["ranked"]["predicted_step_s"]
    s.on_trial_complete("t1", flatten_dict({MEASURED: 0.02, TIMED_HERE: own.to_dict(),
                                            PROBE: 0.001}))
    assert s.measurements[0].probe_s == 0.001
    s.suggest("t2")
    s.on_trial_complete("t2", {MEASURED: 0.08})  # mp 2: ratio 8, shrunk to 3.3
    third = s.suggest("t3")
    assert Candidate.from_dict(third["candidate"]).key() == "mp1-b32"
    # Ranked by mp1-b32's trial's own 15 ms at worker batch 16, times 20 / 25 measured
    # against its own timing: 12 ms. Carried to the host's speed now, twice that.
    assert third["ranked"]["predicted_step_s"] == pytest.approx(0.012)
    assert third["at_speed"]["predicted_step_s"] == pytest.approx(0.024)
    metrics = {MEASURED: 0.025, "projected_time_s": 99.0, "loss": 4.0, "step": 30,
               PROBE: 0.0021, TIMED_HERE: own.to_dict()}
    t = trial_record(third, metrics)
    assert (t["ranked_probe_s"], t["probe_s"], t["timed_here_probe_s"]) == (
        0.002, 0.0021, 0.0011)
    assert t["at_speed_step_s"] == pytest.approx(0.024)
    assert t["at_speed_error"] == pytest.approx(0.025 / 0.024 - 1)
    assert t["error"] == pytest.approx(0.025 / 0.012 - 1)
    assert "1.000 ms then, 2.000 now" in t["at_speed_from"]
    assert "host-speed probe" not in t["correction_from"]
    # The budget is spent: no ranking, so no probe (the fake has none left to give).
    assert s.suggest("t4") == Searcher.FINISHED


def test_no_more_trials_run_at_once_than_allowed_and_a_failed_one_frees_its_place():
    s = CorrectedSearcher(CANDIDATES, max_trials=4, metric="projected_time_s",
                          max_concurrent=2, probe=lambda: 0.001)
    assert s.suggest("t1") and s.suggest("t2")
    assert s.suggest("t3") is None  # two running
    s.on_trial_complete("t1", None, error=True)
    assert s.suggest("t3")
    assert s.suggest("t4") is None
    s.on_trial_complete("t2", {MEASURED: 0.01})
    assert s.suggest("t4")
    assert s.suggest("t5") == Searcher.FINISHED


def test_a_resumed_searcher_takes_the_experiments_record_over_its_own_saved_state():
    """The trials' record and the searcher's saved state may come from different moments
    of a killed driver: the record wins (orchestrator/search.py)."""
    from orchestrator.search import RecordedTrial
    from orchestrator.train.job import TIMED_HERE

    s = CorrectedSearcher(CANDIDATES, max_trials=4, metric="projected_time_s",
                          probe=lambda: 0.001)
    first = s.suggest("t1")
    s.on_trial_complete("t1", {MEASURED: 0.04})
    second = s.suggest("t2")
    s.on_trial_complete("t2", {MEASURED: 0.01})
    phantom = s.suggest("t3")  # suggested, but the record never got it
    # The record: t1 finished (its last result as recorded, nested), t2 still running.
    own = _mp1_own_timing()
    s.resync([RecordedTrial(trial_id="t2", finished=False, config=second, last_result={}),
              RecordedTrial(trial_id="t1", finished=True, config=first,
                            last_result={MEASURED: 0.04, TIMED_HERE: own.to_dict()})])
    assert list(s.suggested) == ["t1", "t2"] and s.running == {"t2"}
    assert [m.measured_step_s for m in s.measurements] == [0.04]
    assert s.measurements[0].retimed == own
    assert s.suggest("t4") is None  # t2 runs again first
    s.on_trial_complete("t2", {MEASURED: 0.01})
    # The phantom's candidate is free again, and nothing recorded is repeated.
    again = s.suggest("t4")
    assert Candidate.from_dict(again["candidate"]).key() == Candidate.from_dict(
        phantom["candidate"]).key()
    assert again["order"] == 3
