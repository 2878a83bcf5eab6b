"""The runtime's figures (issue 6):

1. MP speedup: one worker's step on 2 devices (2 cores, one thread each) over 1 device
   (1 core), for the tiny models, measured side by side, next to the simulator's
   predicted speedup from the profiled graph.
2. Overhead against Ray Train's own DDP (`prepare_model`) at dp_degree=2, mp_degree=1:
   both run in one local Ray session, same model, data, optimizer and steps.

    python -m benchmarks runtime [--models biglstm,inception_v3] [--batch 256]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time

import torch

from orchestrator.profile import partition
from orchestrator.runtime.executor import OpPartition, PlanExecutor, batched_inputs
from orchestrator.train.config import TrainConfig
from orchestrator.train.launch import fit, plan_worker, profile_micro_batch, ray_cluster


def step_s(executor: PlanExecutor, spec, batch: tuple, batch_size: int) -> float:
    spec.module.zero_grad(set_to_none=True)
    started = time.perf_counter()
    executor.step(batch, batch_size)
    return time.perf_counter() - started


MICRO_BATCHES = (1, 2, 4)


def mp_speedup(model: str, batch_size: int, rounds: int, steps: int = 3) -> list[dict]:
    """Measured and predicted step time at mp 1 and at mp 2 with each micro-batch count
    K: one row per K. mp1 runs the whole batch on one device (what `orchestrator train`
    does at mp 1). This machine's speed drifts by 10-40% within a second, so the
    executors alternate in short runs: one untimed step (a step after another
    executor's runs slower than in a run of its own, as training steps are) and
    `steps` timed."""
    torch.set_num_threads(1)
    part, spec = partition(model)
    batch = spec.make_batch(batch_size)
    # mp1 and the mp2 plan with K = 1 share one profile: profiles taken a few seconds
    # apart differ by up to 20% here, which would swamp the prediction. K > 1 needs a
    # profile of its micro-batch, so its prediction carries that noise.
    configs = {k: TrainConfig(model=model, global_batch=batch_size, mp_degree=2,
                              num_micro_batches=k) for k in MICRO_BATCHES}
    graphs = {k: profile_micro_batch(c) for k, c in configs.items()}
    plans = {"mp1": plan_worker(dataclasses.replace(configs[1], mp_degree=1),
                                micro=graphs[1])}
    plans.update((k, plan_worker(c, micro=graphs[k])) for k, c in configs.items())
    executors = {name: PlanExecutor(
        OpPartition(part.module, {o.id: o.nodes for o in part.ops}), p.assignment, p.order,
        [torch.device("cpu")] * p.num_devices, num_micro_batches=p.num_micro_batches,
        batched=batched_inputs(spec.make_batch)) for name, p in plans.items()}
    times: dict[object, list[float]] = {name: [] for name in executors}
    for _ in range(rounds):
        for name, ex in executors.items():
            step_s(ex, spec, batch, batch_size)
            times[name] += [step_s(ex, spec, batch, batch_size) for _ in range(steps)]
    mp1 = statistics.median(times["mp1"])
    return [{"model": model, "batch": batch_size, "micro_batches": k, "mp1_s": mp1,
             "mp2_s": statistics.median(times[k]),
             "measured": mp1 / statistics.median(times[k]),
             "predicted": plans["mp1"].step_time / plans[k].step_time}
            for k in MICRO_BATCHES]


def ddp_loop(config: dict) -> dict:
    """Ray Train's own data parallelism: DDP from `prepare_model`, the same batches."""
    import ray.train
    import ray.train.torch

    from orchestrator.models import build
    from orchestrator.train.batches import BatchSource

    torch.set_num_threads(1)
    cfg = TrainConfig(**config["train"])
    spec = build(cfg.model, cfg.preset, seed=cfg.seed)
    model = ray.train.torch.prepare_model(spec.module)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    ctx = ray.train.get_context()
    source = BatchSource(spec, data=None, global_batch=cfg.global_batch,
                         rank=ctx.get_world_rank(), dp_degree=ctx.get_world_size(), seed=0)
    times = []
    for step in range(cfg.steps):
        batch = source.batch(step)
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(*batch).backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
        ray.train.report({"step": step + 1})
    return {"step_times_s": times}


def ddp_overhead(model: str, batch_size: int, steps: int, rounds: int) -> dict:
    """Median step time of ours and of Ray Train's DDP, in `rounds` alternating runs
    (the machine's speed drifts between runs); the ratio is the median of the rounds'."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    cfg = TrainConfig(model=model, dp_degree=2, global_batch=batch_size, steps=steps,
                      checkpoint_every=steps)
    worker_plan = plan_worker(cfg)
    storage = tempfile.mkdtemp(prefix="bench-runtime-")
    skip = min(5, steps - 1)
    ours, theirs = [], []
    for r in range(rounds):
        times = fit(cfg, worker_plan, storage=storage, name=f"ours-{r}")["step_times_s"]
        ours.append(statistics.median(times[skip:]))
        times = TorchTrainer(
            ddp_loop, train_loop_config={"train": cfg.to_dict()},
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
            torch_config=TorchConfig(backend="gloo"),
            run_config=RunConfig(name=f"ddp-{r}", storage_path=storage),
        ).fit().return_value["step_times_s"]
        theirs.append(statistics.median(times[skip:]))
    ratios = [a / b for a, b in zip(ours, theirs)]
    return {"model": model, "batch": batch_size, "ours_s": statistics.median(ours),
            "ddp_s": statistics.median(theirs), "ratio": statistics.median(ratios),
            "low": min(ratios), "high": max(ratios)}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.runtime")
    parser.add_argument("--models", default="biglstm,inception_v3")
    parser.add_argument("--batch", type=int, default=256, help="per-worker batch for MP")
    parser.add_argument("--rounds", type=int, default=8,
                        help="runs of 1 + 3 steps of each executor, alternating")
    parser.add_argument("--ddp-steps", type=int, default=30, dest="ddp_steps")
    parser.add_argument("--ddp-rounds", type=int, default=3, dest="ddp_rounds")
    parser.add_argument("--skip-ddp", action="store_true", dest="skip_ddp")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    print("| model | batch | K | mp1 measured ms | mp2 measured ms | measured speedup | "
          "predicted speedup | prediction error |")
    print("|---|---|---|---|---|---|---|---|")
    for model in models:
        batch = args.batch if model == "biglstm" else max(8, args.batch // 32)
        for r in mp_speedup(model, batch, args.rounds):
            print(f"| {model} | {batch} | {r['micro_batches']} | {r['mp1_s'] * 1e3:.1f} | "
                  f"{r['mp2_s'] * 1e3:.1f} | {r['measured']:.2f}x | {r['predicted']:.2f}x | "
                  f"{(r['predicted'] - r['measured']) / r['measured']:+.1%} |", flush=True)
    if args.skip_ddp:
        return
    print("\n| model | global batch | ours (dp2 x mp1) ms | Ray Train DDP ms | ratio "
          "(min-max over rounds) |")
    print("|---|---|---|---|---|")
    with ray_cluster(None):
        for model in models:
            r = ddp_overhead(model, 16, args.ddp_steps, args.ddp_rounds)
            print(f"| {model} | 16 | {r['ours_s'] * 1e3:.1f} | {r['ddp_s'] * 1e3:.1f} | "
                  f"{r['ratio']:.3f} ({r['low']:.2f}-{r['high']:.2f}) |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
