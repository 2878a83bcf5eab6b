"""Where the time of a training step went, as a worker measures it: the step is cut at
the end of each part on one monotonic clock, so the parts of a step sum to its wall
time exactly. Cheap: a clock read per part, medians computed only when reported.

On GPUs the host runs ahead of the devices: `executor.step` returns once its kernels
are queued, and the step's one synchronize (in the optimizer part) would otherwise be
charged with all of the devices' compute and allreduce. So on CUDA devices each mark
also records an event on every device's current stream (the executor's and NCCL's
streams are ordered before it), and a part ends when the host and every device have
finished it: the latest of the host's mark and each device's event, read once the step
is done (the events are complete by then, so reading them costs no extra wait).

Each step also says how many of the host's cores its process kept busy from the end of
its data to the end of its optimizer (the span the scaling model and the timing before
the sweep predict): process CPU seconds, every thread's, per wall second. On a host
whose cores are the devices, a trial that got fewer cores than its timing did was slowed
by other processes, and this is the measure that shows it."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

#: The parts of a step, in the order they happen.
#: data: the batch; compute: forward and backward (allreduce launches overlap it);
#: allreduce: waiting for the gradient allreduce to finish; optimizer: the update and
#: the devices' final synchronize; idle: waiting for the other workers at the step's
#: end (the allreduce of the loss), and the loop between steps; reporting: Ray Train's
#: report and the checkpoint.
PARTS = ("data", "compute", "allreduce", "optimizer", "idle", "reporting")
#: The parts the scaling model predicts (placement/scaling/crossover.py step_time_s).
MODELLED = ("compute", "allreduce", "optimizer")
#: Steps of a run left out of its medians: the first pays for allocations, gloo's
#: first connections and the kernels' first calls.
WARMUP_STEPS = 1


class CudaEvents:
    """The device side of a `StepClock` on CUDA devices: `record()` puts a timing event
    on each device's current stream; `elapsed_s(start, end)` is, per device, the seconds
    between two such records (waiting for `end` to complete)."""

    def __init__(self, devices: Sequence[torch.device]) -> None:
        self.devices = [d for d in devices if d.type == "cuda"]

    def record(self) -> list[torch.cuda.Event]:
        events = []
        for d in self.devices:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(d))
            events.append(event)
        return events

    def elapsed_s(self, start: list[torch.cuda.Event],
                  end: list[torch.cuda.Event]) -> list[float]:
        for event in end:
            event.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in zip(start, end)]


def device_timer(devices: Sequence[torch.device]) -> CudaEvents | None:
    """The device timer a worker on `devices` needs: none where the host's clock is the
    devices' (CPU threads run the step before the executor returns)."""
    timer = CudaEvents(devices)
    return timer if timer.devices else None


class StepClock:
    """`start()` a step, `mark(part)` the end of each part in `PARTS` order, `finish()`.

    With a `device_timer` (`CudaEvents`, or any object with its `record` and
    `elapsed_s`), a part ends when the host and every device have finished it."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 device_timer: CudaEvents | None = None,
                 cpu_clock: Callable[[], float] = time.process_time) -> None:
        self.clock = clock
        self.device_timer = device_timer
        self.cpu_clock = cpu_clock
        self.steps: list[dict[str, float]] = []
        """The parts of each finished step the medians count (`start(counted=False)`
        leaves a step out)."""
        self.cores: list[float] = []
        """Per counted step with a data and an optimizer mark: cores busy between them."""
        self._counted = True  # whether the step under way goes into the medians
        self._previous_end: float | None = None
        self._started = 0.0  # where the step under way began: the previous one's end
        self._start = 0.0  # the host's time when the device timer's start was recorded
        self._start_events = None
        # (part, host time, device events) of each mark of the step under way.
        self._marks: list[tuple[str, float, object]] = []
        # (host time, process CPU time) at the marks that bound the modelled span.
        self._span: dict[str, tuple[float, float]] = {}

    def start(self, *, counted: bool = True) -> None:
        """Start a step; one not `counted` is timed but left out of the medians (a step
        right after work outside the steps that evicted its data from the cache)."""
        self._counted = counted
        now = self.clock()
        # The loop between the previous step's end and this one counts as idle.
        self._marks = [] if self._previous_end is None else [("idle", now, None)]
        self._span = {}
        self._started = self._previous_end if self._previous_end is not None else now
        self._start = now
        self._start_events = self.device_timer.record() if self.device_timer else None

    def mark(self, part: str) -> None:
        assert part in PARTS, part
        now = self.clock()
        events = self.device_timer.record() if self.device_timer else None
        self._marks.append((part, now, events))
        if part in ("data", "optimizer"):
            self._span[part] = (now, self.cpu_clock())

    def _ends(self) -> list[tuple[str, float]]:
        """Each mark's part and the time it ended: the host's mark, or later where a
        device finished the part later (never before an earlier part's end)."""
        ends, latest = [], self._started
        for part, host, events in self._marks:
            end = host
            if events is not None:
                device = self.device_timer.elapsed_s(self._start_events, events)
                end = max([host] + [self._start + d for d in device])
            latest = max(latest, end)
            ends.append((part, latest))
        return ends

    def _parts(self) -> tuple[dict[str, float], float]:
        parts, previous = {}, self._started
        for part, end in self._ends():
            parts[part] = parts.get(part, 0.0) + end - previous
            previous = end
        return parts, previous

    def finish(self) -> dict[str, float]:
        measured, end = self._parts()
        parts = {p: measured.get(p, 0.0) for p in PARTS}
        self._previous_end = end
        if not self._counted:
            return parts
        self.steps.append(parts)
        if {"data", "optimizer"} <= self._span.keys():
            (wall0, cpu0), (wall1, cpu1) = self._span["data"], self._span["optimizer"]
            if wall1 > wall0:
                self.cores.append((cpu1 - cpu0) / (wall1 - wall0))
        return parts

    def current_modelled_s(self) -> float:
        """The part of the step under way that the scaling model predicts, so far."""
        parts, _ = self._parts()
        return sum(parts.get(p, 0.0) for p in MODELLED)

    def medians(self) -> dict[str, float]:
        """Median seconds of each part, and of the modelled step, over the steps after
        the warm-up (all of them while there are no others), and the median cores busy
        (`cores_used`) over the same steps."""
        steps = self.steps[WARMUP_STEPS:] or self.steps
        if not steps:
            return {}
        out = {f"time_{p}_s": statistics.median(s[p] for s in steps) for p in PARTS}
        out["measured_step_s"] = statistics.median(sum(s[p] for p in MODELLED) for s in steps)
        cores = self.cores[WARMUP_STEPS:] or self.cores
        if cores:
            out["cores_used"] = statistics.median(cores)
        return out
