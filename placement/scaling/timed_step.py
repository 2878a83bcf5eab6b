"""A worker's step as timed on this host before the sweep: its executor, its plan and
micro-batches, at each worker batch the sweep may run, so that the prediction that
ranks a trial is a measured step(batch) of its own mp_degree, not the scaling model's.

Why not the scaling model here: the model scales per-op profile times by one batch
rule (placement/scaling/step.py) whose fixed share comes from whole one-device steps.
A multi-device worker pays a fixed cost per micro-batch task that rule does not see:
inside the sweep the measured mp 2 step of tiny BigLSTM hardly moved with the batch
(28.0 ms at global batch 64, 28.8 at 32) while the model's fell 15%.

The timing is what the worker's `measured_step_s` holds: `compute` (zero_grad, then
the executor's forward and backward, with the allreduce it overlaps), `allreduce` (the
wait for the gradient averaging after the backward) and `optimizer` (the update), each a
median over rounds in which the batches alternate step by step, so that the host's
drift within a few seconds lands on every batch alike. With dp_degree > 1 the job's dp
workers are timed side by side, as separate processes in one gloo group, as a trial
runs them: on a host whose cores are the devices, two processes of a 2-core machine
slow each other and their allreduce (measured: a 1.6 MB gloo allreduce between two
processes, 2.0 ms against the modelled 0.1), and that share grows with the batch in a
way no one-process step shows (inside the sweep, mp 1 at dp 2 measured nearly the same
step at global batch 32 as at 64 while its one-process timed step fell 2-7 ms)."""

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
    dp_degree: int
    """Workers timed side by side (1: the worker alone, no allreduce)."""
    num_micro_batches: int
    batches: tuple[float, ...]
    """Worker batches timed (samples per worker per step), increasing."""
    compute_s: tuple[float, ...]
    """Median compute (zero_grad + forward + backward) at each of `batches`."""
    allreduce_s: tuple[float, ...]
    """Median wait for the gradient allreduce after the backward, at each of `batches`."""
    optimizer_s: float
    """Median optimizer update, over every timed step (it does not see the batch)."""
    rounds: int
    """Timed steps at each batch."""
    cores_used: tuple[float, ...] | None = None
    """Median cores the timed worker kept busy at each of `batches` (its process's CPU
    seconds per wall second of compute + allreduce + optimizer); None in timings saved
    before it was measured."""
    probe_s: float | None = None
    """Median seconds of the host-speed probe run after each round
    (orchestrator/train/speed_probe.py); None where no probe ran."""

    def __post_init__(self) -> None:
        if not self.batches or not (len(self.batches) == len(self.compute_s)
                                    == len(self.allreduce_s)):
            raise ValueError(f"batches {self.batches}, compute_s {self.compute_s} and "
                             f"allreduce_s {self.allreduce_s} must be non-empty and of one "
                             "length")
        if any(b >= c for b, c in zip(self.batches, self.batches[1:])):
            raise ValueError(f"batches {self.batches} must increase")
        if not (all(t > 0 for t in self.compute_s) and self.optimizer_s >= 0
                and all(t >= 0 for t in self.allreduce_s)):
            raise ValueError(f"compute_s {self.compute_s} must be > 0, allreduce_s "
                             f"{self.allreduce_s} and optimizer_s {self.optimizer_s} >= 0")

    def _at(self, batch: float, times: tuple[float, ...]) -> float:
        """`times` at `batch`: the timed median there, linear between two timed batches.
        A batch outside the timed range is refused: past it the line is a guess."""
        if not self.batches[0] <= batch <= self.batches[-1]:
            raise ValueError(f"worker batch {batch} lies outside the timed batches "
                             f"{self.batches} of mp {self.mp_degree}")
        return float(np.interp(batch, self.batches, times))

    def compute_at(self, batch: float) -> float:
        return self._at(batch, self.compute_s)

    def allreduce_at(self, batch: float) -> float:
        return self._at(batch, self.allreduce_s)

    def cores_at(self, batch: float) -> float | None:
        return None if self.cores_used is None else self._at(batch, self.cores_used)

    def step_s(self, batch: float) -> float:
        """compute + allreduce + optimizer at `batch`: the worker's measured step."""
        return self.compute_at(batch) + self.allreduce_at(batch) + self.optimizer_s

    def to_dict(self) -> dict[str, Any]:
        return {"mp_degree": self.mp_degree, "dp_degree": self.dp_degree,
                "num_micro_batches": self.num_micro_batches, "batches": list(self.batches),
                "compute_s": list(self.compute_s), "allreduce_s": list(self.allreduce_s),
                "optimizer_s": self.optimizer_s, "rounds": self.rounds,
                "cores_used": None if self.cores_used is None else list(self.cores_used),
                "probe_s": self.probe_s}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TimedStep:
        return cls(mp_degree=d["mp_degree"], dp_degree=d["dp_degree"],
                   num_micro_batches=d["num_micro_batches"], batches=tuple(d["batches"]),
                   compute_s=tuple(d["compute_s"]), allreduce_s=tuple(d["allreduce_s"]),
                   optimizer_s=d["optimizer_s"], rounds=d["rounds"],
                   cores_used=None if d.get("cores_used") is None else tuple(d["cores_used"]),
                   probe_s=d.get("probe_s"))


def timed_step(mp_degree: int, dp_degree: int, num_micro_batches: int,
               samples: Mapping[float, Sequence[tuple[float, float, float, float]]],
               probes_s: Sequence[float] = ()) -> TimedStep:
    """The TimedStep of `samples`: per worker batch, the (compute, allreduce, optimizer,
    process CPU) seconds of each timed step, and the probes run between the rounds.
    Medians, so that one step hit by another process's burst does not move the figure."""
    if not samples or len({len(s) for s in samples.values()}) != 1 or not min(
            len(s) for s in samples.values()):
        raise ValueError(f"samples of mp {mp_degree}: every batch needs the same number "
                         f"(> 0) of timed steps, got {[len(s) for s in samples.values()]}")
    batches = tuple(sorted(samples))
    return TimedStep(
        mp_degree=mp_degree, dp_degree=dp_degree, num_micro_batches=num_micro_batches,
        batches=batches,
        compute_s=tuple(statistics.median(c for c, _, _, _ in samples[b]) for b in batches),
        allreduce_s=tuple(statistics.median(a for _, a, _, _ in samples[b]) for b in batches),
        optimizer_s=statistics.median(o for b in batches for _, _, o, _ in samples[b]),
        rounds=len(samples[batches[0]]),
        cores_used=tuple(statistics.median(cpu / (c + a + o) for c, a, o, cpu in samples[b])
                         for b in batches),
        probe_s=statistics.median(probes_s) if probes_s else None)
