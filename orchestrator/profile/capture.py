"""Capture a model's training step as an fx graph that `trace.partition` cuts into ops.

- Granularity `module` (the default): torch.fx symbolic tracing where it works, so the
  built-in models keep the ops they have always been cut into (torch layers and
  functions) and their measured speed. Where it fails (data-dependent Python control
  flow, iteration over proxies, modules built inside `forward`: today's transformers
  models), `torch.export` traces through the Python code instead, and the partition
  groups its ATen operators by the layer call each came from (`nn_module_stack`).
- Granularity `aten`: always torch.export, one op per ATen operator, without fusion.

torch.export specialises the graph to the example batch's shapes; the samples
dimension of the batched inputs stays symbolic (`Dim.AUTO`), so a micro-batch of any
size runs the same graph.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn
from torch.export import Dim

from orchestrator.profile.trace import Partition, TraceFailure, Unit, partition, trace

#: --granularity values: `module` (layers and functions), `aten` (ATen operators).
GRANULARITIES = ("module", "aten")


@dataclass(frozen=True, kw_only=True, eq=False)
class Capture:
    module: fx.GraphModule
    """Runs `module(*batch) -> loss`; its parameters are the model's own."""
    method: str
    """`fx` (symbolic tracing) or `export` (torch.export)."""
    units: Mapping[str, Unit]
    """Exported graphs at module granularity: node name -> the layer call it is in."""
    fuse: bool
    """False at operator granularity: every ATen operator is one op."""
    seconds: float
    """Wall time of the capture."""

    def partition(self) -> Partition:
        return partition(self.module, units=self.units, fuse=self.fuse)


def capture(module: nn.Module, batch: Sequence[torch.Tensor], batched: Sequence[bool], *,
            granularity: str = "module", name: str = "model") -> Capture:
    """Capture `module`'s step on the example `batch`; `batched[i]`: whether input i
    carries the samples along dim 0."""
    assert granularity in GRANULARITIES, granularity
    start = time.perf_counter()
    if granularity == "module":
        try:
            gm = trace(module, name)
            return Capture(module=gm, method="fx", units={}, fuse=True,
                           seconds=time.perf_counter() - start)
        except TraceFailure as failure:
            gm = export(module, batch, batched, name, fx_failure=failure)
        units = layer_calls(gm, module)
    else:
        gm = export(module, batch, batched, name)
        units = {}
    return Capture(module=gm, method="export", units=units, fuse=granularity == "module",
                   seconds=time.perf_counter() - start)


def export(module: nn.Module, batch: Sequence[torch.Tensor], batched: Sequence[bool],
           name: str, fx_failure: TraceFailure | None = None) -> fx.GraphModule:
    """`module`'s step as an ATen graph (torch.export's training IR, which keeps
    autograd-able operators such as linear and layer_norm) returning the loss."""
    dynamic = tuple({0: Dim.AUTO} if b else None for b in batched)
    try:
        with _quiet():
            exported = torch.export.export(module, tuple(batch), strict=False,
                                           dynamic_shapes=dynamic)
    except (RuntimeError, TypeError, ValueError, NotImplementedError, AttributeError,
            AssertionError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if fx_failure is None:
            raise TraceFailure(f"cannot capture {name}: torch.export failed: {reason}",
                               "make the step's Python control flow depend on shapes "
                               "only, not on tensor values") from None
        raise TraceFailure(f"{fx_failure.problem}; torch.export failed too: {reason}",
                           fx_failure.fix) from None
    return _loss_module(exported.module(), name)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep torch.export's own reports of a failure (warnings, and the partial graph it
    prints to stderr) off the user's terminal: the failure's first line goes into our
    one-line error."""
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)


def _loss_module(gm: fx.GraphModule, name: str) -> fx.GraphModule:
    """The exported module as a plain GraphModule: `forward(*batch)` returns the loss
    itself (not a pytree of outputs), and no guard checks the inputs' shapes (the
    executor runs micro-batches, whose size the guards would compare with the
    example's)."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            graph.erase_node(node)
    output = next(n for n in graph.nodes if n.op == "output")
    flat = output.args[0]
    if isinstance(flat, (tuple, list)) and len(flat) == 1:
        output.args = (flat[0],)
    graph.set_codegen(fx.graph.CodeGen())
    graph.lint()
    return fx.GraphModule(gm, graph, name)


def layer_calls(gm: fx.GraphModule, root: nn.Module) -> dict[str, Unit]:
    """Node name -> (call key, module path) of the layer call (a module without child
    modules) each exported node ran in; nodes outside any layer are left out."""
    units = {}
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if node.op != "call_function" or not stack:
            continue
        key, (path, _type) = next(reversed(stack.items()))
        try:
            module = root.get_submodule(path)
        except AttributeError:
            continue
        if next(module.children(), None) is None:
            units[node.name] = (key, path)
    return units
