"""The planner's predicted step against the executor's timed step on CPU threads
(issue 16), per (mp_degree, micro-batch count K), on the job's path: the model
profiled once at the worker batch on this host (what `jobs/*.py` profile), a plan
made for each (mp_degree, K) by the planning policy (placement/policy.py), and each
plan's executor (built as the worker builds it) timed in-process at that batch, one
intra-op thread per device, as the job's timing stage times it.

The executors alternate in short runs (one untimed step, then 3 timed, each): this
host's speed drifts within seconds, and adjacent runs see the same machine. A trial is one
profile, its plans and their timing; the prediction error of a cell is the median
over the trials of (predicted - timed) / timed. On a loaded host the whole profile
can sit above or below the timing taken a minute later (every cell of a trial off by
the same factor, mp 1's plain step included, which no split cost touches), so each
row also gives the error relative to its trial's mp 1 cell: (predicted / timed) /
(mp 1's predicted / timed) - 1, what is left once that common drift is divided out.

    python -m benchmarks planner_step [--models biglstm,gnmt] [--batch 8] [--trials 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import torch

from orchestrator.profile import profile_model
from orchestrator.train.worker_executor import build_executor
from placement.cluster import preset as cluster_preset
from placement.plan import Plan
from placement.policy import plan_worker

#: (mp_degree, micro-batch count) cells: the job's (placement/policy.py job_micro_batches).
CELLS = ((1, 1), (2, 1), (2, 2), (2, 4))


def plans_of(model: str, batch: int, solver: str, time_limit_s: float) -> dict:
    """One trial's profile at `batch` and a plan per cell."""
    graph = profile_model(model, preset="tiny", batch=batch, target="cpu")
    cpu = cluster_preset("cpu")
    cluster = dataclasses.replace(cpu, devices_per_node=max(2, cpu.devices_per_node))
    plans = {(m, k): plan_worker(graph, cluster, num_devices=m, num_micro_batches=k,
                                 time_limit_s=time_limit_s, solver=solver)
             for m, k in CELLS}
    return {"graph": graph, "plans": plans}


def timed_steps(model: str, plans: dict[tuple[int, int], Plan], batch: int,
                rounds: int, steps: int = 3) -> dict[tuple[int, int], float]:
    """Median compute (zero_grad + the executor's forward and backward) of each plan at
    `batch`: in each round, each plan in turn runs one untimed step and `steps` timed
    ones (a step right after another executor's runs slower than one in a run of its
    own kind, which is what the job's timing and training run)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        built = {cell: build_executor(model, preset="tiny", seed=0, plan=p,
                                      devices=[torch.device("cpu")] * p.num_devices,
                                      num_micro_batches=p.num_micro_batches)
                 for cell, p in plans.items()}
        data = {cell: b.spec.make_batch(batch) for cell, b in built.items()}

        def step(cell) -> float:
            module = built[cell].spec.module
            started = time.perf_counter()
            module.zero_grad(set_to_none=True)
            built[cell].executor.step(data[cell], batch)
            return time.perf_counter() - started

        samples: dict[tuple[int, int], list[float]] = {cell: [] for cell in built}
        for _ in range(rounds):
            for cell in built:
                step(cell)
                samples[cell].extend(step(cell) for _ in range(steps))
    finally:
        torch.set_num_threads(before)
    return {cell: statistics.median(s) for cell, s in samples.items()}


def trial(model: str, batch: int, rounds: int, solver: str, time_limit_s: float) -> list[dict]:
    made = plans_of(model, batch, solver, time_limit_s)
    timed = timed_steps(model, made["plans"], batch, rounds)
    md = made["graph"].metadata
    drift = made["plans"][(1, 1)].step_time / timed[(1, 1)]
    rows = []
    for (m, k), p in made["plans"].items():
        rows.append({"model": model, "batch": batch, "mp_degree": m, "micro_batches": k,
                     "predicted_s": p.step_time, "timed_s": timed[(m, k)],
                     "error": (p.step_time - timed[(m, k)]) / timed[(m, k)],
                     "relative_error": p.step_time / timed[(m, k)] / drift - 1,
                     "solver": p.solver, "split_overhead": md.get("split_overhead", {}),
                     "corun_slowdown": md.get("corun_slowdown", {})})
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per model and cell, over the trials: median predicted, timed and error, and the
    error's range."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["batch"], r["mp_degree"], r["micro_batches"]),
                          []).append(r)
    out = []
    for (model, batch, m, k), trials in groups.items():
        errors = [r["error"] for r in trials]
        out.append({"model": model, "batch": batch, "mp_degree": m, "micro_batches": k,
                    "trials": len(trials),
                    "relative_error": statistics.median(r["relative_error"] for r in trials),
                    "predicted_s": statistics.median(r["predicted_s"] for r in trials),
                    "timed_s": statistics.median(r["timed_s"] for r in trials),
                    "error": statistics.median(errors), "low": min(errors),
                    "high": max(errors), "within_15": sum(abs(e) <= 0.15 for e in errors)})
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks planner_step")
    parser.add_argument("--models", default="biglstm,gnmt")
    parser.add_argument("--batch", type=int, default=8,
                        help="worker batch profiled, planned and timed (the demo's: 8)")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5,
                        help="runs of 1 + 3 steps of each plan, alternating")
    parser.add_argument("--solver", default="heuristic",
                        help="the policy's solver (the job's is auto: HiGHS, CBC, GLPK)")
    parser.add_argument("--time-limit", type=float, default=5.0, dest="time_limit",
                        help="seconds per plan for a MILP solver")
    args = parser.parse_args(argv)
    print("| model | batch | mp | K | trial | plan by | predicted ms | timed ms | error | "
          "error relative to mp 1 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for model in args.models.split(","):
        for t in range(1, args.trials + 1):
            for r in trial(model, args.batch, args.rounds, args.solver, args.time_limit):
                rows.append(r)
                print(f"| {model} | {args.batch} | {r['mp_degree']} | {r['micro_batches']} "
                      f"| {t} | {r['solver']} | {r['predicted_s'] * 1e3:.1f} | "
                      f"{r['timed_s'] * 1e3:.1f} | {r['error']:+.1%} | "
                      f"{r['relative_error']:+.1%} |", flush=True)
            print(f"<!-- {model} trial {t}: split overhead {rows[-1]['split_overhead']}, "
                  f"co-run slowdown {rows[-1]['corun_slowdown']} -->", flush=True)
    print("\n| model | batch | mp | K | trials | median predicted ms | median timed ms | "
          "median error (range) | trials within 15% | median error relative to mp 1 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in summarize(rows):
        print(f"| {s['model']} | {s['batch']} | {s['mp_degree']} | {s['micro_batches']} | "
              f"{s['trials']} | {s['predicted_s'] * 1e3:.1f} | {s['timed_s'] * 1e3:.1f} | "
              f"{s['error']:+.1%} ({s['low']:+.1%} to {s['high']:+.1%}) | "
              f"{s['within_15']} of {s['trials']} | {s['relative_error']:+.1%} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
