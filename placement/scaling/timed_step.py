"""A worker's step as timed on this host before the sweep: its executor, its plan and
micro-batches, at each worker batch the sweep may run, so that the prediction that
ranks a trial is a measured step(batch) of its own mp_degree, not the scaling model's.

Why not the scaling model here: the model scales per-op profile times by one batch
rule (placement/scaling/step.py) whose fixed share comes from whole one-device steps.
A multi-device worker pays a fixed cost per micro-batch task that rule does not see:
inside the sweep the measured mp 2 step of tiny BigLSTM hardly moved with the batch
(28.0 ms at global batch 64, 28.8 at 32) while the model's fell 15%.

The timing is what the worker's `measured_step_s` holds besides the allreduce:
`compute` (zero_grad, then the executor's forward and backward) and `optimizer` (the
update), each a median over rounds in which the batches alternate step by step, so
that the host's drift within a few seconds lands on every batch alike."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, kw_only=True)
class TimedStep:
    """One mp_degree's worker step timed at several worker batches (seconds)."""

    mp_degree: int
    num_micro_batches: int
    batches: tuple[float, ...]
    """Worker batches timed (samples per worker per step), increasing."""
    compute_s: tuple[float, ...]
    """Median compute (zero_grad + forward + backward) at each of `batches`."""
    optimizer_s: float
    """Median optimizer update, over every timed step (it does not see the batch)."""
    rounds: int
    """Timed steps at each batch."""

    def __post_init__(self) -> None:
        if not self.batches or len(self.batches) != len(self.compute_s):
            raise ValueError(f"batches {self.batches} and compute_s {self.compute_s} must be "
                             "non-empty and of one length")
        if any(b >= c for b, c in zip(self.batches, self.batches[1:])):
            raise ValueError(f"batches {self.batches} must increase")
        if not (all(t > 0 for t in self.compute_s) and self.optimizer_s >= 0):
            raise ValueError(f"compute_s {self.compute_s} must be > 0 and optimizer_s "
                             f"{self.optimizer_s} >= 0")

    def compute_at(self, batch: float) -> float:
        """Compute at `batch`: the timed median there, linear between two timed batches.
        A batch outside the timed range is refused: past it the line is a guess."""
        if not self.batches[0] <= batch <= self.batches[-1]:
            raise ValueError(f"worker batch {batch} lies outside the timed batches "
                             f"{self.batches} of mp {self.mp_degree}")
        return float(np.interp(batch, self.batches, self.compute_s))

    def step_s(self, batch: float) -> float:
        """compute + optimizer at `batch`: the worker's step without its allreduce."""
        return self.compute_at(batch) + self.optimizer_s

    def to_dict(self) -> dict[str, Any]:
        return {"mp_degree": self.mp_degree, "num_micro_batches": self.num_micro_batches,
                "batches": list(self.batches), "compute_s": list(self.compute_s),
                "optimizer_s": self.optimizer_s, "rounds": self.rounds}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TimedStep:
        return cls(mp_degree=d["mp_degree"], num_micro_batches=d["num_micro_batches"],
                   batches=tuple(d["batches"]), compute_s=tuple(d["compute_s"]),
                   optimizer_s=d["optimizer_s"], rounds=d["rounds"])


def timed_step(mp_degree: int, num_micro_batches: int,
               samples: Mapping[float, Sequence[tuple[float, float]]]) -> TimedStep:
    """The TimedStep of `samples`: per worker batch, the (compute, optimizer) seconds of
    each timed step. Medians, so that one step hit by another process's burst does not
    move the figure."""
    if not samples or len({len(s) for s in samples.values()}) != 1 or not min(
            len(s) for s in samples.values()):
        raise ValueError(f"samples of mp {mp_degree}: every batch needs the same number "
                         f"(> 0) of timed steps, got {[len(s) for s in samples.values()]}")
    batches = tuple(sorted(samples))
    return TimedStep(
        mp_degree=mp_degree, num_micro_batches=num_micro_batches, batches=batches,
        compute_s=tuple(statistics.median(c for c, _ in samples[b]) for b in batches),
        optimizer_s=statistics.median(o for b in batches for _, o in samples[b]),
        rounds=len(samples[batches[0]]))
