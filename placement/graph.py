"""The op-graph IR: ops, edges and their costs, as plain frozen data.

An op is a node of the graph (possibly a fused group of framework ops). A graph is
either a *forward* graph whose ops carry both forward and backward times (what the
profiler produces; `placement.tasks` unrolls it into a training step), or an already
unrolled *task* graph whose backward ops are explicit nodes (the peer format), which
`placement.tasks` takes as it is.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from placement.errors import UserError

#: The device-kind key used when a graph's times are not tied to one kind of device
#: (the peer format, hand-written examples).
ANY_KIND = "any"


class GraphError(UserError):
    """A graph that cannot be planned: a cycle, a dangling id, a negative cost."""


@dataclass(frozen=True, kw_only=True)
class Op:
    id: int
    """Unique within the graph; the peer format's node id where imported."""
    name: str
    forward_s: Mapping[str, float]
    """Device kind -> seconds of this op's forward (or only) computation."""
    backward_s: Mapping[str, float] = field(default_factory=dict)
    """Device kind -> seconds of its backward; empty when the op has none or when the
    backward is an explicit op of its own (`is_backward`)."""
    is_backward: bool = False
    """An explicit backward op (task graphs such as the peer format)."""
    output_bytes: float = 0.0
    """Bytes of the op's output tensor(s), sent once to each consumer device."""
    param_bytes: float = 0.0
    """Bytes of the parameters attributed to this op."""
    frozen_bytes: float = 0.0
    """Bytes of those parameters that do not train (`requires_grad` off): they have no
    gradient to allreduce and no optimizer step or state, only their weights."""
    activation_bytes: float = 0.0
    """Bytes the op keeps on its device for the backward pass (per full batch)."""
    colocation: str | None = None
    """Ops that share a colocation group must sit on the same device."""
    transfer_s: float | None = None
    """Explicit time to move this op's output to another device (the peer format's
    edge `cost`); None means latency + bytes / bandwidth of the link."""
    attrs: Mapping[str, object] = field(default_factory=dict)
    """Plain JSON data about the op for planners that need it, e.g. `layer_kind`
    ('conv2d', 'linear', 'lstm', ...), `output_shape`, `forward_flops`, `module`."""

    @property
    def trainable_bytes(self) -> float:
        """Bytes of the op's parameters that train."""
        return self.param_bytes - self.frozen_bytes

    def time_s(self, kind: str, backward: bool = False) -> float:
        times = self.backward_s if backward else self.forward_s
        if not times:
            return 0.0
        if kind in times:
            return times[kind]
        if ANY_KIND in times:
            return times[ANY_KIND]
        raise GraphError(
            f"op {self.id} ({self.name}) has no time for device kind {kind!r} "
            f"(it has {sorted(times)}): profile the graph for that target"
        )


@dataclass(frozen=True, kw_only=True)
class Edge:
    src: int
    dst: int
    bytes: float = 0.0
    """Size of the tensor flowing along the edge."""
    cost_s: float | None = None
    """Explicit transfer time when the ends sit on different devices (peer format)."""
    grad_bytes: float | None = None
    """Size of the gradient that flows back along the edge in a training step whose
    backward is implied: the part of the value that requires grad (an attention mask
    or token ids carry none). None: the whole value (`bytes`)."""

    @property
    def gradient_bytes(self) -> float:
        """Bytes of the gradient that crosses back (see `grad_bytes`)."""
        return self.bytes if self.grad_bytes is None else self.grad_bytes


@dataclass(frozen=True, kw_only=True)
class OpGraph:
    ops: tuple[Op, ...]
    edges: tuple[Edge, ...]
    name: str = "graph"
    time_unit: str = "s"
    """'s' for seconds; imported graphs keep their file's own unit (e.g. 'peer')."""
    metadata: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate(self)

    @cached_property
    def index(self) -> dict[int, int]:
        """Op id -> position in `ops`."""
        return {op.id: i for i, op in enumerate(self.ops)}

    def op(self, op_id: int) -> Op:
        return self.ops[self.index[op_id]]

    @cached_property
    def successors(self) -> dict[int, tuple[int, ...]]:
        out: dict[int, list[int]] = {op.id: [] for op in self.ops}
        for e in self.edges:
            out[e.src].append(e.dst)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def predecessors(self) -> dict[int, tuple[int, ...]]:
        inc: dict[int, list[int]] = {op.id: [] for op in self.ops}
        for e in self.edges:
            inc[e.dst].append(e.src)
        return {k: tuple(v) for k, v in inc.items()}

    @cached_property
    def topological_order(self) -> tuple[int, ...]:
        order = _topological_order(self.ops, self.edges)
        assert order is not None, "validate() rejects cycles"
        return order

    @property
    def has_explicit_backward(self) -> bool:
        return any(op.is_backward for op in self.ops)

    @property
    def device_kinds(self) -> set[str]:
        return {k for op in self.ops for k in op.forward_s}

    def colocation_groups(self) -> dict[str, tuple[int, ...]]:
        groups: dict[str, list[int]] = {}
        for op in self.ops:
            if op.colocation is not None:
                groups.setdefault(op.colocation, []).append(op.id)
        return {k: tuple(v) for k, v in groups.items()}

    def total_param_bytes(self) -> float:
        return sum(op.param_bytes for op in self.ops)


def _topological_order(ops: Iterable[Op], edges: Iterable[Edge]) -> tuple[int, ...] | None:
    """Kahn's algorithm, stable in the ops' order; None when there is a cycle."""
    ops = tuple(ops)
    order = _topological_order_prefix(ops, edges)
    return order if len(order) == len(ops) else None


def _topological_order_prefix(ops: Iterable[Op], edges: Iterable[Edge]) -> tuple[int, ...]:
    """The ops Kahn's algorithm can order (all of them unless there is a cycle)."""

    ids = [op.id for op in ops]
    indegree = dict.fromkeys(ids, 0)
    succ: dict[int, list[int]] = {i: [] for i in ids}
    for e in edges:
        indegree[e.dst] += 1
        succ[e.src].append(e.dst)
    ready = deque(i for i in ids if indegree[i] == 0)
    order: list[int] = []
    while ready:
        node = ready.popleft()
        order.append(node)
        for nxt in succ[node]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    return tuple(order)


def _check_number(value: float | None, what: str) -> None:
    if value is not None and (not math.isfinite(value) or value < 0):
        raise GraphError(f"{what} is {value}: costs and sizes must be finite and >= 0")


def validate(graph: OpGraph) -> None:
    """Raise GraphError naming the first offending op or edge."""
    seen: set[int] = set()
    for op in graph.ops:
        if op.id in seen:
            raise GraphError(f"op id {op.id} appears twice: give every op a unique id")
        seen.add(op.id)
        for kind, t in op.forward_s.items():
            _check_number(t, f"op {op.id} ({op.name}) forward time on {kind}")
        for kind, t in op.backward_s.items():
            _check_number(t, f"op {op.id} ({op.name}) backward time on {kind}")
        for attr in ("output_bytes", "param_bytes", "frozen_bytes", "activation_bytes",
                     "transfer_s"):
            _check_number(getattr(op, attr), f"op {op.id} ({op.name}) {attr}")
        if op.frozen_bytes > op.param_bytes:
            raise GraphError(f"op {op.id} ({op.name}) has frozen_bytes {op.frozen_bytes:g} "
                             f"over its param_bytes {op.param_bytes:g}: frozen parameters "
                             "are a part of its parameters")
    for e in graph.edges:
        for end in (e.src, e.dst):
            if end not in seen:
                raise GraphError(
                    f"edge {e.src}->{e.dst} names op {end}, which is not in the graph: "
                    "fix the edge or add the op"
                )
        if e.src == e.dst:
            raise GraphError(f"edge {e.src}->{e.dst} is a self-loop: remove it")
        _check_number(e.bytes, f"edge {e.src}->{e.dst} bytes")
        _check_number(e.grad_bytes, f"edge {e.src}->{e.dst} grad_bytes")
        if e.grad_bytes is not None and e.grad_bytes > e.bytes:
            raise GraphError(f"edge {e.src}->{e.dst} has grad_bytes {e.grad_bytes:g} over "
                             f"its bytes {e.bytes:g}: the gradient is of a part of the value")
        _check_number(e.cost_s, f"edge {e.src}->{e.dst} cost")
    if _topological_order(graph.ops, graph.edges) is None:
        cycle = _find_cycle(graph)
        raise GraphError(
            "the graph has a cycle (" + " -> ".join(map(str, cycle)) + "): "
            "an op graph must be acyclic; unroll recurrences over time steps"
        )


def _find_cycle(graph: OpGraph) -> list[int]:
    """A cycle among the ops Kahn's algorithm left: each has a predecessor left too, so
    walking predecessors must revisit an op."""
    order = set(_topological_order_prefix(graph.ops, graph.edges))
    pred: dict[int, int] = {}
    for e in graph.edges:
        if e.dst not in order and e.src not in order:
            pred.setdefault(e.dst, e.src)
    node = next(iter(pred))
    path: list[int] = []
    while node not in path:
        path.append(node)
        node = pred[node]
    cycle = path[path.index(node):] + [node]
    return cycle[::-1]
