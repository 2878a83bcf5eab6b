"""Gantt chart of a plan's timeline: one row per device, forward and backward tasks."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from placement.plan import Plan  # noqa: E402


def save_gantt(plan: Plan, path: str | Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * plan.num_devices))
    colours = {"forward": "tab:blue", "backward": "tab:orange"}
    for _op, phase, _mb, device, start, end in plan.timeline:
        if end > start:
            ax.barh(device, end - start, left=start, height=0.6, color=colours[phase],
                    edgecolor="black", linewidth=0.2)
    ax.set_yticks(range(plan.num_devices))
    ax.set_yticklabels([f"device {d}" for d in range(plan.num_devices)])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({plan.time_unit})")
    ax.set_title(f"{plan.graph_name}: {plan.objective} plan by {plan.solver}, "
                 f"step time {plan.step_time:.4g} {plan.time_unit}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
