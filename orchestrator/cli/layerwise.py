"""`orchestrator layerwise`: choose a parallel configuration per layer (OptCNN) and
compare it with data parallelism, model parallelism and the one weird trick."""

from __future__ import annotations

import argparse
import json
import math

from orchestrator.cli.paths import loaded_by, output_file
from placement.cluster import PRESET_NAMES, ClusterSpec, preset
from placement.errors import UserError
from placement.graph import OpGraph
from placement.io import load_graph
from placement.layerwise import BASELINES, Comparison, CostConfig, LayerwisePlan, compare
from placement.layerwise.examples import MODELS

#: Samples per device when --batch-size is not given (weak scaling: the global batch
#: grows with the device count).
SAMPLES_PER_DEVICE = 32


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("layerwise", help="choose a parallel configuration per layer (OptCNN)",
                       description=__doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model to profile (preset paper) on the cluster's "
                                     f"device kind; {', '.join(MODELS)} are also "
                                     "available analytically, see --analytic")
    src.add_argument("--graph", type=loaded_by(load_graph),
                     help="op graph JSON with layer facts (orchestrator profile)")
    p.add_argument("--devices", type=int, required=True, help="number of devices (N)")
    p.add_argument("--cluster", choices=PRESET_NAMES, default="dgx1-v100",
                   help="cluster preset; nodes are added until N devices fit "
                        "(default: dgx1-v100)")
    p.add_argument("--analytic", action="store_true",
                   help="build --model from its published shapes with roofline times "
                        "instead of profiling it")
    p.add_argument("--batch-size", type=int, default=None, dest="batch_size",
                   help=f"global batch of --model (default: {SAMPLES_PER_DEVICE} x devices)")
    p.add_argument("--task-overhead-us", type=float, default=None, dest="task_overhead_us",
                   help="per-task time that splitting does not shrink, microseconds "
                        f"(default: {CostConfig(num_devices=1).task_overhead_s * 1e6:g})")
    p.add_argument("--out", type=output_file,
                   help="write the layer-wise plan as JSON to this file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def cluster_for(name: str, num_devices: int) -> ClusterSpec:
    if num_devices < 1:
        raise UserError(f"--devices is {num_devices}: give at least 1 device")
    per_node = preset(name).devices_per_node
    return preset(name, num_nodes=math.ceil(num_devices / per_node))


def load_model(name: str, cluster: ClusterSpec, batch_size: int | None,
               num_devices: int, analytic: bool) -> tuple[OpGraph, str]:
    """The model's layer graph and a line saying where it came from."""
    batch = batch_size if batch_size is not None else SAMPLES_PER_DEVICE * num_devices
    if batch < 1:
        raise UserError(f"--batch-size is {batch}: give at least 1 sample")
    if not analytic:
        try:
            from orchestrator.profile import profile_model
        except ModuleNotFoundError as err:
            if err.name != "orchestrator.profile":
                raise
        else:
            graph = profile_model(name, preset="paper", batch=batch,
                                  target=cluster.device.name)
            return graph, (f"profiled (preset paper, batch {batch}, "
                           f"target {cluster.device.name})")
    if name not in MODELS:
        why = ("" if analytic else
               " (the profiler, orchestrator.profile, is not installed here)")
        raise UserError(f"no analytic model {name!r}{why}: choose one of "
                        f"{', '.join(MODELS)}, or pass --graph with a profiled graph")
    return (MODELS[name](batch, cluster.device),
            f"analytic (batch {batch}, roofline on {cluster.device.name})")


def run(args: argparse.Namespace) -> int:
    cluster = cluster_for(args.cluster, args.devices)
    if args.graph:
        graph, source = args.graph, f"graph file {args.graph.name}"
    else:
        graph, source = load_model(args.model, cluster, args.batch_size, args.devices,
                                   args.analytic)
    overhead = {} if args.task_overhead_us is None else {
        "task_overhead_s": args.task_overhead_us * 1e-6}
    try:
        config = CostConfig(num_devices=args.devices, **overhead)
    except ValueError as err:
        raise UserError(f"{err}: fix --task-overhead-us") from None
    result = compare(graph, cluster, config)
    if args.out:
        result.layerwise.save(args.out)
    if args.json:
        print(json.dumps({**result.to_dict(), "source": source}))
    else:
        print(format_comparison(result, source))
    return 0


def _row(name: str, p: LayerwisePlan, reference: float) -> str:
    return (f"  {name:<16} {p.step_time_s * 1e3:>10.2f} {p.compute_s * 1e3:>10.2f} "
            f"{p.sync_s * 1e3:>10.2f} {p.transfer_s * 1e3:>10.2f} "
            f"{reference / p.step_time_s:>8.2f}x")


def format_comparison(result: Comparison, source: str) -> str:
    lw = result.layerwise
    dp = result.baselines["data_parallel"].step_time_s
    s = result.search
    lines = [
        f"{lw.graph_name}: {len(lw.layers)} layers on {lw.num_devices} device(s) of "
        f"{lw.cluster} ({source})",
        f"  search {result.search_seconds:.2f} s: {s.num_node_eliminations} node, "
        f"{s.num_edge_eliminations} edge, {s.num_leaf_eliminations} leaf eliminations, "
        f"{s.residual_nodes} layer(s) left",
        f"  {'strategy':<16} {'step ms':>10} {'compute':>10} {'sync':>10} "
        f"{'transfer':>10} {'vs DP':>9}",
        _row("layerwise", lw, dp),
        *(_row(name, result.baselines[name], dp) for name in BASELINES),
        "  configuration per layer (runs of equal configurations collapsed):",
    ]
    runs: list[list] = []
    for layer in lw.layers:
        if runs and runs[-1][2] == layer.config.label:
            runs[-1][1] = layer.name
            runs[-1][3] += 1
        else:
            runs.append([layer.name, layer.name, layer.config.label, 1])
    for first, last, label, count in runs:
        span = first if count == 1 else f"{first} .. {last} ({count} layers)"
        lines.append(f"    {label:<10} {span}")
    lines += [f"  note: {n}" for n in lw.notes]
    return "\n".join(lines)
