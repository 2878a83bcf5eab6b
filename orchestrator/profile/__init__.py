"""From a PyTorch model to a costed op graph (`placement.graph.OpGraph`).

Public API
----------
`profile_model(model, preset="tiny", batch=None, seq_chunk=None, target="cpu",
repeats=5, granularity="module") -> OpGraph` captures the model's step (torch.fx, or
torch.export where fx fails or at `aten` granularity: see
`orchestrator.profile.capture`), cuts it into ops, and costs each op (see
`orchestrator.profile.costs`). `partition(model, ..., granularity=...) -> (Partition,
ModelSpec)` gives the executor the same cut without costing it.

The partition contract (what the executor of issue 6 relies on)
----------------------------------------------------------------
A `Partition` (orchestrator.profile.trace) holds the captured `fx.GraphModule`
(`part.module`, whose parameters are the model's own; an exported one holds ATen
operators) and:

- `placeholders`: the batch tensors' node names, in the order of `module(*batch)`.
- `prologue`: nodes computed from the batch alone (shapes, index arithmetic). They need
  no gradient. `part.inputs_env(batch)` returns {placeholder and prologue name: value};
  give every device a copy (it is small) before running ops.
- `ops[i]` (op id i, the same id as in the OpGraph; ids are a topological order):
  `nodes` (fx node names in execution order), `inputs` (names of values computed by
  other ops that this op reads), `outputs` (names of its values read by other ops, or
  the loss), `params` (qualified names of the parameters its nodes use; a tied weight
  under its first name only). Ops that share a parameter share a colocation group in
  the OpGraph, so each parameter lives on one device.
- `edges[(src, dst)]`: the value names flowing from op src to op dst (each is a tensor;
  its bytes are the OpGraph edge's bytes). The OpGraph has exactly these edges.
- `part.run_op(i, env)`: evaluates op i's nodes with `env` (a dict name -> value that
  holds the inputs env and op i's `inputs`) and writes every value it computes into
  `env`. To run op i on another device, put its inputs there (detached copies that
  require grad, if you run a separate backward per device), run it, then send its
  `outputs` on.
- `loss` / `loss_op`: the name of the loss value, produced by op `loss_op`.

Running every op in id order in one env (`part.run(batch)`) computes exactly what
`module(*batch)` does, and so does any order that respects the edges: the nodes and
their arguments are the traced module's own.
"""

from orchestrator.profile.trace import OpNodes, Partition, TraceFailure

__all__ = ["OpNodes", "Partition", "TraceFailure", "partition", "profile_model",
           "profile_notes"]


def __getattr__(name: str):
    # The costing code imports more of torch; load it when first asked for.
    if name in ("profile_model", "partition", "profile_notes"):
        from orchestrator.profile import api

        return getattr(api, name)
    raise AttributeError(name)
