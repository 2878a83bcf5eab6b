"""A worker's devices on CPU hosts and GPU nodes: plan devices -> torch devices, every
parameter and buffer on its op's device, the collective set-up, and checkpoints that
load where the saving GPU is absent. Pure: the GPU side is shown with device objects
(and the meta device as a second, distinct device), not with a GPU."""

import io

import pytest
import torch
from torch import fx, nn
from torch import serialization

from orchestrator.runtime.device_kind import DeviceKind
from orchestrator.runtime.devices import (NoCudaError, ddp_device_ids, load_state,
                                          place_module, plan_devices, tensor_owners)
from orchestrator.runtime.executor import OpPartition
from orchestrator.train.sync import (GPU_BACKEND, collective_device, flat_bucket,
                                     process_group_backend)

CPU, META = torch.device("cpu"), torch.device("meta")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 6)
        self.norm = nn.BatchNorm1d(6)
        self.head = nn.Linear(6, 2)
        self.register_buffer("scale", torch.full((2,), 0.5))

    def forward(self, x):
        return (self.head(torch.relu(self.norm(self.stem(x)))) * self.scale).sum()


def split(model):
    gm = fx.symbolic_trace(model)
    names = {n.target if n.op == "call_module" else n.name: n.name for n in gm.graph.nodes}
    op_nodes = {0: [names["stem"], names["norm"]],
                1: [names["relu"], names["head"], names["scale"], names["mul"]],
                2: [names["sum_1"]]}
    return OpPartition(gm, op_nodes)


def test_gpu_plan_devices_are_the_gpus_ray_gave_the_worker():
    visible = [torch.device("cuda:2"), torch.device("cuda:3")]
    assert plan_devices(2, kind=DeviceKind.GPU, cuda_available=True,
                        visible=visible, node="n1") == visible
    for kind in (DeviceKind.CPU, DeviceKind.FAKE_GPU):
        assert plan_devices(2, kind=kind, cuda_available=False,
                            visible=[], node="n1") == [CPU, CPU]


def test_a_gpu_worker_without_cuda_is_an_error_naming_its_node():
    with pytest.raises(NoCudaError, match=r"node 10\.0\.0\.7 .*no CUDA.*setup_commands"):
        plan_devices(1, kind=DeviceKind.GPU, cuda_available=False, visible=[],
                     node="10.0.0.7 (Ray node abc)")


def test_every_parameter_and_buffer_sits_on_its_ops_device():
    part = split(Net())
    owners = tensor_owners(part)
    assert owners["stem.weight"] == owners["norm.running_mean"] == 0
    assert owners["head.bias"] == owners["scale"] == 1
    where = place_module(part, {0: 0, 1: 1, 2: 0}, [CPU, META])
    gm = part.module
    for name, tensor in [*gm.named_parameters(), *gm.named_buffers()]:
        expected = META if name.startswith(("head", "scale")) else CPU
        assert tensor.device == expected == where[name], name
    assert isinstance(gm.head.weight, nn.Parameter)


def test_ddp_gets_the_gpu_of_a_one_device_worker_and_none_on_cpu():
    assert ddp_device_ids(torch.device("cuda:1")) == [torch.device("cuda:1")]
    assert ddp_device_ids(CPU) is None


def test_gpu_workers_get_a_process_group_with_gloo_for_host_scalars():
    assert process_group_backend(DeviceKind.GPU) == GPU_BACKEND
    assert GPU_BACKEND == "cpu:gloo,cuda:nccl"
    assert process_group_backend(DeviceKind.FAKE_GPU) == "gloo"
    assert process_group_backend(DeviceKind.CPU) == "gloo"
    gpu = torch.device("cuda:1")
    assert collective_device(GPU_BACKEND, gpu) == CPU
    assert collective_device("nccl", gpu) == gpu


def test_an_empty_bucket_lives_on_its_device():
    assert flat_bucket([], META).device == META
    p = nn.Parameter(torch.ones(3, device=META))
    assert flat_bucket([p], META).shape == (3,)


def saved_on_cuda3(state) -> bytes:
    """`state` serialised as if its tensors had been on cuda:3 (torch.save records each
    storage's device; a tagger registered first names cuda:3 for CPU storages)."""
    def tagger(obj):
        return "cuda:3" if getattr(obj, "device", None) == CPU else None

    serialization.register_package(1, tagger, lambda obj, location: None)
    try:
        buffer = io.BytesIO()
        torch.save(state, buffer)
    finally:
        serialization._package_registry[:] = [
            entry for entry in serialization._package_registry if entry[1] is not tagger]
    return buffer.getvalue()


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows a machine without the GPU")
def test_a_checkpoint_saved_on_a_gpu_resumes_where_that_gpu_is_absent(tmp_path):
    path = tmp_path / "state.pt"
    path.write_bytes(saved_on_cuda3({"model": {"w": torch.arange(3.0)}, "step": 4}))
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(path, weights_only=False)   # what a load without map_location does
    state = load_state(path)
    assert state["step"] == 4 and state["model"]["w"].tolist() == [0.0, 1.0, 2.0]


def test_a_torch_export_capture_moves_the_users_tensors_too():
    """torch.export's module shares the user's tensors but not its modules: what
    `place_module` moves must be what the user's module (checkpoints, the optimizer)
    holds, or a GPU run checkpoints running statistics that never change."""
    from orchestrator.profile.capture import capture

    model = Net()
    captured = capture(model, (torch.randn(4, 4),), (True,), granularity="aten",
                       name="net")
    part = captured.partition()
    op_part = OpPartition(part.module, {op.id: op.nodes for op in part.ops})
    place_module(op_part, {op.id: 0 for op in part.ops}, [META], owner=model)
    live = dict([*op_part.module.named_parameters(), *op_part.module.named_buffers()])
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        assert tensor.device == META, name
        assert tensor is live[name], name
    assert isinstance(model.head.weight, nn.Parameter)
