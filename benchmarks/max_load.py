"""Max-load at scale (issue 16): the ideal DP baseline against the MILP, per solver.

    python -m benchmarks.max_load [--peer] [--generated] [--graphs DIR]
        [--solvers highs,cbc,glpk] [--time-limit 60] [--dp-limit 60] [--devices 4]
        [--only NAME,...]

For each graph: the contiguous split of one order, the ideal DP (optimum over all
contiguous splits, or the contiguous split where the ideals pass its cap), and each
solver's plan with `--objective max-load --solver <name>`: value, proven bound, gap,
seconds, and the value against the peer's optimum (peer graphs) and the ideal DP.
`--graphs DIR` takes every *.json in DIR (e.g. the graphs of `orchestrator profile
--granularity aten`); the device count is the file's (peer format) or `--devices`.
No flag runs --peer and --generated. `--only` keeps the graphs whose name contains
one of the given words (e.g. `--only resnet50`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.milp import PEER, PEER_REFERENCE, TRAINING
from placement.graph import Edge, Op, OpGraph
from placement.heuristics import contiguous_split
from placement.ideal_dp import ideal_split
from placement.io import load_graph
from placement.milp.backends import BACKENDS
from placement.milp.solve import solve_plan
from placement.planner import PlanConfig, make_problem
from placement.simulate import max_load
from tests.placement.milp_cases import CLUSTER

#: Generated operator-level training graphs: transformer layers of 25 ATen-like ops.
GENERATED_LAYERS = (24, 60, 120)

#: One encoder layer at operator level: (name, forward time, inputs as offsets back
#: in the layer's op list, output size in activations). Views cost almost nothing and
#: attention scores are 4 activations; a transfer costs 3 per activation, which is
#: about what an ATen op of a small BERT costs, so cuts are as dear as real ones.
LAYER = (
    ("layernorm", 2.0, (-1,), 1), ("q", 8.0, (-1,), 1), ("k", 8.0, (-2,), 1),
    ("v", 8.0, (-3,), 1), ("q.view", 0.05, (-3,), 1), ("k.view", 0.05, (-3,), 1),
    ("v.view", 0.05, (-3,), 1), ("k.transpose", 0.05, (-2,), 1),
    ("scores", 5.0, (-4, -1), 4), ("scale", 1.0, (-1,), 4), ("softmax", 3.0, (-1,), 4),
    ("dropout", 1.0, (-1,), 4), ("context", 5.0, (-1, -6), 1),
    ("context.permute", 0.05, (-1,), 1), ("context.view", 0.05, (-1,), 1),
    ("out", 8.0, (-1,), 1), ("out.dropout", 0.5, (-1,), 1), ("residual", 0.5, (-1, -17), 1),
    ("layernorm2", 2.0, (-1,), 1), ("up", 16.0, (-1,), 4), ("gelu", 2.0, (-1,), 4),
    ("down", 16.0, (-1,), 1), ("down.dropout", 0.5, (-1,), 1),
    ("residual2", 0.5, (-1, -5), 1), ("layer.out", 0.05, (-1,), 1),
)


def transformer_dag(num_layers: int, seed: int = 0) -> OpGraph:
    """A BERT-like training graph at operator granularity: `num_layers` layers of
    LAYER (times jittered by +-20%), each op with a backward about twice its forward
    time on its device, and an embedding op first."""
    rng = np.random.default_rng(seed)
    ops = [Op(id=0, name="embedding", forward_s={"any": 4.0}, backward_s={"any": 8.0})]
    edges = []
    for layer in range(num_layers):
        base = len(ops)
        for i, (name, time_s, inputs, size) in enumerate(LAYER):
            t = time_s * float(rng.uniform(0.8, 1.2))
            ops.append(Op(id=base + i, name=f"layer{layer}.{name}", forward_s={"any": t},
                          backward_s={"any": 2 * t}, transfer_s=3.0 * size))
            for back in inputs:
                edges.append(Edge(src=max(0, base + i + back), dst=base + i))
    return OpGraph(ops=tuple(ops), edges=tuple(edges), name=f"transformer{num_layers}",
                   time_unit="unit")


def _graphs(args) -> list[tuple[OpGraph, int, float | None]]:
    """(graph, devices, peer optimum or None) for every graph asked for."""
    graphs = []
    everything = not (args.peer or args.generated or args.graphs)
    if (args.peer or everything) and PEER.is_dir():
        for name in TRAINING:
            graph = load_graph(PEER / f"{name}.json")
            graphs.append((graph, int(graph.metadata.get("num_devices", 6)),
                           PEER_REFERENCE[name]))
    if args.generated or everything:
        for num_layers in GENERATED_LAYERS:
            graphs.append((transformer_dag(num_layers), args.devices, None))
    if args.graphs:
        for path in sorted(Path(args.graphs).glob("*.json")):
            graph = load_graph(path)
            graphs.append((graph, int(graph.metadata.get("num_devices", args.devices)),
                           None))
    return graphs


def run(graphs, solvers, time_limit: float, dp_limit: float) -> None:
    print(f"\nmax-load, {time_limit:g} s limit (values in each graph's own unit)")
    print("| graph | tasks | k | peer optimum | contiguous (one order) | ideal DP | exact | "
          "DP s | solver | value | bound | gap | s | value/peer | value/DP |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for graph, k, peer in graphs:
        config = PlanConfig(num_devices=k, objective="max-load", time_limit_s=time_limit,
                            gap=1e-4)
        p = make_problem(graph, CLUSTER, config)
        one_order = contiguous_split(p.tg, k, p.group_memory, p.memory_cap)
        order_value = max_load(p.tg, one_order, k) if one_order is not None else None
        started = time.perf_counter()
        ideal = ideal_split(p.tg, k, p.group_memory, p.memory_cap,
                            deadline=started + dp_limit)
        dp_seconds = time.perf_counter() - started
        for solver in solvers:
            plan = solve_plan(p, solver)
            print(f"| {graph.name} | {p.tg.num_tasks} | {k} | {peer or '-'} | "
                  f"{_fmt(order_value)} | {_fmt(ideal and ideal.value)} | "
                  f"{'yes' if ideal and ideal.exact else 'no'} | {dp_seconds:.1f} | "
                  f"{solver} | {plan.value:.5g} | {plan.lower_bound:.5g} | {plan.gap:.2%} | "
                  f"{plan.solve_seconds:.0f} | {_ratio(plan.value, peer)} | "
                  f"{_ratio(plan.value, ideal and ideal.value)} |", flush=True)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.5g}"


def _ratio(value: float, reference: float | None) -> str:
    return "-" if not reference else f"{value / reference:.4f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.max_load", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", action="store_true", help="the peer training graphs")
    ap.add_argument("--generated", action="store_true",
                    help="generated operator-level training graphs (601-3,001 ops)")
    ap.add_argument("--graphs", metavar="DIR", help="every *.json graph file in DIR")
    ap.add_argument("--solvers", default="highs,cbc,glpk")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--dp-limit", type=float, default=60.0,
                    help="seconds for the ideal DP column (past it: not exact)")
    ap.add_argument("--devices", type=int, default=4,
                    help="devices for generated graphs and files without a count")
    ap.add_argument("--only", default="",
                    help="comma-separated words: run the graphs whose name holds one")
    args = ap.parse_args(argv)
    if args.graphs and not Path(args.graphs).is_dir():
        ap.error(f"--graphs {args.graphs}: not a directory: give a folder of graph files")
    solvers = [s for s in args.solvers.split(",") if BACKENDS[s].is_available()]
    graphs = _graphs(args)
    words = [w for w in args.only.split(",") if w]
    if words:
        graphs = [g for g in graphs if any(w in g[0].name for w in words)]
        if not graphs:
            ap.error(f"--only {args.only}: no graph's name holds any of these words")
    run(graphs, solvers, args.time_limit, args.dp_limit)


if __name__ == "__main__":
    main()
