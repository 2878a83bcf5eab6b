"""Tracing, the partition contract, and the costed op graph (tiny presets, fast)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from orchestrator.models import MODEL_NAMES, ModelSpec, build
from orchestrator.models.layers import LEAF_MODULES, leaf_module
from orchestrator.profile import TraceFailure, costs, partition, profile_model
from orchestrator.profile.costs import Kernel, measure_op, reference_env, step_peak_bytes
from orchestrator.profile.roofline import Efficiency, kernel_time_s, op_time_s
from orchestrator.profile.trace import partition as cut, trace
from placement.cluster import A100, V100
from placement.errors import UserError
from placement.io import load_graph, save_graph
from placement.policy import MICRO_BATCH_COUNTS

ATTR_KEYS = {"layer_kind", "module", "output_shape", "input_shapes", "forward_flops"}
KINDS = {"conv2d", "linear", "lstm", "embedding", "pool", "norm", "elementwise", "concat",
         "attention", "softmax", "loss", "other"}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def graphs():
    # The tests here read what a graph holds, not how steady its split costs are: one
    # paired ratio per micro-batch count instead of 5-10 (two thirds of each profile,
    # 90 s of the suite under load).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(costs, "SPLIT_MIN_RATIOS", 1)
        patch.setattr(costs, "SPLIT_BUDGET_S", 0.0)
        return {name: profile_model(name, repeats=1, warmup=0) for name in MODEL_NAMES}


def _random_topological_order(part, seed: int) -> list[int]:
    rng = random.Random(seed)
    preds = {op.id: {s for (s, d) in part.edges if d == op.id} for op in part.ops}
    done: list[int] = []
    while len(done) < len(part.ops):
        ready = [i for i in preds if i not in done and preds[i] <= set(done)]
        done.append(rng.choice(ready))
    return done


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_partition_reproduces_the_module_in_any_topological_order(name):
    part, spec = partition(name)
    batch = spec.make_batch(spec.batch)
    expected = spec.module(*batch)
    assert part.run(batch).item() == expected.item()
    env = part.inputs_env(batch)
    for op_id in _random_topological_order(part, seed=7):
        part.run_op(op_id, env)
    assert env[part.loss].item() == expected.item()


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_partition_contract(name):
    part, _ = partition(name)
    owner = {}
    for op in part.ops:
        assert op.id == part.ops.index(op)
        for n in op.nodes:
            assert n not in owner, f"{n} is in two ops"
            owner[n] = op.id
    free = set(part.placeholders) | set(part.prologue)
    for node in part.module.graph.nodes:
        assert node.name in owner or node.name in free or node.op in ("get_attr", "output")
    for (src, dst), values in part.edges.items():
        assert src < dst, "op ids are a topological order"
        for v in values:
            assert owner[v] == src and v in part.ops[src].outputs and v in part.ops[dst].inputs
    for op in part.ops:
        readers = {owner[u.name] for n in op.nodes for u in part.nodes[n].users
                   if u.name in owner} - {op.id}
        assert readers == {d for (s, d) in part.edges if s == op.id}
    assert part.loss in part.ops[part.loss_op].outputs


def _reaches(part, a: int, b: int) -> bool:
    succ: dict[int, list[int]] = {}
    for s, d in part.edges:
        succ.setdefault(s, []).append(d)
    stack, seen = [a], set()
    while stack:
        u = stack.pop()
        if u == b:
            return True
        if u not in seen:
            seen.add(u)
            stack.extend(succ.get(u, []))
    return False


def test_recurrent_ops_form_a_wavefront():
    part, _ = partition("biglstm", seq_chunk=2)   # 8 steps -> 4 chunks per layer
    ids = {op.name: op.id for op in part.ops}
    assert [n for n in ids if n.startswith("lstm.")] == \
        [f"lstm.{l}[{k}]" for l in (0, 1) for k in range(4)]
    # Layer 1 at chunk k needs layer 0 at chunk k and layer 1 at chunk k-1, and runs
    # concurrently with layer 0 at chunk k+1.
    assert (ids["lstm.0[1]"], ids["lstm.1[1]"]) in part.edges
    assert (ids["lstm.1[0]"], ids["lstm.1[1]"]) in part.edges
    assert not _reaches(part, ids["lstm.0[2]"], ids["lstm.1[1]"])
    assert not _reaches(part, ids["lstm.1[1]"], ids["lstm.0[2]"])


def test_inception_branches_are_parallel_ops_meeting_at_one_concat():
    part, _ = partition("inception_v3")
    block = [op for op in part.ops if op.module.startswith("Mixed_5b")]
    heads = [next(op.id for op in block if op.module.startswith(f"Mixed_5b.{b}"))
             for b in ("branch1x1", "branch5x5_1", "branch3x3dbl_1", "branch_pool")]
    ends = [max(op.id for op in block if op.module.startswith(f"Mixed_5b.{b}"))
            for b in ("branch1x1", "branch5x5_2", "branch3x3dbl_3", "branch_pool")]
    for i, a in enumerate(heads):
        for j, b in enumerate(ends):
            assert _reaches(part, a, b) == (i == j)
    concat = next(op for op in block if op.kind == "concat")
    assert all((e, concat.id) in part.edges for e in ends)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_profiled_graph(graphs, name, tmp_path):
    graph = graphs[name]
    spec = build(name)
    assert 10 <= len(graph.ops) <= 3000
    assert graph.total_param_bytes() == sum(p.numel() * 4 for p in spec.module.parameters())
    for op in graph.ops:
        assert ATTR_KEYS <= set(op.attrs) and op.attrs["layer_kind"] in KINDS
        assert set(op.forward_s) == {"cpu", "v100", "a100", "h100"}
        assert op.forward_s["cpu"] > 0 and op.backward_s["cpu"] >= 0
        assert op.forward_s["h100"] <= op.forward_s["a100"] <= op.forward_s["v100"]
        if op.attrs["layer_kind"] in ("conv2d", "linear") and op.param_bytes:
            assert len(op.attrs["weight_shape"]) >= 2
    assert all(e.bytes > 0 for e in graph.edges)
    # What one autograd call per op and micro-batch costs the executor, measured at
    # each micro-batch count that divides the batch (projected kinds: no).
    assert set(graph.metadata["split_overhead"]) == {"cpu"}
    ks = {str(k) for k in MICRO_BATCH_COUNTS if graph.metadata["batch"] % k == 0}
    assert set(graph.metadata["split_overhead"]["cpu"]) == ks
    assert all(1 <= r < 20 for r in graph.metadata["split_overhead"]["cpu"].values())
    # How much two device threads of this host slow each other down, measured.
    assert set(graph.metadata["corun_slowdown"]) == {"cpu"}
    assert set(graph.metadata["corun_slowdown"]["cpu"]) == ks
    assert all(1 <= r < 10 for r in graph.metadata["corun_slowdown"]["cpu"].values())
    json.dumps([dict(op.attrs) for op in graph.ops])
    save_graph(graph, tmp_path / "g.json")
    again = load_graph(tmp_path / "g.json")
    assert again.ops == graph.ops and again.edges == graph.edges


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_op_flops_add_up_to_the_whole_step(graphs, name):
    spec = build(name)
    batch = spec.make_batch(spec.batch)
    with FlopCounterMode(display=False) as forward:
        loss = spec.module(*batch)
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    graph = graphs[name]
    assert graph.metadata["forward_flops"] == forward.get_total_flops()
    assert graph.metadata["backward_flops"] == pytest.approx(backward.get_total_flops(),
                                                             rel=1e-9)


def test_ops_sharing_parameters_are_colocated(graphs):
    graph = graphs["gnmt"]
    by_name = {op.name: op for op in graph.ops}
    chunks = [op for n, op in by_name.items() if n.startswith("decoder.2[")]
    assert len(chunks) == 4 and len({op.colocation for op in chunks}) == 1
    assert chunks[0].colocation is not None
    assert sum(op.param_bytes > 0 for op in chunks) == 1
    # The encoder and the decoder share the embedding.
    assert by_name["embedding[0]"].colocation == by_name["embedding[1]"].colocation


def test_step_peak_memory_is_the_same_on_meta_and_cpu():
    cpu = build("vgg16", "tiny", device="cpu")
    meta = build("vgg16", "tiny", device="meta")
    on_cpu = step_peak_bytes(cpu.module, cpu.make_batch(cpu.batch))
    on_meta = step_peak_bytes(meta.module, meta.make_batch(meta.batch, device="meta"))
    assert on_cpu == on_meta
    assert on_cpu["step_peak_bytes"] > 2 * on_cpu["param_bytes"]   # weights + gradients


def test_paper_preset_is_profiled_on_meta_with_exact_sizes():
    graph = profile_model("vgg16", preset="paper", batch=2)
    assert graph.metadata["cpu_times"] == "projected"
    assert graph.total_param_bytes() == 138_357_544 * 4
    conv = next(op for op in graph.ops if op.name == "features.0")
    assert conv.attrs["output_shape"] == [2, 64, 224, 224]
    # 2 x batch x C_out x H x W x C_in x k x k multiply-adds.
    assert conv.attrs["forward_flops"] == 2 * 2 * 64 * 224 * 224 * 3 * 9
    assert conv.activation_bytes > 0 and conv.forward_s["v100"] > 0


def test_roofline_kernel_time():
    eff = Efficiency()
    gemm = Kernel(flops=2e12, bytes=1e6, matmul=True)
    assert kernel_time_s(gemm, "linear", V100, eff) == pytest.approx(2e12 / (0.75 * 15.7e12))
    copy = Kernel(flops=0.0, bytes=9e8, matmul=False)
    assert kernel_time_s(copy, "elementwise", V100, eff) == pytest.approx(9e8 / (0.8 * 900e9))
    tiny = Kernel(flops=10.0, bytes=10.0, matmul=False)
    assert kernel_time_s(tiny, "elementwise", V100, eff) == eff.launch_s
    with pytest.raises(ValueError, match="memory=1.5"):
        Efficiency(memory=1.5)


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x


class Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gate = DataDependent()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.fc(x)).sum()


def test_an_untraceable_module_is_named_with_the_leaf_fix():
    with pytest.raises(TraceFailure, match=r"module 'gate' \(DataDependent\).*leaf"):
        trace(Untraceable())
    leaf_module(DataDependent)
    try:
        part = cut(trace(Untraceable()))
        assert [op.name for op in part.ops] == ["fc", "gate", "sum_1"]
    finally:
        LEAF_MODULES.discard(DataDependent)


def test_bad_arguments():
    with pytest.raises(UserError, match="cpu, v100, a100, h100"):
        profile_model("vgg16", target="tpu")
    with pytest.raises(UserError, match="--batch 0"):
        profile_model("vgg16", batch=0)


def test_roofline_takes_the_precisions_peak_for_matmuls_only():
    eff = Efficiency()
    gemm = Kernel(flops=2e12, bytes=1e6, matmul=True)
    assert kernel_time_s(gemm, "linear", A100, eff, "tf32") == pytest.approx(
        2e12 / (0.75 * 156e12))
    assert kernel_time_s(gemm, "linear", A100, eff, "bf16") == pytest.approx(
        2e12 / (0.75 * 312e12))
    # V100 has no TF32: an fp32 GEMM stays at the fp32 peak.
    assert kernel_time_s(gemm, "linear", V100, eff, "tf32") == pytest.approx(
        kernel_time_s(gemm, "linear", V100, eff, "fp32"))
    softmax = Kernel(flops=1e11, bytes=1e3, matmul=False)
    assert kernel_time_s(softmax, "other", A100, eff, "bf16") == pytest.approx(
        1e11 / (0.5 * 19.5e12))
    with pytest.raises(UserError, match="fp32, tf32, bf16"):
        kernel_time_s(gemm, "linear", A100, eff, "fp8")


def test_projected_backward_counts_the_optimizer_step():
    """Each op's projected backward includes SGD-momentum's pass over its parameters:
    an op with parameters of P bytes pays at least 5 P / (eta_m W) on top of its own
    backward kernels, an op without parameters nothing."""
    graph = profile_model("vgg16", preset="paper", batch=1, device="meta")
    part, _ = partition("vgg16", preset="paper", device="meta")
    eff = Efficiency()
    fc = next(op for op in graph.ops if op.param_bytes > 1e8)
    assert fc.attrs["params"]
    costs = measure_op(part, fc.id, reference_env(part, build(
        "vgg16", "paper", device="meta").make_batch(1, device="meta")))
    without = op_time_s(costs.backward_kernels, fc.attrs["layer_kind"], V100, eff)
    update = 5 * fc.param_bytes / (0.8 * 900e9)
    assert fc.backward_s["v100"] == pytest.approx(without + update, rel=1e-9)
    pool = next(op for op in graph.ops if op.param_bytes == 0 and "pool" in op.name)
    assert pool.backward_s["v100"] > 0


class HalfFrozen(nn.Module):
    """A fine-tuning step: the first layer frozen, as pretrained embeddings often are."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(16, 32)
        self.frozen.requires_grad_(False)
        self.trained = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.trained(torch.relu(self.frozen(x))), y)


def half_frozen(preset: str = "tiny") -> ModelSpec:
    def make_batch(batch: int, *, device="cpu", seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, 16, generator=generator).to(device),
                torch.randint(0, 4, (batch,), generator=generator).to(device))

    return ModelSpec(name="half_frozen", preset=preset, module=HalfFrozen(),
                     make_batch=make_batch, batch=8)


def test_a_frozen_layer_has_no_backward_and_no_optimizer_step():
    """Nothing upstream of the frozen layer takes a gradient: its op runs no backward
    kernel (not even the optimizer's), the trained layer's does; the graph records
    which parameter bytes are frozen (no allreduce, no optimizer state)."""
    graph = profile_model("tests.orchestrator.test_profile:half_frozen", device="meta")
    frozen = next(op for op in graph.ops if "frozen" in op.name)
    trained = next(op for op in graph.ops if "trained" in op.name)
    assert frozen.param_bytes > 0 and frozen.backward_s["v100"] == 0
    assert frozen.frozen_bytes == frozen.param_bytes == (16 * 32 + 32) * 4
    assert trained.backward_s["v100"] > 0
    assert trained.frozen_bytes == 0 and trained.trainable_bytes == (32 * 4 + 4) * 4


def test_an_edge_records_the_gradient_that_flows_back_along_it():
    """Nothing requires grad up to the frozen layer's output, so it crosses to a
    reader on another device and nothing comes back; the trained layer's output carries
    its whole gradient back. The planner charges each accordingly (placement.tasks
    build_tasks)."""
    graph = profile_model("tests.orchestrator.test_profile:half_frozen", device="meta")
    name = {op.id: op.name for op in graph.ops}
    frozen = [e for e in graph.edges if "frozen" in name[e.src]]
    trained = [e for e in graph.edges if "trained" in name[e.src]]
    assert frozen and trained
    assert all(e.bytes > 0 and e.grad_bytes == 0 for e in frozen)
    assert all(e.bytes > 0 and e.grad_bytes == e.bytes for e in trained)
