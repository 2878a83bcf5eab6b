"""Reading and writing op graphs: our own JSON format, and the peer format (auto-detected).

Our format is documented in docs/graph-format.md. The peer format is the one of the
NeurIPS 2020 placement paper's published graphs (see ../shared/peer-graphs/README.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from placement.graph import ANY_KIND, Edge, GraphError, Op, OpGraph

FORMAT_NAME = "hybrid-orchestrator.op-graph"
FORMAT_VERSION = 1
PEER_TIME_UNIT = "peer"
#: The key that marks a file in the peer format (its device count).
PEER_MARKER = 'maxFPGAs'


def load_graph(path: str | Path) -> OpGraph:
    """Read a graph file in our format or the peer format, whichever it is."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise GraphError(f"{path}: no such graph file: check the path") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise GraphError(f"{path}: cannot read it as a text file ({err})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise GraphError(
            f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}): "
            "fix the file or re-export it"
        ) from None
    name = path.stem
    try:
        if isinstance(data, Mapping) and data.get("format") == FORMAT_NAME:
            return graph_from_dict(data, default_name=name)
        if isinstance(data, Mapping) and PEER_MARKER in data:
            return graph_from_peer(data, name=name)
    except GraphError as err:
        raise GraphError(f"{path}: {err}") from None
    raise GraphError(
        f"{path}: neither our op-graph format (\"format\": \"{FORMAT_NAME}\") nor the "
        f"peer format ({PEER_MARKER}, nodes, edges): see docs/graph-format.md"
    )


def save_graph(graph: OpGraph, path: str | Path) -> None:
    Path(path).write_text(json.dumps(graph_to_dict(graph), indent=1) + "\n")


def graph_to_dict(graph: OpGraph) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "name": graph.name,
        "time_unit": graph.time_unit,
        "metadata": dict(graph.metadata),
        "ops": [
            {
                "id": op.id,
                "name": op.name,
                "forward_s": dict(op.forward_s),
                "backward_s": dict(op.backward_s),
                "is_backward": op.is_backward,
                "output_bytes": op.output_bytes,
                "param_bytes": op.param_bytes,
                "frozen_bytes": op.frozen_bytes,
                "activation_bytes": op.activation_bytes,
                "colocation": op.colocation,
                "transfer_s": op.transfer_s,
                "attrs": dict(op.attrs),
            }
            for op in graph.ops
        ],
        "edges": [
            {"src": e.src, "dst": e.dst, "bytes": e.bytes, "cost_s": e.cost_s,
             "grad_bytes": e.grad_bytes}
            for e in graph.edges
        ],
    }


def _field(record: Mapping[str, Any], key: str, what: str, default: Any = ...) -> Any:
    if key in record:
        return record[key]
    if default is ...:
        raise GraphError(f"{what} has no {key!r}: every {what.split()[0]} needs one")
    return default


def _times(value: Any, what: str) -> dict[str, float]:
    if isinstance(value, (int, float)):
        return {ANY_KIND: float(value)}
    if not isinstance(value, Mapping):
        raise GraphError(f"{what} must be a number or a map of device kind to seconds")
    return {str(k): _number(v, what) for k, v in value.items()}


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GraphError(f"{what} is {value!r}: it must be a number")
    return float(value)


def _optional_number(value: Any, what: str) -> float | None:
    return None if value is None else _number(value, what)


def graph_from_dict(data: Mapping[str, Any], default_name: str = "graph") -> OpGraph:
    version = data.get("version")
    if version != FORMAT_VERSION:
        raise GraphError(
            f"op-graph format version {version!r} is not supported (this tool reads "
            f"version {FORMAT_VERSION}): re-export the graph with this version"
        )
    ops = []
    for i, rec in enumerate(_field(data, "ops", "graph")):
        what = f"op #{i}"
        op_id = _field(rec, "id", what)
        if isinstance(op_id, bool) or not isinstance(op_id, int):
            raise GraphError(f"{what} has id {op_id!r}: ids must be integers")
        what = f"op {op_id}"
        ops.append(Op(
            id=op_id,
            name=str(rec.get("name", f"op{op_id}")),
            forward_s=_times(_field(rec, "forward_s", what), f"{what} forward_s"),
            backward_s=_times(rec.get("backward_s") or {}, f"{what} backward_s"),
            is_backward=bool(rec.get("is_backward", False)),
            output_bytes=_number(rec.get("output_bytes", 0.0), f"{what} output_bytes"),
            param_bytes=_number(rec.get("param_bytes", 0.0), f"{what} param_bytes"),
            frozen_bytes=_number(rec.get("frozen_bytes", 0.0), f"{what} frozen_bytes"),
            activation_bytes=_number(rec.get("activation_bytes", 0.0),
                                     f"{what} activation_bytes"),
            colocation=None if rec.get("colocation") is None else str(rec["colocation"]),
            transfer_s=_optional_number(rec.get("transfer_s"), f"{what} transfer_s"),
            attrs=dict(rec.get("attrs") or {}),
        ))
    edges = []
    for i, rec in enumerate(_field(data, "edges", "graph")):
        what = f"edge #{i}"
        edges.append(Edge(
            src=_field(rec, "src", what),
            dst=_field(rec, "dst", what),
            bytes=_number(rec.get("bytes", 0.0), f"{what} bytes"),
            cost_s=_optional_number(rec.get("cost_s"), f"{what} cost_s"),
            grad_bytes=_optional_number(rec.get("grad_bytes"), f"{what} grad_bytes"),
        ))
    return OpGraph(
        ops=tuple(ops), edges=tuple(edges),
        name=str(data.get("name", default_name)),
        time_unit=str(data.get("time_unit", "s")),
        metadata=dict(data.get("metadata", {})),
    )


def graph_from_peer(data: Mapping[str, Any], name: str = "peer") -> OpGraph:
    """Import the peer format: node ids, times and costs stay in the file's own unit.

    Each node becomes an op whose only time is its `fpgaLatency`; the node's `size`
    becomes memory it keeps resident; its colour class becomes a colocation group; its
    outgoing edge `cost` (the same on every edge leaving it) becomes its transfer time.
    """
    out_cost: dict[int, float] = {}
    edges = []
    for i, rec in enumerate(_field(data, "edges", "peer graph")):
        what = f"peer edge #{i}"
        src, dst = int(_field(rec, "sourceId", what)), int(_field(rec, "destId", what))
        cost = _number(_field(rec, "cost", what), f"{what} cost")
        out_cost[src] = max(out_cost.get(src, 0.0), cost)
        edges.append(Edge(src=src, dst=dst, bytes=_number(rec.get("size", 0.0), f"{what} size"),
                          cost_s=cost))
    ops = []
    for i, rec in enumerate(_field(data, "nodes", "peer graph")):
        what = f"peer node #{i}"
        node_id = int(_field(rec, "id", what))
        colour = rec.get("colorClass")
        ops.append(Op(
            id=node_id,
            name=str(rec.get("name", f"node{node_id}")),
            forward_s={ANY_KIND: _number(_field(rec, "fpgaLatency", what), f"{what} fpgaLatency")},
            is_backward=bool(rec.get("isBackwardNode", 0)),
            activation_bytes=_number(rec.get("size", 0.0), f"{what} size"),
            colocation=None if colour is None else f"color{colour}",
            transfer_s=out_cost.get(node_id),
        ))
    return OpGraph(
        ops=tuple(ops), edges=tuple(edges), name=name, time_unit=PEER_TIME_UNIT,
        metadata={
            "source_format": "peer",
            "num_devices": int(data[PEER_MARKER]),
            "device_memory_bytes": float(data.get("maxSizePerFPGA", 0.0)) or None,
        },
    )


def load_peer_split(path: str | Path) -> dict[int, int]:
    """Read a peer expert split (`fpgas[i].nodes`) as op id -> device index."""
    data = json.loads(Path(path).read_text())
    return {int(node): dev for dev, fpga in enumerate(data["fpgas"]) for node in fpga["nodes"]}
