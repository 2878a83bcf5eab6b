"""Each mp_degree's worker step timed on this host before the sweep, as its trials will
run it: the plan's executor and gradient sync (the worker's own construction,
worker_executor.py) on CPU threads, one intra-op thread per device as in the worker, at
every worker batch the sweep may run, and with dp_degree > 1 the job's dp workers side
by side, one forked process each in one gloo group (placement/scaling/timed_step.py
says why). Only where the devices are this host's CPU threads
(DeviceKind.measured_here): a GPU's step cannot be timed on the driver, and GPU jobs
keep the scaling model's prediction."""

from __future__ import annotations

import datetime
import json
import multiprocessing
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from orchestrator.train.speed_probe import SpeedProbe
from orchestrator.train.sync import DDPSync, GradientSync
from orchestrator.train.worker_executor import PlannedModel, build_executor, gradient_sync
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
#: How long the side-by-side workers wait for each other at a collective before the
#: timing fails (a worker that died leaves the others waiting).
GROUP_TIMEOUT_S = 120
#: Seconds between looks at the side-by-side workers while they run.
POLL_S = 0.05
#: Where rank 0 of the side-by-side workers leaves its samples.
SAMPLES_FILE = "samples.json"

#: The (compute, allreduce, optimizer) seconds of one step, and the process CPU seconds
#: (every thread's) it took.
StepParts = tuple[float, float, float, float]
#: A worker's timed steps at each batch, and the host-speed probes between its rounds.
Samples = tuple[dict[float, list[StepParts]], list[float]]


@contextmanager
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _step(planned: PlannedModel, sync: DDPSync | GradientSync,
          optimizer: torch.optim.Optimizer, batch: tuple, batch_size: int,
          clock: Callable[[], float]) -> StepParts:
    """One step, cut where the worker's StepClock cuts it: zero_grad and the executor's
    step (launching each device's allreduce as its backward ends), the wait for the
    allreduce, then the update."""
    cpu = time.process_time()
    started = clock()
    optimizer.zero_grad(set_to_none=True)
    planned.executor.step(batch, batch_size, on_device_done=sync.launch)
    computed = clock()
    sync.finish()
    synced = clock()
    optimizer.step()
    return computed - started, synced - computed, clock() - synced, time.process_time() - cpu


def _rounds(step: Callable[[int], StepParts], sizes: Sequence[int],
            clock: Callable[[], float], agree: Callable[[bool], bool],
            probe: Callable[[], float] | None) -> Samples:
    """One warm-up step at each batch, then rounds of one step at each batch in turn
    until MAX_ROUNDS or, past MIN_ROUNDS, the budget; `agree(stop)` turns this
    worker's wish to stop into the decision every worker takes. After each round, outside
    its steps' timed windows, the host-speed `probe` (None: this worker probes nothing);
    its seconds come back with the samples. The rounds go up and down the batches in turn, so that the step after a
    probe, which finds part of its data evicted (speed_probe.py), is each batch's alike."""
    for b in sizes:
        step(b)
    samples: dict[float, list[StepParts]] = {b: [] for b in sizes}
    probes = []
    started = clock()
    for r in range(MAX_ROUNDS):
        if agree(r >= MIN_ROUNDS and clock() - started > BUDGET_S):
            break
        for b in (sizes if r % 2 == 0 else reversed(sizes)):
            samples[b].append(step(b))
        if probe is not None:
            probes.append(probe())
    return samples, probes


def _sizes(plan: Plan, batches: Sequence[float]) -> list[int]:
    """`batches` as the increasing whole worker batches the timing steps, each split
    into the plan's micro-batches."""
    sizes = sorted({int(b) for b in batches})
    assert sizes and all(b == int(b) and b % plan.num_micro_batches == 0 for b in batches), (
        batches, plan.num_micro_batches)
    return sizes


def _built(model: str, preset: str, plan: Plan, sizes: Sequence[int],
           seed: int) -> tuple[PlannedModel, dict[int, tuple]]:
    """The worker's executor of `plan` on CPU threads, and a batch of each size."""
    planned = build_executor(model, preset=preset, seed=seed, plan=plan,
                             devices=[torch.device("cpu")] * plan.num_devices,
                             num_micro_batches=plan.num_micro_batches)
    return planned, {b: planned.spec.make_batch(b) for b in sizes}


def _cpu_sync(planned: PlannedModel, plan: Plan, world: int) -> DDPSync | GradientSync:
    """The worker's gradient sync of `planned` on CPU threads among `world` workers."""
    return gradient_sync(planned, plan, [torch.device("cpu")] * plan.num_devices, world)


def _timed_samples(planned: PlannedModel, sync: DDPSync | GradientSync,
                   data: Mapping[int, tuple], *, world: int, clock: Callable[[], float],
                   probe: Callable[[], float] | None) -> Samples:
    """This worker's samples and probes (`_rounds`): its executor and gradient sync among
    `world` workers (the process group is up when world > 1)."""
    # lr 0, an optimizer of its own: the timing's updates cost what the worker's do and
    # leave the weights (and so the arithmetic's values) and a trial's optimizer state
    # as they were.
    optimizer = torch.optim.SGD(planned.spec.module.parameters(), lr=0.0, momentum=0.9)

    def step(b: int) -> StepParts:
        parts = _step(planned, sync, optimizer, data[b], b, clock)
        if world > 1:
            # The worker's one allreduce of the step's scalars after the update: the
            # point where the workers of a trial wait for each other every step.
            dist.all_reduce(torch.zeros(3, dtype=torch.float64))
        return parts

    def agree(stop: bool) -> bool:
        if world == 1:
            return stop
        flag = torch.tensor([float(stop)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag[0] > 0)

    return _rounds(step, sorted(data), clock, agree, probe)


def _side_by_side_worker(rank: int, world: int, planned: PlannedModel, plan: Plan,
                         data: Mapping[int, tuple], probe: Callable[[], float],
                         folder: Path) -> None:
    """One of `world` forked workers (a copy of the driver's executor each); rank 0
    writes its samples to `folder`."""
    # Before any op: a forked process must not enter the parent's OpenMP pool.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder / 'group'}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    try:
        # Rank 0 alone probes: two probes at once share the cache and read slower than
        # one (speed_probe.py).
        samples, probes = _timed_samples(planned, _cpu_sync(planned, plan, world), data,
                                         world=world, clock=time.perf_counter,
                                         probe=probe if rank == 0 else None)
        # Every rank's gloo work is done before any rank tears its group down.
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        (folder / SAMPLES_FILE).write_text(json.dumps(
            {"samples": {str(b): s for b, s in samples.items()}, "probes": probes}))


def _wait_all(procs: list) -> None:
    """Wait for every worker; the first that fails ends the others (they would wait
    for it at their next collective until GROUP_TIMEOUT_S) and raises."""
    while any(p.is_alive() for p in procs):
        if any(p.exitcode not in (None, 0) for p in procs):
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
            break
        time.sleep(POLL_S)
    codes = [p.exitcode for p in procs]
    if any(codes):
        raise RuntimeError(f"the side-by-side step timing's workers exited with {codes} "
                           "(their tracebacks are on stderr above)")


def _side_by_side(planned: PlannedModel, plan: Plan, data: Mapping[int, tuple], *,
                  dp_degree: int,
                  probe: Callable[[], float]) -> Samples:
    """Rank 0's samples and probes of `dp_degree` workers timed side by side, each its own
    process as in a trial. Forked from the driver, which has built the executor: fresh
    interpreters import torch and capture the model again (measured with tiny BigLSTM's
    mp 1 pair: 18-21 s spawned against 3.5 s forked, the rounds included). A forked worker touches none of the driver's Ray
    state and leaves by os._exit (multiprocessing's), running none of its exit hooks."""
    fork = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as name:
        folder = Path(name)
        procs = [fork.Process(target=_side_by_side_worker,
                              args=(r, dp_degree, planned, plan, data, probe, folder))
                 for r in range(dp_degree)]
        for p in procs:
            p.start()
        _wait_all(procs)
        saved = json.loads((folder / SAMPLES_FILE).read_text())
    return ({float(b): [tuple(parts) for parts in s] for b, s in saved["samples"].items()},
            saved["probes"])


def time_plan(model: str, preset: str, plan: Plan, batches: Sequence[float], *,
              dp_degree: int = 1, seed: int = 0,
              clock: Callable[[], float] = time.perf_counter,
              probe: Callable[[], float] | None = None) -> TimedStep:
    """`plan`'s worker step at each of `batches` (samples per worker) among `dp_degree`
    workers: in this process alone (dp 1, on `clock`), else side by side in forked
    processes (on their own perf_counter); the host-speed `probe` (a SpeedProbe unless
    given) after each round, in each worker."""
    sizes = _sizes(plan, batches)
    probe = probe or SpeedProbe()
    with _one_thread():
        planned, data = _built(model, preset, plan, sizes, seed)
        samples, probes = (
            _timed_samples(planned, _cpu_sync(planned, plan, 1), data, world=1, clock=clock,
                           probe=probe) if dp_degree == 1
            else _side_by_side(planned, plan, data, dp_degree=dp_degree, probe=probe))
    return timed_step(plan.num_devices, dp_degree, plan.num_micro_batches, samples, probes)


def time_in_worker(planned: PlannedModel, sync: DDPSync | GradientSync, plan: Plan,
                   batches: Sequence[float], *, world: int,
                   probe: Callable[[], float] | None) -> TimedStep:
    """A sweep trial's own timing of its mp_degree's step at each of `batches`, run by
    every one of its `world` workers at once (Ray Train's process group is up), with the
    worker's own executor and gradient sync: the rounds `time_plan` runs before the
    sweep, but inside the trial's worker group (placement/sweep_rank.py says why). Each
    worker returns its own samples' TimedStep; rank 0's is the one a trial reports.
    CPU-thread devices only, like `time_plan`: the steps are timed on the host's clock
    without a device synchronize."""
    sizes = _sizes(plan, batches)
    data = {b: planned.spec.make_batch(b) for b in sizes}
    samples, probes = _timed_samples(planned, sync, data, world=world,
                                     clock=time.perf_counter, probe=probe)
    return timed_step(plan.num_devices, world, plan.num_micro_batches, samples, probes)


def time_worker_steps(model: str, preset: str, plans: Mapping[int, Plan],
                      batches: Mapping[int, Sequence[float]], dp_degrees: Mapping[int, int], *,
                      seed: int = 0) -> dict[int, TimedStep]:
    """The TimedStep of every mp_degree in `batches`, with its plan, among its
    `dp_degrees[m]` workers."""
    return {m: time_plan(model, preset, plans[m], bs, dp_degree=dp_degrees[m], seed=seed)
            for m, bs in sorted(batches.items())}

