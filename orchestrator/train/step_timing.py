"""Each mp_degree's worker step timed on this host before the sweep, in-process: the
plan's executor (the worker's own construction, worker_executor.py) on CPU threads,
one intra-op thread per device as in the worker, at every worker batch the sweep may
run (placement/scaling/timed_step.py says why). Only where the devices are this
host's CPU threads (DeviceKind.measured_here): a GPU's step cannot be timed on the
driver, and GPU jobs keep the scaling model's prediction."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager

import torch

from orchestrator.train.worker_executor import PlannedModel, build_executor
from placement.plan import Plan
from placement.scaling.timed_step import TimedStep, timed_step

#: Timed rounds per mp_degree at most; a round is one step at each batch, in turn.
#: Tiny BigLSTM's 25 rounds span about as many seconds as a 60-step trial's median.
MAX_ROUNDS = 25
#: Rounds always timed, however long they take (medians of fewer say little).
MIN_ROUNDS = 3
#: Seconds of rounds per mp_degree after which no new round starts (a large model's
#: steps must not turn the timing into a training run of its own).
BUDGET_S = 3.0


@contextmanager
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _step(planned: PlannedModel, optimizer: torch.optim.Optimizer, batch: tuple,
          batch_size: int, clock: Callable[[], float]) -> tuple[float, float]:
    """(compute, optimizer) seconds of one step, cut where the worker's StepClock cuts
    them: zero_grad and the executor's step, then the update."""
    started = clock()
    optimizer.zero_grad(set_to_none=True)
    planned.executor.step(batch, batch_size)
    computed = clock()
    optimizer.step()
    return computed - started, clock() - computed


def time_plan(model: str, preset: str, plan: Plan, batches: Sequence[float], *,
              seed: int = 0, clock: Callable[[], float] = time.perf_counter) -> TimedStep:
    """`plan`'s worker step at each of `batches` (samples per worker): one warm-up
    step each, then rounds of one step at each batch in turn."""
    sizes = sorted({int(b) for b in batches})
    assert sizes and all(b == int(b) and b % plan.num_micro_batches == 0 for b in batches), (
        batches, plan.num_micro_batches)
    with _one_thread():
        planned = build_executor(model, preset=preset, seed=seed, plan=plan,
                                 devices=[torch.device("cpu")] * plan.num_devices,
                                 num_micro_batches=plan.num_micro_batches)
        # lr 0: the timing's updates cost what the worker's do and leave the weights
        # (and so the arithmetic's values) as they were built.
        optimizer = torch.optim.SGD(planned.spec.module.parameters(), lr=0.0, momentum=0.9)
        data = {b: planned.spec.make_batch(b) for b in sizes}
        for b in sizes:
            _step(planned, optimizer, data[b], b, clock)
        samples: dict[float, list[tuple[float, float]]] = {b: [] for b in sizes}
        started = clock()
        for r in range(MAX_ROUNDS):
            if r >= MIN_ROUNDS and clock() - started > BUDGET_S:
                break
            for b in sizes:
                samples[b].append(_step(planned, optimizer, data[b], b, clock))
    return timed_step(plan.num_devices, plan.num_micro_batches, samples)


def time_worker_steps(model: str, preset: str, plans: Mapping[int, Plan],
                      batches: Mapping[int, Sequence[float]], *,
                      seed: int = 0) -> dict[int, TimedStep]:
    """The TimedStep of every mp_degree in `batches`, with its plan."""
    return {m: time_plan(model, preset, plans[m], bs, seed=seed)
            for m, bs in sorted(batches.items())}
