"""Where the time of a training step went, as a worker measures it: the step is cut at
the end of each part on one monotonic clock, so the parts of a step sum to its wall
time exactly. Cheap: a clock read per part, medians computed only when reported."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

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


class StepClock:
    """`start()` a step, `mark(part)` the end of each part in `PARTS` order, `finish()`."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.steps: list[dict[str, float]] = []
        self._previous_end: float | None = None
        self._parts: dict[str, float] = {}
        self._last = 0.0

    def start(self) -> None:
        now = self.clock()
        # The loop between the previous step's end and this one counts as idle.
        self._parts = {"idle": 0.0 if self._previous_end is None else now - self._previous_end}
        self._last = now

    def mark(self, part: str) -> None:
        assert part in PARTS, part
        now = self.clock()
        self._parts[part] = self._parts.get(part, 0.0) + now - self._last
        self._last = now

    def finish(self) -> dict[str, float]:
        parts = {p: self._parts.get(p, 0.0) for p in PARTS}
        self.steps.append(parts)
        self._previous_end = self._last
        return parts

    def current_modelled_s(self) -> float:
        """The part of the step under way that the scaling model predicts, so far."""
        return sum(self._parts.get(p, 0.0) for p in MODELLED)

    def medians(self) -> dict[str, float]:
        """Median seconds of each part, and of the modelled step, over the steps after
        the warm-up (all of them while there are no others)."""
        steps = self.steps[WARMUP_STEPS:] or self.steps
        if not steps:
            return {}
        out = {f"time_{p}_s": statistics.median(s[p] for s in steps) for p in PARTS}
        out["measured_step_s"] = statistics.median(sum(s[p] for p in MODELLED) for s in steps)
        return out
