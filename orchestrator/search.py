"""The sweep's Tune search algorithm: it suggests the candidates one by one in the order
placement/sweep_rank.py gives, re-fitting the correction each time a trial completes.

A Searcher rather than a grid: Tune asks it for the next trial only when one may start,
so every trial is ranked with the measurements of all those finished before it.

It limits the trials running at once itself, and --resume rebuilds its state from the
trials the experiment recorded (`resync`), not from the state Tune saved beside them.
Tune writes the experiment's trials, this searcher's state and its concurrency
limiter's state to three files, and a driver killed while they were being copied to
the storage left them from two different moments: the limiter's file still held the
first trial as running where the trials' file had it finished and the second one
pending (tests/e2e/test_jobs.py, 1 run in 4 on 2026-12-07). The resumed limiter then
waited for a trial that would never finish again, and the sweep hung with nothing
running."""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
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
    searcher (tune_controller's flatten_dict: `{key: {"a": 1}}` arrives as `{"key/a": 1}`)
    or from a trial's last result as the experiment recorded it (nested); empty where it
    reported none."""
    if isinstance(result.get(key), dict):
        return result[key]
    prefix = f"{key}/"
    return {k[len(prefix):]: v for k, v in result.items() if k.startswith(prefix)}


@dataclass(frozen=True, kw_only=True)
class RecordedTrial:
    """A trial as the experiment's record holds it (what `resync` needs of Tune's Trial)."""

    trial_id: str
    finished: bool
    """Terminated: a resumed sweep does not run it again (any other trial it resumes)."""
    config: dict
    last_result: dict


class CorrectedSearcher(Searcher):
    """Suggests `{"candidate": ..., "ranked": ..., "order": n}` configs (the n-th
    suggested, from 1), at most `max_trials`, and with each the prediction carried to
    the host's speed (`at_speed`): `probe()` measures that speed right before each
    ranking (seconds of orchestrator/train/speed_probe.py's workload; the median of
    DRIVER_PROBES of them unless given)."""

    def __init__(self, candidates: Sequence[Candidate], max_trials: int, *, metric: str,
                 mode: str = "min", max_concurrent: int = 1,
                 probe: Callable[[], float] | None = None) -> None:
        super().__init__(metric=metric, mode=mode)
        self.probe = probe or partial(SpeedProbe().median_s, DRIVER_PROBES)
        self.candidates = list(candidates)
        self.max_trials = max_trials
        self.max_concurrent = max_concurrent
        self.suggested: dict[str, Candidate] = {}
        self.running: set[str] = set()
        """Suggested trials not yet complete."""
        self.measurements: list[Measurement] = []

    def suggest(self, trial_id: str) -> dict | str | None:
        if len(self.suggested) >= self.max_trials:
            return Searcher.FINISHED
        if len(self.running) >= self.max_concurrent:
            return None
        probe_s = self.probe()
        correction = fit_correction(self.measurements)
        tried = {c.key() for c in self.suggested.values()}
        c = next_candidate(self.candidates, tried, correction)
        if c is None:
            return Searcher.FINISHED
        self.suggested[trial_id] = c
        self.running.add(trial_id)
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
        self.running.discard(trial_id)
        if not error and trial_id in self.suggested:
            self._measure(self.suggested[trial_id], result or {})

    def _measure(self, c: Candidate, result: dict) -> None:
        """Learn from a completed trial of `c` that reported `result`, if it measured."""
        measured = result.get(MEASURED, math.nan)
        if not math.isfinite(measured):
            return
        retimed = _unflattened(result, TIMED_HERE)
        self.measurements.append(Measurement(
            mp_degree=c.mp_degree, predicted_step_s=c.predicted_step_s, measured_step_s=measured,
            retimed=TimedStep.from_dict(retimed) if retimed else None,
            worker_batch=c.config.worker_batch, probe_s=result.get(PROBE)))

    def resync(self, trials: Iterable[RecordedTrial]) -> None:
        """Take the state the recorded `trials` imply, in the order they were suggested:
        each suggested, the finished ones measured, the others running (the resumed sweep
        runs them again). A candidate whose trial the record lacks is free again."""
        self.suggested, self.running, self.measurements = {}, set(), []
        for t in sorted(trials, key=lambda t: t.config.get("order", 0)):
            c = Candidate.from_dict(t.config["candidate"])
            self.suggested[t.trial_id] = c
            if t.finished:
                self._measure(c, t.last_result)
            else:
                self.running.add(t.trial_id)

    def get_state(self) -> dict:
        return {"candidates": self.candidates, "max_trials": self.max_trials,
                "max_concurrent": self.max_concurrent, "suggested": self.suggested,
                "running": self.running, "measurements": self.measurements}

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.get_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.set_state(pickle.load(f))
