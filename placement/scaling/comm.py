"""Alpha-beta cost of the gradient allreduce among the data-parallel workers.

Each of a worker's `mp_degree` devices holds a shard of the model's parameters; the
devices that hold the same shard in every worker (one per worker) allreduce its
gradient, all shards at once. A worker's devices share one node, so a node holds
`devices_per_node // mp_degree` workers, and each of those allreduce groups spans
`ceil(dp_degree / workers_per_node)` nodes. The alpha-beta model charges a message of
n bytes over a link alpha + n * beta (alpha = latency, beta = 1 / bandwidth); the
reduction arithmetic is left out (it is memory-bound and overlaps the transfers).
"""

from __future__ import annotations

import math

from placement.cluster import ClusterSpec, Link

ALGORITHMS = ("ring", "hierarchical", "best")


def ring_step_bytes(p: int, n_bytes: float) -> float:
    """Bytes one device sends in one step of a ring collective: its chunk n/p."""
    return n_bytes / p


def ring_allreduce_bytes_per_device(p: int, n_bytes: float) -> float:
    """Bytes each device sends in a ring allreduce: 2(p-1) steps of n/p, i.e.
    2(p-1)/p * n, the bandwidth lower bound of any allreduce."""
    # see Patarasuk & Yuan 2009 (bandwidth-optimal all-reduce): the lower bound they meet
    return 2 * (p - 1) * ring_step_bytes(p, n_bytes)


def ring_reduce_scatter_s(p: int, n_bytes: float, link: Link) -> float:
    """(p-1) alpha + (p-1)/p n beta: p-1 steps, each moving one n/p chunk."""
    # see Thakur, Rabenseifner & Gropp 2005 (MPICH collectives), ring reduce-scatter cost
    if p <= 1:
        return 0.0
    return (p - 1) * (link.latency_s + ring_step_bytes(p, n_bytes) / link.bandwidth_bytes_per_s)


def ring_all_gather_s(p: int, n_bytes: float, link: Link) -> float:
    """(p-1) alpha + (p-1)/p n beta, the mirror image of the reduce-scatter."""
    # see Thakur, Rabenseifner & Gropp 2005, ring allgather cost
    return ring_reduce_scatter_s(p, n_bytes, link)


def ring_allreduce_s(p: int, n_bytes: float, link: Link) -> float:
    """2(p-1) alpha + 2(p-1)/p n beta: a reduce-scatter then an all-gather."""
    # see Thakur, Rabenseifner & Gropp 2005, allreduce as reduce-scatter + allgather
    return ring_reduce_scatter_s(p, n_bytes, link) + ring_all_gather_s(p, n_bytes, link)


def hierarchical_allreduce_s(p_local: int, p_nodes: int, n_bytes: float,
                             intra: Link, inter: Link) -> float:
    """Reduce-scatter inside each node, ring allreduce of each 1/p_local shard across
    the nodes, all-gather inside each node."""
    # see Goyal et al. 2017 (ImageNet in 1 hour), sec. 4: intra-server reduce,
    # inter-server allreduce, intra-server broadcast; here as reduce-scatter/all-gather
    return (ring_reduce_scatter_s(p_local, n_bytes, intra)
            + ring_allreduce_s(p_nodes, n_bytes / p_local, inter)
            + ring_all_gather_s(p_local, n_bytes, intra))


def workers_per_node(cluster: ClusterSpec, mp_degree: int) -> int:
    return max(1, cluster.devices_per_node // mp_degree)


def allreduce_s(dp_degree: int, n_bytes: float, cluster: ClusterSpec, mp_degree: int,
                algorithm: str = "best") -> float:
    """Seconds to allreduce `n_bytes` of gradient among `dp_degree` workers of
    `mp_degree` devices each, packed onto as few nodes as they fit."""
    assert algorithm in ALGORITHMS, algorithm
    if dp_degree <= 1 or n_bytes <= 0:
        return 0.0
    per_node = workers_per_node(cluster, mp_degree)
    num_nodes = math.ceil(dp_degree / per_node)
    if num_nodes == 1:
        return ring_allreduce_s(dp_degree, n_bytes, cluster.intra_node)
    # A flat ring crossing nodes moves in lock step, so every step waits for the
    # slowest (inter-node) link.
    ring = ring_allreduce_s(dp_degree, n_bytes, cluster.inter_node)
    hierarchical = hierarchical_allreduce_s(min(per_node, dp_degree), num_nodes, n_bytes,
                                            cluster.intra_node, cluster.inter_node)
    return {"ring": ring, "hierarchical": hierarchical,
            "best": min(ring, hierarchical)}[algorithm]


def exposed_allreduce_s(allreduce: float, backward_s: float, overlap_fraction: float) -> float:
    """The part of the allreduce the step waits for: a fraction of it runs during the
    backward pass (gradients of late layers are ready early), never longer than the
    backward itself."""
    # see Goyal et al. 2017, sec. 4 (allreduce overlapped with backprop per layer)
    return allreduce - min(overlap_fraction * allreduce, backward_s)
