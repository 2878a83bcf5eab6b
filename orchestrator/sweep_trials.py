"""One plain record per trial of a finished sweep, for winner.json and the report: the
hybrid configuration, the prediction that ranked the trial (after the correction in
force then), what it measured and where its measured step went."""

from __future__ import annotations

import math
from collections.abc import Iterable

from orchestrator.search import MEASURED
from orchestrator.sweep import METRIC
from orchestrator.train.job import PROBE, TIMED_HERE
from orchestrator.train.step_breakdown import PARTS
from placement.scaling.timed_step import TimedStep
from placement.sweep_rank import Correction
from placement.sweep_space import Candidate

#: A trial ranked with a correction of its own mp_degree must measure within this of it.
CALIBRATED_TOLERANCE = 0.15


def trial_record(config: dict, metrics: dict) -> dict:
    c = Candidate.from_dict(config["candidate"])
    ranked, at_speed = config["ranked"], config["at_speed"]
    correction = Correction.from_dict(ranked["correction"])
    measured = float(metrics[MEASURED])
    timed_here = metrics.get(TIMED_HERE)
    return {
        "order": config["order"], "trial_id": metrics.get("trial_id"), "key": c.key(),
        "mp_degree": c.mp_degree, "dp_degree": c.dp_degree, "global_batch": c.global_batch,
        "num_micro_batches": c.num_micro_batches, "lr": c.lr,
        "model_step_s": c.predicted_step_s, "step_source": c.step_source,
        "predicted_parts_s": dict(c.predicted_parts_s),
        "predicted_step_s": ranked["predicted_step_s"],
        "predicted_time_s": ranked["predicted_time_s"],
        "overhead_s": ranked["overhead_s"], "base_step_s": ranked["base_step_s"],
        "correction": ranked["correction"],
        "correction_from": correction.source(c.mp_degree),
        "calibrated": correction.calibrated(c.mp_degree),
        "measured_step_s": measured, "worker_batch": c.config.worker_batch,
        "timed_here": timed_here,
        "timed_here_step_s": None if timed_here is None else TimedStep.from_dict(
            timed_here).step_s(c.config.worker_batch),
        # The host-speed probe (orchestrator/train/speed_probe.py), seconds: the driver's
        # right before it ranked the trial, the trial's between its steps and after the
        # rounds of its own timing; and what the earlier trials' levels carried to the
        # driver's probe predicted (CorrectedSearcher).
        "ranked_probe_s": at_speed["probe_s"], "probe_s": metrics.get(PROBE),
        "timed_here_probe_s": None if timed_here is None else timed_here.get("probe_s"),
        "at_speed_step_s": at_speed["predicted_step_s"], "at_speed_from": at_speed["from"],
        "at_speed_error": measured / at_speed["predicted_step_s"] - 1,
        "error": measured / ranked["predicted_step_s"] - 1,
        "projected_time_s": float(metrics[METRIC]),
        "breakdown_s": {p: float(metrics.get(f"time_{p}_s", math.nan)) for p in PARTS},
        "cores_used": metrics.get("cores_used"), "predicted_cores": c.predicted_cores,
        "loss": float(metrics["loss"]), "noise_scale": metrics.get("noise_scale"),
        "steps": int(metrics["step"]),
    }


def cores_text(t: dict) -> str:
    """The cores a trial's worker kept busy against its timing's, in words ("" where
    either is unknown): on a host whose cores are the devices, a trial that got fewer
    than its timing shared them with other processes."""
    used, timed = t.get("cores_used"), t.get("predicted_cores")
    if used is None or timed is None:
        return ""
    return f"{used:.2f} cores busy, timed at {timed:.2f}"


def probe_text(t: dict) -> str:
    """The host-speed probe the trial ran between its steps against the driver's before
    ranking it, and the prediction carried to the driver's, in words ("" where the trial
    probed nothing)."""
    ranked, own = t["ranked_probe_s"], t["probe_s"]
    if own is None:
        return ""
    return (f"host-speed probe {own * 1e3:.3f} ms, {ranked * 1e3:.3f} before ranking; carried "
            f"to it {t['at_speed_step_s'] * 1e3:.1f} ms, {t['at_speed_error']:+.0%}")


def trial_records(grid: Iterable) -> list[dict]:
    """Every trial that reported, in the order the sweep started them."""
    rows = [trial_record(r.config, r.metrics) for r in grid
            if r.metrics and math.isfinite(r.metrics.get(MEASURED, math.nan))
            and METRIC in r.metrics]
    return sorted(rows, key=lambda t: t["order"])
