"""The executor a worker runs for its plan: the one construction that the Ray Train
worker (worker.py) and the sweep's timing of each mp_degree before its trials
(step_timing.py) share, so that what is timed is what trains."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from orchestrator.models import ModelSpec
from orchestrator.profile import partition
from orchestrator.runtime.devices import place_module
from orchestrator.runtime.executor import OpPartition, PlanExecutor, batched_inputs
from placement.plan import Plan


@dataclass(frozen=True)
class PlannedModel:
    spec: ModelSpec
    """The model built from its seed; `spec.module` holds the parameters that train."""
    op_partition: OpPartition
    """The captured module cut into the plan's ops, its tensors on their devices."""
    executor: PlanExecutor


def build_executor(model: str, *, preset: str, seed: int, plan: Plan,
                   devices: Sequence[torch.device], num_micro_batches: int,
                   mixed_precision: bool = False) -> PlannedModel:
    """`model` cut by the plan's granularity, each op's parameters moved to its device
    (before an optimizer or DDP is built from them), and the executor of `plan`."""
    part, spec = partition(model, preset=preset, seed=seed, granularity=plan.granularity)
    op_part = OpPartition(part.module, {op.id: op.nodes for op in part.ops})
    place_module(op_part, plan.assignment, devices, owner=spec.module)
    executor = PlanExecutor(op_part, plan.assignment, plan.order, devices,
                            num_micro_batches=num_micro_batches,
                            batched=batched_inputs(spec.make_batch),
                            autocast_dtype=torch.bfloat16 if mixed_precision else None)
    return PlannedModel(spec=spec, op_partition=op_part, executor=executor)
