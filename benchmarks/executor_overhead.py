"""The executor's cost per op on operator-level graphs, against the plain module.

    python -m benchmarks.executor_overhead [--models resnet50 bert3] [--batch 2]
        [--granularity decomposed] [--steps 9]

Each model of `benchmarks.op_graphs` (paper presets, weights on the CPU) is cut at
`--granularity` and one forward+backward of a batch is timed, on one thread, three
ways, interleaved round by round so that the shared machine's load falls on all three
alike:

- `plain`: the model itself (`module(*batch).backward()`);
- `mp1`: the executor under a one-device plan (it runs the captured graph whole);
- `per-op`: the executor's op-by-op path, which every split plan runs: a plan of two
  devices with every op on the first (the second idle), so that all it adds to the
  model's own work is the executor's cost of running each op as a task (fetching its
  inputs, detaching them at its boundary, the backward call per op).

It prints the median step of each, wall time and the process's CPU time, and their
ratios within the same run, and checks that the three give the same loss (ResNet-50;
BERT's dropout draws other masks in each).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from benchmarks.op_graphs import MODELS
from orchestrator.profile import partition
from orchestrator.profile.capture import GRANULARITIES
from orchestrator.runtime.executor import OpPartition, PlanExecutor, batched_inputs


def _executors(part, spec) -> dict[str, PlanExecutor]:
    op_part = OpPartition(part.module, {op.id: op.nodes for op in part.ops})
    ids = [op.id for op in part.ops]
    cpu = torch.device("cpu")
    batched = batched_inputs(spec.make_batch)
    mp1 = PlanExecutor(op_part, dict.fromkeys(ids, 0),
                       [[(i, "forward", 0) for i in ids]
                        + [(i, "backward", 0) for i in reversed(ids)]],
                       [cpu], num_micro_batches=1, batched=batched)
    per_op = PlanExecutor(op_part, dict.fromkeys(ids, 0),
                          [[(i, "forward", 0) for i in ids]
                           + [(i, "backward", 0) for i in reversed(ids)], []],
                          [cpu, cpu], num_micro_batches=1, batched=batched)
    return {"mp1": mp1, "per-op": per_op}


def measure(name: str, *, granularity: str, batch: int, steps: int, warmup: int = 2
            ) -> dict[str, object]:
    """Median wall and CPU seconds of a step, per way of running it."""
    part, spec = partition(f"benchmarks.op_graphs:{name}", preset="paper", device="cpu",
                           granularity=granularity)
    data = spec.make_batch(batch)
    runs = {"plain": lambda: _plain(spec.module, data),
            **{label: (lambda ex=ex: ex.step(data, batch))
               for label, ex in _executors(part, spec).items()}}
    wall: dict[str, list[float]] = {label: [] for label in runs}
    cpu: dict[str, list[float]] = {label: [] for label in runs}
    losses: dict[str, float] = {}
    for round_ in range(warmup + steps):
        for label, run in runs.items():
            spec.module.zero_grad(set_to_none=True)
            started, started_cpu = time.perf_counter(), time.process_time()
            losses[label] = run()
            if round_ >= warmup:
                wall[label].append(time.perf_counter() - started)
                cpu[label].append(time.process_time() - started_cpu)
    # Dropout (BERT's, as published) draws other masks in each run: compare without it.
    if name.startswith("resnet"):
        for label, loss in losses.items():
            assert abs(loss - losses["plain"]) <= 1e-4 * abs(losses["plain"]), (label, losses)
    return {"model": name, "ops": len(part.ops), "batch": batch,
            "wall": {label: statistics.median(ts) for label, ts in wall.items()},
            "cpu": {label: statistics.median(ts) for label, ts in cpu.items()}}


def _plain(module, data) -> float:
    loss = module(*data)
    loss.backward()
    return float(loss.detach())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.executor_overhead",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "bert3"],
                        choices=list(MODELS))
    parser.add_argument("--granularity", default="decomposed", choices=GRANULARITIES)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=9, help="timed rounds (median)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"--granularity {args.granularity}, batch {args.batch}, medians of {args.steps} "
          "rounds; wall ms / CPU ms (the process's CPU time: what other processes' load "
          "on the machine changes least)\n")
    print("| model | forward ops | plain | mp1 | per-op | mp1 / plain | per-op / plain | "
          "per-op / mp1 | per-op - mp1, per op |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        r = measure(name, granularity=args.granularity, batch=args.batch, steps=args.steps)
        wall, cpu = r["wall"], r["cpu"]
        cells = [" / ".join(f"{t[label] * 1e3:.0f}" for t in (wall, cpu))
                 for label in ("plain", "mp1", "per-op")]
        ratios = [" / ".join(f"{t[a] / t[b]:.3f}" for t in (wall, cpu))
                  for a, b in (("mp1", "plain"), ("per-op", "plain"), ("per-op", "mp1"))]
        per_op = " / ".join(f"{(t['per-op'] - t['mp1']) / r['ops'] * 1e6:.0f} us"
                            for t in (wall, cpu))
        print(f"| {name} | {r['ops']} | {' | '.join(cells)} | {' | '.join(ratios)} | "
              f"{per_op} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
