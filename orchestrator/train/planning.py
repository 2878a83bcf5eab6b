"""Planning one worker of a training run: its share of the batch profiled on this
machine, its ops placed on its mp_degree devices."""

from __future__ import annotations

import dataclasses

from orchestrator.train.config import TrainConfig
from placement import policy
from placement.cluster import ClusterSpec, preset
from placement.graph import OpGraph
from placement.plan import Plan
from placement.policy import DEFAULT_SOLVER

#: Seconds `plan_worker`'s MILP may take (one plan: `orchestrator train` without --plan).
PLAN_TIME_LIMIT_S = 20.0


def worker_batch_size(cfg: TrainConfig) -> int:
    """Samples in one worker's share of the global batch."""
    from orchestrator.models import build

    global_batch = cfg.global_batch or build(cfg.model, cfg.preset, device="meta").batch
    return max(1, global_batch // cfg.dp_degree)


def profile_worker_batch(cfg: TrainConfig, **options) -> OpGraph:
    """The model's graph profiled on this machine at a worker's share of the batch
    (`options`: more of profile_model's, e.g. `device="meta"`).

    At the batch the worker runs, the profiler's split overhead at each micro-batch
    count (placement/tasks.py split_overhead) says what K micro-batches of it cost
    beyond the op times (fixed costs per task, kernels on smaller tensors), measured
    in one profile for every K, so that the plans of different K are compared on the
    same measurement."""
    from orchestrator.profile import profile_model

    return profile_model(cfg.model, preset=cfg.preset, target="cpu",
                         batch=worker_batch_size(cfg), granularity=cfg.granularity, **options)


def plan_worker(cfg: TrainConfig, *, solver: str = DEFAULT_SOLVER,
                time_limit_s: float = PLAN_TIME_LIMIT_S,
                graph: OpGraph | None = None, cluster: ClusterSpec | None = None,
                objective: str = "makespan") -> Plan:
    """Place the worker's ops on its devices by the planning policy within
    `time_limit_s`, for `objective` (as `orchestrator plan --objective`), from `graph`,
    the model profiled at the worker's batch (profiled now on this machine's CPU when
    not given), on `cluster`'s devices (default: this machine's threads, the devices
    of CPU hosts and fake-GPU clusters, whose measured CPU costs are then the right
    ones; a GPU run passes its GPUs' preset and a GPU profile:
    orchestrator/train/resources.py plan_on_gpus)."""
    if graph is None:
        graph = profile_worker_batch(cfg)
    if cluster is None:
        cpu = preset("cpu")
        cluster = dataclasses.replace(cpu, devices_per_node=max(cfg.mp_degree,
                                                                cpu.devices_per_node))
    return policy.plan_worker(graph, cluster, num_devices=cfg.mp_degree,
                              num_micro_batches=cfg.num_micro_batches,
                              time_limit_s=time_limit_s, solver=solver, objective=objective)
