"""Whether a run fits the cluster: each worker's bundle, and a refusal, before any
placement group is requested, of a run Ray would leave PENDING forever."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import ray

from orchestrator.train.config import TrainConfig
from placement.errors import UserError


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


def worker_resources(cfg: TrainConfig) -> dict[str, float]:
    """A worker's bundle: its mp_degree GPUs and a CPU, or mp_degree CPU cores."""
    if cfg.device_kind.ray_gpus:
        return {"CPU": 1, "GPU": cfg.mp_degree}
    return {"CPU": cfg.mp_degree}


def check_fits(cfg: TrainConfig, nodes: list[NodeResources]) -> None:
    """Refuse, before any placement group is requested, a run the cluster cannot hold
    (Ray would leave it PENDING forever): every worker's bundle must fit on one node."""
    need = worker_resources(cfg)
    gpus, kind = cfg.device_kind.ray_gpus, cfg.device_kind.unit
    per_node = [min(int(n.cpus // need["CPU"]), int(n.gpus // need["GPU"]) if gpus else 10**9)
                for n in nodes]
    largest = max((n.gpus if gpus else n.cpus) for n in nodes)
    if max(per_node, default=0) == 0:
        raise ClusterTooSmallError(
            f"--mp {cfg.mp_degree} needs {cfg.mp_degree} {kind}s on one node but the largest "
            f"node has {largest:g}: use --mp {int(largest)} or less")
    if sum(per_node) < cfg.dp_degree:
        raise ClusterTooSmallError(
            f"--dp {cfg.dp_degree} x --mp {cfg.mp_degree} does not fit: the cluster holds at "
            f"most {sum(per_node)} worker(s) of {cfg.mp_degree} {kind}(s) (per node: "
            f"{per_node}): use --dp {sum(per_node)} or less, or a smaller --mp")
