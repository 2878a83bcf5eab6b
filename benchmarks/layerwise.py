"""Layer-wise parallelism (OptCNN) on Inception-V3 and VGG-16 with 4, 8 and 16 devices
of dgx1-v100: predicted step time of the searched plan against data parallelism, model
parallelism and the one weird trick, and the search time (median of --repeats runs).

    .venv/bin/python -m benchmarks.layerwise [--repeats 5] [--no-profile]

Graphs: the analytic ones of `placement.layerwise.examples` (roofline times on a V100)
with 32 samples per device (weak scaling) and with a fixed global batch of 256 (strong
scaling); then the profiler's graphs (`orchestrator.profile.profile_model`, preset
paper, target v100) with 32 samples per device. Last, graphs that do not reduce:
complete DAGs (every layer feeds every later one) with random cost tables, solved by
the exact DP over the residual.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
from collections import Counter

import numpy as np

from placement.cluster import DeviceKind, preset
from placement.graph import OpGraph
from placement.layerwise import BASELINES, CostConfig, compare
from placement.layerwise.examples import MODELS
from placement.layerwise.search import MAX_TABLE_ENTRIES, ResidualTooLargeError, solve

DEVICE_COUNTS = (4, 8, 16)
CLUSTER = "dgx1-v100"


def _strategy_summary(plan) -> str:
    """The chosen configurations, most frequent first, e.g. 'n16 x117, n8c2 x6'."""
    counts = Counter(layer.config.label for layer in plan.layers)
    return ", ".join(f"{label} x{n}" for label, n in counts.most_common(4))


def _graph(model: str, batch_size: int, device: DeviceKind, profiled: bool) -> OpGraph:
    if not profiled:
        return MODELS[model](batch_size, device)
    from orchestrator.profile import profile_model

    return profile_model(model, preset="paper", batch=batch_size, target=device.name)


def run_case(model: str, num_devices: int, batch_size: int, repeats: int,
             profiled: bool = False) -> dict:
    per_node = preset(CLUSTER).devices_per_node
    cluster = preset(CLUSTER, num_nodes=math.ceil(num_devices / per_node))
    graph = _graph(model, batch_size, cluster.device, profiled)
    runs = [compare(graph, cluster, CostConfig(num_devices=num_devices))
            for _ in range(repeats)]
    result = runs[-1]
    return {
        "model": model, "devices": num_devices, "batch": batch_size,
        "layers": len(graph.ops),
        "layerwise_ms": result.layerwise.step_time_s * 1e3,
        **{f"{name}_ms": result.baselines[name].step_time_s * 1e3 for name in BASELINES},
        "search_s": statistics.median(r.search_seconds for r in runs),
        "residual": result.search.residual_nodes,
        "configs": result.num_configs,
        "choice": _strategy_summary(result.layerwise),
    }


def residual_cases(repeats: int) -> None:
    """Time the DP over residuals that no elimination touches (complete DAGs)."""
    print("\ngraphs that do not reduce (complete DAGs, random tables)\n")
    print("| layers | configs per layer | largest DP table | seconds |")
    print("|---|---|---|---|")
    rng = np.random.default_rng(0)
    for n, k in ((4, 16), (6, 16), (5, 30), (4, 70), (5, 70)):
        nodes = [rng.random(k) for _ in range(n)]
        edges = [(u, v, rng.random((k, k))) for u in range(n) for v in range(u + 1, n)]
        try:
            results = [solve(nodes, edges) for _ in range(repeats)]
        except ResidualTooLargeError:
            print(f"| {n} | {k} | {k ** n:,} | refused (over {MAX_TABLE_ENTRIES:,}) |")
            continue
        seconds = statistics.median(r.seconds for r in results)
        print(f"| {n} | {k} | {results[0].residual_largest_table:,} | {seconds:.2f} |",
              flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the profiled graphs (they need torch, ~10 s each)")
    args = parser.parse_args(argv)
    print(f"# machine: {platform.machine()}, {platform.python_implementation()} "
          f"{platform.python_version()}, search time median of {args.repeats}")
    regimes = [("analytic, 32 samples per device", lambda n: 32 * n, False),
               ("analytic, global batch 256", lambda n: 256, False)]
    if not args.no_profile:
        regimes.append(("profiled (preset paper), 32 samples per device",
                        lambda n: 32 * n, True))
    for regime, batch_of, profiled in regimes:
        print(f"\n{regime}\n")
        print("| model | devices | batch | layer-wise ms | DP ms | MP ms | OWT ms "
              "| vs DP | vs OWT | search s | configs | layer-wise choice |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for model in ("inception_v3", "vgg16"):
            for n in DEVICE_COUNTS:
                r = run_case(model, n, batch_of(n), args.repeats, profiled)
                print(f"| {model} | {n} | {r['batch']} | {r['layerwise_ms']:.1f} "
                      f"| {r['data_parallel_ms']:.1f} | {r['model_parallel_ms']:.1f} "
                      f"| {r['one_weird_trick_ms']:.1f} "
                      f"| {r['data_parallel_ms'] / r['layerwise_ms']:.2f}x "
                      f"| {r['one_weird_trick_ms'] / r['layerwise_ms']:.2f}x "
                      f"| {r['search_s']:.2f} | {r['configs']} | {r['choice']} |", flush=True)
    residual_cases(args.repeats)


if __name__ == "__main__":
    main()
