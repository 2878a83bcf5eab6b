"""Re-ranking the sweep as trials report: the predicted step time corrected by what the
trials measured, and the order in which the candidates not yet run are tried.

The correction is an overhead per mp_degree: measured step = predicted step + overhead.
Where the predicted step was timed here before the sweep (the worker's own executor at
the trial's batch, placement/scaling/timed_step.py), what is left for the overhead is
what Ray Train adds around the same code: the other worker process and Ray's own
processes taking slices of the cores, gloo's allreduce inside DDP's backward. That
costs a step about the same at every batch. Measured on this machine with the scaling
model's steps, the misses of one mp_degree already hardly moved with the batch (mp 1:
+11.8 ms at global batch 64, +12.5 at 32), where a ratio fitted on one batch missed
the other by 18% and more. An overhead + ratio fit would take two trials of every
mp_degree before it said anything, where a sweep of a few trials has one or two. An
mp_degree not measured yet takes the median overhead of those that were (the host's
load is shared), or none before any trial has reported."""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from placement.sweep_space import Candidate, best_per_mp_degree


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What one finished trial taught: its mp_degree, the model's uncorrected step time
    for it and the median step time it measured, in seconds."""

    mp_degree: int
    predicted_step_s: float
    measured_step_s: float

    def __post_init__(self) -> None:
        if not (self.predicted_step_s > 0 and self.measured_step_s > 0):
            raise ValueError(f"predicted_step_s={self.predicted_step_s} and measured_step_s="
                             f"{self.measured_step_s} must both be > 0")

    @property
    def overhead_s(self) -> float:
        return self.measured_step_s - self.predicted_step_s


#: A corrected step never goes below this share of the model's: an overhead learned
#: from a trial that ran faster than predicted says little of a much shorter step.
MIN_CORRECTED_SHARE = 0.25


@dataclass(frozen=True, kw_only=True)
class Correction:
    """measured step = predicted step + overhead, one overhead per measured mp_degree."""

    overheads_s: Mapping[int, float] = field(default_factory=dict)
    """Median measured - predicted step time of each measured mp_degree (seconds)."""
    shared_overhead_s: float = 0.0
    """The overhead of an mp_degree not measured yet: the median of `overheads_s`, else 0."""

    def overhead_s(self, mp_degree: int) -> float:
        return self.overheads_s.get(mp_degree, self.shared_overhead_s)

    def step_s(self, mp_degree: int, predicted_step_s: float) -> float:
        return max(predicted_step_s + self.overhead_s(mp_degree),
                   MIN_CORRECTED_SHARE * predicted_step_s)

    def source(self, mp_degree: int) -> str:
        """Where the overhead of `mp_degree` comes from, in words."""
        if mp_degree in self.overheads_s:
            return f"mp {mp_degree} trials"
        return "other mp_degrees' trials" if self.overheads_s else "none (no trial yet)"

    def to_dict(self) -> dict[str, Any]:
        return {"overheads_s": {str(m): o for m, o in sorted(self.overheads_s.items())},
                "shared_overhead_s": self.shared_overhead_s}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Correction:
        return cls(overheads_s={int(m): o for m, o in d["overheads_s"].items()},
                   shared_overhead_s=d["shared_overhead_s"])


def fit_correction(measurements: Sequence[Measurement]) -> Correction:
    """The per-mp_degree overhead of the trials measured so far (medians: one trial
    slowed by a neighbour's burst does not move it much once there are three)."""
    by_mp: dict[int, list[float]] = {}
    for m in measurements:
        by_mp.setdefault(m.mp_degree, []).append(m.overhead_s)
    overheads = {mp: statistics.median(os) for mp, os in by_mp.items()}
    return Correction(overheads_s=overheads, shared_overhead_s=statistics.median(
        overheads.values()) if overheads else 0.0)


@dataclass(frozen=True, kw_only=True)
class Ranked:
    """The prediction a trial was ranked by: the model's, with the correction in force."""

    predicted_step_s: float
    predicted_time_s: float
    overhead_s: float
    correction: Correction

    def to_dict(self) -> dict[str, Any]:
        return {"predicted_step_s": self.predicted_step_s,
                "predicted_time_s": self.predicted_time_s, "overhead_s": self.overhead_s,
                "correction": self.correction.to_dict()}


def ranked(c: Candidate, correction: Correction) -> Ranked:
    """Time to accuracy is steps x step time: the corrected step scales it."""
    step = correction.step_s(c.mp_degree, c.predicted_step_s)
    return Ranked(predicted_step_s=step,
                  predicted_time_s=c.predicted_time_s * step / c.predicted_step_s,
                  overhead_s=step - c.predicted_step_s, correction=correction)


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
