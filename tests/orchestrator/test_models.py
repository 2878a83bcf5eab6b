"""The models: losses, published sizes, chunking that changes nothing, the registry."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from orchestrator.models import MODEL_NAMES, ModelSpec, UnknownModelError, build
from orchestrator.models.layers import LSTMLayer, chunk_bounds, run_layer
from placement.errors import UserError


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tiny_step_is_deterministic_and_trains(name):
    a, b = build(name, "tiny", seed=3), build(name, "tiny", seed=3)
    batch = a.make_batch(a.batch, seed=1)
    loss = a.module(*batch)
    loss.backward()
    assert torch.isfinite(loss) and loss.item() > 0
    assert all(p.grad is not None for p in a.module.parameters())
    assert b.module(*b.make_batch(b.batch, seed=1)).item() == loss.item()


# Published parameter counts: torchvision's inception_v3 (with the auxiliary head) and
# vgg16 exactly; BigLSTM "1.8B" (Jozefowicz et al. 2016, Table 1); GNMT v2 ~160M
# (NVIDIA DeepLearningExamples).
@pytest.mark.parametrize("name,low,high", [
    ("inception_v3", 27_161_264, 27_161_264), ("vgg16", 138_357_544, 138_357_544),
    ("biglstm", 1.75e9, 1.85e9), ("gnmt", 1.55e8, 1.65e8)])
def test_paper_presets_have_the_published_size_without_allocating(name, low, high):
    spec = build(name, "paper", device="meta")
    params = list(spec.module.parameters())
    assert all(p.is_meta for p in params)
    assert low <= sum(p.numel() for p in params) <= high


@pytest.mark.parametrize("name", ["biglstm", "gnmt"])
def test_chunking_time_steps_does_not_change_the_loss(name):
    losses = []
    for chunk in (1, 3, 100):
        spec = build(name, "tiny", seq_chunk=chunk, seed=0)
        losses.append(spec.module(*spec.make_batch(spec.batch)).item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert losses[2] == pytest.approx(losses[0], rel=1e-5)


@pytest.mark.parametrize("proj", [0, 5])
@pytest.mark.parametrize("reverse", [False, True])
def test_lstm_layer_matches_torch_lstm(proj, reverse):
    torch.manual_seed(0)
    ours = LSTMLayer(4, 8, proj_size=proj, reverse=reverse)
    ref = nn.LSTM(4, 8, proj_size=proj, batch_first=True)
    ref.load_state_dict(ours.lstm.state_dict())
    x = torch.randn(3, 7, 4)
    expected, _ = ref(x.flip(1) if reverse else x)
    expected = expected.flip(1) if reverse else expected
    chunks = [x[:, a:b] for a, b in chunk_bounds(7, 3)]
    got = torch.cat(run_layer(ours, chunks), dim=1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_chunk_bounds_cover_the_sequence():
    assert chunk_bounds(7, 3) == [(0, 3), (3, 6), (6, 7)]
    with pytest.raises(ValueError, match="seq_chunk=0"):
        chunk_bounds(7, 0)


def test_unknown_model_and_preset_list_the_known_ones():
    with pytest.raises(UnknownModelError, match="biglstm, gnmt, inception_v3, vgg16"):
        build("resnet50")
    with pytest.raises(UnknownModelError, match="paper, tiny"):
        build("gnmt", "huge")
    with pytest.raises(UserError, match="recurrent models only"):
        build("vgg16", seq_chunk=2)
    with pytest.raises(UnknownModelError, match="MODULE:FUNCTION"):
        build("no_such_pkg.mod:fn")


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def user_model(preset: str):
    """A user's builder in the (module, make_batch, loss_fn) form."""
    def make_batch(n: int):
        return torch.randn(n, 6), torch.randint(0, 3, (n,))
    return _Mlp(), make_batch, nn.functional.cross_entropy


def test_a_user_model_by_reference():
    spec = build("tests.orchestrator.test_models:user_model", "tiny")
    assert isinstance(spec, ModelSpec)
    batch = spec.make_batch(4, seed=2)
    x, y = batch
    expected = nn.functional.cross_entropy(spec.module.model(x), y)
    assert spec.module(*batch).item() == expected.item()


def width_builder(width: int = 5):
    """A builder with a parameter that is not `preset`: it must be left at its default."""
    return nn.Linear(width, 1), lambda n: (torch.randn(n, width),)


def preset_builder(preset: str):
    return nn.Linear(4 if preset == "tiny" else 8, 1), lambda n: (torch.randn(n, 4),)


def needs_width(width: int):
    return nn.Linear(width, 1), lambda n: (torch.randn(n, width),)


def test_a_builder_gets_the_preset_only_through_a_parameter_named_preset():
    assert build("tests.orchestrator.test_models:width_builder", "tiny").module.in_features == 5
    assert build("tests.orchestrator.test_models:preset_builder", "paper").module.in_features == 8
    with pytest.raises(UserError, match="needs argument.s. width: a model builder takes none"):
        build("tests.orchestrator.test_models:needs_width")


def builder_with_a_bug():
    sizes = [16, 32]
    return nn.Linear(sizes[2], 1), lambda n: (torch.randn(n, 16),)


def builder_with_a_runtime_error():
    return nn.Linear(4, 1)(torch.randn(2, 5)), lambda n: (torch.randn(n, 4),)


def test_a_builder_that_raises_is_one_line_naming_the_error_and_where(tmp_path, capsys):
    from orchestrator.cli import main

    with pytest.raises(UserError, match=r"builder_with_a_bug raised IndexError: list index "
                       r"out of range \(at .*test_models.py:\d+\): fix the function"):
        build("tests.orchestrator.test_models:builder_with_a_bug")
    # A RuntimeError off the meta device is the builder's too.
    with pytest.raises(UserError, match="builder_with_a_runtime_error raised RuntimeError"):
        build("tests.orchestrator.test_models:builder_with_a_runtime_error")
    code = main(["profile", "--model", "tests.orchestrator.test_models:builder_with_a_bug",
                 "--out", str(tmp_path / "g.json")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "IndexError" in err


def test_a_user_model_takes_its_batch_from_the_run_or_its_spec():
    pair = build("tests.orchestrator.user_models:mlp_pair")
    assert pair.batch is None and pair.batch_size(24) == 24
    with pytest.raises(UserError, match="names no batch size: pass --global-batch N"):
        pair.batch_size(None, "--global-batch")
    spec = build("tests.orchestrator.user_models:mlp", "tiny")
    assert spec.batch_size(None) == 8 and spec.batch_size(4) == 4
    with pytest.raises(UserError, match="--batch-size 0: must be >= 1"):
        spec.batch_size(0)


def test_drawing_a_user_batch_leaves_the_training_rng_alone():
    spec = build("tests.orchestrator.test_models:user_model")
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    spec.make_batch(4, seed=2)
    assert torch.equal(torch.rand(3), expected)


def named_gnmt():
    return ModelSpec(name="gnmt", preset="tiny", module=nn.Linear(2, 1),
                     make_batch=lambda n: (torch.randn(n, 2),), batch=2)


def test_a_user_spec_must_not_take_a_built_in_name_nor_carry_odd_data():
    with pytest.raises(UserError, match="the name of a built-in model: give it a name"):
        build("tests.orchestrator.test_models:named_gnmt")
    with pytest.raises(UserError, match="give a torch.utils.data.Dataset or a function"):
        ModelSpec(name="mine", preset="tiny", module=nn.Linear(2, 1),
                  make_batch=lambda n: (), batch=2, data=[1, 2])
