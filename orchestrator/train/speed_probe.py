"""A cheap measure of the host's speed right now: the seconds a fixed small workload,
a few 192 x 192 matrix products on one thread, takes.

Why: on a shared 2-core host a worker's step follows the host's speed, which moves
within seconds (docs/benchmarks.md "Sweep": in one process the mp 2 step of tiny BigLSTM
went 12.6 -> 7.7 -> 12 ms as five such products went 1.04 -> 0.81 ms). A trial runs this
probe between its steps and after each round of its own timing, and reports its median
beside its measured step; the sweep's driver runs it right before it ranks a trial, so
that a level measured at one speed can be carried to another (placement/sweep_rank.py).

Products only, no large copy, though a 32 MB copy tracked the step as well: a 16 MB copy
in the probe slowed the step after it by 5% (12.9 against 12.3 ms, every other step
probed), evicting the step's data from the 32 MiB cache; the products alone by 1% (10.4
against 10.3 ms), and they tracked the step's level over windows of 20 steps with a
correlation of 0.91 (commit message of this file). About 1.2 ms; run outside a step's
timed window all the same: it takes a core."""

from __future__ import annotations

import statistics
import time

import torch

#: Side of the square matrix multiplied by itself.
SIDE = 192
#: Products per probe.
MATMULS = 8


class SpeedProbe:
    """`probe()` times the workload once and returns its seconds; the matrix is made
    once, so a probe allocates only its products."""

    def __init__(self) -> None:
        self.matrix = torch.randn(SIDE, SIDE, generator=torch.Generator().manual_seed(0))

    def __call__(self) -> float:
        threads = torch.get_num_threads()
        if threads != 1:
            # One core's speed, whatever the caller's pool (the sweep's driver keeps
            # torch's default): a worker's devices are one thread each.
            torch.set_num_threads(1)
        try:
            started = time.perf_counter()
            for _ in range(MATMULS):
                torch.mm(self.matrix, self.matrix)
            return time.perf_counter() - started
        finally:
            if threads != 1:
                torch.set_num_threads(threads)

    def median_s(self, repeats: int) -> float:
        """The median of `repeats` probes back to back (one may land on a neighbour's
        burst)."""
        return statistics.median(self() for _ in range(repeats))
