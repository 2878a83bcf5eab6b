"""The devices a job runs on: decided from the cluster's node types (or --num-gpus),
requested from Ray's autoscaler, waited for with a visible status and a timeout, and
the model profiled on one of those GPUs (a Ray task with num_gpus=1), never on the head.

A fresh `ray up cluster.yaml` cluster has only its CPU head: the GPU node types start at
0 workers and grow only when something asks for GPUs. A job that looked at the live
nodes alone would see no GPU, and profile, plan and train the model on the head's CPUs.
The node types come from the autoscaler's config, which `ray up` leaves on the head as
~/ray_bootstrap_config.yaml (the job's driver runs there)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import ray
import yaml

from orchestrator.train.errors import user_errors_raised
from orchestrator.train.config import TrainConfig
from orchestrator.runtime.device_kind import DeviceKind
from orchestrator.train.capacity import NodeResources, cluster_nodes
from orchestrator.train.planning import plan_worker, worker_batch_size
from placement.cluster import PRESET_NAMES, ClusterSpec, preset
from placement.errors import UserError
from placement.plan import Plan

#: Where `ray up` puts the autoscaler's config on the head node; RAY_BOOTSTRAP_CONFIG
#: names another file.
BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"
#: How long a job waits for its GPU nodes: EC2 GPU instances take 5-15 minutes to boot,
#: pull the image and run the setup commands.
GPU_WAIT_S = 30 * 60
GPU_POLL_S = 10.0


@dataclass(frozen=True, kw_only=True)
class NodeType:
    name: str
    gpus: int
    """GPUs one node of this type offers."""
    max_workers: int
    """Nodes of this type the autoscaler may start."""
    instance_type: str | None = None


def node_types(config: Mapping) -> list[NodeType]:
    """The GPU node types of a Ray cluster config (`available_node_types`)."""
    types = []
    for name, spec in config.get("available_node_types", {}).items():
        gpus = int(spec.get("resources", {}).get("GPU", 0))
        if gpus > 0:
            types.append(NodeType(name=name, gpus=gpus,
                                  max_workers=int(spec.get("max_workers", 0)),
                                  instance_type=spec.get("node_config", {}).get("InstanceType")))
    return types


def load_node_types(path: str | None = None) -> list[NodeType] | None:
    """The node types of the autoscaler this job's cluster runs, or None where there is
    none (local Ray, a fixed cluster started by hand)."""
    file = Path(os.path.expanduser(path or os.environ.get("RAY_BOOTSTRAP_CONFIG",
                                                          BOOTSTRAP_CONFIG)))
    if not file.is_file():
        return None
    return node_types(yaml.safe_load(file.read_text()))


@dataclass(frozen=True, kw_only=True)
class GpuRequest:
    num_gpus: int
    bundles: tuple[Mapping[str, int], ...]
    """One bundle per node to start: `{"GPU": g}`, g at most that node type's GPUs."""
    node_type: NodeType
    """The type the GPUs come from first (its devices per node bound mp_degree)."""


def plan_gpu_request(types: Sequence[NodeType], num_gpus: int | None) -> GpuRequest:
    """What to ask the autoscaler for: `num_gpus` (default: one node of the type with the
    most GPUs per node), in whole-node bundles from the largest node types first, so
    that model-parallel groups can share a node. Refuses, naming what fits, a count the
    node types can never hold."""
    if not types:
        raise UserError("the cluster's config has no GPU node type: add one to "
                        "available_node_types (see cluster.yaml), or run on CPUs")
    ordered = sorted(types, key=lambda t: -t.gpus)
    capacity = sum(t.gpus * t.max_workers for t in ordered)
    wanted = ordered[0].gpus if num_gpus is None else num_gpus
    if wanted > capacity:
        held = ", ".join(f"{t.name}: {t.max_workers} x {t.gpus}" for t in ordered)
        raise UserError(f"--num-gpus {wanted}: the cluster's node types hold at most "
                        f"{capacity} GPUs ({held}): use --num-gpus {capacity} or less, or "
                        "raise max_workers in the cluster config")
    bundles, left = [], wanted
    for t in ordered:
        for _ in range(t.max_workers):
            if left <= 0:
                break
            bundles.append({"GPU": min(t.gpus, left)})
            left -= t.gpus
    return GpuRequest(num_gpus=wanted, bundles=tuple(bundles), node_type=ordered[0])


def plan_worker_request(types: Sequence[NodeType], dp_degree: int,
                        mp_degree: int) -> GpuRequest:
    """What a training run of `dp_degree` workers of `mp_degree` GPUs asks for: one
    bundle per worker, which the autoscaler packs onto nodes as Ray Train will place
    them (a worker's GPUs share a node). Refuses, naming what fits, a run the node
    types can never hold."""
    if not types:
        raise UserError("the cluster's config has no GPU node type: add one to "
                        "available_node_types (see cluster.yaml), or train without --gpu")
    ordered = sorted(types, key=lambda t: -t.gpus)
    if mp_degree > ordered[0].gpus:
        raise UserError(f"--mp {mp_degree}: the largest node type ({ordered[0].name}) has "
                        f"{ordered[0].gpus} GPUs per node: use --mp {ordered[0].gpus} or less")
    workers = sum(t.gpus // mp_degree * t.max_workers for t in ordered)
    if dp_degree > workers:
        raise UserError(f"--dp {dp_degree} x --mp {mp_degree}: the cluster's node types hold "
                        f"at most {workers} worker(s) of {mp_degree} GPU(s): use --dp "
                        f"{workers} or less, or raise max_workers in the cluster config")
    return GpuRequest(num_gpus=dp_degree * mp_degree,
                      bundles=({"GPU": mp_degree},) * dp_degree, node_type=ordered[0])


def wait_for_gpus(num_gpus: int, *, timeout_s: float, poll_s: float = GPU_POLL_S,
                  say: Callable[[str], None] = print,
                  nodes: Callable[[], list[NodeResources]] = cluster_nodes
                  ) -> list[NodeResources]:
    """Poll the live nodes until they hold `num_gpus` GPUs, saying how many are there at
    every poll; a timeout is an error naming what came up and where to look."""
    started = time.monotonic()
    while True:
        live = nodes()
        have = int(sum(n.gpus for n in live))
        waited = time.monotonic() - started
        if have >= num_gpus:
            say(f"{have} GPU(s) on {sum(n.gpus > 0 for n in live)} node(s) after "
                f"{waited:.0f} s")
            return live
        if waited >= timeout_s:
            raise UserError(
                f"the cluster has {have} of the {num_gpus} GPUs asked for after waiting "
                f"{waited:.0f} s: see `ray status` and the autoscaler's log "
                "(/tmp/ray/session_latest/logs/monitor.*) for nodes that failed to start "
                "(instance quota, capacity, setup commands), or ask for fewer with "
                "--num-gpus")
        say(f"waiting for GPUs: {have} of {num_gpus} after {waited:.0f} s "
            f"(the autoscaler is starting nodes; up to {timeout_s:.0f} s)")
        time.sleep(poll_s)


def request_gpus(request: GpuRequest) -> None:
    """Ask the autoscaler to keep nodes for `request` (it replaces any earlier request
    of this cluster; `release_gpus` withdraws it)."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[dict(b) for b in request.bundles])


def release_gpus() -> None:
    """Withdraw the standing request, so that idle GPU nodes can scale down."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[])


def acquire(request: GpuRequest, *, say: Callable[[str], None] = print,
            timeout_s: float = GPU_WAIT_S) -> list[NodeResources]:
    """Ask the autoscaler for `request` and wait until the cluster holds its GPUs."""
    say(f"asking the autoscaler for {request.num_gpus} GPU(s) as "
        f"{len(request.bundles)} bundle(s) {list(request.bundles)}")
    request_gpus(request)
    return wait_for_gpus(request.num_gpus, timeout_s=timeout_s, say=say)


@dataclass(frozen=True, kw_only=True)
class JobDevices:
    nodes: list[NodeResources]
    kind: DeviceKind
    num_gpus: int
    """Devices the job uses: GPUs, or CPU cores on a CPU cluster."""
    cluster: ClusterSpec
    """The preset the plans and the projection use."""
    requested: bool
    """Whether the job asked the autoscaler for GPUs (and should withdraw it after)."""


def decide_devices(num_gpus: int | None, *, fake_cluster: bool, cluster_name: str | None,
                   types: Sequence[NodeType] | None,
                   say: Callable[[str], None] = print,
                   timeout_s: float = GPU_WAIT_S) -> JobDevices:
    """The job's devices. With an autoscaler's GPU node types (`types`), ask for
    `num_gpus` (or one node's worth) and wait for them; otherwise take the live nodes:
    their GPUs if any, else their CPU cores."""
    requested = bool(types) and not fake_cluster
    if requested:
        nodes = acquire(plan_gpu_request(types, num_gpus), say=say, timeout_s=timeout_s)
    else:
        nodes = cluster_nodes()
    kind = (DeviceKind.from_flags(gpu=True, fake_cluster=fake_cluster)
            if any(n.gpus > 0 for n in nodes) else DeviceKind.CPU)
    total = int(sum((n.gpus if kind.ray_gpus else n.cpus) for n in nodes))
    wanted = num_gpus or total
    if wanted > total:
        raise UserError(f"--num-gpus {wanted}: the cluster has {total} "
                        f"{'GPU' if kind.ray_gpus else 'CPU core'}s: use at most that many")
    per_node = int(max((n.gpus if kind.ray_gpus else n.cpus) for n in nodes))
    name = cluster_name or ("cpu" if kind.measured_here else preset_for(types, nodes))
    spec = preset(name)
    if kind.measured_here:
        spec = dataclasses.replace(spec, devices_per_node=max(per_node, 1))
    return JobDevices(nodes=nodes, kind=kind, num_gpus=wanted, cluster=spec,
                      requested=requested)


def preset_for(types: Sequence[NodeType] | None, nodes: Sequence[NodeResources]) -> str:
    """The preset of the instance type the job's GPUs came from: the node type whose
    preset's GPU is the one Ray detected on the live nodes (its `accelerator_type:X`
    resource), else the largest node type with a preset, else dgx1-v100."""
    detected = [k.split(":", 1)[1].lower() for n in nodes if n.gpus > 0 for k in n.custom
                if k.startswith("accelerator_type:")]
    named = [t.instance_type for t in sorted(types or (), key=lambda t: -t.gpus)
             if t.instance_type in PRESET_NAMES]
    matching = [name for name in named
                if any(preset(name).device.name in kind for kind in detected)]
    return next(iter(matching or ([] if detected else named)), "dgx1-v100")


def profile_on_gpu_worker(model: str, *, preset_name: str, batch: int, target: str,
                          granularity: str = "module", timeout_s: float = GPU_WAIT_S):
    """The model's graph profiled on a GPU of the cluster (a Ray task holding one GPU,
    timing with CUDA events), not on the head, which has none. A node whose torch has
    no CUDA fails with one line naming it."""
    from orchestrator.profile.api import profile_model

    def run():
        import torch

        from orchestrator.runtime.devices import NoCudaError

        if not torch.cuda.is_available():
            raise NoCudaError(
                f"node {ray.util.get_node_ip_address()}: the profile task holds a GPU but "
                f"torch {torch.__version__} there has no CUDA: install a CUDA build of "
                "torch on the GPU nodes (cluster.yaml's setup_commands)")
        return profile_model(model, preset=preset_name, batch=batch, target=target,
                             device="cuda", granularity=granularity)

    task = ray.remote(num_gpus=1, max_retries=0)(run)
    with user_errors_raised(ray.exceptions.RayTaskError):
        return ray.get(task.remote(), timeout=timeout_s)



def plan_on_gpus(cfg: TrainConfig, *, solver: str, time_limit_s: float) -> Plan:
    """The plan of a training run on the cluster's real GPUs: its GPUs asked for (on an
    autoscaling cluster they exist once asked), a worker's batch profiled on one of them
    (CUDA events), and placed with the preset of their instance type. Never the
    driver's CPU costs: the head has no GPU, and a CPU plan misplaces a GPU step."""
    types = load_node_types()
    if types:
        acquire(plan_worker_request(types, cfg.dp_degree, cfg.mp_degree))
    cluster = preset(preset_for(types, cluster_nodes()))
    graph = profile_on_gpu_worker(cfg.model, preset_name=cfg.preset,
                                  batch=worker_batch_size(cfg), target=cluster.device.name,
                                  granularity=cfg.granularity)
    return plan_worker(cfg, solver=solver, time_limit_s=time_limit_s, graph=graph,
                       cluster=cluster)
