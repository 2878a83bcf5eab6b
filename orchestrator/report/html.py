"""The job's report: an HTML page of PNG plots (sweep heat map, cross-over curve, the
winner's plan as a Gantt chart, predicted vs measured step time per trial, where each
trial's step went, the final run's losses) and the winner's JSON summary, written next
to the sweep in the storage path."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from orchestrator.report.crossover_plot import save_crossover_plot  # noqa: E402
from orchestrator.report.gantt import save_gantt  # noqa: E402
from orchestrator.report.trial_plots import (  # noqa: E402
    learned_correction,
    save_breakdown,
    save_losses,
    save_predicted_vs_measured,
)
from orchestrator.sweep_trials import CALIBRATED_TOLERANCE, cores_text  # noqa: E402
from orchestrator.train.step_breakdown import PARTS  # noqa: E402
from placement.plan import Plan  # noqa: E402
from placement.scaling.crossover import CrossoverResult  # noqa: E402
from placement.sweep_rank import PRIOR_TRIALS  # noqa: E402


def save_heatmap(rows: Sequence[dict], path: Path) -> None:
    batches = sorted({r["global_batch"] for r in rows})
    mps = sorted({r["mp_degree"] for r in rows})
    grid = np.full((len(mps), len(batches)), np.nan)
    for r in rows:
        grid[mps.index(r["mp_degree"]), batches.index(r["global_batch"])] = r["projected_time_s"]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 + 1.3 * len(batches)), 1.6 + 0.8 * len(mps)))
    image = ax.imshow(grid, cmap="viridis_r", aspect="auto")
    for i in range(len(mps)):
        for j in range(len(batches)):
            label = "not run" if np.isnan(grid[i, j]) else f"{grid[i, j]:.3g} s"
            ax.text(j, i, label, ha="center", va="center", color="white", fontsize=8)
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_yticks(range(len(mps)), [str(m) for m in mps])
    ax.set_xlabel("global batch")
    ax.set_ylabel("mp_degree")
    ax.set_title("projected time to accuracy per trial")
    fig.colorbar(image, ax=ax, label="seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _noise(value: float | None) -> str:
    return "n/a (one worker)" if value is None else f"{value:.3g}"


def _timed_text(timed: list[dict] | None) -> str:
    """What was timed before the sweep, in words ('' where nothing was)."""
    if not timed:
        return ""
    steps = "; ".join(
        f"mp {t['mp_degree']} x dp {t['dp_degree']}: " + ", ".join(
            f"{(c + a + t['optimizer_s']) * 1e3:.1f} ms at worker batch {b:g}"
            for b, c, a in zip(t["batches"], t["compute_s"], t["allreduce_s"]))
        for t in timed)
    return (f"({steps}, allreduce included, medians of alternating steps with the dp "
            "workers side by side)")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _trial_row(t: dict) -> str:
    parts = " / ".join(f"{t['breakdown_s'][p] * 1e3:.1f}" for p in PARTS)
    mark = "" if not t["calibrated"] else (" ok" if abs(t["error"]) <= CALIBRATED_TOLERANCE
                                            else " MISS")
    return (f"<tr><td>{html.escape(t['key'])}</td><td>{t['dp_degree']}</td>"
            f"<td>{t['mp_degree']}</td><td>{t['global_batch']}</td>"
            f"<td>{t['model_step_s'] * 1e3:.2f}</td>"
            f"<td>{t['overhead_s'] * 1e3:+.2f} ({html.escape(t['correction_from'])})</td>"
            f"<td>{t['predicted_step_s'] * 1e3:.2f}</td><td>{t['measured_step_s'] * 1e3:.2f}</td>"
            f"<td>{t['error']:+.1%}{mark}</td><td>{_ms(t['timed_here_step_s'])}</td>"
            f"<td>{html.escape(cores_text(t)) or '-'}</td>"
            f"<td>{_ms(t['probe_s'])} / {_ms(t['ranked_probe_s'])}; "
            f"{_ms(t['at_speed_step_s'])}, {t['at_speed_error']:+.1%}</td>"
            f"<td>{parts}</td>"
            f"<td>{t['projected_time_s']:.4g}</td><td>{t['loss']:.4f}</td>"
            f"<td>{_noise(t['noise_scale'])}</td><td>{t['steps']}</td></tr>")


def write_report(storage: Path, *, plans: dict[int, Plan], crossover: CrossoverResult,
                 summary: dict) -> Path:
    out = storage / "report"
    out.mkdir(parents=True, exist_ok=True)
    rows = summary["trials"]
    images = {"predicted_vs_measured.png": "Step time per trial: the prediction that ranked "
                                           "it vs measured",
              "breakdown.png": "Where each trial's step went (medians)",
              "sweep.png": "Sweep: projected time to accuracy (global batch x mp_degree)",
              "losses.png": "The final run's training loss",
              "crossover.png": "Cross-over: DP vs hybrid time to accuracy and speedup, "
                               "projected from the op profile with every device on its own "
                               "(lines); the sweep's trials as measured here (stars), where "
                               "the DP workers share the host's cores",
              "plan.png": "The winner's plan (one worker, Gantt chart)"}
    save_heatmap(rows, out / "sweep.png")
    save_crossover_plot(crossover, out / "crossover.png",
                        f"{summary['model']} ({summary['preset']}) on {summary['cluster']}",
                        trials=rows)
    save_gantt(plans[summary["hybrid"]["mp_degree"]], out / "plan.png")
    save_predicted_vs_measured(rows, out / "predicted_vs_measured.png")
    save_breakdown(rows, out / "breakdown.png")
    save_losses(summary["final"]["losses"], out / "losses.png")
    (out / "winner.json").write_text(json.dumps(summary, indent=1) + "\n")
    table = "".join(_trial_row(t) for t in rows)
    plan_table = "".join(
        f"<tr><td>{m}</td><td>{p.num_micro_batches}</td><td>{html.escape(p.solver)}</td>"
        f"<td>{p.status}</td><td>{p.value * 1e3:.2f}</td><td>{p.lower_bound * 1e3:.2f}</td>"
        f"<td>{p.gap:.1%}</td><td>{html.escape('; '.join(p.notes))}</td></tr>"
        for m, p in sorted(plans.items()))
    figures = "".join(f'<figure><img src="{name}" alt="{html.escape(caption)}">'
                      f"<figcaption>{html.escape(caption)}</figcaption></figure>"
                      for name, caption in images.items())
    winner, hybrid = summary["winner"], summary["hybrid"]
    losses = summary["final"]["losses"]
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(summary['model'])} sweep report</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px}}
figure{{display:inline-block;margin:0.5em;width:520px}}img{{width:100%}}</style></head><body>
<h1>{html.escape(summary['model'])} ({html.escape(summary['preset'])}) on
{summary['num_gpus']} device(s)</h1>
<p>Winner: <b>dp {hybrid['dp_degree']} x mp {hybrid['mp_degree']}</b>, global batch
{hybrid['global_batch']}, {hybrid['num_micro_batches']} micro-batch(es), lr {winner['lr']:.4g};
projected time to accuracy {summary['winner_projected_time_s']:.4g} s. Cross-over
(projection, {html.escape(summary['cluster'])}): {summary['crossover_num_gpus']}.
Final run: loss {losses[0]:.3f} at its first step, {losses[-1]:.3f} at its last.</p>
<p>Each trial's step before correction: {html.escape(summary['step_prediction'])}
{html.escape(_timed_text(summary['timed_steps']))}.
Correction learned (measured step = the uncorrected x a ratio per mp_degree, the trials'
median ratio shrunk towards 1 as if {PRIOR_TRIALS} more trials had measured the timed step;
where an mp_degree's trials timed its step in their own workers before their first step, the
rest of it rank from those timings at their own batch, times the trials' measured over timed
step, in full):
{html.escape(learned_correction(rows))}. A trial ranked with the ratio of its own mp_degree
must measure within {CALIBRATED_TOLERANCE:.0%} of its ranked prediction (ok / MISS).
Cores: how many of the host's cores the trial's worker kept busy from the end of its data
to the end of its update (its process's CPU seconds per wall second, medians), against its
timing's at the same worker batch; where the devices are the host's cores, a trial that got
fewer shared them with other processes while it ran.</p>
<h2>Plots</h2>{figures}
<h2>Trials, in the order the sweep ran them</h2>
<table><tr><th>trial</th><th>dp</th><th>mp</th><th>global batch</th>
<th>uncorrected step (ms)</th><th>correction (ms)</th><th>ranked step (ms)</th>
<th>measured step (ms)</th><th>error</th><th>timed in its workers (ms)</th>
<th>cores (trial, timing)</th><th>host-speed probe: trial / before ranking (ms); carried to it (ms, error)</th>
<th>{' / '.join(PARTS)} (ms)</th>
<th>projected time (s)</th><th>loss</th><th>noise scale</th><th>steps</th></tr>{table}</table>
<h2>Plans (one worker per mp_degree)</h2>
<table><tr><th>mp</th><th>micro-batches</th><th>made by</th><th>status</th>
<th>predicted step (ms)</th><th>bound (ms)</th><th>gap</th><th>notes</th></tr>{plan_table}</table>
<p>Summary: <a href="winner.json">winner.json</a>. TensorBoard: <code>tensorboard --logdir
{html.escape(str(storage / 'sweep'))}</code>.</p>
<script>
// Self-check a reader (or a headless browser) can see: how many plots rendered.
window.addEventListener("load", () => {{
  const imgs = [...document.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.imagesLoaded = ok + "/" + imgs.length;
}});
</script>
</body></html>
"""
    path = out / "index.html"
    path.write_text(page)
    return path
