"""How a model's op times grow with the batch on this host: a second profile at a
larger batch, so the scaling model knows the share of a step that the batch does not
change. Small models on CPU threads are mostly that share (the interpreter, launches,
allocations): tiny BigLSTM's ops took 17.2 ms in all at batch 8 and 28.1 ms at 64, where
a rule linear in the batch predicted 138 ms at 64."""

from __future__ import annotations

from placement.graph import OpGraph
from placement.scaling.step import fit_fixed_fraction

#: The second profile's batch, as a multiple of the first's.
LARGER_BATCH_MULTIPLE = 4


def total_compute_s(graph: OpGraph, kind: str) -> float:
    return sum(op.forward_s[kind] + op.backward_s[kind] for op in graph.ops)


def fixed_fraction(model: str, preset: str, graph: OpGraph, batch: int, kind: str) -> float:
    """f of placement/scaling/step.py's BatchRule for `graph` (profiled at `batch`),
    from one more profile of `model` at LARGER_BATCH_MULTIPLE times the batch."""
    from orchestrator.profile import profile_model

    larger = batch * LARGER_BATCH_MULTIPLE
    other = profile_model(model, preset=preset, batch=larger, target=kind)
    return fit_fixed_fraction(batch, total_compute_s(graph, kind), larger,
                              total_compute_s(other, kind))
