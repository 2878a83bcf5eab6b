"""Layer-wise plans: the searched optimum and the single-strategy baselines, all priced
by the same cost model (Jia et al. 2018, Section 4).

A `LayerwisePlan` is plain frozen data a runtime can execute: per layer its degrees
along sample/channel/height/width and the devices of its tasks (task k on device k,
tasks numbered row-major over the degrees; see `placement.layerwise.configs`).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placement.cluster import ClusterSpec
from placement.errors import UserError
from placement.graph import OpGraph
from placement.layerwise.configs import ParallelConfig
from placement.layerwise.cost import CostConfig, LayerCosts
from placement.layerwise.layers import DIMS, Layer
from placement.layerwise.search import SearchResult, solve

BASELINES = ("data_parallel", "model_parallel", "one_weird_trick")
PLAN_FORMAT = "hybrid-orchestrator.layerwise-plan"


@dataclass(frozen=True, kw_only=True)
class LayerChoice:
    op_id: int
    name: str
    kind: str
    config: ParallelConfig
    compute_s: float
    """t_c of the layer under `config`."""
    sync_s: float
    """t_s of the layer under `config`."""

    def to_dict(self) -> dict[str, Any]:
        return {"op_id": self.op_id, "name": self.name, "kind": self.kind,
                **self.config.to_dict(), "compute_s": self.compute_s, "sync_s": self.sync_s}


@dataclass(frozen=True, kw_only=True)
class LayerwisePlan:
    strategy: str
    """'layerwise' or one of BASELINES."""
    graph_name: str
    cluster: str
    device_kind: str
    num_devices: int
    step_time_s: float
    """Predicted step time: compute_s + sync_s + transfer_s."""
    compute_s: float
    sync_s: float
    transfer_s: float
    layers: tuple[LayerChoice, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def configs(self) -> dict[str, dict[str, Any]]:
        """Layer name (made unique with '#<op id>' where names repeat) -> its config."""
        counts = Counter(layer.name for layer in self.layers)
        return {(c.name if counts[c.name] == 1 else f"{c.name}#{c.op_id}"):
                {"label": c.config.label, **c.config.to_dict()} for c in self.layers}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT, "strategy": self.strategy, "graph": self.graph_name,
            "cluster": self.cluster, "device_kind": self.device_kind,
            "num_devices": self.num_devices, "step_time_s": self.step_time_s,
            "compute_s": self.compute_s, "sync_s": self.sync_s,
            "transfer_s": self.transfer_s, "configs": self.configs(),
            "layers": [c.to_dict() for c in self.layers], "notes": list(self.notes),
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> LayerwisePlan:
        if data.get("format") != PLAN_FORMAT:
            raise UserError(f"not a layer-wise plan (\"format\" is {data.get('format')!r}, "
                            f"expected {PLAN_FORMAT!r}): write it with `orchestrator "
                            "layerwise --out`")
        layers = tuple(LayerChoice(op_id=int(d["op_id"]), name=d["name"], kind=d["kind"],
                                   config=ParallelConfig.from_dict(d),
                                   compute_s=float(d["compute_s"]), sync_s=float(d["sync_s"]))
                       for d in data["layers"])
        return LayerwisePlan(
            strategy=data["strategy"], graph_name=data["graph"], cluster=data["cluster"],
            device_kind=data["device_kind"], num_devices=int(data["num_devices"]),
            step_time_s=float(data["step_time_s"]), compute_s=float(data["compute_s"]),
            sync_s=float(data["sync_s"]), transfer_s=float(data["transfer_s"]),
            layers=layers, notes=tuple(data.get("notes", ())))


def plan_from_choice(costs: LayerCosts, strategy: str, choice: tuple[int, ...],
                     cluster: ClusterSpec, notes: tuple[str, ...] = ()) -> LayerwisePlan:
    compute, sync, transfer = costs.breakdown(choice)
    layers = tuple(
        LayerChoice(op_id=layer.op_id, name=layer.name, kind=layer.kind,
                    config=costs.configs[i][c], compute_s=float(costs.compute[i][c]),
                    sync_s=float(costs.sync[i][c]))
        for i, (layer, c) in enumerate(zip(costs.layers, choice)))
    return LayerwisePlan(
        strategy=strategy, graph_name=costs.graph.name, cluster=cluster.name,
        device_kind=cluster.device.name, num_devices=costs.config.num_devices,
        step_time_s=compute + sync + transfer, compute_s=compute, sync_s=sync,
        transfer_s=transfer, layers=layers, notes=notes)


def _widest(configs: tuple[ParallelConfig, ...], dim: str) -> ParallelConfig:
    """The configuration splitting only `dim`, at the largest degree it allows."""
    only = [c for c in configs
            if all(getattr(c, d) == 1 for d in DIMS if d != dim)]
    return max(only, key=lambda c: c.degree)


def baseline_choice(costs: LayerCosts, strategy: str) -> tuple[int, ...]:
    """Configuration index per layer of a single-strategy baseline.

    data_parallel: every layer splits its samples over all devices.
    model_parallel: every layer splits its output channels (its weights) over all
    devices; layers without a channel dimension (concat, loss, ...) run on device 0.
    one_weird_trick (Krizhevsky 2014): data-parallel layers up to the first
    fully-connected one, model-parallel fully-connected layers and the layers fed
    only by them.
    """
    if strategy == "data_parallel":
        dims = ["sample"] * len(costs.layers)
    elif strategy == "model_parallel":
        dims = ["channel"] * len(costs.layers)
    elif strategy == "one_weird_trick":
        dims = ["channel" if fc else "sample" for fc in _fully_connected_part(costs)]
    else:
        raise ValueError(f"unknown baseline {strategy!r}: one of {', '.join(BASELINES)}")
    return tuple(costs.index_of(i, _widest(cfgs, dim))
                 for i, (cfgs, dim) in enumerate(zip(costs.configs, dims)))


def _fully_connected_part(costs: LayerCosts) -> list[bool]:
    graph = costs.graph
    index = graph.index
    fc: dict[int, bool] = {}
    for op_id in graph.topological_order:
        layer: Layer = costs.layers[index[op_id]]
        preds = graph.predecessors[op_id]
        fc[op_id] = layer.kind == "linear" or (
            bool(preds) and layer.kind != "conv2d" and all(fc[p] for p in preds))
    return [fc[op.id] for op in graph.ops]


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """The searched plan, the baselines on the same cost model, and search figures."""

    layerwise: LayerwisePlan
    baselines: Mapping[str, LayerwisePlan]
    search: SearchResult
    cost_tables_seconds: float
    """Building every layer's and edge's cost table."""
    num_configs: int
    """Configurations over all layers (the search space is their product)."""

    @property
    def search_seconds(self) -> float:
        """The whole layer-wise optimisation: cost tables + elimination + undo."""
        return self.cost_tables_seconds + self.search.seconds

    def to_dict(self) -> dict[str, Any]:
        s = self.search
        return {
            "layerwise": self.layerwise.to_dict(),
            "baselines": {name: p.to_dict() for name, p in self.baselines.items()},
            "search_seconds": self.search_seconds,
            "search": {
                "cost_tables_seconds": self.cost_tables_seconds,
                "elimination_seconds": s.seconds,
                "num_layers": len(self.layerwise.layers),
                "num_configs": self.num_configs,
                "node_eliminations": s.num_node_eliminations,
                "edge_eliminations": s.num_edge_eliminations,
                "leaf_eliminations": s.num_leaf_eliminations,
                "residual_nodes": s.residual_nodes,
                "residual_largest_table": s.residual_largest_table,
            },
        }


def compare(graph: OpGraph, cluster: ClusterSpec, config: CostConfig) -> Comparison:
    """Search the best layer-wise plan and price the baselines on `cluster`."""
    if config.num_devices > cluster.num_devices:
        raise UserError(
            f"{config.num_devices} devices asked of cluster {cluster.name} with "
            f"{cluster.num_devices}: ask for fewer devices or give it more nodes")
    start = time.perf_counter()
    costs = LayerCosts(graph, cluster, config)
    tables_s = time.perf_counter() - start
    result = solve(costs.node_costs(), costs.edges)
    notes = ()
    if result.residual_nodes > 2:
        notes = (f"{result.residual_nodes} layers did not reduce by elimination; solved "
                 f"exactly by DP over them (largest table {result.residual_largest_table:,}"
                 " entries)",)
    best = plan_from_choice(costs, "layerwise", result.choice, cluster, notes)
    baselines = {name: plan_from_choice(costs, name, baseline_choice(costs, name), cluster)
                 for name in BASELINES}
    assert all(best.step_time_s <= p.step_time_s * (1 + 1e-9) for p in baselines.values())
    return Comparison(layerwise=best, baselines=baselines, search=result,
                      cost_tables_seconds=tables_s,
                      num_configs=sum(len(c) for c in costs.configs))
