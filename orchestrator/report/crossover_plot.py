"""Cross-over chart: time to accuracy and speedup over DP against num_gpus."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from placement.scaling.crossover import CrossoverResult  # noqa: E402


def save_crossover_plot(result: CrossoverResult, path: str | Path, title: str) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True)
    curves: dict[int, list[tuple[int, float]]] = {}
    for row in result.rows:
        for mp, p in result.best_by_mp(row.num_gpus).items():
            curves.setdefault(mp, []).append((row.num_gpus, p.time_to_accuracy_s))
    dp = dict(curves.get(1, []))
    for mp, points in sorted(curves.items()):
        xs, ys = zip(*points)
        label = "DP only" if mp == 1 else f"hybrid, mp_degree {mp}"
        style = {"linewidth": 2.5, "color": "black"} if mp == 1 else {"marker": "o",
                                                                      "markersize": 3}
        top.plot(xs, [y / 3600 for y in ys], label=label, **style)
        if mp > 1:
            pairs = [(n, dp[n] / t) for n, t in points if n in dp]
            if pairs:
                bottom.plot(*zip(*pairs), marker="o", markersize=3, label=f"mp_degree {mp}")
    best = [(r.num_gpus, r.speedup) for r in result.rows if r.speedup is not None]
    if best:
        bottom.plot(*zip(*best), color="tab:red", linewidth=2.5, label="best hybrid")
    bottom.axhline(1.0, color="black", linewidth=1)
    cross = result.crossover_num_gpus
    for ax in (top, bottom):
        if cross is not None:
            ax.axvline(cross, color="tab:red", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    top.set_yscale("log")
    top.set_ylabel("time to accuracy (hours)")
    bottom.set_ylabel("speedup over DP (x)")
    bottom.set_xlabel("num_gpus")
    where = f"cross-over at {cross} GPUs" if cross is not None else "hybrid never wins"
    top.set_title(f"{title}: {where}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
