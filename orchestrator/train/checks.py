"""What can be checked of a training run before Ray starts: the model builds, its data
gives batches of the right shapes, a given plan is one of this model for these degrees.
Each failure is one line naming the fix, not a worker's traceback after Ray's start."""

from __future__ import annotations

from orchestrator.models import ModelSpec, build
from orchestrator.train.batches import check_data
from orchestrator.train.config import TrainConfig
from placement.errors import UserError
from placement.plan import Plan


def model_for_checks(model: str, preset: str) -> ModelSpec:
    """The model built as profiling builds it: a paper preset on the meta device (no
    weights allocated), any other on the CPU (a user's builder may make its data set
    with torch calls, which the meta device would leave without values)."""
    return build(model, preset, device="meta" if preset == "paper" else "cpu")


def check_run(cfg: TrainConfig, spec: ModelSpec, worker_plan: Plan | None = None,
              plan_file: str = "the plan") -> None:
    """`spec`: the run's model, from `model_for_checks`."""
    assert cfg.global_batch is not None, "the caller resolves the batch (spec.batch_size)"
    check_data(spec, data=cfg.data, global_batch=cfg.global_batch, dp_degree=cfg.dp_degree,
               seed=cfg.seed)
    if worker_plan is not None:
        check_plan(worker_plan, cfg, spec, plan_file)


def check_plan(worker_plan: Plan, cfg: TrainConfig, spec: ModelSpec, plan_file: str) -> None:
    from orchestrator.profile.api import worker_partition

    if worker_plan.num_devices != cfg.mp_degree:
        raise UserError(f"{plan_file} places the model on {worker_plan.num_devices} "
                        f"device(s) but --mp is {cfg.mp_degree}: use --mp "
                        f"{worker_plan.num_devices}, or plan again with --devices "
                        f"{cfg.mp_degree}")
    if worker_plan.num_micro_batches != cfg.num_micro_batches:
        raise UserError(f"{plan_file} schedules {worker_plan.num_micro_batches} "
                        f"micro-batch(es) but --micro-batches is {cfg.num_micro_batches}: "
                        f"use --micro-batches {worker_plan.num_micro_batches}, or plan again "
                        f"with --micro-batches {cfg.num_micro_batches}")
    graph = f"{spec.name}-{spec.preset}"
    if worker_plan.graph_name and worker_plan.graph_name != graph:
        raise UserError(f"{plan_file} is a plan of graph {worker_plan.graph_name!r}, not of "
                        f"{graph!r}: profile and plan this model (orchestrator profile, "
                        "then orchestrator plan), or leave --plan out")
    granularity = worker_plan.granularity
    part = worker_partition(cfg.model, preset=cfg.preset, seed=cfg.seed,
                            granularity=granularity)
    if sorted(worker_plan.assignment) != [op.id for op in part.ops]:
        raise UserError(f"{plan_file} places {len(worker_plan.assignment)} op(s) but "
                        f"{graph} traces to {len(part.ops)} at --granularity {granularity}: "
                        "plan the graph that orchestrator profile writes for this model, "
                        "preset and granularity"
                        + ("" if granularity == "module" else
                           " with --device cpu (the worker captures it on its CPU; the meta "
                           "device traces some kernels differently)")
                        + ", or leave --plan out")
