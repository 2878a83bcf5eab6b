"""How a model's step time grows with the batch on this host, so the scaling model
knows the share of a step the batch does not change. Small models on CPU threads are
mostly that share (the interpreter, launches, allocations): inside the sweep, tiny
BigLSTM's step took 21 ms at worker batch 32 and 19 ms at 64, where a rule linear in
the batch predicted twice as long at 64.

Whole training steps, not the profile's per-op times, and the two batches alternate
step by step: on a shared host the load drifts within seconds, and two profiles taken
apart (17 and 25 ms at batch 8 and 32 in one run, 6 and 13 ms in another) put the
drift into the slope."""

from __future__ import annotations

import statistics
import time

import torch

from placement.scaling.step import fit_fixed_fraction

#: The larger batch timed, as a multiple of the profiled one.
LARGER_BATCH_MULTIPLE = 4
#: Timed steps at each batch (after one warm-up step each).
REPEATS = 15


def _step_s(module: torch.nn.Module, batch: tuple) -> float:
    started = time.perf_counter()
    module.zero_grad(set_to_none=True)
    module(*batch).backward()
    return time.perf_counter() - started


def fixed_fraction(model: str, preset: str, batch: int, *, repeats: int = REPEATS) -> float:
    """f of placement/scaling/step.py's BatchRule at profiled batch `batch`: the
    intercept of the line through the median step times at `batch` and
    LARGER_BATCH_MULTIPLE x `batch`, on one thread (one device)."""
    from orchestrator.models import build

    spec = build(model, preset)
    sizes = (batch, batch * LARGER_BATCH_MULTIPLE)
    batches = {b: spec.make_batch(b) for b in sizes}
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times: dict[int, list[float]] = {b: [] for b in sizes}
        for b in sizes:
            _step_s(spec.module, batches[b])
        for _ in range(repeats):
            for b in sizes:
                times[b].append(_step_s(spec.module, batches[b]))
    finally:
        torch.set_num_threads(before)
    small, large = (statistics.median(times[b]) for b in sizes)
    return fit_fixed_fraction(sizes[0], small, sizes[1], large)
