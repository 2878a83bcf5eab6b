"""Placement MILP benchmarks (issue 3): exactness, peer graphs, step time, scaling.

    python -m benchmarks.milp [--exact] [--peer] [--step] [--scaling] [--presets]
        [--solvers highs,cbc,glpk] [--time-limit 60] [--graphs N] [--devices 2,4,8]
        [--objectives max-load,makespan] [--models biglstm,gnmt,inception_v3]
        [--configs 2x1,2x4,4x1,4x4] [--placement-bounds] [--t5]

No flag runs all six tables (long: over an hour on a 2-core machine).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from placement.graph import Edge, Op, OpGraph
from placement.io import load_graph
from placement.milp.backends import BACKENDS
from placement.milp.solve import solve_plan
from placement.planner import (
    InfeasiblePlacementError,
    PlanConfig,
    make_problem,
    solve_heuristic,
)
from placement.simulate import list_schedule
from tests.placement.milp_cases import (
    CLUSTER,
    brute_max_load,
    brute_step_time,
    problem,
    random_dag,
)

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT.parent / "shared" / "peer-graphs"
TRAINING = ("bert24_training", "gnmt_training", "resnet50_training", "inceptionv3_training")
#: Max-load optimum over contiguous splits from ../shared/peer-graphs/README.md.
PEER_REFERENCE = {"bert24_training": 41.7458125, "gnmt_training": 107.0044140625,
                  "resnet50_training": 78.63181250000001, "inceptionv3_training": None}


def exactness(solvers, num_graphs: int) -> None:
    print(f"\n(1) exactness on {num_graphs} random DAGs (5-7 ops, 2-3 devices)")
    print("| solver | objective | optimal | worst rel. error | median s |")
    print("|---|---|---|---|---|")
    cases = [(seed, 5 + seed % 3, 2 + seed % 2) for seed in range(num_graphs)]
    refs = {}
    for objective, brute in (("max-load", brute_max_load), ("makespan", brute_step_time)):
        for seed, n, k in cases:
            p = problem(random_dag(seed + (0 if objective == "max-load" else 10), n,
                                   colocate=seed % 5 == 1), k, objective)
            refs[objective, seed] = (p, brute(p.tg, k))
    for solver in solvers:
        for objective in ("max-load", "makespan"):
            hits, worst, seconds = 0, 0.0, []
            for seed, _, _ in cases:
                p, ref = refs[objective, seed]
                plan = solve_plan(p, solver)
                err = abs(plan.value - ref) / ref
                hits += err <= 1e-9
                worst = max(worst, err)
                seconds.append(plan.solve_seconds)
            print(f"| {solver} | {objective} | {hits}/{len(cases)} | {worst:.1e} | "
                  f"{statistics.median(seconds):.2f} |", flush=True)


def peer_max_load(solvers, time_limit: float, graphs) -> None:
    print(f"\n(2) max-load on the peer training graphs, 6 devices, {time_limit:g} s limit")
    print("| graph | peer optimum | heuristic | solver | value | bound | gap | s | value/peer |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in graphs:
        graph = load_graph(PEER / f"{name}.json")
        k = int(graph.metadata.get("num_devices", 6))
        for solver in solvers:
            p = make_problem(graph, CLUSTER, PlanConfig(
                num_devices=k, objective="max-load", time_limit_s=time_limit, gap=1e-4))
            heuristic = solve_heuristic(p).value
            plan = solve_plan(p, solver)
            ref = PEER_REFERENCE[name]
            ratio = f"{plan.value / ref:.4f}" if ref else "-"
            print(f"| {name} | {ref or 'none'} | {heuristic:.3f} | {solver} | "
                  f"{plan.value:.3f} | {plan.lower_bound:.3f} | {plan.gap:.2%} | "
                  f"{plan.solve_seconds:.0f} | {ratio} |", flush=True)


def step_time(solvers, time_limit: float, device_counts, graphs) -> None:
    print(f"\n(3) step time on the peer training graphs, {time_limit:g} s limit")
    print("| graph | devices | HEFT | solver | value | bound | gap | s | value/HEFT |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in graphs:
        graph = load_graph(PEER / f"{name}.json")
        for k in device_counts:
            try:
                p = make_problem(graph, CLUSTER, PlanConfig(
                    num_devices=k, objective="makespan", time_limit_s=time_limit,
                    gap=0.01))
            except InfeasiblePlacementError as err:
                print(f"| {name} | {k} | - | - | infeasible: {err} | | | | |", flush=True)
                continue
            from placement.heuristics import heft
            heft_value = list_schedule(p.tg, heft(p.tg, k, p.group_memory, p.memory_cap),
                                       k).step_time_s
            for solver in solvers:
                plan = solve_plan(p, solver)
                print(f"| {name} | {k} | {heft_value:.3f} | {solver} | {plan.value:.3f} | "
                      f"{plan.lower_bound:.3f} | {plan.gap:.2%} | {plan.solve_seconds:.0f} | "
                      f"{plan.value / heft_value:.4f} |", flush=True)


#: The job models' paper presets and the (devices, micro-batches) the table plans.
JOB_MODELS = ("biglstm", "gnmt", "inception_v3")
PRESET_CONFIGS = ((2, 1), (2, 4), (4, 1), (4, 4))


def presets(time_limit: float, models, configs=PRESET_CONFIGS,
            placement_bounds: bool = False) -> None:
    """Step time on the paper presets of the job models (profiled for V100s on the meta
    device, as `orchestrator profile --preset paper --target v100` does), by the
    planning policy ('auto' = HiGHS) against HEFT; the solver column says who made the
    plan (a heuristic + local search when the MILP found nothing better). With
    `placement_bounds`, a second table gives each plan's placement's own bound
    (`placement.milp.rank_rows.placement_bound`, without and with the rank rows): what
    no order of that placement beats, so how much of the gap only another placement
    can close."""
    from orchestrator.profile import profile_model

    print(f"\n(5) step time on the job models' paper presets (dgx1-v100), policy 'auto', "
          f"{time_limit:g} s limit")
    _policy_header()
    own_bounds = []
    for model in models:
        graph = profile_model(model, preset="paper", target="v100")
        for k, micro in configs:
            p, plan = _policy_row(model, graph, k, micro, time_limit)
            if placement_bounds:
                own_bounds.append(_own_bounds(model, p, plan))
    if own_bounds:
        print("\n| model | devices | K | value ms | bound ms | placement's bound ms | "
              "+ rank rows ms | s |")
        print("|---|---|---|---|---|---|---|---|")
        for row in own_bounds:
            print(row, flush=True)


def _policy_header() -> None:
    print("| model | devices | K | tasks | HEFT | solver | status | value | bound | gap | s "
          "| value/HEFT |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")


def _policy_row(model: str, graph: OpGraph, k: int, micro: int, time_limit: float):
    """Print one row, the planning policy's plan for k devices and `micro`
    micro-batches against HEFT, in ms; returns the problem and the plan."""
    from placement.heuristics import heft
    from placement.policy import plan_worker

    p = make_problem(graph, CLUSTER, PlanConfig(
        num_devices=k, num_micro_batches=micro, time_limit_s=time_limit))
    heft_value = list_schedule(p.tg, heft(p.tg, k, p.group_memory, p.memory_cap),
                               k).step_time_s
    plan = plan_worker(graph, CLUSTER, num_devices=k, num_micro_batches=micro,
                       time_limit_s=time_limit)
    ms = 1e3
    print(f"| {model} | {k} | {micro} | {p.tg.num_tasks} | {heft_value * ms:.1f} | "
          f"{plan.solver} | {plan.status} | "
          f"{plan.value * ms:.1f} | {plan.lower_bound * ms:.1f} | {plan.gap:.2%} | "
          f"{plan.solve_seconds:.0f} | {plan.value / heft_value:.4f} |", flush=True)
    return p, plan


def _own_bounds(model: str, p, plan) -> str:
    """A table row: the plan's placement's own bound, without and with the rank rows."""
    from placement.milp.rank_rows import placement_bound

    group_device = p.tg.group_devices(plan.assignment)
    started = time.perf_counter()
    plain, ranked = (placement_bound(p, group_device, BACKENDS["highs"], 120, with_rank_rows=r)
                     for r in (False, True))
    ms = 1e3
    return (f"| {model} | {p.num_devices} | {p.tg.num_micro_batches} | {plan.value * ms:.1f} | "
            f"{plan.lower_bound * ms:.1f} | {plain * ms:.1f} | {ranked * ms:.1f} | "
            f"{time.perf_counter() - started:.0f} |")


#: The (devices, micro-batches) of the T5 rows.
T5_CONFIGS = ((2, 4), (4, 4))


def t5_step_time(time_limit: float, configs=T5_CONFIGS) -> None:
    """Step time on a model the planner was not tuned on: transformers T5 at T5-small's
    sizes, batch 64, at the `aten` granularity (660 ops, 1,320 tasks per micro-batch;
    `benchmarks.op_graphs`), planned as the presets are."""
    from orchestrator.profile import profile_model

    graph = profile_model("benchmarks.op_graphs:t5", preset="paper", target="v100",
                          granularity="aten")
    print(f"\n(5b) step time on T5-small (aten, {len(graph.ops)} ops with their backward, "
          f"dgx1-v100), policy 'auto', {time_limit:g} s limit")
    _policy_header()
    for k, micro in configs:
        _policy_row("t5", graph, k, micro, time_limit)


def layered_dag(seed: int, num_ops: int, width: int = 8) -> OpGraph:
    """Layers of up to `width` ops; each op feeds 1-3 ops of the next layer."""
    rng = np.random.default_rng(seed)
    layers: list[list[int]] = []
    i = 0
    while i < num_ops:
        w = int(min(rng.integers(1, width + 1), num_ops - i))
        layers.append(list(range(i, i + w)))
        i += w
    ops = tuple(Op(id=j, name=f"op{j}", forward_s={"any": float(rng.uniform(1, 10))},
                   backward_s={"any": float(rng.uniform(1, 20))}) for j in range(num_ops))
    edges = set()
    for a, b in zip(layers, layers[1:]):
        for u in a:
            for v in rng.choice(b, size=min(len(b), int(rng.integers(1, 4))), replace=False):
                edges.add((u, int(v)))
        for v in b:
            if not any((u, v) in edges for u in a):
                edges.add((int(rng.choice(a)), v))
    return OpGraph(ops=ops, edges=tuple(Edge(src=u, dst=v, cost_s=float(rng.uniform(0, 4)))
                                        for u, v in sorted(edges)),
                   name=f"layered{num_ops}", time_unit="unit")


def scaling(solvers, time_limit: float, sizes, objectives=("max-load", "makespan")) -> None:
    print(f"\n(4) solve time and gap vs graph size (layered random DAGs, 4 devices, "
          f"{time_limit:g} s limit)")
    print("| ops | tasks | objective | solver | heuristic | value | bound | gap | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        graph = layered_dag(n, n)
        for objective in objectives:
            for solver in solvers:
                p = make_problem(graph, CLUSTER, PlanConfig(
                    num_devices=4, objective=objective, time_limit_s=time_limit, gap=0.01))
                started = time.perf_counter()
                heuristic = solve_heuristic(p).value
                plan = solve_plan(p, solver)
                print(f"| {n} | {p.tg.num_tasks} | {objective} | {solver} | {heuristic:.1f} | "
                      f"{plan.value:.1f} | {plan.lower_bound:.1f} | {plan.gap:.2%} | "
                      f"{time.perf_counter() - started:.0f} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.milp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--peer", action="store_true")
    ap.add_argument("--step", action="store_true")
    ap.add_argument("--scaling", action="store_true")
    ap.add_argument("--presets", action="store_true",
                    help="step time on the job models' paper presets (needs torch)")
    ap.add_argument("--t5", action="store_true",
                    help="step time on T5-small at the aten granularity (needs torch)")
    ap.add_argument("--models", default=",".join(JOB_MODELS), help="models for --presets")
    ap.add_argument("--configs", default=",".join(f"{k}x{m}" for k, m in PRESET_CONFIGS),
                    help="devices x micro-batches for --presets")
    ap.add_argument("--placement-bounds", action="store_true",
                    help="with --presets: each plan's placement's own bound")
    ap.add_argument("--objectives", default="max-load,makespan",
                    help="objectives for --scaling")
    ap.add_argument("--solvers", default="highs,cbc,glpk")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--graphs", type=int, default=30, help="random DAGs for --exact")
    ap.add_argument("--devices", default="2,4,8", help="device counts for --step")
    ap.add_argument("--sizes", default="50,100,200,500,1000,2000")
    ap.add_argument("--only", default="", help="peer graphs whose name contains this")
    args = ap.parse_args(argv)
    try:
        configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    except ValueError:
        ap.error(f"--configs {args.configs}: give devices x micro-batches, e.g. 2x1,4x4")
    if any(len(c) != 2 or min(c) < 1 for c in configs):
        ap.error(f"--configs {args.configs}: give devices x micro-batches, e.g. 2x1,4x4")
    solvers = [s for s in args.solvers.split(",") if BACKENDS[s].is_available()]
    graphs = [g for g in TRAINING if args.only in g]
    everything = not (args.exact or args.peer or args.step or args.scaling or args.presets
                      or args.t5)
    if args.exact or everything:
        exactness(solvers, args.graphs)
    if (args.peer or everything) and PEER.is_dir():
        peer_max_load(solvers, args.time_limit, graphs)
    if (args.step or everything) and PEER.is_dir():
        step_time(solvers, args.time_limit, [int(x) for x in args.devices.split(",")],
                  graphs)
    if args.scaling or everything:
        scaling(solvers, args.time_limit, [int(x) for x in args.sizes.split(",")],
                args.objectives.split(","))
    if args.presets or everything:
        presets(args.time_limit, args.models.split(","), configs, args.placement_bounds)
    if args.t5 or everything:
        t5_step_time(args.time_limit)


if __name__ == "__main__":
    main()
