"""The Ray cluster a job runs on: the one of RAY_ADDRESS, local Ray, or a fake
multi-node cluster of fake-GPU nodes on this machine."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import ray

from orchestrator.train.leaks import reclaim_leaked_placement_groups
from orchestrator.train.resources import load_node_types, release_gpus
from placement.errors import UserError

#: A custom resource for the sweep's trial drivers, which train nothing: clusters that
#: offer it (local Ray started here, cluster.yaml's head, `ray start --resources`) leave
#: every CPU to the workers; elsewhere a driver takes 0.01 CPU (orchestrator/sweep.py).
DRIVER_RESOURCE = "orchestrator_driver"
DRIVER_RESOURCE_AMOUNT = 1000


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
