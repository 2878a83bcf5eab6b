"""Capture of today's models: torch.export where fx fails, operator granularity, tied
weights; each through profile -> plan -> the executor, against one device."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
from torch import nn

from orchestrator.models import ModelSpec
from orchestrator.profile import partition, profile_model
from orchestrator.profile.capture import capture
from orchestrator.profile.trace import aten_name
from orchestrator.runtime.executor import OpPartition, PlanExecutor, batched_inputs
from placement.cluster import preset
from placement.planner import PlanConfig, plan
from tests.orchestrator.test_profile import _random_topological_order, one_thread  # noqa: F401

pytest.importorskip("transformers")

HF = "tests.orchestrator.hf_models"
STEPS = 3
BATCH = 8
LR = 0.1


def split_plan(graph, num_devices: int):
    """A plan that uses every device: max-load balances the ops over them (a step-time
    plan of a model this small keeps it on one device). Four devices exceed the cpu
    preset's two per node, so they are planned on a DGX-1's."""
    cluster = preset("cpu" if num_devices <= 2 else "dgx1-v100")
    return plan(graph, cluster, PlanConfig(num_devices=num_devices, objective="max-load",
                                           num_micro_batches=2))


def train_losses(model: str, the_plan, *, granularity: str = "module") -> list[float]:
    """Losses of STEPS SGD steps on one batch of `model`, run by the executor under
    `the_plan` (one batch, so that the loss falls step after step)."""
    part, spec = partition(model, granularity=granularity)
    executor = PlanExecutor(
        OpPartition(part.module, {op.id: op.nodes for op in part.ops}), the_plan.assignment,
        the_plan.order, [torch.device("cpu")] * the_plan.num_devices,
        num_micro_batches=the_plan.num_micro_batches,
        batched=batched_inputs(spec.make_batch))
    optimizer = torch.optim.SGD(spec.module.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        losses.append(executor.step(spec.make_batch(BATCH), BATCH))
        optimizer.step()
    return losses


def eager_losses(spec: ModelSpec) -> list[float]:
    """The same steps on the model itself, unsplit and uncaptured."""
    optimizer = torch.optim.SGD(spec.module.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = spec.module(*spec.make_batch(BATCH))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def assert_trains_like_one_device(model: str, graph, spec: ModelSpec, *,
                                  granularity: str = "module") -> None:
    eager = eager_losses(spec)
    assert eager[-1] < eager[0] - 1e-3, "the steps must train, or equality shows nothing"
    one = train_losses(model, plan(graph, preset("cpu"), PlanConfig(num_devices=1)),
                       granularity=granularity)
    assert one == pytest.approx(eager, abs=1e-5)
    for num_devices in (2, 4):
        split = split_plan(graph, num_devices)
        assert set(split.assignment.values()) == set(range(num_devices))
        assert train_losses(model, split, granularity=granularity) == pytest.approx(
            one, abs=1e-5), f"mp{num_devices}"


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_transformers_models_profile_plan_and_train_like_one_device(name):
    model = f"{HF}:{name}"
    graph = profile_model(model, repeats=1, warmup=0)
    assert graph.metadata["capture"] == "export"
    # One op per layer call or attention function, not one op for the whole model.
    assert len(graph.ops) > 20
    assert any(op.attrs["layer_kind"] == "attention" for op in graph.ops)
    _, spec = partition(model)
    assert_trains_like_one_device(model, graph, spec)


def test_aten_granularity_is_one_op_per_operator_and_runs_split():
    model = f"{HF}:bert"
    part, spec = partition(model, granularity="aten")
    for op in part.ops:
        operators = [n for n in op.nodes if part.nodes[n].users
                     and part.nodes[n].target is not operator.getitem]
        assert len(operators) == 1, (op.name, op.nodes)
        assert aten_name(part.nodes[operators[0]]) is not None
    module_ops = len(partition(model)[0].ops)
    assert len(part.ops) > 2 * module_ops
    batch = spec.make_batch(BATCH)
    expected = spec.module(*batch).item()
    env = part.inputs_env(batch)
    for op_id in _random_topological_order(part, seed=3):
        part.run_op(op_id, env)
    assert env[part.loss].item() == pytest.approx(expected, abs=1e-6)
    graph = profile_model(model, repeats=1, warmup=0, granularity="aten")
    assert len(graph.ops) == len(part.ops) and graph.metadata["granularity"] == "aten"
    assert_trains_like_one_device(model, graph, partition(model)[1], granularity="aten")


class TiedLM(nn.Module):
    """An LM whose output layer reads the input embedding's weight (fx traces it)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 128)
        self.hidden = nn.Sequential(*(nn.Sequential(nn.Linear(128, 128), nn.Tanh())
                                      for _ in range(4)))
        self.head = nn.Linear(128, 40, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.hidden(self.embed(ids)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def tied(preset: str = "tiny") -> ModelSpec:
    def make_batch(batch: int, *, device="cpu", seed: int = 0):
        ids = torch.randint(0, 40, (batch, 32), generator=torch.Generator().manual_seed(seed))
        return ids.to(device), ids.roll(1, dims=1).to(device)

    return ModelSpec(name="tied", preset=preset, module=TiedLM(), make_batch=make_batch,
                     batch=BATCH)


@pytest.mark.parametrize("model", ["tests.orchestrator.test_capture:tied", f"{HF}:gpt2"])
def test_ops_reading_a_tied_weight_share_a_colocation_group(model):
    graph = profile_model(model, repeats=1, warmup=0)
    _, spec = partition(model)
    weight = spec.module.get_submodule("embed" if "tied" in model
                                       else "lm.transformer.wte").weight
    readers = [op for op in graph.ops if any(
        spec.module.get_parameter(p) is weight for p in op.attrs["params"])]
    assert len(readers) == 2 and readers[0].colocation is not None
    assert readers[0].colocation == readers[1].colocation
    assert graph.total_param_bytes() == sum(p.numel() * 4 for p in spec.module.parameters())
    split = split_plan(graph, 2)
    assert split.assignment[readers[0].id] == split.assignment[readers[1].id]
    if "tied" in model:
        assert graph.metadata["capture"] == "fx"
        assert_trains_like_one_device(model, graph, spec)


class ShapeBranch(nn.Module):
    """Python control flow on a shape (torch.export traces through it; fx cannot)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if h.shape[-1] > 4:
            h = torch.relu(h)
        return ((self.out(h).squeeze(-1) - y) ** 2).mean()


def test_fx_failure_falls_back_to_export_grouped_by_layer():
    module = ShapeBranch()
    batch = (torch.randn(6, 4), torch.randn(6))
    captured = capture(module, batch, (True, True))
    assert captured.method == "export"
    part = captured.partition()
    # relu, squeeze and the squared error fuse into their producers' ops.
    assert [op.name for op in part.ops] == ["fc", "out", "mean"]
    assert {p for op in part.ops for p in op.params} == {n for n, _ in module.named_parameters()}
    # The graph keeps the samples dimension symbolic: micro-batches of any size run.
    for size in (1, 3, 6):
        x, y = batch[0][:size], batch[1][:size]
        assert part.run((x, y)).item() == pytest.approx(module(x, y).item(), abs=1e-6)
    assert copy.deepcopy(captured.module)(*batch).item() == pytest.approx(
        module(*batch).item(), abs=1e-6)
