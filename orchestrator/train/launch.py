"""The driver side of training: plan the worker, check the cluster can hold the run,
and hand a TorchTrainer to Ray Train (ScalingPolicy-style: decisions are data here,
only this module turns them into Ray calls)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.train import (CheckpointConfig, FailureConfig, RunConfig, ScalingConfig,
                       TrainingFailedError)
from ray.train.torch import TorchConfig, TorchTrainer

from orchestrator.train.config import TrainConfig
from orchestrator.train.sync import process_group_backend
from orchestrator.train.errors import user_errors_raised
from orchestrator.train.worker import STATE_FILE, train_loop_per_worker
from placement.cluster import ClusterSpec, preset
from placement.errors import UserError
from placement.graph import OpGraph
from placement.plan import Plan
from placement import policy
from placement.policy import DEFAULT_SOLVER
from placement.scaling.step import scale_graph


#: A custom resource for the sweep's trial drivers, which train nothing: clusters that
#: offer it (local Ray started here, cluster.yaml's head, `ray start --resources`) leave
#: every CPU to the workers; elsewhere a driver takes 0.01 CPU (orchestrator/sweep.py).
DRIVER_RESOURCE = "orchestrator_driver"
DRIVER_RESOURCE_AMOUNT = 1000
#: Seconds `plan_worker`'s MILP may take (one plan: `orchestrator train` without --plan).
PLAN_TIME_LIMIT_S = 20.0


class ClusterTooSmallError(UserError):
    pass


@dataclass(frozen=True, kw_only=True)
class NodeResources:
    node_id: str
    cpus: float
    gpus: float
    custom: Mapping[str, float] = dataclasses.field(default_factory=dict)


def cluster_nodes() -> list[NodeResources]:
    return [NodeResources(node_id=n["NodeID"], cpus=n["Resources"].get("CPU", 0.0),
                          gpus=n["Resources"].get("GPU", 0.0), custom=n["Resources"])
            for n in ray.nodes() if n["Alive"]]


@dataclass(frozen=True, kw_only=True)
class PlacementGroupRecord:
    """What the GCS knows of a placement group, as far as its lifetime goes."""

    pg_id: str
    job_id: str
    state: str
    detached: bool
    creator_actor_id: str | None
    """None for a group a driver created, or whose creator the GCS has marked dead."""
    resources: Mapping[str, float]
    """Summed over its bundles."""


def leaked(groups: list[PlacementGroupRecord], dead_jobs: set[str],
           actor_alive: Callable[[str], bool]) -> list[PlacementGroupRecord]:
    """Groups whose creator is gone (Ray's lifetime rule: a group that is not detached
    lives as long as the actor or driver that created it, and no longer than its job)
    but which still hold their bundles. `actor_alive` is asked only about the creators of
    groups that are not detached and whose job has ended: each answer is a GCS lookup."""
    return [g for g in groups if g.state != "REMOVED" and not g.detached
            and g.job_id in dead_jobs
            and (g.creator_actor_id is None or not actor_alive(g.creator_actor_id))]


def placement_groups_not_removed() -> list[PlacementGroupRecord]:
    """The groups holding or waiting for bundles (the GCS also remembers removed ones)."""
    # The GCS table read directly: neither ray.util.placement_group_table() nor the State
    # API names a group's creator actor, which tells a group that a live detached actor of
    # an ended job still uses from a leaked one. The table's creator_actor_dead flag is
    # not enough: a group registered after its creator's death was processed never gets
    # it (seen in 2 of 3 groups leaked by killed drivers), so the actor table decides.
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    table = gcs_pb2.PlacementGroupTableData
    records = []
    for raw in state._connect_and_get_accessor().get_placement_group_table():
        data = table.FromString(raw)
        if data.state == table.REMOVED:
            continue
        resources: dict[str, float] = {}
        for bundle in data.bundles:
            for name, amount in bundle.unit_resources.items():
                resources[name] = resources.get(name, 0.0) + amount
        records.append(PlacementGroupRecord(
            pg_id=data.placement_group_id.hex(), job_id=data.creator_job_id.hex(),
            state=table.PlacementGroupState.Name(data.state), detached=data.is_detached,
            creator_actor_id=None if data.creator_actor_dead else data.creator_actor_id.hex(),
            resources=resources))
    return records


def reclaim_leaked_placement_groups() -> list[str]:
    """Remove the placement groups Ray should have removed with their creator, and say
    which. Ray 2.60's GCS leaks one when a dying job's actor asks for it after the job was
    marked finished: a driver killed while a trial's worker group was being placed left
    a group of two CPU bundles that the GCS registered 70 ms after "Marking job as
    finished" (CI's Ray logs), and the resumed sweep's trial waited for those CPUs for 30
    minutes. Returns one line per group removed."""
    from ray._private.state import actors, jobs
    from ray.util.placement_group import PlacementGroup

    def actor_alive(actor_id: str) -> bool:
        return actors(actor_id=actor_id).get("State", "DEAD") != "DEAD"

    dead_jobs = {job["JobID"] for job in jobs() if job["IsDead"]}
    lines = []
    for group in leaked(placement_groups_not_removed(), dead_jobs, actor_alive):
        ray.util.remove_placement_group(
            PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group.pg_id))))
        held = ", ".join(f"{name} {amount:g}"
                         for name, amount in sorted(group.resources.items()))
        lines.append(f"removed placement group {group.pg_id} ({held}) left behind by ended "
                     f"job {group.job_id}: Ray misses a group requested as its job ends")
    return lines


def worker_resources(cfg: TrainConfig) -> dict[str, float]:
    """A worker's bundle: its mp_degree GPUs and a CPU, or mp_degree CPU cores."""
    return {"CPU": 1, "GPU": cfg.mp_degree} if cfg.use_gpu else {"CPU": cfg.mp_degree}


def check_fits(cfg: TrainConfig, nodes: list[NodeResources]) -> None:
    """Refuse, before any placement group is requested, a run the cluster cannot hold
    (Ray would leave it PENDING forever): every worker's bundle must fit on one node."""
    need = worker_resources(cfg)
    kind = "GPU" if cfg.use_gpu else "CPU"
    per_node = [min(int(n.cpus // need["CPU"]),
                    int(n.gpus // need["GPU"]) if cfg.use_gpu else 10**9) for n in nodes]
    largest = max((n.gpus if cfg.use_gpu else n.cpus) for n in nodes)
    if max(per_node, default=0) == 0:
        raise ClusterTooSmallError(
            f"--mp {cfg.mp_degree} needs {cfg.mp_degree} {kind}s on one node but the largest "
            f"node has {largest:g}: use --mp {int(largest)} or less")
    if sum(per_node) < cfg.dp_degree:
        raise ClusterTooSmallError(
            f"--dp {cfg.dp_degree} x --mp {cfg.mp_degree} does not fit: the cluster holds at "
            f"most {sum(per_node)} worker(s) of {cfg.mp_degree} {kind}(s) (per node: "
            f"{per_node}): use --dp {sum(per_node)} or less, or a smaller --mp")


def micro_batch_size(cfg: TrainConfig) -> int:
    """Samples in one micro-batch of a worker's share of the global batch."""
    from orchestrator.models import build

    global_batch = cfg.global_batch or build(cfg.model, cfg.preset, device="meta").batch
    return max(1, global_batch // cfg.dp_degree // cfg.num_micro_batches)


def profile_micro_batch(cfg: TrainConfig) -> OpGraph:
    """The model's graph profiled on this machine at one micro-batch of a worker's share
    of the batch.

    Profiling at the micro-batch, not at the worker's batch divided by K, keeps what a
    small batch costs per sample (fixed per-op overheads, less efficient kernels) in
    the plan's prediction."""
    from orchestrator.profile import profile_model

    return profile_model(cfg.model, preset=cfg.preset, target="cpu",
                         batch=micro_batch_size(cfg), granularity=cfg.granularity)


def plan_worker(cfg: TrainConfig, *, solver: str = DEFAULT_SOLVER,
                time_limit_s: float = PLAN_TIME_LIMIT_S,
                micro: OpGraph | None = None, cluster: ClusterSpec | None = None) -> Plan:
    """Place the worker's ops on its devices by the planning policy within
    `time_limit_s`, from `micro`, the graph of one micro-batch (profiled now on this
    machine's CPU when not given), on `cluster`'s devices (default: this machine's
    threads, the devices of CPU hosts and fake-GPU clusters, whose measured CPU costs
    are then the right ones; a GPU run passes its GPUs' preset and a GPU profile:
    orchestrator/train/resources.py plan_on_gpus)."""
    k = cfg.num_micro_batches
    if micro is None:
        micro = profile_micro_batch(cfg)
    # The planner splits each op's time over K micro-batch tasks; hand it K x the
    # micro-batch's times so that each task costs what was measured.
    graph = scale_graph(micro, compute_factor=k, data_factor=k)
    if cluster is None:
        cpu = preset("cpu")
        cluster = dataclasses.replace(cpu, devices_per_node=max(cfg.mp_degree,
                                                                cpu.devices_per_node))
    return policy.plan_worker(graph, cluster, num_devices=cfg.mp_degree,
                              num_micro_batches=k, time_limit_s=time_limit_s, solver=solver)


@contextlib.contextmanager
def ray_cluster(fake_cluster: str | None) -> Iterator[None]:
    """Join the cluster of RAY_ADDRESS (a job), start local Ray, or start a fake
    multi-node cluster `NODESxGPUS` of fake-GPU nodes on this machine."""
    if not os.environ.get("RAY_ADDRESS"):
        # An instance we start ourselves listens on this machine only. Ray 2.60 turns
        # token auth on for it, which Ray Train's own state queries then fail, so the
        # placement groups of finished runs are never cleaned up (RAY_NOTES.md).
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if fake_cluster is None:
        started = not ray.is_initialized()
        address = os.environ.get("RAY_ADDRESS")
        if started:
            # A local instance offers the sweep drivers their own resource (sweep.py).
            ray.init(address=address, log_to_driver=False,
                     resources=None if address else {DRIVER_RESOURCE: DRIVER_RESOURCE_AMOUNT})
        if address:
            # A cluster we join may hold what an earlier, killed driver leaked.
            for line in reclaim_leaked_placement_groups():
                print(line, flush=True)
        try:
            yield
        finally:
            if address:
                _withdraw_gpu_request()
            if started:
                ray.shutdown()
        return
    from ray.cluster_utils import Cluster

    num_nodes, gpus = parse_fake_cluster(fake_cluster)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {DRIVER_RESOURCE: DRIVER_RESOURCE_AMOUNT}})
    for _ in range(num_nodes):
        cluster.add_node(num_cpus=gpus, num_gpus=gpus)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        cluster.shutdown()


def _withdraw_gpu_request() -> None:
    """On an autoscaling cluster, withdraw the GPUs a job asked for
    (orchestrator/train/resources.py), so that its nodes can scale down when idle. The
    autoscaler keeps one standing request per cluster, which the next job replaces."""
    from orchestrator.train.resources import load_node_types, release_gpus

    if load_node_types():
        release_gpus()


def parse_fake_cluster(text: str) -> tuple[int, int]:
    try:
        nodes, gpus = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise UserError(f"--fake-cluster {text!r}: write NODESxGPUS, e.g. 2x2") from None
    if nodes < 1 or gpus < 1:
        raise UserError(f"--fake-cluster {text!r}: nodes and GPUs must be >= 1")
    return nodes, gpus


def fit(cfg: TrainConfig, worker_plan: Plan, *, storage: str | Path, name: str,
        max_failures: int = 0, fake_gpus: bool = False,
        resume_from: str | Path | None = None) -> dict:
    """Run training on the connected Ray cluster; returns rank 0's result.

    `resume_from`: a checkpoint directory of an earlier run, at any dp and mp degree
    (checkpoints hold the whole model, not per-device shards). A user's error raised in
    a worker (missing data, a bad batch, a GPU node without CUDA) is raised here as
    itself."""
    cfg = dataclasses.replace(cfg, fake_gpus=cfg.fake_gpus or fake_gpus)
    # Imported here: resources.py builds on this module's cluster view.
    from orchestrator.train.resources import acquire, load_node_types, plan_worker_request

    types = load_node_types() if cfg.use_gpu and not cfg.fake_gpus else None
    if types:
        # An autoscaling cluster starts GPU nodes only when asked (train/resources.py).
        acquire(plan_worker_request(types, cfg.dp_degree, cfg.mp_degree))
    check_fits(cfg, cluster_nodes())
    if resume_from is not None and not (Path(resume_from) / STATE_FILE).is_file():
        raise UserError(f"{resume_from}: not a checkpoint of this tool (no {STATE_FILE}): "
                        "give a checkpoint_* directory of an earlier run")
    marker_dir = str(Path(storage) / name / "markers")
    trainer = TorchTrainer(
        train_loop_per_worker,
        # Train V2 resumes its own runs by name; an earlier run's checkpoint is handed
        # to the workers, which load it when their run has none yet.
        train_loop_config={"train": cfg.to_dict(), "plan": worker_plan.to_dict(),
                           "marker_dir": marker_dir,
                           "resume_from": None if resume_from is None else str(resume_from)},
        scaling_config=ScalingConfig(num_workers=cfg.dp_degree, use_gpu=cfg.use_gpu,
                                     resources_per_worker=worker_resources(cfg)),
        torch_config=TorchConfig(backend=process_group_backend(use_gpu=cfg.use_gpu,
                                                               fake_gpus=cfg.fake_gpus)),
        run_config=RunConfig(name=name, storage_path=str(Path(storage).resolve()),
                             failure_config=FailureConfig(max_failures=max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
    )
    with user_errors_raised(TrainingFailedError):
        return trainer.fit().return_value
