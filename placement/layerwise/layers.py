"""Layer facts for the layer-wise search, read from an op graph's `Op.attrs`.

Contract with the profiler (see `Op.attrs`): `layer_kind` (conv2d, linear, lstm,
embedding, pool, norm, elementwise, concat, attention, softmax, loss, other),
`output_shape` (batch-first list of ints, e.g. [N, C, H, W] or [N, F]), optionally
`input_shapes`, `weight_shape` ([C_out, C_in, kh, kw] for conv2d) and `kernel_size`
(int or [kh, kw], for pools); times come from `Op.forward_s` / `Op.backward_s` and
weights from `Op.trainable_bytes` (a frozen weight is never synchronised). An op
without a usable `output_shape` is treated as a batch-first tensor of unknown size:
only its sample dimension may be split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from placement.errors import UserError
from placement.graph import Op, OpGraph

#: The dimensions a layer's work can be split along (Jia et al. 2018, Section 3).
DIMS = ("sample", "channel", "height", "width")

LAYER_KINDS = ("conv2d", "linear", "lstm", "embedding", "pool", "norm", "elementwise",
               "concat", "attention", "softmax", "loss", "other")

#: Dimensions each kind may split. Channel means *output* channels: a split there
#: partitions the weights of conv2d/linear/embedding/norm. Concat keeps its channels
#: whole because each output channel range comes from a different input; recurrent,
#: attention, softmax and loss layers mix their non-batch axes, so only samples split.
_KIND_DIMS: Mapping[str, tuple[str, ...]] = {
    "conv2d": DIMS, "pool": DIMS, "norm": DIMS, "elementwise": DIMS,
    "concat": ("sample", "height", "width"),
    "linear": ("sample", "channel"), "embedding": ("sample", "channel"),
}

#: Kinds whose output channel i reads only input channel i (so an input tile can
#: follow the output's channel split) ...
CHANNELWISE = frozenset({"pool", "norm", "elementwise"})
#: ... and kinds whose output pixel reads the input pixels around the same place.
SPATIAL = frozenset({"conv2d", "pool", "norm", "elementwise", "concat"})


class LayerFactsError(UserError):
    """An op graph the layer-wise search cannot use."""


@dataclass(frozen=True, kw_only=True)
class Layer:
    """One op seen as a layer: what it may split and what it costs unsplit."""

    op_id: int
    name: str
    kind: str
    shape: tuple[int | None, ...]
    """The layer's iteration space, batch-first: its output shape (its first input's
    shape for a loss whose output is a scalar); None where the size is unknown."""
    axes: tuple[str | None, ...]
    """Per axis of `shape`, the dimension it is (None: an axis that is never split)."""
    dims: tuple[str, ...]
    """Dimensions this layer may split, in `DIMS` order."""
    compute_s: float
    """Forward + backward seconds on one device, whole batch (t_c at degree 1)."""
    trainable_bytes: float
    """Bytes of trainable weights: what a replica's allreduce moves."""
    output_bytes: float
    kernel: tuple[int, int] = (1, 1)
    """Window (kh, kw) each output pixel reads: a spatial split's tiles need halos."""

    def size(self, dim: str) -> int | None:
        return self.shape[self.axes.index(dim)] if dim in self.axes else None


def axis_names(rank: int, kind: str) -> tuple[str | None, ...]:
    """Which dimension each axis of a batch-first tensor of this rank is."""
    if rank == 0:
        return ()
    if rank == 4:
        return DIMS
    if rank == 2:
        return ("sample", "channel")
    if rank == 3 and kind in ("linear", "embedding"):
        # [N, T, F]: a token-wise linear layer or an embedding lookup.
        return ("sample", None, "channel")
    return ("sample",) + (None,) * (rank - 1)


def _shape(value: object) -> tuple[int, ...] | None:
    if isinstance(value, Sequence) and not isinstance(value, str) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        return tuple(value)
    return None


def _kernel(op: Op) -> tuple[int, int]:
    weight = _shape(op.attrs.get("weight_shape"))
    if weight is not None and len(weight) == 4:
        return weight[2], weight[3]
    size = op.attrs.get("kernel_size")
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        return size, size
    pair = _shape(size)
    return (pair[0], pair[1]) if pair is not None and len(pair) == 2 else (1, 1)


def layer_of(op: Op, device_kind: str) -> Layer:
    kind = str(op.attrs.get("layer_kind", "other"))
    if kind not in LAYER_KINDS:
        kind = "other"
    shape: tuple[int | None, ...] | None = _shape(op.attrs.get("output_shape"))
    if shape == ():
        inputs = op.attrs.get("input_shapes")
        first = inputs[0] if isinstance(inputs, Sequence) and inputs else None
        shape = _shape(first) or ()
    if shape is None:
        shape = (None,)
    axes = axis_names(len(shape), kind)
    allowed = _KIND_DIMS.get(kind, ("sample",))
    dims = tuple(d for d in DIMS if d in allowed and d in axes)
    compute_s = op.time_s(device_kind) + op.time_s(device_kind, backward=True)
    return Layer(op_id=op.id, name=op.name, kind=kind, shape=shape, axes=axes, dims=dims,
                 compute_s=compute_s, trainable_bytes=op.trainable_bytes,
                 output_bytes=op.output_bytes, kernel=_kernel(op))


def layers_of(graph: OpGraph, device_kind: str) -> tuple[Layer, ...]:
    """The graph's ops as layers, in the graph's op order."""
    if graph.has_explicit_backward:
        raise LayerFactsError(
            f"graph {graph.name!r} has explicit backward ops (a task graph such as the "
            "peer format): the layer-wise search needs a forward layer graph; produce one "
            "with `orchestrator profile` or `--model`")
    if not any("layer_kind" in op.attrs for op in graph.ops):
        raise LayerFactsError(
            f"graph {graph.name!r} has no layer facts (no op has attrs.layer_kind): "
            "produce it with `orchestrator profile`, or add layer_kind and output_shape "
            "to each op's attrs")
    return tuple(layer_of(op, device_kind) for op in graph.ops)
