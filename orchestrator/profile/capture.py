"""Capture a model's training step as an fx graph that `trace.partition` cuts into ops.

- Granularity `module` (the default): torch.fx symbolic tracing where it works, so the
  built-in models keep the ops they have always been cut into (torch layers and
  functions) and their measured speed. Where it fails (data-dependent Python control
  flow, iteration over proxies, modules built inside `forward`: today's transformers
  models), `torch.export` traces through the Python code instead, and the partition
  groups its ATen operators by the layer call each came from (`nn_module_stack`).
- Granularity `aten`: always torch.export, one op per ATen operator as the model calls
  it (torch.export's training IR: `linear`, `layer_norm`, `scaled_dot_product_attention`
  stay whole), without fusion.
- Granularity `core-aten`: the same, decomposed into PyTorch's Core ATen operator set
  (`run_decompositions`: `linear` becomes `permute` + `addmm`, attention its matmuls and
  softmax), about twice the ops. Some models do not decompose with symbolic batch sizes
  (GPT-2's Conv1D views, in torch 2.13); they say so.
- Granularity `decomposed`: Core ATen with the normalisations (batch norm, layer
  norm) decomposed too, by PyTorch's own decompositions (`torch._decomp`), into their
  arithmetic (`var_mean`, `rsqrt`, `mul`, `add`, and the running statistics' update).
  Core ATen keeps a batch norm one operator, so a convolutional network such as
  ResNet-50 has few more ops there than layers; here each normalisation is about a
  dozen ops that a placer may split.

torch.export specialises the graph to the example batch's shapes; the samples
dimension of the batched inputs stays symbolic (`Dim.AUTO`), so a micro-batch of any
size runs the same graph.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sysconfig
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import fx, nn
from torch._decomp import get_decompositions
from torch.export import Dim
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from orchestrator.profile.trace import (Partition, TraceFailure, Unit, aten_name, partition,
                                        trace)

#: --granularity values: `module` (layers and functions), `aten` (ATen operators),
#: `core-aten` (Core ATen operators), `decomposed` (Core ATen, normalisations decomposed).
GRANULARITIES = ("module", "aten", "core-aten", "decomposed")


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
        gm = export(module, batch, batched, name, granularity=granularity)
        units = {}
    return Capture(module=gm, method="export", units=units, fuse=granularity == "module",
                   seconds=time.perf_counter() - start)


def export(module: nn.Module, batch: Sequence[torch.Tensor], batched: Sequence[bool],
           name: str, fx_failure: TraceFailure | None = None,
           granularity: str = "aten") -> fx.GraphModule:
    """`module`'s step as an ATen graph returning the loss: torch.export's training IR
    (autograd-able operators such as linear and layer_norm) at `module` and `aten`
    granularity, else that IR decomposed (`_decompositions`)."""
    dynamic = tuple({0: Dim.AUTO} if b else None for b in batched)
    try:
        with _quiet():
            exported = torch.export.export(module, tuple(batch), strict=False,
                                           dynamic_shapes=dynamic)
    except _EXPORT_ERRORS as err:
        where = _model_line(err)
        at = f" at {where}" if where else ""
        fix = (f"make the step's Python control flow{' there' if where else ''} depend "
               "on shapes only, not on tensor values")
        if fx_failure is None:
            raise TraceFailure(f"cannot capture {name}: torch.export failed{at}: "
                               f"{_first_line(err)}", fix) from None
        raise TraceFailure(f"{fx_failure.problem}; torch.export failed too{at}: "
                           f"{_first_line(err)}", f"{fx_failure.fix}, or {fix}") from None
    if _fixed_samples(exported, batched):
        exported = _strict_export(module, batch, batched, name, dynamic)
    if granularity in ("core-aten", "decomposed"):
        try:
            with _quiet():
                exported = exported.run_decompositions(_decompositions(granularity))
        except _EXPORT_ERRORS as err:
            raise TraceFailure(f"cannot capture {name} at --granularity {granularity}: "
                               f"{_first_line(err)}", "use --granularity aten") from None
    return _loss_module(exported.module(), name)


def _fixed_samples(exported: torch.export.ExportedProgram, batched: Sequence[bool]) -> bool:
    """Whether the graph holds a batched input's samples dimension fixed to the example
    batch's size (`Dim.AUTO` lets torch.export specialise it where the step uses the
    size as a Python number): a micro-batch of another size would then fail inside
    the graph, or, where only a constant took the size, silently compute the wrong
    thing."""
    inputs = [exported.graph.find_nodes(op="placeholder", target=spec.arg.name)[0]
              for spec in exported.graph_signature.input_specs
              if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    return any(b and isinstance(node.meta["val"], torch.Tensor)
               and is_concrete_int(node.meta["val"].shape[0])
               for node, b in zip(inputs, batched, strict=True))


def _strict_export(module: nn.Module, batch: Sequence[torch.Tensor], batched: Sequence[bool],
                   name: str, dynamic: tuple) -> torch.export.ExportedProgram:
    """torch.export in strict mode, where the non-strict one fixed the samples
    dimension. Non-strict export runs the step's Python as is, and Python demands an
    int from `len(tensor)`, so `torch.arange(len(logits))` (CLIP's contrastive loss)
    becomes a constant of the example's size; strict export traces the bytecode and
    keeps it symbolic. A step that still fixes it is refused."""
    problem = f"cannot capture {name} for a batch of any size"
    size = len(batch[batched.index(True)])
    fix = ("take the size from x.shape[0] where the step needs the batch size, or "
           "compute the loss in the model's forward from outputs that do not fix it")
    try:
        with _quiet():
            exported = torch.export.export(module, tuple(batch), strict=True,
                                           dynamic_shapes=dynamic)
    except _EXPORT_ERRORS as err:
        raise TraceFailure(f"{problem}: torch.export fixed its samples dimension to {size}, "
                           f"and its strict mode failed: {_first_line(err)}", fix) from None
    if _fixed_samples(exported, batched):
        raise TraceFailure(f"{problem}: the step fixes its samples dimension to {size}", fix)
    return exported


def _decompositions(granularity: str) -> dict:
    """torch.export's table down to Core ATen, plus at `decomposed` PyTorch's own
    decompositions of the normalisations Core ATen keeps whole (in training mode,
    the functional batch norm that also returns the updated running statistics)."""
    table = torch.export.default_decompositions()
    if granularity == "decomposed":
        aten = torch.ops.aten
        # torch._decomp's table is how torch.export's own docs extend the default one;
        # no public API names these decompositions.
        table.update(get_decompositions([
            aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit,
            aten._native_batch_norm_legit_no_training, aten.native_batch_norm,
            aten.native_layer_norm]))
    return table


#: What torch.export raises for a model it cannot capture.
_EXPORT_ERRORS = (RuntimeError, TypeError, ValueError, NotImplementedError, AttributeError,
                  AssertionError)


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _model_line(err: Exception) -> str | None:
    """Where in the model's own code torch.export failed: the innermost frame outside
    torch, Python's standard library and this package (non-strict export runs the
    model's Python, so its frames are in the traceback), as file:line, an installed
    library's file named from its package; None where the failure is in no such
    frame."""
    skipped = (Path(torch.__file__).parent, Path(__file__).parents[1],
               Path(sysconfig.get_paths()["stdlib"]))
    found = None
    for frame, line in traceback.walk_tb(err.__traceback__):
        path = Path(frame.f_code.co_filename)
        if path.is_absolute() and not any(path.is_relative_to(s) for s in skipped):
            found = path, line
    if found is None:
        return None
    path, line = found
    installed = [i for i, part in enumerate(path.parts)
                 if part in ("site-packages", "dist-packages")]
    if installed:
        path = Path(*path.parts[installed[-1] + 1:])
    return f"{path}:{line}"


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
    """The exported module as a plain GraphModule the executor can split: `forward(*batch)`
    returns the loss itself (not a pytree of outputs), no guard checks the inputs' shapes
    (the executor runs micro-batches, whose size the guards would compare with the
    example's), and no operator writes into an activation in place (see
    `_out_of_place`) or into a buffer that another operator saved for its backward (see
    `_snapshot_mutated_buffers`)."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            graph.erase_node(node)
    output = next(n for n in graph.nodes if n.op == "output")
    flat = output.args[0]
    if isinstance(flat, (tuple, list)) and len(flat) == 1:
        output.args = (flat[0],)
    _out_of_place(graph, name)
    _differentiable_copies(graph)
    _snapshot_mutated_buffers(graph)
    _detach_buffer_writes(graph)
    graph.set_codegen(fx.graph.CodeGen())
    graph.lint()
    return fx.GraphModule(gm, graph, name)


def _out_of_place(graph: fx.Graph, name: str) -> None:
    """Replace each in-place operator on an activation (`hidden += residual` in HF's
    ResNet, `ReLU(inplace=True)`, `shifted[:, 1:] = ids[:, :-1]` as BART and T5 make
    their decoder inputs) by its out-of-place form. An op boundary hands the next op a
    detached copy of each input, which an in-place write may not modify, and the write
    would not reach the other readers anyway. What torch's functionalization does (which
    torch.export only runs together with decompositions that would change the ops of
    this IR): a write into a view is scattered back into the view's base (`slice_scatter`,
    ...), and whatever reads the base or a view of it after the write reads the new base
    or the same view taken of it. Writes into buffers (running statistics) stay."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        packet_name = aten_name(node)
        if packet_name is None or not packet_name.endswith("_") or packet_name.startswith("_"):
            continue
        written = node.args[0]
        packet = getattr(torch.ops.aten, packet_name[:-1], None)
        functional = getattr(packet, node.target._overloadname, None) if packet else None
        if not isinstance(written, fx.Node) or functional is None:
            continue
        chain = _view_chain(written)
        if chain[0].op == "get_attr":
            continue
        with graph.inserting_after(node):
            result = graph.call_function(functional, node.args, node.kwargs)
        result.meta = dict(node.meta)
        fresh = {result}
        value = result
        for view, base in zip(reversed(chain[1:]), reversed(chain[:-1])):
            with graph.inserting_after(value):
                value = _scatter(graph, view, base, value, name)
            value.meta = dict(node.meta)
            fresh.add(value)
        node.replace_all_uses_with(result)
        _rebind(graph, chain[0], value, node, order, fresh)
        graph.erase_node(node)


def _is_view(node: fx.Node) -> bool:
    return (isinstance(node.target, torch._ops.OpOverload) and node.target.is_view
            and bool(node.args) and isinstance(node.args[0], fx.Node))


def _view_chain(node: fx.Node) -> list[fx.Node]:
    """[base, view, view of view, ..., node]: the views `node` is taken through."""
    chain = [node]
    while _is_view(chain[0]):
        chain.insert(0, chain[0].args[0])
    return chain


def _rebind(graph: fx.Graph, base: fx.Node, new_base: fx.Node, write: fx.Node,
            order: dict, fresh: set) -> None:
    """The model's readers that run after `write` (in the graph's order) of `base`, or
    of a view of it taken before the write, read `new_base` or that view taken again of
    `new_base`. Nodes this pass added are none of the model's readers; those of earlier
    writes (`new_base` of one is often a view) are views of `base` taken before this
    write, those of this one (`fresh`: its value, scattered back) are not."""
    again = {base: new_base}

    def taken_again(view: fx.Node) -> fx.Node:
        if view not in again:
            parent = taken_again(view.args[0])
            with graph.inserting_after(parent):
                again[view] = graph.call_function(view.target, (parent, *view.args[1:]),
                                                  dict(view.kwargs))
            again[view].meta = dict(view.meta)
        return again[view]

    stack = [base]
    while stack:
        alias = stack.pop()
        for reader in list(alias.users):
            if reader in fresh:
                continue
            if order.get(reader, -1) > order[write]:
                reader.replace_input_with(alias, taken_again(alias))
            elif _is_view(reader) and reader.args[0] is alias:
                stack.append(reader)


def _differentiable_copies(graph: fx.Graph) -> None:
    """ATen's functional `copy` (what functionalization makes of `copy_`, and what
    `_out_of_place` does) has no derivative: a copy becomes its source expanded and
    cast to the destination, which autograd differentiates."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.copy.default:
            continue
        destination, source = node.args[:2]
        with graph.inserting_before(node):
            value = graph.call_function(torch.ops.aten.expand_as.default, (source, destination))
            cast = graph.call_function(torch.ops.aten.type_as.default, (value, destination))
        value.meta = cast.meta = dict(node.meta)
        node.replace_all_uses_with(cast)
        graph.erase_node(node)


def _scatter(graph: fx.Graph, view: fx.Node, base: fx.Node, value: fx.Node,
             name: str) -> fx.Node:
    """`base` with `value` written where `view` (a view of `base`) lies."""
    aten = torch.ops.aten
    kind = aten_name(view)
    args = view.args[1:]
    if kind == "slice":
        return graph.call_function(aten.slice_scatter.default, (base, value, *args), view.kwargs)
    if kind == "select":
        return graph.call_function(aten.select_scatter.default, (base, value, *args))
    if kind == "diagonal":
        return graph.call_function(aten.diagonal_scatter.default, (base, value, *args), view.kwargs)
    if kind == "as_strided":
        return graph.call_function(aten.as_strided_scatter.default, (base, value, *args),
                                   view.kwargs)
    if kind in ("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "alias"):
        return graph.call_function(aten.reshape_as.default, (value, base))
    if kind in ("transpose", "t"):
        return graph.call_function(view.target, (value, *args))
    if kind == "permute":
        dims = [d % len(args[0]) for d in args[0]]
        inverse = [dims.index(d) for d in range(len(dims))]
        return graph.call_function(aten.permute.default, (value, inverse))
    raise TraceFailure(f"cannot capture {name}: an in-place write through aten.{kind} "
                       f"({view.name}), a view this capture cannot write back",
                       "use --granularity core-aten")


def _snapshot_mutated_buffers(graph: fx.Graph) -> None:
    """Core ATen's functional batch norm saves the running statistics it reads for its
    backward, and the graph then writes the updated statistics into those buffers
    (`copy_`), which autograd refuses at the backward. Readers of a buffer that the
    graph writes get a copy of it instead (taken from the inputs alone: prologue)."""
    for node in list(graph.nodes):
        if aten_name(node) != "copy_" or node.args[0].op != "get_attr":
            continue
        buffer = node.args[0]
        readers = [u for u in buffer.users if u is not node]
        if not readers:
            continue
        with graph.inserting_before(readers[0]):
            snapshot = graph.call_function(torch.ops.aten.clone.default, (buffer,))
        for reader in readers:
            reader.replace_input_with(buffer, snapshot)


def _detach_buffer_writes(graph: fx.Graph) -> None:
    """A buffer written from an activation's statistics (a decomposed batch norm's
    running mean is arithmetic on the batch's mean) would become a non-leaf tensor of
    the autograd graph, holding the step's graph alive and refusing a deepcopy; a
    buffer never takes a gradient, so what is written into it is detached first."""
    for node in list(graph.nodes):
        if aten_name(node) != "copy_" or node.args[0].op != "get_attr":
            continue
        with graph.inserting_before(node):
            detached = graph.call_function(torch.ops.aten.detach.default, (node.args[1],))
        node.replace_input_with(node.args[1], detached)


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
