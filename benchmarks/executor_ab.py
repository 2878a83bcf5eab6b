"""The split-step time of two checkouts' executors, in alternating processes: did a
change to orchestrator/runtime/executor.py keep the CPU testbed's speed?

    git archive <base> | tar -x -C /tmp/base
    python -m benchmarks.executor_ab /tmp/base . --rounds 5

Each round runs one process per checkout (base first), each timing 30 mp=2 steps (2
micro-batches, the ops split into two contiguous runs) of the tiny BigLSTM and
Inception-V3 on CPU threads after 3 warm-up steps; the figure is the median over the
rounds of each round's new/base ratio of step medians (adjacent processes see the same
machine), for wall time and for the process's CPU time per step (all threads), which
other work on a loaded host moves less. Not part of `make bench`: it compares two
trees."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

MODELS = ("biglstm", "inception_v3")

# Runs inside either checkout, so it imports only what the base checkout has: its split
# (`contiguous`) is a copy of scripts/gpu_check.py's, which an older tree lacks.
ONE_CHECKOUT = """
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from orchestrator.profile.api import partition
from orchestrator.runtime.executor import OpPartition, PlanExecutor, batched_inputs

def contiguous(part, n, k):
    first, dev = {}, {}
    for op in part.ops:
        shared = [dev[first[p]] for p in op.params if p in first]
        dev[op.id] = shared[0] if shared else op.id * n // len(part.ops)
        for p in op.params:
            first.setdefault(p, op.id)
    ids = [o.id for o in part.ops]
    return dev, [[(o, "forward", m) for m in range(k) for o in ids if dev[o] == d]
                 + [(o, "backward", m) for m in range(k) for o in reversed(ids)
                    if dev[o] == d] for d in range(n)]

out = {}
for model in sys.argv[2].split(","):
    part, spec = partition(model, preset="tiny", seed=0)
    dev, order = contiguous(part, 2, 2)
    ex = PlanExecutor(OpPartition(part.module, {o.id: o.nodes for o in part.ops}), dev, order,
                      [torch.device("cpu")] * 2, num_micro_batches=2,
                      batched=batched_inputs(spec.make_batch))
    batch = spec.make_batch(spec.batch)
    times, cpu = [], []
    for i in range(33):
        part.module.zero_grad(set_to_none=True)
        t0, c0 = time.perf_counter(), time.process_time()
        ex.step(batch, spec.batch)
        if i >= 3:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    out[model] = statistics.median(times)
    out[model + ":cpu"] = statistics.median(cpu)
print(json.dumps(out))
"""


def run(tree: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", ONE_CHECKOUT, tree, ",".join(MODELS)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    keys = [key for m in MODELS for key in (m, m + ":cpu")]
    ratios: dict[str, list[float]] = {key: [] for key in keys}
    for r in range(args.rounds):
        base, new = run(args.base), run(args.new)
        for key in keys:
            ratios[key].append(new[key] / base[key])
        print(f"round {r + 1}: " + "  ".join(
            f"{m} base {base[m] * 1e3:.2f} ms new {new[m] * 1e3:.2f} ms" for m in MODELS),
            flush=True)
    for key in keys:
        what = "CPU time (all threads)" if key.endswith(":cpu") else "wall time"
        print(f"{key.split(':')[0]} {what}: new/base median "
              f"{statistics.median(ratios[key]):.3f} "
              f"(rounds {min(ratios[key]):.3f}-{max(ratios[key]):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
