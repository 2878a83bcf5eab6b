"""The executor a worker runs for its plan, and how it averages its gradients with the
other workers: the one construction that the Ray Train worker (worker.py) and the
sweep's timing of each mp_degree before its trials (step_timing.py) share, so that what
is timed is what trains."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from orchestrator.models import ModelSpec
from orchestrator.profile import partition
from orchestrator.runtime.devices import place_module, tensor_owners
from orchestrator.runtime.executor import OpPartition, PlanExecutor, batched_inputs
from orchestrator.train.sync import DDPSync, GradientSync
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
    # Checked on other batch sizes by the driver (profile, or train's checks).
    part, spec = partition(model, preset=preset, seed=seed, granularity=plan.granularity,
                           check_batch_sizes=False)
    op_part = OpPartition(part.module, {op.id: op.nodes for op in part.ops})
    place_module(op_part, plan.assignment, devices, owner=spec.module)
    executor = PlanExecutor(op_part, plan.assignment, plan.order, devices,
                            num_micro_batches=num_micro_batches,
                            batched=batched_inputs(spec.make_batch),
                            autocast_dtype=torch.bfloat16 if mixed_precision else None)
    return PlannedModel(spec=spec, op_partition=op_part, executor=executor)


def _params_by_device(part: OpPartition, assignment: Mapping[int, int],
                      num_devices: int) -> list[list[torch.nn.Parameter]]:
    """Each device's trainable parameters (the bucket it allreduces), as `place_module`
    put them: a frozen one has no gradient to average (DDP leaves it out too), and a
    zero gradient installed on it would let weight decay move it."""
    owners = tensor_owners(part)
    buckets: list[list[torch.nn.Parameter]] = [[] for _ in range(num_devices)]
    for name, param in part.module.named_parameters():
        if param.requires_grad:
            buckets[assignment[owners[name]] if name in owners else 0].append(param)
    return buckets


def gradient_sync(planned: PlannedModel, plan: Plan, devices: Sequence[torch.device],
                  world: int) -> DDPSync | GradientSync:
    """How `planned`'s gradients are averaged over `world` workers (torch.distributed's
    group must be up when world > 1): DDP, whose allreduce overlaps the backward, for
    a one-device worker among others; else one bucket per device (sync.py)."""
    if world > 1 and len(devices) == 1:
        sync = DDPSync(planned.op_partition.module, devices[0])
        planned.executor.whole_module = sync.ddp
        return sync
    return GradientSync(_params_by_device(planned.op_partition, plan.assignment, len(devices)),
                        list(devices), world)
