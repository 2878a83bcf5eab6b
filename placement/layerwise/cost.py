"""The cost model of Jia et al. 2018, Section 4, on a cluster preset's links.

    t_o(G, D, S) = sum_i [t_c(l_i, c_i) + t_s(l_i, c_i)] + sum_(i,j) t_x(e_ij, c_i, c_j)

t_c: a layer's compute time under its configuration; t_s: synchronising its replicated
weights; t_x: moving the part of an edge's tensor that the consumer's tasks need and
their devices do not already hold. Layers run one after another, as in the paper.

Rules where the paper leaves room (all stated in docs/benchmarks.md too):
- t_c = tau + (t - tau) / |c| with t the profiled forward + backward time and tau a
  fixed per-task cost (kernel launches) that splitting does not shrink: small work
  gains little from more devices.
- t_s is a ring allreduce of the weight shard (trainable_bytes / channel degree) over its
  replicas (|c| / channel degree of them), all shards' rings in parallel.
- t_x counts the forward tensor and, on the way back, its gradient (same bytes).
  Each receiving device takes its bytes over the intra-node link from devices of its
  node and over the inter-node link from the others, one after the other; the edge
  takes as long as the slowest receiver.
- A collective or transfer whose devices span nodes runs at the inter-node link's
  speed (the preset's per-device share of the node's network). Devices 0..7 are node
  0, 8..15 node 1, and so on.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from placement.cluster import ClusterSpec, Link
from placement.graph import OpGraph
from placement.layerwise.configs import ParallelConfig, configurations, tile_bounds
from placement.layerwise.layers import CHANNELWISE, DIMS, SPATIAL, Layer, layers_of


@dataclass(frozen=True, kw_only=True)
class CostConfig:
    num_devices: int
    """Devices the layers may spread over (their configurations' degrees divide it)."""
    task_overhead_s: float = 15e-6
    """tau: seconds of each task that do not shrink with its share of the work (three
    kernel launches of ~5 us: forward, backward-data, backward-weights)."""

    def __post_init__(self) -> None:
        if self.num_devices < 1:
            raise ValueError(f"num_devices is {self.num_devices}: give at least 1 device")
        if self.task_overhead_s < 0:
            raise ValueError(f"task_overhead_s is {self.task_overhead_s}: must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Topology:
    num_devices: int
    devices_per_node: int
    intra_node: Link
    inter_node: Link

    @staticmethod
    def of(cluster: ClusterSpec, num_devices: int) -> Topology:
        return Topology(num_devices=num_devices, devices_per_node=cluster.devices_per_node,
                        intra_node=cluster.intra_node, inter_node=cluster.inter_node)

    @property
    def num_nodes(self) -> int:
        return math.ceil(self.num_devices / self.devices_per_node)

    def node(self, device: int) -> int:
        return device // self.devices_per_node

    def link(self, devices: Sequence[int]) -> Link:
        """The link a collective over `devices` runs at."""
        return self.inter_node if len({self.node(d) for d in devices}) > 1 else self.intra_node


def compute_s(t: float, degree: int, tau: float) -> float:
    """t_c: Amdahl's split of the profiled time t over |c| tasks, tau not shrinking.

    # see Jia et al. 2018, Section 4 (t_c)
    """
    fixed = min(tau, t)
    return fixed + (t - fixed) / degree


def ring_allreduce_s(num_bytes: float, num_replicas: int, link: Link) -> float:
    """Ring allreduce of num_bytes over r replicas: 2(r-1) steps of num_bytes/r each.

    # see Thakur, Rabenseifner & Gropp 2005, eq. for ring allreduce; alpha-beta model
    """
    r = num_replicas
    if r <= 1 or num_bytes <= 0:
        return 0.0
    return 2 * (r - 1) * (link.latency_s + num_bytes / r / link.bandwidth_bytes_per_s)


def sync_s(layer: Layer, config: ParallelConfig, topology: Topology) -> float:
    """t_s: allreduce each weight shard over the tasks that hold a replica of it; all
    shards' rings run at once, so the slowest (one spanning nodes, if any) counts.

    # see Jia et al. 2018, Section 4 (t_s)
    """
    if layer.trainable_bytes <= 0:
        return 0.0
    link = topology.inter_node if _replicas_span_nodes(config, topology) else \
        topology.intra_node
    return ring_allreduce_s(layer.trainable_bytes / config.channel,
                            config.degree // config.channel, link)


@functools.cache
def _replicas_span_nodes(config: ParallelConfig, topology: Topology) -> bool:
    channel_of_task = config.task_indices()[:, DIMS.index("channel")]
    return any(len({topology.node(int(d)) for d in np.flatnonzero(channel_of_task == c)}) > 1
               for c in range(config.channel))


def requirement_axes(producer: Layer, consumer: Layer) -> tuple[str | None, ...]:
    """Per axis of the producer's output: which of the consumer's dimensions the part
    a consumer task reads follows (None: every consumer task reads the whole axis).

    Samples always follow; output channels follow for channel-wise kinds, pixels for
    spatial kinds.
    """
    same_layout = producer.axes == consumer.axes
    out: list[str | None] = []
    for axis, dim in enumerate(producer.axes):
        follows = dim == "sample" and axis == 0 and consumer.axes[:1] == ("sample",)
        if same_layout and dim == "channel":
            follows = consumer.kind in CHANNELWISE
        if same_layout and dim in ("height", "width"):
            follows = consumer.kind in SPATIAL
        out.append(dim if follows and dim in consumer.dims else None)
    return tuple(out)


def requirement_halos(producer: Layer, consumer: Layer,
                      required_axes: Sequence[str | None]) -> tuple[float, ...]:
    """Per axis of the producer's output, the halo a consumer tile reads beyond its own
    slice: (k - 1) // 2 input rows (columns) of a k-wide window, as a fraction."""
    out = []
    for axis, dim in enumerate(required_axes):
        size = producer.shape[axis]
        halo = {"height": consumer.kernel[0], "width": consumer.kernel[1]}.get(dim, 1)
        out.append(((halo - 1) // 2) / size if size else 0.0)
    return tuple(out)


def _overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of the intersection of [lo, hi) intervals stored in the last axis."""
    return np.clip(np.minimum(a[..., 1], b[..., 1]) - np.maximum(a[..., 0], b[..., 0]),
                   0.0, None)


@dataclass(frozen=True)
class TransferFractions:
    """Fractions of an edge's tensor, per (producer config p, consumer config q,
    receiving device d): what d needs, what it holds itself, what its node holds."""

    need: np.ndarray
    """(Q, D)"""
    local: np.ndarray
    """(P, Q, D)"""
    on_node: np.ndarray
    """(P, Q, D), local included."""


def transfer_fractions(producer_configs: Sequence[ParallelConfig],
                       producer_axes: Sequence[str | None],
                       consumer_configs: Sequence[ParallelConfig],
                       required_axes: Sequence[str | None],
                       halos: Sequence[float], topology: Topology) -> TransferFractions:
    n = topology.num_devices
    held = tile_bounds(producer_configs, producer_axes, n)             # (P, D', A, 2)
    wanted = tile_bounds(consumer_configs, required_axes, n, halos)    # (Q, D, A, 2)
    need = np.prod(wanted[..., 1] - wanted[..., 0], axis=-1)     # (Q, D)
    local = np.prod(_overlap(wanted[None], held[:, None]), axis=-1)   # (P, Q, D)
    if topology.num_nodes == 1:
        # The producer's tiles cover its whole tensor, all of it on this node.
        return TransferFractions(need=need, local=local,
                                 on_node=np.broadcast_to(need[None], local.shape))
    # What consumer task (q, d) wants of what producer tasks (p, d') on d's node hold,
    # as a product over axes of interval overlaps summed over d': the search's largest
    # arrays (P*Q*D*D/num_nodes), so computed node by node and in place.
    on_node = np.empty_like(local)
    for first in range(0, n, topology.devices_per_node):
        node = slice(first, min(first + topology.devices_per_node, n))
        want, have = wanted[None, :, node, None], held[:, None, None, node]
        overlap = np.ones(np.broadcast_shapes(want.shape, have.shape)[:-2])
        hi = np.empty_like(overlap)
        for a in range(held.shape[2]):
            np.minimum(want[..., a, 1], have[..., a, 1], out=hi)
            hi -= np.maximum(want[..., a, 0], have[..., a, 0])
            np.maximum(hi, 0.0, out=hi)
            overlap *= hi
        on_node[:, :, node] = overlap.sum(axis=-1)
    return TransferFractions(need=need, local=local, on_node=on_node)


def transfer_table(num_bytes: float, fractions: TransferFractions,
                   topology: Topology) -> np.ndarray:
    """t_x for every (producer config, consumer config): forward tensor + its gradient.

    # see Jia et al. 2018, Section 4 (t_x)
    """
    intra = np.clip(fractions.on_node - fractions.local, 0.0, None) * num_bytes
    inter = np.clip(fractions.need[None] - fractions.on_node, 0.0, None) * num_bytes
    tiny = 1e-9 * max(num_bytes, 1.0)
    receive_s = (np.where(intra > tiny, topology.intra_node.latency_s, 0.0)
                 + intra / topology.intra_node.bandwidth_bytes_per_s
                 + np.where(inter > tiny, topology.inter_node.latency_s, 0.0)
                 + inter / topology.inter_node.bandwidth_bytes_per_s)
    return 2.0 * receive_s.max(axis=-1)


class LayerCosts:
    """The graph's layers, their configurations and every cost table of the model:
    node costs t_c + t_s per layer and configuration, t_x per edge and config pair."""

    def __init__(self, graph: OpGraph, cluster: ClusterSpec, config: CostConfig) -> None:
        self.graph = graph
        self.config = config
        self.topology = Topology.of(cluster, config.num_devices)
        self.layers = layers_of(graph, cluster.device.name)
        self.configs = tuple(configurations(layer, config.num_devices)
                             for layer in self.layers)
        self.compute = [np.array([compute_s(layer.compute_s, c.degree,
                                            config.task_overhead_s) for c in cfgs])
                        for layer, cfgs in zip(self.layers, self.configs)]
        self.sync = [np.array([sync_s(layer, c, self.topology) for c in cfgs])
                     for layer, cfgs in zip(self.layers, self.configs)]
        self.edges = self._edge_tables()

    def _edge_tables(self) -> list[tuple[int, int, np.ndarray]]:
        cache: dict[tuple, TransferFractions] = {}
        index = self.graph.index
        tables = []
        for edge in self.graph.edges:
            u, v = index[edge.src], index[edge.dst]
            prod, cons = self.layers[u], self.layers[v]
            prod_axes = tuple(d if d in prod.dims else None for d in prod.axes)
            req_axes = requirement_axes(prod, cons)
            halos = requirement_halos(prod, cons, req_axes)
            key = (self.configs[u], prod_axes, self.configs[v], req_axes, halos)
            if key not in cache:
                cache[key] = transfer_fractions(self.configs[u], prod_axes,
                                                self.configs[v], req_axes, halos,
                                                self.topology)
            num_bytes = edge.bytes if edge.bytes > 0 else prod.output_bytes
            tables.append((u, v, transfer_table(num_bytes, cache[key], self.topology)))
        self.num_fraction_tables = len(cache)
        return tables

    def node_costs(self) -> list[np.ndarray]:
        return [c + s for c, s in zip(self.compute, self.sync)]

    def breakdown(self, choice: Sequence[int]) -> tuple[float, float, float]:
        """(compute, sync, transfer) seconds of one configuration index per layer."""
        compute = sum(float(self.compute[i][c]) for i, c in enumerate(choice))
        sync = sum(float(self.sync[i][c]) for i, c in enumerate(choice))
        transfer = sum(float(t[choice[u], choice[v]]) for u, v, t in self.edges)
        return compute, sync, transfer

    def index_of(self, layer: int, config: ParallelConfig) -> int:
        return self.configs[layer].index(config)
