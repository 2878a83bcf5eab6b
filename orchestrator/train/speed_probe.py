"""A cheap measure of the host's speed right now: the seconds a fixed small workload
takes on one thread, copying a 4 MiB buffer six times (the memory traffic of a tiny
model's step, within the host's 32 MiB L3 cache).

Why: on a shared 2-core host a worker's step follows the host's speed, which moves
within seconds (docs/benchmarks.md "Sweep": in one process the mp 2 step of tiny BigLSTM
went 12.6 -> 7.7 -> 12 ms as a 32 MB copy went 23 -> 36 GB/s). A trial runs this probe
between its steps and after each round of its own timing, and reports its median beside
its measured step; the sweep's driver runs it right before it ranks a trial, so that a
level measured at one speed can be carried to another (placement/sweep_rank.py), in
proportion.

Chosen among three, in one process timing that step at worker batch 32 with each probe
after every fourth step (2,400 steps, load 2.9-3.2 from other sessions; windows of 40
steps, the step 9.3-16.9 ms): this copy tracked the step's level with a correlation of
0.80 and an elasticity (log-log slope) of 1.27, eight 192 x 192 matrix products 0.82 but
3.3 (they sit in the core's own cache: the step moved 3x as much as they did), the two
together 0.84 and 2.5. A step right after the copy took 4.6% longer (the copy evicts
some of the step's data), after the products 1.9%: the probe runs outside a step's
timed window, after one step in four, the next step left out of the trial's medians
(worker.py), and after each round of a timing, whose order alternates so that the cost
lands on every batch alike. About 0.6 ms, the first, untimed copy included."""

from __future__ import annotations

import statistics
import time

import torch

#: Bytes of the buffer copied: an eighth of the host's L3, so that source and
#: destination stay in the cache shared with other processes, not in a core's own.
COPY_BYTES = 4 * 2**20
#: Copies per probe.
COPIES = 6


class SpeedProbe:
    """`probe()` times the workload, `copies` copies, once and returns its seconds; the
    buffers are made once, so a probe allocates nothing."""

    def __init__(self, copies: int = COPIES) -> None:
        self.copies = copies
        self.source = torch.rand(COPY_BYTES // 4, generator=torch.Generator().manual_seed(0))
        self.target = torch.empty_like(self.source)

    def __call__(self) -> float:
        threads = torch.get_num_threads()
        if threads != 1:
            # One core's speed, whatever the caller's pool (the sweep's driver keeps
            # torch's default): a worker's devices are one thread each.
            torch.set_num_threads(1)
        try:
            # One copy untimed first, so that every probe times the buffers in the L3,
            # wherever it runs: after a trial's step, which evicted part of them, as
            # after another probe in the driver (cold, the first copy took some 0.2 ms
            # more, and a trial's probes read 1.5x the driver's).
            self.target.copy_(self.source)
            started = time.perf_counter()
            for _ in range(self.copies):
                self.target.copy_(self.source)
            return time.perf_counter() - started
        finally:
            if threads != 1:
                torch.set_num_threads(threads)

    def __reduce__(self):
        # Pickled as its recipe, not its 8 MiB of buffers: the searcher that holds one
        # is saved with the sweep's experiment.
        return SpeedProbe, (self.copies,)

    def median_s(self, repeats: int) -> float:
        """The median of `repeats` probes back to back (one may land on a neighbour's
        burst)."""
        return statistics.median(self() for _ in range(repeats))
