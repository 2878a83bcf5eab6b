"""The report's plots of the sweep's trials (predicted vs measured, where each step went)
and of the final run's losses; rows are winner.json's `trials`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from orchestrator.sweep_trials import CALIBRATED_TOLERANCE  # noqa: E402
from orchestrator.train.step_breakdown import PARTS  # noqa: E402
from placement.scaling.timed_step import TimedStep  # noqa: E402
from placement.sweep_rank import Measurement, fit_correction  # noqa: E402


def learned_correction(rows: Sequence[dict]) -> str:
    """The correction fitted from every trial, in words."""
    fitted = fit_correction([Measurement(
        mp_degree=t["mp_degree"], predicted_step_s=t["model_step_s"],
        measured_step_s=t["measured_step_s"], worker_batch=t["worker_batch"],
        retimed=None if t["timed_here"] is None else TimedStep.from_dict(t["timed_here"]))
        for t in rows])
    return ", ".join(f"mp {m}: x{r:.3f} ({fitted.source(m)})"
                     for m, r in sorted(fitted.ratios.items())) or "none (no trial reported)"


def save_predicted_vs_measured(rows: Sequence[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 4.2))
    top = max([t["predicted_step_s"] for t in rows] + [t["measured_step_s"] for t in rows]
              + [t["model_step_s"] for t in rows]) * 1e3 * 1.15
    ax.plot([0, top], [0, top], color="grey", linestyle="--", label="measured = predicted")
    ax.fill_between([0, top], [0, top * (1 - CALIBRATED_TOLERANCE)],
                    [0, top * (1 + CALIBRATED_TOLERANCE)], color="grey", alpha=0.15,
                    label=f"within {CALIBRATED_TOLERANCE:.0%}")
    for calibrated, marker, label in ((False, "o", "ranked before its mp_degree's first "
                                                   "measure"),
                                      (True, "s", "ranked with its mp_degree's correction")):
        chosen = [t for t in rows if t["calibrated"] == calibrated]
        ax.scatter([t["predicted_step_s"] * 1e3 for t in chosen],
                   [t["measured_step_s"] * 1e3 for t in chosen], marker=marker, label=label)
    ax.scatter([t["model_step_s"] * 1e3 for t in rows], [t["measured_step_s"] * 1e3 for t in rows],
               marker="x", color="grey", label="uncorrected (timed here, or the model's)")
    for t in rows:
        ax.annotate(t["key"], (t["predicted_step_s"] * 1e3, t["measured_step_s"] * 1e3),
                    fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("predicted step time (ms)")
    ax.set_ylabel("measured median step time (ms)")
    ax.legend(fontsize="x-small", loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_breakdown(rows: Sequence[dict], path: Path) -> None:
    """A stacked bar per trial: the median of each part of its step, with the prediction
    that ranked it (which covers compute, allreduce and optimizer)."""
    fig, ax = plt.subplots(figsize=(5, 4.2))
    x = range(len(rows))
    bottom = [0.0] * len(rows)
    for part in PARTS:
        heights = [t["breakdown_s"][part] * 1e3 for t in rows]
        ax.bar(x, heights, bottom=bottom, label=part)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.scatter(x, [t["predicted_step_s"] * 1e3 for t in rows], marker="_", s=400,
               color="black", label="ranked prediction", zorder=3)
    ax.set_xticks(list(x), [t["key"] for t in rows], rotation=30, fontsize=8)
    ax.set_ylabel("median ms per step")
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_losses(losses: Sequence[float], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 4.2))
    ax.plot(range(1, len(losses) + 1), losses, marker=".")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over workers)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
