"""Cross-over chart: time to accuracy and speedup over DP against num_gpus.

The lines are the scaling model's projection from the op profile, every device on its
own; a sweep's trials, where given, are the points measured on its own cluster. The two
can disagree at the sweep's size: on a CPU host the devices are the host's cores, and
there the DP workers slow each other (shared cores and memory, a gloo allreduce between
processes) in a way the projection of independent devices leaves out, which the timed
and measured steps include (placement/scaling/timed_step.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from placement.scaling.crossover import CrossoverResult  # noqa: E402


def verdict(result: CrossoverResult, trials: Sequence[Mapping] = ()) -> str:
    """What the chart shows, in words: the projected cross-over, and, given a sweep's
    `trials` (dp_degree, mp_degree, projected_time_s from the step each measured), which
    configuration the sweep measured fastest, whether or not the projection agrees."""
    cross = result.crossover_num_gpus
    text = ("projected: " + (f"cross-over at {cross} GPUs" if cross is not None
                             else "hybrid never wins"))
    if trials:
        best = min(trials, key=lambda t: t["projected_time_s"])
        kind = "hybrid" if best["mp_degree"] > 1 else "DP"
        text += (f"; measured at {best['dp_degree'] * best['mp_degree']} devices: {kind} "
                 f"(dp {best['dp_degree']} x mp {best['mp_degree']}) fastest")
    return text


def save_crossover_plot(result: CrossoverResult, path: str | Path, title: str,
                        trials: Sequence[Mapping] = ()) -> None:
    """The chart of `result`, with the sweep's `trials` (see `verdict`) as points."""
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
        lines = top.plot(xs, [y / 3600 for y in ys], label=label, **style)
        measured = [t for t in trials if t["mp_degree"] == mp]
        if measured:
            top.scatter([t["dp_degree"] * mp for t in measured],
                        [t["projected_time_s"] / 3600 for t in measured], marker="*", s=90,
                        color=lines[0].get_color(), zorder=3,
                        label=f"{'DP' if mp == 1 else f'mp_degree {mp}'}: sweep trials, "
                              "measured here")
        if mp > 1:
            pairs = [(n, dp[n] / t) for n, t in points if n in dp]
            if pairs:
                bottom.plot(*zip(*pairs), marker="o", markersize=3, label=f"mp_degree {mp}")
    best = [(r.num_gpus, r.speedup) for r in result.rows if r.speedup is not None]
    if best:
        bottom.plot(*zip(*best), color="tab:red", linewidth=2.5, label="best hybrid")
    dp_trials = [t["projected_time_s"] for t in trials if t["mp_degree"] == 1]
    hybrid_trials = [t for t in trials if t["mp_degree"] > 1]
    if dp_trials and hybrid_trials:
        fastest = min(hybrid_trials, key=lambda t: t["projected_time_s"])
        bottom.scatter([fastest["dp_degree"] * fastest["mp_degree"]],
                       [min(dp_trials) / fastest["projected_time_s"]], marker="*", s=90,
                       color="tab:red", zorder=3, label="best hybrid, measured here")
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
    top.set_title(f"{title}\n{verdict(result, trials)}", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
