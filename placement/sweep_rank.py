"""Re-ranking the sweep as trials report: the scaling model's step time corrected by
what the trials measured, and the order in which the candidates not yet run are tried.

The correction is a ratio per mp_degree, measured step = ratio x predicted step. Why
this shape: what the model leaves out inside Ray Train on a shared host (the worker
processes' threads competing with Ray's own for the cores, the first steps' allocations,
gloo's loopback copies) slows a worker's step by a factor that depends on how many
threads its mp_degree runs and how many workers share the host, i.e. on the mp_degree,
and hardly on the batch. An overhead + ratio fit would take two trials of every
mp_degree before it said anything, where a sweep of a few trials has one or two. An
mp_degree not measured yet takes the median ratio of those that were (the host's load
is shared), or 1 before any trial has reported."""

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
    def ratio(self) -> float:
        return self.measured_step_s / self.predicted_step_s


@dataclass(frozen=True, kw_only=True)
class Correction:
    """measured step = ratio x predicted step, with one ratio per measured mp_degree."""

    ratios: Mapping[int, float] = field(default_factory=dict)
    """Median measured / predicted step time of each measured mp_degree."""
    shared_ratio: float = 1.0
    """The ratio of an mp_degree not measured yet: the median of `ratios`, else 1."""

    def ratio(self, mp_degree: int) -> float:
        return self.ratios.get(mp_degree, self.shared_ratio)

    def source(self, mp_degree: int) -> str:
        """Where the ratio of `mp_degree` comes from, in words."""
        if mp_degree in self.ratios:
            return f"mp {mp_degree} trials"
        return "other mp_degrees' trials" if self.ratios else "none (no trial yet)"

    def to_dict(self) -> dict[str, Any]:
        return {"ratios": {str(m): r for m, r in sorted(self.ratios.items())},
                "shared_ratio": self.shared_ratio}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Correction:
        return cls(ratios={int(m): r for m, r in d["ratios"].items()},
                   shared_ratio=d["shared_ratio"])


def fit_correction(measurements: Sequence[Measurement]) -> Correction:
    """The per-mp_degree ratio of the trials measured so far (medians: one trial slowed
    by a neighbour's burst does not move it much once there are three)."""
    by_mp: dict[int, list[float]] = {}
    for m in measurements:
        by_mp.setdefault(m.mp_degree, []).append(m.ratio)
    ratios = {mp: statistics.median(rs) for mp, rs in by_mp.items()}
    return Correction(ratios=ratios,
                      shared_ratio=statistics.median(ratios.values()) if ratios else 1.0)


@dataclass(frozen=True, kw_only=True)
class Ranked:
    """The prediction a trial was ranked by: the model's, times the correction in force."""

    predicted_step_s: float
    predicted_time_s: float
    ratio: float
    correction: Correction

    def to_dict(self) -> dict[str, Any]:
        return {"predicted_step_s": self.predicted_step_s,
                "predicted_time_s": self.predicted_time_s, "ratio": self.ratio,
                "correction": self.correction.to_dict()}


def ranked(c: Candidate, correction: Correction) -> Ranked:
    r = correction.ratio(c.mp_degree)
    return Ranked(predicted_step_s=r * c.predicted_step_s,
                  predicted_time_s=r * c.predicted_time_s, ratio=r, correction=correction)


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
