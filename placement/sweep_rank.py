"""Re-ranking the sweep as trials report: the predicted step time corrected by what the
trials measured, and the order in which the candidates not yet run are tried.

The correction is a ratio per mp_degree, measured step = predicted step x ratio, shrunk
towards 1 by how little evidence is behind it. The predicted step is timed here before
the sweep, as the trials run it (placement/scaling/timed_step.py: the worker's own
executor and gradient sync, its dp workers side by side), so what is left between a
trial and its timing is mostly the load other processes put on the shared cores during
the trial's few seconds of steps: it slows compute in proportion (a ratio, not an
overhead), and it changes from one trial to the next. Recorded on this machine (14
calibrated trials of demos and e2e runs, docs/benchmarks.md "Sweep"): a trial measured
-39% to +58% against its timing, the first trial of an mp_degree told little of its
second, and taking the first trial's full miss as the correction put 3 of the 14 within
15% where the timing alone put 7. So the timing counts as `PRIOR_TRIALS` trials that
measured exactly it: with n trials of an mp_degree whose median ratio is r, the
correction is 1 + (r - 1) n / (n + PRIOR_TRIALS). One trial moves the prediction by a
third of its miss; a difference the trials keep repeating takes over as they add up.
Replayed on the same 14 trials, this puts 7 within 15%: no worse than the timing alone,
where the full overhead did harm.
An mp_degree not measured yet takes the median ratio of all trials (the host's load is
shared), shrunk the same way by their number.

A trial may also time its own mp_degree's step at every worker batch, in its own workers
just before its first step (orchestrator/train/step_timing.py `time_in_worker`): the same
rounds as the timing before the sweep, but in a Ray Train worker group of the trial's
shape. Once a trial of an mp_degree has done so, the rest of that mp_degree is ranked by
the step its trials measured, carried to the candidate's worker batch by their own
timing: the median of those timings at the candidate's batch, times the median of their
measured / own timing at their own batch, in full (not shrunk). Why: on this machine the
step's level follows the host's speed, which moves within seconds, far more than its
shape over the batch does (docs/benchmarks.md "Sweep": 24 fresh processes timing mp 2 on
a quiet box, 6.3-11.3 ms at one batch, coefficient of variation 13%, the ratio between
two batches within each process 3.7%). The two figures of such a ratio are one
process's, so the shrinking, which guards against another process's level, does not
apply: the timing's rounds (the batches interleaved) give the shape, the trial's
measured steps (59 against the timing's 25 per batch) the level. Replayed on the five
calibrated trials recorded on the quiet box at commit 03ec862, the shrunk ratio put 4
within 15% (+18.9% the miss), the full ratio all 5 (-10.1 to +6.9%). What no rule here
can foresee is the host's speed while the next trial runs: a prediction taken from
another process errs by about sqrt(2) x 13% here.

Where the trials probed the host's speed between their steps (a fixed copy within the
cache on one thread, orchestrator/train/speed_probe.py) and the driver probed it right
before a ranking, `fit_correction(..., probe_s=...)` carries each trial's ratio from its
speed to the driver's, in proportion: ratio x driver's probe / trial's probe, from what
is known before the trial starts. In one process under other sessions' load the mp 2
step's level followed that probe over windows of 40 steps (correlation 0.80, log-log
slope 1.27); but across processes the driver's probe did not foresee the next trial's
level, and on the runs recorded so far the carried prediction missed more than the
level as measured (docs/benchmarks.md "Sweep"). So the sweep ranks without it and
records it beside each trial (orchestrator/search.py)."""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from placement.scaling.timed_step import TimedStep
from placement.sweep_space import Candidate, best_per_mp_degree

#: How many trials the timed step is worth against the trials' own measures.
PRIOR_TRIALS = 2


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What one finished trial taught: its mp_degree, the model's uncorrected step time
    for it and the median step time it measured, in seconds; and, where the trial timed
    its mp_degree's step in its own workers, that timing and the trial's worker batch."""

    mp_degree: int
    predicted_step_s: float
    measured_step_s: float
    retimed: TimedStep | None = None
    """The trial's own timing of its mp_degree's worker step (None: it timed nothing)."""
    worker_batch: float | None = None
    """Samples per worker per step of the trial (needed with `retimed`)."""
    probe_s: float | None = None
    """The median host-speed probe the trial ran between its steps, in seconds
    (orchestrator/train/speed_probe.py); None where it ran none."""

    def __post_init__(self) -> None:
        if not (self.predicted_step_s > 0 and self.measured_step_s > 0):
            raise ValueError(f"predicted_step_s={self.predicted_step_s} and measured_step_s="
                             f"{self.measured_step_s} must both be > 0")
        if self.retimed is not None and self.worker_batch is None:
            raise ValueError("a measurement with its trial's own timing needs its worker_batch")
        if self.probe_s is not None and not self.probe_s > 0:
            raise ValueError(f"probe_s={self.probe_s} must be > 0 (or None: no probe ran)")

    @property
    def ratio(self) -> float:
        """Measured over the step that ranked the trial before any correction."""
        return self.measured_step_s / self.predicted_step_s

    @property
    def retimed_ratio(self) -> float:
        """Measured over the trial's own timing at its worker batch."""
        assert self.retimed is not None and self.worker_batch is not None
        return self.measured_step_s / self.retimed.step_s(self.worker_batch)


def shrunk(ratios: Sequence[float]) -> float:
    """The median of `ratios`, pulled towards 1 as if `PRIOR_TRIALS` more had been 1."""
    n = len(ratios)
    return 1.0 + (statistics.median(ratios) - 1.0) * n / (n + PRIOR_TRIALS)


@dataclass(frozen=True, kw_only=True)
class Correction:
    """measured step = base step x ratio, one ratio per measured mp_degree. The base step
    is the trials' own timing of their mp_degree where they timed it (`retimed`), else
    the step that ranked the candidate before any correction."""

    ratios: Mapping[int, float] = field(default_factory=dict)
    """The ratio of each measured mp_degree (shrunk unless against its trials' own
    timings, `fit_correction`)."""
    trials: Mapping[int, int] = field(default_factory=dict)
    """How many trials of each mp_degree stand behind its ratio."""
    shared_ratio: float = 1.0
    """The ratio of an mp_degree not measured yet: all trials' median, shrunk; else 1."""
    retimed: Mapping[int, tuple[TimedStep, ...]] = field(default_factory=dict)
    """Each mp_degree's steps as its trials timed them in their own workers."""
    probe_s: float | None = None
    """The host-speed probe the driver ran right before this ranking, in seconds."""
    trial_probe_s: Mapping[int, float] = field(default_factory=dict)
    """The median probe of the trials behind each ratio carried to `probe_s` (an
    mp_degree is absent where its ratio is not: `fit_correction`)."""

    def ratio(self, mp_degree: int) -> float:
        return self.ratios.get(mp_degree, self.shared_ratio)

    def base_s(self, mp_degree: int, predicted_step_s: float,
               worker_batch: float | None = None) -> float:
        """The step the ratio multiplies: the median of the trials' own timings at
        `worker_batch` where `mp_degree`'s trials timed it, else `predicted_step_s`."""
        if mp_degree not in self.retimed:
            return predicted_step_s
        if worker_batch is None:
            raise ValueError(f"mp {mp_degree} ranks from its trials' own timings: give the "
                             "candidate's worker_batch")
        return statistics.median(t.step_s(worker_batch) for t in self.retimed[mp_degree])

    def step_s(self, mp_degree: int, predicted_step_s: float,
               worker_batch: float | None = None) -> float:
        return self.base_s(mp_degree, predicted_step_s, worker_batch) * self.ratio(mp_degree)

    def calibrated(self, mp_degree: int) -> bool:
        return mp_degree in self.ratios

    def source(self, mp_degree: int) -> str:
        """Where the ratio of `mp_degree` comes from, in words."""
        if mp_degree in self.ratios:
            n = self.trials[mp_degree]
            timed = (f", timed in {'their' if n > 1 else 'its'} workers"
                     if mp_degree in self.retimed else "")
            speed = (f", host-speed probe {self.trial_probe_s[mp_degree] * 1e3:.3f} ms then, "
                     f"{self.probe_s * 1e3:.3f} now" if mp_degree in self.trial_probe_s else "")
            return f"{n} mp {mp_degree} trial{'s' * (n > 1)}{timed}{speed}"
        if self.ratios:
            n = sum(self.trials.values())
            return f"{n} trial{'s' * (n > 1)} of other mp_degrees"
        return "none (no trial yet)"

    def to_dict(self) -> dict[str, Any]:
        return {"ratios": {str(m): r for m, r in sorted(self.ratios.items())},
                "trials": {str(m): n for m, n in sorted(self.trials.items())},
                "shared_ratio": self.shared_ratio,
                "retimed": {str(m): [t.to_dict() for t in ts]
                            for m, ts in sorted(self.retimed.items())},
                "probe_s": self.probe_s,
                "trial_probe_s": {str(m): p for m, p in sorted(self.trial_probe_s.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Correction:
        return cls(ratios={int(m): r for m, r in d["ratios"].items()},
                   trials={int(m): n for m, n in d["trials"].items()},
                   shared_ratio=d["shared_ratio"],
                   retimed={int(m): tuple(TimedStep.from_dict(t) for t in ts)
                            for m, ts in d["retimed"].items()},
                   probe_s=d.get("probe_s"),
                   trial_probe_s={int(m): p for m, p in d.get("trial_probe_s", {}).items()})


def fit_correction(measurements: Sequence[Measurement],
                   probe_s: float | None = None) -> Correction:
    """The ratio of each mp_degree measured so far (medians: one trial caught by a
    neighbour's burst moves it less once there are three), shrunk where it is against
    the step that ranked the trials. An mp_degree whose trials timed their own step
    keeps only those trials: the median of their ratios against their own timings, in
    full (the module's docstring says why); and where those trials probed the host's
    speed and the driver's probe right now is `probe_s`, each ratio is carried from the
    speed its trial ran at to the speed now (`_at_speed`)."""
    by_mp: dict[int, list[Measurement]] = {}
    for m in measurements:
        by_mp.setdefault(m.mp_degree, []).append(m)
    ratios, trials, retimed, trial_probe_s = {}, {}, {}, {}
    for mp, ms in by_mp.items():
        own = [m for m in ms if m.retimed is not None]
        if own:
            retimed[mp] = tuple(m.retimed for m in own)
            trials[mp] = len(own)
            if probe_s is not None and all(m.probe_s is not None for m in own):
                ratios[mp] = statistics.median(_at_speed(m, probe_s) for m in own)
                trial_probe_s[mp] = statistics.median(m.probe_s for m in own)
            else:
                ratios[mp] = statistics.median(m.retimed_ratio for m in own)
        else:
            ratios[mp], trials[mp] = shrunk([m.ratio for m in ms]), len(ms)
    return Correction(ratios=ratios, trials=trials, retimed=retimed,
                      shared_ratio=shrunk([m.ratio for m in measurements])
                      if measurements else 1.0,
                      probe_s=probe_s, trial_probe_s=trial_probe_s)


def _at_speed(m: Measurement, probe_s: float) -> float:
    """`m`'s ratio against its own timing, at the host speed whose probe takes `probe_s`:
    the step's level scaled by the probe's, in proportion (one core's arithmetic; the
    worker's step is the same kind of work, on as many cores as it has devices)."""
    assert m.probe_s is not None
    return m.retimed_ratio * probe_s / m.probe_s


@dataclass(frozen=True, kw_only=True)
class Ranked:
    """The prediction a trial was ranked by: the model's, with the correction in force."""

    predicted_step_s: float
    predicted_time_s: float
    overhead_s: float
    """`predicted_step_s` less the candidate's uncorrected step."""
    base_step_s: float
    """The step the correction's ratio multiplied (`Correction.base_s`)."""
    correction: Correction

    def to_dict(self) -> dict[str, Any]:
        return {"predicted_step_s": self.predicted_step_s,
                "predicted_time_s": self.predicted_time_s, "overhead_s": self.overhead_s,
                "base_step_s": self.base_step_s, "correction": self.correction.to_dict()}


def ranked(c: Candidate, correction: Correction) -> Ranked:
    """Time to accuracy is steps x step time: the corrected step scales it, by the base
    step's ratio to the uncorrected one and then the correction's ratio, so that a
    candidate ranked from its uncorrected step keeps its time times exactly its ratio
    (two that tie before a correction common to both still tie, and break by key; the
    ratio of the corrected step to the uncorrected one rounds differently per step)."""
    base = correction.base_s(c.mp_degree, c.predicted_step_s, c.config.worker_batch)
    ratio = correction.ratio(c.mp_degree)
    step = base * ratio
    return Ranked(predicted_step_s=step,
                  predicted_time_s=c.predicted_time_s * (base / c.predicted_step_s) * ratio,
                  overhead_s=step - c.predicted_step_s, base_step_s=base,
                  correction=correction)


def next_candidate(candidates: Sequence[Candidate], tried: Collection[str],
                   correction: Correction) -> Candidate | None:
    """The candidate to try next, given the keys already `tried` (finished or running).

    Coverage first: while some mp_degree has no trial, the best candidate of each such
    mp_degree competes, so that every mp_degree is measured before any is tried twice.
    Then the rest of the budget goes where the ranking is uncertain: the untried
    candidate of least corrected time to accuracy, the one most likely to overturn the
    incumbent (its figure is still a prediction, the incumbent's a measurement)."""
    untried = [c for c in candidates if c.key() not in tried]
    if not untried:
        return None
    covered = {c.mp_degree for c in candidates if c.key() in tried}
    uncovered = [c for c in untried if c.mp_degree not in covered]
    pool = list(best_per_mp_degree(uncovered).values()) if uncovered else untried
    return min(pool, key=lambda c: (ranked(c, correction).predicted_time_s, c.key()))
