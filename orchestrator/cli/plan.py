"""`orchestrator plan`: place one worker's ops onto its devices and report the plan."""

from __future__ import annotations

import argparse
import json

from orchestrator.cli.paths import loaded_by, output_file
from placement.cluster import PRESET_NAMES, preset
from placement.errors import UserError
from placement.graph import ANY_KIND, OpGraph
from placement.io import load_graph
from placement.plan import OBJECTIVES, Plan
from placement.planner import SOLVERS
from placement.policy import DEFAULT_SOLVER, plan_worker

#: The preset whose device kind matches a graph's times, when --cluster is not given.
_PRESET_FOR_KIND = {ANY_KIND: "dgx1-v100", "v100": "dgx1-v100", "a100": "dgx-a100",
                    "h100": "dgx-h100", "cpu": "cpu"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="place a graph's ops onto one worker's devices",
                       description=__doc__)
    p.add_argument("--graph", required=True, type=loaded_by(load_graph),
                   help="op graph JSON (ours or the peer format)")
    p.add_argument("--devices", type=int, required=True, help="devices of the worker (M)")
    p.add_argument("--objective", choices=OBJECTIVES, default="makespan")
    p.add_argument("--micro-batches", type=int, default=1, dest="micro_batches")
    p.add_argument("--cluster", choices=PRESET_NAMES, default=None,
                   help="cluster preset (default: the one matching the graph's device kind)")
    p.add_argument("--solver", default=DEFAULT_SOLVER,
                   help=f"one of {', '.join(SOLVERS)} (default: {DEFAULT_SOLVER}, the "
                        "MILP with the first installed of HiGHS, CBC, GLPK)")
    p.add_argument("--time-limit", type=float, default=60.0, dest="time_limit",
                   help="solver wall-clock limit in seconds")
    p.add_argument("--gap", type=float, default=0.01, help="relative gap to stop at")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=output_file, help="write the plan as JSON to this file")
    p.add_argument("--gantt", type=output_file,
                   help="write a Gantt chart PNG of the plan to this file")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.set_defaults(run=run)


def default_preset(graph: OpGraph) -> str:
    """The preset of the graph's profiling target (`orchestrator profile --target`),
    else of its only device kind, else dgx1-v100."""
    target = graph.metadata.get("target")
    if target in _PRESET_FOR_KIND and target in graph.device_kinds:
        return _PRESET_FOR_KIND[str(target)]
    kinds = sorted(graph.device_kinds)
    return _PRESET_FOR_KIND.get(kinds[0], "dgx1-v100") if len(kinds) == 1 else "dgx1-v100"


def run(args: argparse.Namespace) -> int:
    graph = args.graph
    cluster = preset(args.cluster or default_preset(graph))
    if args.time_limit <= 0:
        raise UserError(f"--time-limit {args.time_limit}: must be > 0 seconds")
    result = plan_worker(graph, cluster, num_devices=args.devices,
                         num_micro_batches=args.micro_batches, time_limit_s=args.time_limit,
                         solver=args.solver, objective=args.objective, gap=args.gap,
                         threads=args.threads)
    if args.out:
        result.save(args.out)
    if args.gantt:
        from orchestrator.report.gantt import save_gantt

        save_gantt(result, args.gantt)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(format_plan(result, cluster.name))
    return 0


def format_plan(p: Plan, cluster_name: str) -> str:
    unit = p.time_unit
    lines = [
        f"{p.graph_name}: {p.objective} on {p.num_devices} device(s) of {cluster_name}, "
        f"{p.num_micro_batches} micro-batch(es)",
        f"  value {p.value:.6g} {unit}   lower bound {p.lower_bound:.6g} {unit}   "
        f"gap {p.gap:.2%}",
        f"  solver {p.solver} ({p.status}) in {p.solve_seconds:.2f} s   "
        f"step time {p.step_time:.6g} {unit}   max-load {p.max_load:.6g} {unit}",
        "  device   load        ops   memory",
    ]
    counts = [0] * p.num_devices
    for dev in p.assignment.values():
        counts[dev] += 1
    for d in range(p.num_devices):
        lines.append(f"  {d:>6}   {p.device_load[d]:<10.6g}  {counts[d]:>4}   "
                     f"{p.device_memory_bytes[d] / 2**30:.3g} GiB")
    lines += [f"  note: {n}" for n in p.notes]
    return "\n".join(lines)
