"""Which torch devices a worker's plan runs on, and putting each op's parameters and
buffers on its device (before the optimizer and DDP see them).

A plan numbers a worker's devices 0..mp_degree-1; Ray gives the worker its GPUs as
`ray.train.torch.get_devices()` (e.g. [cuda:2, cuda:3] on a node shared with another
worker). On CPU hosts and fake-GPU test clusters every plan device is a thread on the
CPU."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from orchestrator.runtime.device_kind import DeviceKind
from orchestrator.runtime.executor import OpPartition
from placement.errors import UserError


class NoCudaError(UserError):
    """GPUs were asked for, but the worker's process has no CUDA."""


def plan_devices(num_devices: int, *, kind: DeviceKind, cuda_available: bool,
                 visible: Sequence[torch.device], node: str) -> list[torch.device]:
    """The torch device of each plan device. `visible`: the GPUs Ray gave this worker
    (ray.train.torch.get_devices()); `node`: where the worker runs, for the error a
    node without CUDA gets instead of a silent fall back to CPU threads."""
    if not kind.cuda:
        return [torch.device("cpu")] * num_devices
    if not cuda_available:
        raise NoCudaError(
            f"node {node}: the run asked for GPUs but torch {torch.__version__} in the "
            f"worker has no CUDA (built for CUDA {torch.version.cuda}): install a CUDA "
            "build of torch on every GPU node (cluster.yaml's setup_commands), or train "
            "on CPU without --gpu")
    devices = [torch.device(d) for d in visible]
    assert len(devices) == num_devices, (devices, num_devices)
    return devices


def tensor_owners(partition: OpPartition) -> dict[str, int]:
    """Qualified parameter and buffer name -> the op that uses it first: the tensors of
    the modules an op calls, and the attributes it reads. Ops that share a parameter
    share a colocation group, so they sit on one device."""
    gm = partition.module
    nodes = {n.name: n for n in gm.graph.nodes}
    owners: dict[str, int] = {}
    for op, names in sorted(partition.op_nodes.items()):
        for name in names:
            node = nodes[name]
            used = [a.target for a in node.all_input_nodes if a.op == "get_attr"]
            if node.op == "get_attr":
                used.append(node.target)
            if node.op == "call_module":
                sub = gm.get_submodule(node.target)
                used += [f"{node.target}.{n}" for n, _ in sub.named_parameters()]
                used += [f"{node.target}.{n}" for n, _ in sub.named_buffers()]
            for qualified in used:
                owners.setdefault(qualified, op)
    return owners


def place_module(partition: OpPartition, assignment: Mapping[int, int],
                 devices: Sequence[torch.device], *,
                 owner: nn.Module | None = None) -> dict[str, torch.device]:
    """Move every parameter and buffer of the partition's module to the device of the
    op that owns it (device 0 for those no op uses); returns name -> device.

    Each module's own tensors move together, with torch's own conversion
    (`Module._apply`, what `Module.to` runs), which keeps a parameter the same object
    where the devices allow it (CPU <-> GPU). Build the optimizer and DDP after this
    all the same: their state (momentum, buckets) is allocated where the parameters
    are when they are built or first used.

    `owner`: the module the partition was captured from, when the two share tensors but
    not modules (a torch.export capture). `_apply` puts a new tensor in place of every
    moved buffer (and of a parameter it cannot move in place), so the owner's slots
    are pointed at the moved tensors too: its state_dict (checkpoints, the final
    parameters) and an optimizer built from its parameters then see what the executor
    updates, not the stale host copies."""
    gm = partition.module
    owners = tensor_owners(partition)
    where: dict[str, torch.device] = {}
    replaced: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for module_name, module in gm.named_modules():
        prefix = f"{module_name}." if module_name else ""
        own = [prefix + n for n, _ in [*module.named_parameters(recurse=False),
                                       *module.named_buffers(recurse=False)]]
        if not own:
            continue
        placed = {devices[assignment[owners[n]]] for n in own if n in owners}
        # Ops sharing a tensor share a colocation group: one device per module.
        assert len(placed) <= 1, (module_name, placed)
        device = placed.pop() if placed else devices[0]
        before = _own_tensors(module)
        module._apply(lambda t, device=device: t.to(device), recurse=False)
        for slot, tensor in _own_tensors(module).items():
            if tensor is not before[slot]:
                replaced[id(before[slot])] = (before[slot], tensor)
        where.update((n, device) for n in own)
    if owner is not None and replaced:
        for module in owner.modules():
            for table in (module._parameters, module._buffers):
                for name, tensor in table.items():
                    old, new = replaced.get(id(tensor), (None, None))
                    if old is tensor:
                        table[name] = new
    return where


def _own_tensors(module: nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    return {**{("p", n): t for n, t in module._parameters.items() if t is not None},
            **{("b", n): t for n, t in module._buffers.items() if t is not None}}


@contextmanager
def random_streams_and_buffers_kept(modules: Sequence[nn.Module],
                                    devices: Sequence[torch.device | str]) -> Iterator[None]:
    """Run something that draws random numbers or moves the modules' buffers (a
    training-mode forward: dropout masks, batch norm's running statistics), then put
    both back as they were: the generators of the CPU and of the CUDA `devices`."""
    saved = [(b, b.clone()) for m in modules for b in m.buffers()]
    cuda = sorted({torch.device(d) for d in devices if torch.device(d).type == "cuda"},
                  key=str)
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


def ddp_device_ids(device: torch.device) -> list[torch.device] | None:
    """DDP's `device_ids` for a one-device worker: its GPU (so DDP's buckets and
    streams live there), or None for a CPU module, which DDP requires."""
    return [device] if device.type == "cuda" else None



def synchronize(devices: Sequence[torch.device]) -> None:
    """Wait until every GPU among `devices` has finished its queued work (nothing to
    wait for on CPU devices)."""
    for device in dict.fromkeys(d for d in devices if d.type == "cuda"):
        torch.cuda.synchronize(device)


def load_state(path: Path) -> dict:
    """A checkpoint's state, loaded onto the host whatever devices saved it: a state
    saved on cuda:3 must load where cuda:3 is absent (another node, a smaller one, a
    different plan). `load_state_dict` then copies each tensor to where this worker's
    parameter sits, and the optimizer's state follows its parameters."""
    return torch.load(path, map_location="cpu", weights_only=False)
