"""The sweep's Tune search algorithm: it suggests the candidates one by one in the order
placement/sweep_rank.py gives, re-fitting the correction each time a trial completes.

A Searcher rather than a grid: Tune asks it for the next trial only when one may start,
so every trial is ranked with the measurements of all those finished before it. Its
state is saved with the experiment (save/restore), so --resume continues the order."""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Sequence
from functools import partial

from ray.tune.search import Searcher

from orchestrator.train.job import PROBE, TIMED_HERE
from orchestrator.train.speed_probe import SpeedProbe
from placement.scaling.timed_step import TimedStep
from placement.sweep_rank import Measurement, fit_correction, next_candidate, ranked
from placement.sweep_space import Candidate

#: The worker's metric of a trial's median step time (warm-up steps left out).
MEASURED = "measured_step_s"
#: Host-speed probes the driver runs back to back right before it ranks a trial (their
#: median counts; about 20 ms in all).
DRIVER_PROBES = 15


def _unflattened(result: dict, key: str) -> dict:
    """The dict a worker reported under `key`, from the flattened result Tune hands a
    searcher (tune_controller's flatten_dict: `{key: {"a": 1}}` arrives as `{"key/a": 1}`);
    empty where it reported none."""
    prefix = f"{key}/"
    return {k[len(prefix):]: v for k, v in result.items() if k.startswith(prefix)}


class CorrectedSearcher(Searcher):
    """Suggests `{"candidate": ..., "ranked": ..., "order": n}` configs (the n-th
    suggested, from 1), at most `max_trials`, and with each the prediction carried to
    the host's speed (`at_speed`): `probe()` measures that speed right before each
    ranking (seconds of orchestrator/train/speed_probe.py's workload; the median of
    DRIVER_PROBES of them unless given)."""

    def __init__(self, candidates: Sequence[Candidate], max_trials: int, *, metric: str,
                 mode: str = "min", probe: Callable[[], float] | None = None) -> None:
        super().__init__(metric=metric, mode=mode)
        self.probe = probe or partial(SpeedProbe().median_s, DRIVER_PROBES)
        self.candidates = list(candidates)
        self.max_trials = max_trials
        self.suggested: dict[str, Candidate] = {}
        self.measurements: list[Measurement] = []

    def suggest(self, trial_id: str) -> dict | str | None:
        if len(self.suggested) >= self.max_trials:
            return Searcher.FINISHED
        probe_s = self.probe()
        correction = fit_correction(self.measurements)
        tried = {c.key() for c in self.suggested.values()}
        c = next_candidate(self.candidates, tried, correction)
        if c is None:
            return Searcher.FINISHED
        self.suggested[trial_id] = c
        # What the trials' levels carried to the host's speed now predict, recorded beside
        # the prediction that ranks: on the runs recorded so far it missed more than the
        # levels as measured (docs/benchmarks.md "Sweep"), so it does not rank, and every
        # run measures it again.
        at_speed = fit_correction(self.measurements, probe_s=probe_s)
        return {"candidate": c.to_dict(), "ranked": ranked(c, correction).to_dict(),
                "at_speed": {"probe_s": probe_s,
                             "predicted_step_s": ranked(c, at_speed).predicted_step_s,
                             "from": at_speed.source(c.mp_degree)},
                "order": len(self.suggested)}

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        measured = (result or {}).get(MEASURED, math.nan)
        if error or trial_id not in self.suggested or not math.isfinite(measured):
            return
        c = self.suggested[trial_id]
        retimed = _unflattened(result, TIMED_HERE)
        self.measurements.append(Measurement(
            mp_degree=c.mp_degree, predicted_step_s=c.predicted_step_s, measured_step_s=measured,
            retimed=TimedStep.from_dict(retimed) if retimed else None,
            worker_batch=c.config.worker_batch, probe_s=result.get(PROBE)))

    def get_state(self) -> dict:
        return {"candidates": self.candidates, "max_trials": self.max_trials,
                "suggested": self.suggested, "measurements": self.measurements}

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.get_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.set_state(pickle.load(f))
