"""The sweep's Tune search algorithm: it suggests the candidates one by one in the order
placement/sweep_rank.py gives, re-fitting the correction each time a trial completes.

A Searcher rather than a grid: Tune asks it for the next trial only when one may start,
so every trial is ranked with the measurements of all those finished before it, and,
given a `retime`, with its candidates' steps timed again at that moment: on a host
shared with other work the load a trial runs under moves within a minute, and the
sweep's timing before its first trial is that far behind its last. Its state is saved
with the experiment (save/restore), so --resume continues the order."""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Sequence

from ray.tune.search import Searcher

from placement.sweep_rank import Measurement, fit_correction, next_candidate, ranked
from placement.sweep_space import Candidate

#: The worker's metric of a trial's median step time (warm-up steps left out).
MEASURED = "measured_step_s"


#: The candidates not tried yet, predicted by their steps timed now.
Retime = Callable[[Sequence[Candidate]], list[Candidate]]


class CorrectedSearcher(Searcher):
    """Suggests `{"candidate": ..., "ranked": ..., "order": n, "sweep_step_s": s}`
    configs (the n-th suggested, from 1; s the candidate's step as the sweep's first
    timing predicted it), at most `max_trials`. With `retime`, every trial after the
    first is ranked by the untried candidates' steps timed again when it is asked for
    (the first one's timing is the sweep's own, just made)."""

    def __init__(self, candidates: Sequence[Candidate], max_trials: int, *, metric: str,
                 mode: str = "min", retime: Retime | None = None) -> None:
        super().__init__(metric=metric, mode=mode)
        self.candidates = list(candidates)
        self.max_trials = max_trials
        self.retime = retime
        self.suggested: dict[str, Candidate] = {}
        self.measurements: list[Measurement] = []

    def suggest(self, trial_id: str) -> dict | str | None:
        if len(self.suggested) >= self.max_trials:
            return Searcher.FINISHED
        correction = fit_correction(self.measurements)
        tried = {c.key() for c in self.suggested.values()}
        untried = [c for c in self.candidates if c.key() not in tried]
        if self.retime is not None and self.suggested and untried:
            untried = self.retime(untried)
        c = next_candidate([*self.suggested.values(), *untried], tried, correction)
        if c is None:
            return Searcher.FINISHED
        self.suggested[trial_id] = c
        sweep_step_s = next(s.predicted_step_s for s in self.candidates if s.key() == c.key())
        return {"candidate": c.to_dict(), "ranked": ranked(c, correction).to_dict(),
                "order": len(self.suggested), "sweep_step_s": sweep_step_s}

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        measured = (result or {}).get(MEASURED, math.nan)
        if error or trial_id not in self.suggested or not math.isfinite(measured):
            return
        c = self.suggested[trial_id]
        self.measurements.append(Measurement(mp_degree=c.mp_degree,
                                             predicted_step_s=c.predicted_step_s,
                                             measured_step_s=measured))

    def get_state(self) -> dict:
        return {"candidates": self.candidates, "max_trials": self.max_trials,
                "suggested": self.suggested, "measurements": self.measurements}

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.get_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.set_state(pickle.load(f))
