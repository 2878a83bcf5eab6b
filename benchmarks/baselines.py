"""Baseline placers on the peer graphs: max-load and step time against the peer's figures.

    python -m benchmarks baselines
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from placement.cluster import preset
from placement.io import load_graph
from placement.planner import PlanConfig, heuristic_placements, make_problem

PEER_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "peer-graphs"

#: The peer's optimum over contiguous splits, from ../shared/peer-graphs/README.md.
PEER_MAX_LOAD = {
    "bert24_training": 41.7458125, "gnmt_training": 107.0044140625,
    "resnet50_training": 78.63181250000001, "inceptionv3_training": None,
    "inceptionv3_inference": None, "resnet50_inference": 33.774666015625,
    "bert24_inference": 17.78990625, "gnmt_inference": 32.910658203124996,
}


def measure(graph, objective: str, repeats: int) -> dict[str, tuple[float, float]]:
    """Per baseline: (value, median seconds of placing + evaluating)."""
    problem = make_problem(graph, preset("dgx1-v100"),
                           PlanConfig(num_devices=graph.metadata["num_devices"],
                                      objective=objective))
    seconds: dict[str, list[float]] = {}
    values: dict[str, float] = {}
    for _ in range(repeats):
        started = time.perf_counter()
        for name, group_device in heuristic_placements(problem).items():
            values[name] = problem.evaluate(group_device)
        seconds.setdefault("all", []).append(time.perf_counter() - started)
    return {name: (value, statistics.median(seconds["all"])) for name, value in values.items()}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.baselines")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if not PEER_DIR.is_dir():
        print(f"skipped: {PEER_DIR} is absent")
        return
    print("| graph | ops | k | peer max-load | contiguous DP | ratio | HEFT max-load | "
          "one device | HEFT step time | contiguous step time | lower bound (step) | "
          "3 baselines x 2 objectives, median s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, peer in PEER_MAX_LOAD.items():
        graph = load_graph(PEER_DIR / f"{name}.json")
        k = graph.metadata["num_devices"]
        load = measure(graph, "max-load", args.repeats)
        step = measure(graph, "makespan", args.repeats)
        bound = make_problem(graph, preset("dgx1-v100"),
                             PlanConfig(num_devices=k)).lower_bound()
        ratio = f"{load['contiguous-dp'][0] / peer:.4f}" if peer else "n/a"
        print(f"| {name} | {len(graph.ops)} | {k} | {peer if peer else 'none'} | "
              f"{load['contiguous-dp'][0]:.4f} | {ratio} | {load['heft'][0]:.3f} | "
              f"{load['single-device'][0]:.3f} | {step['heft'][0]:.3f} | "
              f"{step['contiguous-dp'][0]:.3f} | {bound:.3f} | "
              f"{load['heft'][1] + step['heft'][1]:.3f} |", flush=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
