"""`orchestrator crossover`: project DP-only vs hybrid DP x MP time to accuracy over
1..N GPUs and find the smallest cluster at which hybrid wins."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from orchestrator.cli.paths import input_dir, loaded_by, output_dir
from placement.cluster import ClusterSpec, preset
from placement.errors import UserError
from placement.graph import OpGraph
from placement.io import load_graph
from placement.scaling.comm import ALGORITHMS
from placement.scaling.crossover import CrossoverResult, ScalingParams, crossover
from placement.scaling.efficiency import dataset_size_for, efficiency_for, load_curve
from placement.scaling.step import BatchRule
from placement.policy import DEFAULT_SOLVER
from placement.scaling.workers import (
    DEFAULT_MP_DEGREES,
    PLAN_TIME_LIMIT_S,
    default_batches,
    worker_plans,
    worker_steps,
)

def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("crossover", help="DP vs hybrid time to accuracy and the cross-over",
                       description=__doc__)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="profile this model (e.g. biglstm, gnmt, inception_v3)")
    source.add_argument("--graph", type=loaded_by(load_graph),
                        help="op graph JSON in seconds, profiled at one batch")
    p.add_argument("--preset", default="paper",
                   help="model size preset for --model (default: paper)")
    p.add_argument("--plans", type=input_dir,
                   help="folder of plan_mp<M>.json files (others are computed)")
    p.add_argument("--solver", default=DEFAULT_SOLVER,
                   help=f"solver for the plans computed here (default {DEFAULT_SOLVER})")
    p.add_argument("--plan-time-limit", type=float, default=PLAN_TIME_LIMIT_S,
                   dest="plan_time_limit", help="seconds those plans may take in all "
                   f"(default {PLAN_TIME_LIMIT_S:g})")
    p.add_argument("--cluster", required=True, help="cluster preset, e.g. dgx1-v100")
    stats = p.add_mutually_exclusive_group()
    stats.add_argument("--curve", type=loaded_by(load_curve),
                       help="CSV of global_batch,epochs measured to the target")
    stats.add_argument("--noise-scale", type=float, dest="noise_scale",
                       help="gradient noise scale B_noise in samples")
    p.add_argument("--min-epochs", type=float, dest="min_epochs",
                   help="E_min in epochs for --noise-scale (default: the model's, else 1)")
    p.add_argument("--dataset-size", type=float, dest="dataset_size",
                   help="samples per epoch (default: the model's, else 1e6)")
    p.add_argument("--max-gpus", type=int, default=4096, dest="max_gpus")
    p.add_argument("--mp-degrees", default=",".join(map(str, DEFAULT_MP_DEGREES)),
                   dest="mp_degrees", help="hybrid mp_degrees to try, comma-separated")
    p.add_argument("--batches", help="per-worker batches to try, comma-separated "
                                     "(default: b0/8 .. 4 b0)")
    p.add_argument("--profiled-batch", type=float, dest="profiled_batch",
                   help="batch the graph was profiled at (default: its metadata.batch, as the profiler writes)")
    p.add_argument("--min-efficient-batch", type=float, default=8.0,
                   dest="min_efficient_batch",
                   help="samples per micro-batch below which an op is no faster (default 8)")
    p.add_argument("--overlap", type=float, default=0.5,
                   help="share of the allreduce hidden under backward (default 0.5)")
    p.add_argument("--allreduce", choices=ALGORITHMS, default="best")
    p.add_argument("--out", required=True, type=output_dir,
                   help="folder for crossover.json and crossover.png")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(run=run)


def _numbers(text: str, what: str, kind: type = float) -> list:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{what} {text!r}: give numbers separated by commas, e.g. 2,4,8") from None
    if not values:
        raise UserError(f"{what} {text!r} is empty: give at least one number")
    return values


def model_graph(name: str, cluster: ClusterSpec, model_preset: str = "paper") -> OpGraph:
    try:
        from orchestrator.profile import profile_model
    except ImportError as err:
        if not (err.name or "").startswith(("orchestrator.profile", "torch")):
            raise
        raise UserError("--model needs orchestrator.profile.profile_model, which this "
                        f"checkout lacks ({err}): pass --graph G.json instead") from None
    return profile_model(name, preset=model_preset, target=cluster.device.name)


def run(args: argparse.Namespace) -> int:
    cluster = preset(args.cluster)
    if args.max_gpus < 1:
        raise UserError(f"--max-gpus {args.max_gpus}: must be at least 1 (e.g. --max-gpus 4096)")
    mp_degrees = _numbers(args.mp_degrees, "--mp-degrees", int)
    graph = model_graph(args.model, cluster, args.preset) if args.model else args.graph
    model = args.model or graph.metadata.get("model")
    efficiency = efficiency_for(args.curve, args.noise_scale, args.min_epochs, model)
    dataset_size = dataset_size_for(args.dataset_size, model)
    b0 = args.profiled_batch or graph.metadata.get("batch")
    if b0 is None:
        raise UserError(f"graph {graph.name!r} does not say which batch it was profiled at: "
                        "pass --profiled-batch B")
    rule = BatchRule(profiled_batch=float(b0), min_efficient_batch=args.min_efficient_batch)
    params = ScalingParams(overlap_fraction=args.overlap, allreduce_algorithm=args.allreduce)
    batches = (_numbers(args.batches, "--batches") if args.batches
               else list(default_batches(rule.profiled_batch)))
    if args.plan_time_limit <= 0:
        raise UserError(f"--plan-time-limit {args.plan_time_limit}: must be > 0 seconds")
    plans = worker_plans(graph, cluster, mp_degrees, args.plans,
                         time_limit_s=args.plan_time_limit, solver=args.solver)
    workers = worker_steps(graph, plans, cluster, batches, rule)
    result = crossover(workers, cluster, efficiency, dataset_size, args.max_gpus, params)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = {
        "graph": graph.name, "model": model, "cluster": cluster.name,
        "statistical_efficiency": efficiency.source, "dataset_size": dataset_size,
        "profiled_batch": rule.profiled_batch, "min_efficient_batch": rule.min_efficient_batch,
        "per_worker_batches": batches, "mp_degrees": sorted(plans),
        "overlap_fraction": params.overlap_fraction,
        "allreduce_algorithm": params.allreduce_algorithm,
        "optimizer_passes": params.optimizer_passes,
        "plans": {m: {"solver": p.solver, "status": p.status, "value": p.value,
                      "lower_bound": p.lower_bound, "gap": p.gap,
                      "num_micro_batches": p.num_micro_batches,
                      "step_time_s_at_profiled_batch": p.step_time, "notes": list(p.notes)}
                  for m, p in plans.items()},
    }
    report = {**result.to_dict(), "inputs": inputs}
    (out / "crossover.json").write_text(json.dumps(report, indent=1) + "\n")
    from orchestrator.report.crossover_plot import save_crossover_plot

    save_crossover_plot(result, out / "crossover.png", f"{graph.name} on {cluster.name}")
    if args.json:
        print(json.dumps(report))
    else:
        print(format_table(result, inputs))
    return 0


def format_table(result: CrossoverResult, inputs: dict[str, Any]) -> str:
    lines = [
        f"{inputs['graph']} on {inputs['cluster']}: {inputs['statistical_efficiency']}",
        "  num_gpus   DP hours   (batch)   hybrid hours  mp  (batch)   speedup",
    ]
    for r in result.rows:
        dp = "-" if r.dp is None else f"{r.dp.time_to_accuracy_s / 3600:9.3f}   {r.dp.config.global_batch:7g}"
        hy = ("-" if r.hybrid is None else
              f"{r.hybrid.time_to_accuracy_s / 3600:9.3f}    {r.hybrid.config.mp_degree:2d}  "
              f"{r.hybrid.config.global_batch:7g}")
        sp = "-" if r.speedup is None else f"{r.speedup:.3f}x"
        lines.append(f"  {r.num_gpus:8d}   {dp:<19}   {hy:<27}   {sp}")
    cross = result.crossover_num_gpus
    lines.append(f"  cross-over: {cross} GPUs" if cross is not None
                 else "  cross-over: hybrid never wins up to --max-gpus")
    unfit = sum(not p.fits_memory for p in result.projections)
    if unfit:
        lines.append(f"  note: {unfit} configuration(s) do not fit in device memory "
                     "(listed in crossover.json with fits_memory false)")
    return "\n".join(lines)
