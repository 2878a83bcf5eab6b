"""Cross-over study behind docs/crossover.md: BigLSTM, GNMT and Inception-V3 on
dgx1-v100, from the profiled graphs (`orchestrator.profile.profile_model(name,
preset="paper", target="v100")`, with --profiled) or the analytic ones
(benchmarks/analytic_models.py), with each model's documented statistical-efficiency
defaults.

    PYTHONPATH=. .venv/bin/python -m benchmarks.crossover [--profiled] [--out results/crossover]

Prints the headline table, a sensitivity table (noise scale x 1/4 and x 4, small-batch
floor 32, per-worker batch fixed at the profiled batch) and the wall time of each model's cross-over; writes each model's graph,
crossover.json and crossover.png under --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.analytic_models import MODELS
from orchestrator.cli import main as cli_main
from placement.cluster import preset
from placement.graph import OpGraph
from placement.io import save_graph
from placement.scaling.crossover import crossover
from placement.scaling.efficiency import MODEL_DEFAULTS
from placement.scaling.step import BatchRule
from placement.scaling.workers import default_batches, worker_plans, worker_steps

CLUSTER = "dgx1-v100"
PAPER_CLAIM = {"inception_v3": "at least 26.5% faster (>= 1.265x)",
               "gnmt": "at least 8% faster (>= 1.08x)", "biglstm": "at least 22% faster (>= 1.22x)"}


def _profiled(name: str) -> OpGraph:
    from orchestrator.profile import profile_model

    return profile_model(name, preset="paper", target=preset(CLUSTER).device.name)


def _summary(result) -> tuple[str, str, str]:
    last = result.rows[-1]
    best = max((r for r in result.rows if r.speedup is not None), key=lambda r: r.speedup)
    return (str(result.crossover_num_gpus), f"{last.speedup:.3f}x (mp {last.hybrid.config.mp_degree})",
            f"{best.speedup:.3f}x at {best.num_gpus}")


def sensitivity(name: str, graph: OpGraph) -> list[str]:
    cluster = preset(CLUSTER)
    d = MODEL_DEFAULTS[name]
    plans = worker_plans(graph, cluster, (2, 4, 8))
    b0 = graph.metadata["batch"]
    rows = []
    cases = (("defaults", 1.0, 8.0, default_batches(b0)),
             ("B_noise x 1/4", 0.25, 8.0, default_batches(b0)),
             ("B_noise x 4", 4.0, 8.0, default_batches(b0)),
             ("floor 32", 1.0, 32.0, default_batches(b0)),
             (f"worker batch fixed at b0={b0} (Pal et al.'s protocol)", 1.0, 8.0, (b0,)))
    for label, scale, floor, batches in cases:
        ws = worker_steps(graph, plans, cluster, batches,
                          BatchRule(profiled_batch=b0, min_efficient_batch=floor))
        eff = replace(d.efficiency, b_noise=d.efficiency.b_noise * scale)
        r = crossover(ws, cluster, eff, d.dataset_size, 4096)
        rows.append(f"| {name} | {label} | " + " | ".join(_summary(r)) + " |")
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="results/crossover")
    ap.add_argument("--profiled", action="store_true",
                    help="profile the models (paper presets) instead of the analytic graphs")
    args = ap.parse_args(argv)
    out = Path(args.out)
    headline, timing, sens = [], [], []
    for name in ("biglstm", "gnmt", "inception_v3"):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        graph = _profiled(name) if args.profiled else MODELS[name]()
        save_graph(graph, folder / "graph.json")
        walls = []
        for _ in range(3):
            started = time.perf_counter()
            cli_main(["crossover", "--graph", str(folder / "graph.json"), "--cluster", CLUSTER,
                      "--out", str(folder), "--json"])
            walls.append(time.perf_counter() - started)
        report = json.loads((folder / "crossover.json").read_text())
        rows = report["rows"]
        last = rows[-1]
        mp2 = next(r for r in rows if r["num_gpus"] == 2)
        headline.append(
            f"| {name} | {report['crossover_num_gpus']} | {last['speedup']:.3f}x "
            f"(mp {last['best_mp_degree']}) | {mp2['speedup']:.3f}x | {PAPER_CLAIM[name]} |")
        plans = report["inputs"]["plans"]
        timing.append(f"| {name} | {statistics.median(walls):.2f} s | "
                      f"{plans['1']['step_time_s_at_profiled_batch'] / plans['2']['step_time_s_at_profiled_batch']:.3f}x |")
        sens += sensitivity(name, graph)
    print("| model | cross-over (GPUs) | speedup at 4096 GPUs | speedup at 2 GPUs | paper |")
    print("|---|---|---|---|---|")
    print("\n".join(headline))
    print("\n| model | case | cross-over | speedup at 4096 | best speedup |")
    print("|---|---|---|---|---|")
    print("\n".join(sens))
    print("\n| model | crossover CLI wall time (median of 3, plans computed) | mp=2 step speedup at b0 |")
    print("|---|---|---|")
    print("\n".join(timing))


if __name__ == "__main__":
    main()
