"""From a module to a partition: the fx graph cut into ops, in the order of our op graph.

Tracing keeps torch.nn layers and the classes registered with
`orchestrator.models.layers.leaf_module` whole; a graph captured with torch.export
(`orchestrator.profile.capture`) holds ATen operators instead, each with the module call
it came from. Every node then falls in one of:

- an *input*: a placeholder (a batch tensor) or a get_attr of something that is not a
  trainable parameter; available to every op.
- a *prologue* node: computed from inputs alone (shapes, index arithmetic, sampled ids);
  it needs no gradient, so the executor computes it once and hands it to every op.
- a member of exactly one *op*. Every call_module, and every function or method that is
  not cheap (matmul, cat, losses, pooling, ...), starts a new op (its *anchor*). A cheap
  node (elementwise, view, getitem, BatchNorm, ReLU) joins the op of its latest producer
  (the largest op id among its inputs), so ops are created in a topological order and
  every edge goes from a lower op id to a higher one. A cheap node whose inputs are only
  parameters and inputs (a parameter's view) joins the smallest op that consumes it.
  In an exported graph, the ATen nodes of one call of a layer (a module without
  children: Linear, LayerNorm, HF's Conv1D) form one op, cheap unless one of them is
  not (a Dropout call fuses, an RMSNorm call is an op). With `fuse=False` (operator
  granularity) every ATen node is an op of its own; only `getitem`, which picks an
  element of a tuple an operator returned, joins its producer. A node whose value no
  one reads (an assertion, a buffer's in-place update) joins its latest producer, or,
  if it has none (`num_batches_tracked += 1`), the op that follows it.

Parameters are named by their first qualified name (`named_parameters()`): a tied
weight, reachable under two names, is one parameter, so the ops reading it share a
colocation group.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from orchestrator.models.layers import LEAF_MODULES, LSTMLayer
from placement.errors import UserError


class TraceFailure(UserError):
    """A model that cannot be captured: `problem`, then `fix` (what to change)."""

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(f"{problem}; {fix}" if fix else problem)
        self.problem = problem
        self.fix = fix


#: torch.nn modules that hold a stack of layers (fx's default keeps them whole).
_LAYER_STACKS = (nn.TransformerEncoder, nn.TransformerDecoder, nn.Transformer)


class _Tracer(fx.Tracer):
    """fx tracer that keeps registered leaves whole and remembers which module it was
    inside when tracing failed."""

    def __init__(self) -> None:
        super().__init__()
        self.inside: list[tuple[str, str]] = []

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        # fx keeps every torch.nn module whole, and PyTorch's transformer stacks are
        # torch.nn modules: a model built on nn.TransformerEncoder was one op for all
        # its layers, which no plan can split.
        return type(m) in LEAF_MODULES or (not isinstance(m, _LAYER_STACKS)
                                           and super().is_leaf_module(m, qualname))

    def call_module(self, m: nn.Module, forward: Callable, args: Any, kwargs: Any) -> Any:
        self.inside.append((self.path_of_module(m), type(m).__name__))
        out = super().call_module(m, forward, args, kwargs)
        self.inside.pop()
        return out


def trace(module: nn.Module, name: str = "model") -> fx.GraphModule:
    """Symbolically trace `module`; a failure names the module it happened in."""
    tracer = _Tracer()
    try:
        graph = tracer.trace(module)
    except (fx.proxy.TraceError, TypeError, RuntimeError, ValueError,
            NotImplementedError, AttributeError, NameError) as err:
        # NameError: fx's "module is not installed as a submodule", for a module that
        # forward calls without owning it (Mamba's kernel-hub layers).
        path, cls = tracer.inside[-1] if tracer.inside else ("<top level>",
                                                             type(module).__name__)
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TraceFailure(
            f"cannot trace {name}: module {path!r} ({cls}) failed: {reason}",
            f"mark {cls} as a leaf (decorate the class with "
            "@orchestrator.models.layers.leaf_module) so it becomes one op") from None
    return fx.GraphModule(module, graph, name)


#: Functions and methods cheap enough to fuse into the op that produces their input.
_CHEAP_FUNCTIONS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg,
    operator.getitem, getattr, torch.add, torch.sub, torch.mul, torch.div, torch.neg,
    torch.sigmoid, torch.tanh, torch.relu, F.relu, torch.flatten, torch.reshape,
    torch.squeeze, torch.unsqueeze, torch.transpose, torch.permute, F.dropout,
}
_CHEAP_METHODS = {
    "add", "sub", "mul", "div", "neg", "sigmoid", "tanh", "relu", "view", "reshape",
    "flatten", "squeeze", "unsqueeze", "transpose", "permute", "contiguous", "t", "size",
    "expand", "float", "to", "type_as",
}
_CHEAP_MODULES = (nn.ReLU, nn.ReLU6, nn.Sigmoid, nn.Tanh, nn.GELU, nn.Dropout,
                  nn.Identity, nn.Flatten, nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm)

_MODULE_KINDS = (
    (nn.Conv2d, "conv2d"), (nn.Linear, "linear"), (LSTMLayer, "lstm"),
    (nn.LSTM, "lstm"), (nn.Embedding, "embedding"),
    ((nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d), "pool"),
    ((nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm), "norm"),
    ((nn.Softmax, nn.LogSoftmax), "softmax"),
    ((nn.CrossEntropyLoss, nn.NLLLoss, nn.MSELoss), "loss"),
    (_CHEAP_MODULES, "elementwise"),
)
_FUNCTION_KINDS = {
    F.conv2d: "conv2d", F.linear: "linear", torch.matmul: "linear", torch.mm: "linear",
    torch.bmm: "linear", operator.matmul: "linear", F.embedding: "embedding",
    F.max_pool2d: "pool", F.avg_pool2d: "pool", F.adaptive_avg_pool2d: "pool",
    F.adaptive_max_pool2d: "pool", torch.cat: "concat", torch.stack: "concat",
    torch.softmax: "softmax", F.softmax: "softmax", F.log_softmax: "softmax",
    torch.logsumexp: "softmax", F.cross_entropy: "loss", F.nll_loss: "loss",
    F.mse_loss: "loss", F.batch_norm: "norm", F.layer_norm: "norm",
}


#: ATen operators (by packet name) cheap enough to fuse into their producer's op.
_CHEAP_ATEN = {
    "view", "_unsafe_view", "reshape", "flatten", "squeeze", "unsqueeze", "transpose", "t",
    "permute", "expand", "contiguous", "clone", "alias", "detach", "slice", "select",
    "split", "split_with_sizes", "chunk", "unbind", "add", "sub", "mul", "div", "neg",
    "rsqrt", "sqrt", "pow", "tanh", "sigmoid", "relu", "relu_", "gelu", "silu", "dropout",
    "native_dropout", "to", "_to_copy", "type_as", "masked_fill", "where",
}
#: Op kinds (the vocabulary of Op.attrs) of ATen operators, by packet name.
_ATEN_KINDS = {
    "linear": "linear", "addmm": "linear", "mm": "linear", "bmm": "linear",
    "matmul": "linear", "baddbmm": "linear", "conv2d": "conv2d", "convolution": "conv2d",
    "embedding": "embedding", "layer_norm": "norm", "native_layer_norm": "norm",
    "batch_norm": "norm", "_native_batch_norm_legit_functional": "norm",
    "_native_batch_norm_legit_no_training": "norm", "native_batch_norm": "norm",
    "group_norm": "norm", "softmax": "softmax", "_softmax": "softmax",
    "log_softmax": "softmax", "_log_softmax": "softmax", "logsumexp": "softmax",
    "scaled_dot_product_attention": "attention",
    "_scaled_dot_product_flash_attention_for_cpu": "attention",
    "cross_entropy_loss": "loss", "nll_loss": "loss", "nll_loss_forward": "loss",
    "mse_loss": "loss", "max_pool2d": "pool", "max_pool2d_with_indices": "pool",
    "avg_pool2d": "pool", "adaptive_avg_pool2d": "pool", "_adaptive_avg_pool2d": "pool",
    "cat": "concat", "stack": "concat",
}


def aten_name(node: fx.Node) -> str | None:
    """The ATen packet name of an exported graph's node (None for other nodes)."""
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return node.target.overloadpacket.__name__
    return None


def is_cheap(node: fx.Node, gm: fx.GraphModule) -> bool:
    if aten_name(node) is not None:
        return aten_name(node) in _CHEAP_ATEN
    if node.op == "call_function":
        return node.target in _CHEAP_FUNCTIONS
    if node.op == "call_method":
        return node.target in _CHEAP_METHODS
    if node.op == "call_module":
        return isinstance(gm.get_submodule(node.target), _CHEAP_MODULES)
    return False


def layer_kind(node: fx.Node, gm: fx.GraphModule) -> str:
    """The kind of an op, from its anchor node (the vocabulary of Op.attrs)."""
    if node.op == "call_module":
        sub = gm.get_submodule(node.target)
        for types, kind in _MODULE_KINDS:
            if isinstance(sub, types):
                return kind
        return getattr(sub, "layer_kind", "other")
    if aten_name(node) in _ATEN_KINDS:
        return _ATEN_KINDS[aten_name(node)]
    if node.op == "call_function" and node.target in _FUNCTION_KINDS:
        return _FUNCTION_KINDS[node.target]
    if node.op == "call_method" and node.target in ("matmul", "mm", "bmm"):
        return "linear"
    return "elementwise" if is_cheap(node, gm) else "other"


@dataclass(frozen=True, kw_only=True)
class OpNodes:
    """One op of the partition: its fx nodes and what it exchanges with other ops."""

    id: int
    name: str
    module: str
    """Qualified name of the module the anchor node belongs to ('' for the top)."""
    kind: str
    nodes: tuple[str, ...]
    """fx node names, in graph (= execution) order."""
    inputs: tuple[str, ...]
    """Values produced by other ops that this op reads."""
    outputs: tuple[str, ...]
    """Values of this op read by other ops, or the loss."""
    params: tuple[str, ...]
    """Qualified names of the trainable parameters the op's nodes use."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Partition:
    """The contract between the profiler and the executor: see `orchestrator.profile`."""

    module: fx.GraphModule
    placeholders: tuple[str, ...]
    """Batch tensor names, in the order of `module(*batch)`."""
    prologue: tuple[str, ...]
    """Nodes computed from the batch alone, before any op (no gradients)."""
    ops: tuple[OpNodes, ...]
    """ops[i].id == i; ids are a topological order of the op graph."""
    edges: Mapping[tuple[int, int], tuple[str, ...]]
    """(src op, dst op) -> names of the values flowing along that edge."""
    loss: str
    """Name of the node whose value is the step's loss (an output of `loss_op`)."""
    loss_op: int
    nodes: Mapping[str, fx.Node] = field(repr=False)

    def inputs_env(self, batch: Iterable[torch.Tensor]) -> dict[str, Any]:
        """The batch under its placeholder names, plus the prologue computed from it."""
        env = dict(zip(self.placeholders, batch, strict=True))
        for name in self.prologue:
            env[name] = self.eval_node(self.nodes[name], env)
        return env

    def run_op(self, op_id: int, env: dict[str, Any]) -> None:
        """Run op `op_id`'s nodes, reading inputs from `env` and writing every value
        it computes into `env` (its `outputs` among them)."""
        for name in self.ops[op_id].nodes:
            env[name] = self.eval_node(self.nodes[name], env)

    def run(self, batch: Iterable[torch.Tensor]) -> torch.Tensor:
        """Reference execution: every op in id order on one device; returns the loss."""
        env = self.inputs_env(batch)
        for op in self.ops:
            self.run_op(op.id, env)
        return env[self.loss]

    def eval_node(self, node: fx.Node, env: Mapping[str, Any]) -> Any:
        return self._compiled[node.name](env)

    @cached_property
    def _compiled(self) -> dict[str, Callable[[Mapping[str, Any]], Any]]:
        """Per node, a function of the env computing it: callables and parameters are
        looked up once, so interpreting the graph op by op costs little more than
        the traced module's own code (the profiler times ops this way)."""
        return {name: _compile(node, self.module) for name, node in self.nodes.items()
                if node.op not in ("placeholder", "output")}


def _compile(node: fx.Node, module: fx.GraphModule) -> Callable[[Mapping[str, Any]], Any]:
    if node.op == "get_attr":
        value = _fetch_attr(module, node.target)
        return lambda env: value
    if node.op == "call_module":
        fn = module.get_submodule(node.target)
    elif node.op == "call_function":
        fn = node.target
    elif node.op == "call_method":
        name = node.target

        def fn(obj, *args, **kwargs):
            return getattr(obj, name)(*args, **kwargs)
    else:
        raise AssertionError(f"node {node.name} ({node.op}) is not part of any op")

    def loader(n: fx.Node) -> Callable[[Mapping[str, Any]], Any]:
        if n.op == "get_attr":
            value = _fetch_attr(module, n.target)
            return lambda env: value
        key = n.name
        return lambda env: env[key]

    nested = any(isinstance(a, (list, tuple, dict, slice)) for a in
                 (*node.args, *node.kwargs.values()))
    if nested:
        args_t, kwargs_t = node.args, node.kwargs

        def load_nested(env: Mapping[str, Any]):
            def get(n: fx.Node) -> Any:
                return _fetch_attr(module, n.target) if n.op == "get_attr" else env[n.name]
            return fx.node.map_arg(args_t, get), fx.node.map_arg(kwargs_t, get)

        def run_nested(env: Mapping[str, Any]) -> Any:
            args, kwargs = load_nested(env)
            return fn(*args, **kwargs)
        return run_nested

    getters = [loader(a) if isinstance(a, fx.Node) else (lambda env, c=a: c)
               for a in node.args]
    kw_getters = {k: loader(v) if isinstance(v, fx.Node) else (lambda env, c=v: c)
                  for k, v in node.kwargs.items()}

    def run(env: Mapping[str, Any]) -> Any:
        return fn(*[g(env) for g in getters], **{k: g(env) for k, g in kw_getters.items()})
    return run


def _fetch_attr(module: nn.Module, target: str) -> Any:
    obj: Any = module
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def parameter_names(module: nn.Module) -> dict[str, str]:
    """Every qualified name of a trainable parameter, tied aliases included -> the
    parameter's first name (the one `named_parameters()` gives)."""
    first: dict[int, str] = {}
    names = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names[name] = first.setdefault(id(p), name)
    return names


#: A module call: (key unique to the call, the module's qualified name).
Unit = tuple[str, str]


def partition(gm: fx.GraphModule, *, units: Mapping[str, Unit] | None = None,
              fuse: bool = True) -> Partition:
    """Cut a traced or exported module into ops (see the module docstring for the
    rules). `units`: node name -> the layer call it belongs to, for exported graphs;
    `fuse=False`: one op per operator."""
    units = units or {}
    params = parameter_names(gm)
    nodes = {n.name: n for n in gm.graph.nodes}
    placeholders = tuple(n.name for n in gm.graph.nodes if n.op == "placeholder")
    free = set(placeholders)        # inputs and prologue: no op, no gradient
    group: dict[str, int] = {}
    anchors: list[fx.Node] = []
    deferred: list[fx.Node] = []
    prologue: list[str] = []
    unit_op: dict[str, int] = {}
    writes: list[fx.Node] = []
    cheap_units = _cheap_units(gm, units)
    output = None
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            output = n
            continue
        if n.op == "get_attr":
            if n.target not in params:
                free.add(n.name)
            continue
        inputs = n.all_input_nodes
        if n.op != "call_module" and all(i.name in free for i in inputs):
            if not n.users and _writes(n):
                # A buffer's in-place update that nothing reads (BatchNorm's
                # num_batches_tracked += 1): the executor computes only the prologue
                # values ops read, so it runs in the op that follows it.
                writes.append(n)
                continue
            free.add(n.name)
            prologue.append(n.name)
            continue
        producer_ops = [group[i.name] for i in inputs if i.name in group]
        latest = max(producer_ops, default=-1)
        unit = units.get(n.name)
        if unit is not None and unit[0] in unit_op and unit_op[unit[0]] >= latest:
            group[n.name] = unit_op[unit[0]]
        elif producer_ops and (not n.users or n.target in _NOT_OPERATORS):
            # Not an operator of its own: no op, and no layer call, starts here.
            group[n.name] = latest
            continue
        elif producer_ops and fuse and _fuses(n, gm, unit, cheap_units):
            group[n.name] = latest
        elif fuse and is_cheap(n, gm) and n.op != "call_module" and unit is None:
            deferred.append(n)
        else:
            group[n.name] = len(anchors)
            anchors.append(n)
        if unit is not None:
            unit_op[unit[0]] = group[n.name]
        if n.name in group:
            group.update((w.name, group[n.name]) for w in writes)
            writes.clear()
    group.update((w.name, len(anchors) - 1) for w in writes)
    for n in reversed(deferred):
        consumers = [group[u.name] for u in n.users if u.name in group]
        assert consumers, f"{n.name} computes from parameters but no op uses it"
        group[n.name] = min(consumers)

    assert output is not None
    loss_node = output.args[0]
    if not isinstance(loss_node, fx.Node) or loss_node.name not in group:
        raise UserError("the model must return one loss tensor computed from its "
                        "parameters: make forward(*batch) return the scalar loss")
    return _assemble(gm, nodes, placeholders, tuple(prologue), group, anchors, params,
                     loss_node.name, units)


#: Nodes that select or detach a producer's value (the detach before a buffer's
#: update: capture.py `_detach_buffer_writes`) and compute nothing.
_NOT_OPERATORS = (operator.getitem, torch.ops.aten.detach.default)


def _writes(n: fx.Node) -> bool:
    """Whether an ATen node writes into one of its arguments."""
    return aten_name(n) is not None and n.target._schema.is_mutable


def _cheap_units(gm: fx.GraphModule, units: Mapping[str, Unit]) -> set[str]:
    """The layer calls all of whose nodes are cheap (they fuse like one cheap node)."""
    cheap = {unit[0] for unit in units.values()}
    for n in gm.graph.nodes:
        if n.name in units and not is_cheap(n, gm):
            cheap.discard(units[n.name][0])
    return cheap


def _fuses(n: fx.Node, gm: fx.GraphModule, unit: Unit | None, cheap_units: set[str]) -> bool:
    if unit is not None:
        return unit[0] in cheap_units
    return is_cheap(n, gm)


def _assemble(gm, nodes, placeholders, prologue, group, anchors, params,
              loss: str, units: Mapping[str, Unit]) -> Partition:
    num_ops = len(anchors)
    members: list[list[str]] = [[] for _ in range(num_ops)]
    for n in gm.graph.nodes:
        if n.name in group:
            members[group[n.name]].append(n.name)
    edges: dict[tuple[int, int], list[str]] = {}
    inputs: list[list[str]] = [[] for _ in range(num_ops)]
    outputs: list[list[str]] = [[] for _ in range(num_ops)]
    for name, g in group.items():
        readers = sorted({group[u.name] for u in nodes[name].users
                          if u.name in group and group[u.name] != g})
        for h in readers:
            edges.setdefault((g, h), []).append(name)
            inputs[h].append(name)
        if readers or name == loss:
            outputs[g].append(name)
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    called = [_called_module(a, units) for a in anchors]
    call_counts: dict[str, int] = {}
    for target in called:
        if target is not None:
            call_counts[target] = call_counts.get(target, 0) + 1
    seen: dict[str, int] = {}
    ops = []
    for i, a in enumerate(anchors):
        module, name = _anchor_names(a, called[i], call_counts, seen)
        ops.append(OpNodes(
            id=i, name=name, module=module,
            kind=(_unit_kind([nodes[m] for m in members[i]], gm) if a.name in units
                  else layer_kind(a, gm)),
            nodes=tuple(members[i]),
            inputs=tuple(sorted(set(inputs[i]), key=order.__getitem__)),
            outputs=tuple(sorted(outputs[i], key=order.__getitem__)),
            params=_op_params(gm, [nodes[m] for m in members[i]], params)))
    return Partition(module=gm, placeholders=placeholders, prologue=prologue,
                     ops=tuple(ops),
                     edges={k: tuple(sorted(v, key=order.__getitem__))
                            for k, v in sorted(edges.items())},
                     loss=loss, loss_op=group[loss], nodes=nodes)


def _called_module(a: fx.Node, units: Mapping[str, Unit]) -> str | None:
    """The module an op is one call of (a traced leaf, an exported layer), if any."""
    if a.op == "call_module":
        return a.target
    return units[a.name][1] if a.name in units else None


def _unit_kind(members: list[fx.Node], gm: fx.GraphModule) -> str:
    """The kind of an exported layer call: that of its first operator that is not
    elementwise (a Conv1D call is addmm and views: linear)."""
    kinds = [layer_kind(n, gm) for n in members]
    return next((k for k in kinds if k not in ("elementwise", "other")), kinds[0])


def _anchor_names(a: fx.Node, called: str | None, call_counts: dict[str, int],
                  seen: dict[str, int]) -> tuple[str, str]:
    """(module path, op name): a module called once keeps its path; one called per
    chunk gets `path[k]` for its k-th call; a function gets `module.path/node`."""
    if called is not None:
        k = seen.get(called, 0)
        seen[called] = k + 1
        return called, called if call_counts[called] == 1 else f"{called}[{k}]"
    stack = a.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()))[0] if stack else ""
    return path, f"{path}/{a.name}" if path else a.name


def _op_params(gm: fx.GraphModule, members: list[fx.Node],
               params: Mapping[str, str]) -> tuple[str, ...]:
    """The canonical names of the parameters an op's nodes use."""
    used: list[str] = []
    for n in members:
        if n.op == "call_module":
            used += [params[f"{n.target}.{p}"] for p, _ in
                     gm.get_submodule(n.target).named_parameters(remove_duplicate=False)]
        used += [params[i.target] for i in n.all_input_nodes
                 if i.op == "get_attr" and i.target in params]
    return tuple(dict.fromkeys(used))
