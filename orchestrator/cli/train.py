"""`orchestrator train`: hybrid DPxMP training of a model on Ray Train."""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from orchestrator.cli.paths import input_dir, loaded_by, output_dir
from orchestrator.profile.capture import GRANULARITIES
from orchestrator.runtime.device_kind import DeviceKind
from orchestrator.train.config import TrainConfig
from placement.errors import UserError
from placement.plan import load_plan
from placement.policy import DEFAULT_SOLVER


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model with dp workers of mp devices each",
                       description=__doc__)
    p.add_argument("--model", required=True,
                   help="biglstm, gnmt, inception_v3, vgg16, or MODULE:FUNCTION (a model "
                        "of your own, see orchestrator.models)")
    p.add_argument("--preset", default="tiny", choices=("tiny", "paper"))
    p.add_argument("--dp", type=int, default=1, help="workers (data parallel)")
    p.add_argument("--mp", type=int, default=1, help="devices per worker (model parallel)")
    p.add_argument("--micro-batches", type=int, default=1, dest="micro_batches")
    p.add_argument("--global-batch", type=int, default=None, dest="global_batch",
                   help="samples per step over all workers (default: the preset's, or "
                        "the batch of the model's ModelSpec)")
    p.add_argument("--plan", type=loaded_by(load_plan),
                   help="plan JSON from `orchestrator plan` (default: profile and plan now)")
    p.add_argument("--granularity", default=None, choices=GRANULARITIES,
                   help="what one op is in the plan made without --plan (as orchestrator "
                        "profile --granularity; default: --plan's, else module)")
    p.add_argument("--solver", default=DEFAULT_SOLVER,
                   help=f"solver for the plan made without --plan (default {DEFAULT_SOLVER})")
    p.add_argument("--plan-time-limit", type=float, default=None, dest="plan_time_limit",
                   help="seconds that plan may take (default: "
                        "orchestrator.train.planning.PLAN_TIME_LIMIT_S, 20)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint-every", type=int, default=5, dest="checkpoint_every")
    p.add_argument("--mixed-precision", action="store_true", dest="mixed_precision")
    p.add_argument("--clip-grad-norm", type=float, default=None, dest="clip_grad_norm")
    p.add_argument("--data", type=input_dir,
                   help="dataset root in a built-in model's layout (default: synthetic; a "
                        "model of your own brings its data)")
    p.add_argument("--max-failures", type=int, default=1, dest="max_failures")
    p.add_argument("--gpu", action="store_true", help="workers take GPUs (NCCL)")
    p.add_argument("--fake-cluster", dest="fake_cluster", metavar="NODESxGPUS",
                   help="start a local cluster of fake-GPU nodes, e.g. 2x2")
    p.add_argument("--storage", default=None, type=output_dir,
                   help="where checkpoints and results go")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.train.checks import check_run, model_for_checks
    from orchestrator.train.cluster import parse_fake_cluster, ray_cluster
    from orchestrator.train.planning import PLAN_TIME_LIMIT_S, plan_worker
    from orchestrator.train.resources import plan_on_gpus
    from orchestrator.train.trainer import fit

    if args.fake_cluster:
        parse_fake_cluster(args.fake_cluster)
    time_limit_s = PLAN_TIME_LIMIT_S if args.plan_time_limit is None else args.plan_time_limit
    if time_limit_s <= 0:
        raise UserError(f"--plan-time-limit {time_limit_s}: must be > 0 seconds")
    worker_plan = args.plan
    if worker_plan and args.granularity not in (None, worker_plan.granularity):
        raise UserError(f"--plan places ops of --granularity {worker_plan.granularity}, "
                        f"not {args.granularity}: leave --granularity out, or plan a graph "
                        f"profiled with --granularity {args.granularity}")
    spec = model_for_checks(args.model, args.preset)
    cfg = TrainConfig(model=args.model, preset=args.preset,
                      granularity=args.granularity or (
                          worker_plan.granularity if worker_plan else "module"),
                      dp_degree=args.dp, mp_degree=args.mp,
                      global_batch=spec.batch_size(args.global_batch, "--global-batch"),
                      num_micro_batches=args.micro_batches, steps=args.steps, lr=args.lr,
                      checkpoint_every=args.checkpoint_every,
                      mixed_precision=args.mixed_precision,
                      clip_grad_norm=args.clip_grad_norm, data=args.data,
                      device_kind=DeviceKind.from_flags(gpu=args.gpu,
                                                        fake_cluster=bool(args.fake_cluster)))
    check_run(cfg, spec, worker_plan, plan_file="--plan" if worker_plan else "the plan")
    # Fake GPUs are threads of this machine: plan them here, like CPU hosts.
    if worker_plan is None and cfg.device_kind.measured_here:
        worker_plan = plan_worker(cfg, solver=args.solver, time_limit_s=time_limit_s)
    storage = args.storage or tempfile.mkdtemp(prefix="orchestrator-train-")
    with ray_cluster(args.fake_cluster):
        if worker_plan is None:
            worker_plan = plan_on_gpus(cfg, solver=args.solver, time_limit_s=time_limit_s)
        result = fit(cfg, worker_plan, storage=storage,
                     name=f"train-{args.model}-{time.strftime('%Y%m%d-%H%M%S')}",
                     max_failures=args.max_failures)
    summary = {"losses": result["losses"], "step_times_s": result["step_times_s"],
               "workers": result["workers"], "plan": {
                   "solver": worker_plan.solver, "status": worker_plan.status,
                   "gap": worker_plan.gap,
                   "predicted_step_time_s": worker_plan.step_time}, "storage": storage}
    if args.json:
        print(json.dumps(summary))
    else:
        for step, (loss, t) in enumerate(zip(result["losses"], result["step_times_s"]), 1):
            print(f"step {step:>4}  loss {loss:.4f}  {t * 1000:.1f} ms")
        for w in result["workers"]:
            print(f"worker {w['rank']} on node {w['node_id'][:12]}  devices {w['devices']}")
        print(f"checkpoints and results in {storage}")
    return 0
