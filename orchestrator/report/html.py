"""The job's report: an HTML page of PNG plots (sweep heat map, cross-over curve, the
winner's plan as a Gantt chart, predicted vs measured step time per trial) and the
winner's JSON summary, written next to the sweep in the storage path."""

from __future__ import annotations

import html
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from orchestrator.report.crossover_plot import save_crossover_plot  # noqa: E402
from orchestrator.report.gantt import save_gantt  # noqa: E402
from orchestrator.sweep import METRIC, Candidate  # noqa: E402
from placement.plan import Plan  # noqa: E402
from placement.scaling.crossover import CrossoverResult  # noqa: E402


def trial_rows(grid) -> list[dict]:
    """Per finished trial: its candidate, projected time and median measured step."""
    rows = []
    for result in grid:
        if result.metrics is None or METRIC not in result.metrics:
            continue
        frame = result.metrics_dataframe
        rows.append({"candidate": Candidate(**result.config["candidate"]),
                     "projected_time_s": float(result.metrics[METRIC]),
                     "measured_step_s": float(statistics.median(frame["step_time_s"])),
                     "loss": float(result.metrics["loss"]),
                     "noise_scale": result.metrics.get("noise_scale"),
                     "steps": int(result.metrics["step"])})
    return rows


def save_heatmap(rows: Sequence[dict], path: Path) -> None:
    batches = sorted({r["candidate"].global_batch for r in rows})
    mps = sorted({r["candidate"].mp_degree for r in rows})
    grid = np.full((len(mps), len(batches)), np.nan)
    for r in rows:
        c = r["candidate"]
        grid[mps.index(c.mp_degree), batches.index(c.global_batch)] = r["projected_time_s"]
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


def save_predicted_vs_measured(rows: Sequence[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 4.2))
    predicted = [r["candidate"].predicted_step_s * 1e3 for r in rows]
    measured = [r["measured_step_s"] * 1e3 for r in rows]
    ax.scatter(predicted, measured)
    for r, x, y in zip(rows, predicted, measured):
        ax.annotate(r["candidate"].key(), (x, y), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    top = max(predicted + measured) * 1.15
    ax.plot([0, top], [0, top], color="grey", linestyle="--", label="measured = predicted")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("predicted step time (ms)")
    ax.set_ylabel("measured median step time (ms)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _noise(value: float | None) -> str:
    return "n/a (one worker)" if value is None else f"{value:.3g}"


def write_report(storage: Path, *, grid, plans: dict[int, Plan], crossover: CrossoverResult,
                 summary: dict) -> Path:
    out = storage / "report"
    out.mkdir(parents=True, exist_ok=True)
    rows = trial_rows(grid)
    images = {"sweep.png": "Sweep: projected time to accuracy (global batch x mp_degree)",
              "crossover.png": "Cross-over: DP vs hybrid time to accuracy and speedup",
              "plan.png": "The winner's plan (one worker, Gantt chart)",
              "predicted_vs_measured.png": "Predicted vs measured step time per trial"}
    save_heatmap(rows, out / "sweep.png")
    save_crossover_plot(crossover, out / "crossover.png",
                        f"{summary['model']} ({summary['preset']}) on {summary['cluster']}")
    save_gantt(plans[summary["winner"]["mp_degree"]], out / "plan.png")
    save_predicted_vs_measured(rows, out / "predicted_vs_measured.png")
    (out / "winner.json").write_text(json.dumps(summary, indent=1) + "\n")
    table = "".join(
        f"<tr><td>{html.escape(r['candidate'].key())}</td><td>{r['candidate'].dp_degree}</td>"
        f"<td>{r['candidate'].mp_degree}</td><td>{r['candidate'].global_batch}</td>"
        f"<td>{r['candidate'].predicted_step_s * 1e3:.2f}</td>"
        f"<td>{r['measured_step_s'] * 1e3:.2f}</td><td>{r['projected_time_s']:.4g}</td>"
        f"<td>{r['loss']:.4f}</td><td>{_noise(r['noise_scale'])}</td><td>{r['steps']}</td></tr>"
        for r in rows)
    plan_table = "".join(
        f"<tr><td>{m}</td><td>{p.num_micro_batches}</td><td>{html.escape(p.solver)}</td>"
        f"<td>{p.status}</td><td>{p.value * 1e3:.2f}</td><td>{p.lower_bound * 1e3:.2f}</td>"
        f"<td>{p.gap:.1%}</td><td>{html.escape('; '.join(p.notes))}</td></tr>"
        for m, p in sorted(plans.items()))
    figures = "".join(f'<figure><img src="{name}" alt="{html.escape(caption)}">'
                      f"<figcaption>{html.escape(caption)}</figcaption></figure>"
                      for name, caption in images.items())
    winner = summary["winner"]
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(summary['model'])} sweep report</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px}}
figure{{display:inline-block;margin:1em}}img{{max-width:520px}}</style></head><body>
<h1>{html.escape(summary['model'])} ({html.escape(summary['preset'])}) on
{summary['num_gpus']} device(s)</h1>
<p>Winner: <b>dp {winner['dp_degree']} x mp {winner['mp_degree']}</b>, global batch
{winner['global_batch']}, {winner['num_micro_batches']} micro-batch(es), lr {winner['lr']:.4g};
projected time to accuracy {summary['winner_projected_time_s']:.4g} s. Cross-over
(projection, {html.escape(summary['cluster'])}): {summary['crossover_num_gpus']}.</p>
<h2>Trials</h2>
<table><tr><th>trial</th><th>dp</th><th>mp</th><th>global batch</th>
<th>predicted step (ms)</th><th>measured step (ms)</th><th>projected time (s)</th>
<th>loss</th><th>noise scale</th><th>steps</th></tr>{table}</table>
<h2>Plans (one worker per mp_degree)</h2>
<table><tr><th>mp</th><th>micro-batches</th><th>made by</th><th>status</th>
<th>predicted step (ms)</th><th>bound (ms)</th><th>gap</th><th>notes</th></tr>{plan_table}</table>
<h2>Plots</h2>{figures}
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
