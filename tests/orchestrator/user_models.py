"""Models of a user's own, by reference (`tests.orchestrator.user_models:NAME`): a small
MLP classifier with each way of bringing data, and with data that is wrong; language
models on PyTorch's own transformer modules."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from orchestrator.models import ModelSpec

NUM_FEATURES, NUM_CLASSES, NUM_SAMPLES = 6, 3, 64


class Classifier(nn.Module):
    """An MLP whose forward takes the whole batch and returns the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (nn.Linear(NUM_FEATURES, 32), nn.Linear(32, 32),
                                        nn.Linear(32, NUM_CLASSES))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.fc2(torch.relu(self.fc1(x))))
        return nn.functional.cross_entropy(self.fc3(hidden), y)


def make_batch(n: int, *, device="cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, NUM_FEATURES, generator=g)
    return x.to(device), (x[:, 0] > 0).long().to(device)


def samples(num: int = NUM_SAMPLES) -> TensorDataset:
    """A learnable data set: the class is whether the first feature is positive."""
    x, y = make_batch(num, seed=7)
    return TensorDataset(x, y)


def mlp(preset: str) -> ModelSpec:
    """No data of its own: make_batch feeds the steps."""
    return ModelSpec(name="mlp", preset=preset, module=Classifier(), make_batch=make_batch,
                     batch=8)


def mlp_dataset() -> ModelSpec:
    return ModelSpec(name="mlp", preset="tiny", module=Classifier(), make_batch=make_batch,
                     batch=8, data=samples())


def stream(rank: int, world_size: int, batch_size: int):
    """Each worker's rows of a global batch, step after step, forever."""
    data = samples()
    step = 0
    while True:
        rows = torch.arange(batch_size) + (step * world_size + rank) * batch_size
        x, y = data[rows % len(data)]
        yield x, y
        step += 1


def mlp_stream() -> ModelSpec:
    return ModelSpec(name="mlp", preset="tiny", module=Classifier(), make_batch=make_batch,
                     batch=8, data=stream)


def mlp_pair():
    """The bare (module, make_batch) form: no batch size of its own."""
    return Classifier(), make_batch


def mlp_wrong_shape() -> ModelSpec:
    x, y = make_batch(NUM_SAMPLES)
    return ModelSpec(name="mlp", preset="tiny", module=Classifier(), make_batch=make_batch,
                     batch=8, data=TensorDataset(x[:, :4], y))


def mlp_short_stream() -> ModelSpec:
    def two_batches(rank, world_size, batch_size):
        for step in range(2):
            yield make_batch(batch_size, seed=step * world_size + rank)

    return ModelSpec(name="mlp", preset="tiny", module=Classifier(), make_batch=make_batch,
                     batch=8, data=two_batches)


class ShallowClassifier(Classifier):
    """The same model one layer shorter: what a plan of an earlier version would miss."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.fc3(torch.relu(self.fc1(x))), y)


def mlp_shallow() -> ModelSpec:
    return ModelSpec(name="mlp", preset="tiny", module=ShallowClassifier(),
                     make_batch=make_batch, batch=8)


def needs_arguments(width: int):
    return Classifier(), make_batch


class Regression(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(NUM_FEATURES, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.fc(x).squeeze(1), y)


def regression_samples(num: int = 512) -> TensorDataset:
    """y = x . w + noise: a data set whose gradient noise scale is computable."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(num, NUM_FEATURES, generator=g)
    y = x @ torch.linspace(-1, 1, NUM_FEATURES) + 0.5 * torch.randn(num, generator=g)
    return TensorDataset(x, y)


def regression() -> ModelSpec:
    def batch(n: int, *, device="cpu", seed: int = 0):
        x, y = regression_samples(n)[:]
        return x.to(device), y.to(device)

    return ModelSpec(name="regression", preset="tiny", module=Regression(),
                     make_batch=batch, batch=16, data=regression_samples())


VOCAB, SEQ = 50, 12


def _tokens(n: int, *, device="cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    return ids.to(device), ids.roll(-1, dims=1).to(device)


class CausalEncoder(nn.Module):
    """A language model on PyTorch's own nn.TransformerEncoder, with a causal mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1],
                                                              device=ids.device)
        hidden = self.encoder(self.embed(ids), mask=mask, is_causal=True)
        return nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), labels.flatten())


class Seq2Seq(nn.Module):
    """PyTorch's own nn.Transformer, encoder and decoder."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.transformer = nn.Transformer(32, 2, 2, 2, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = self.transformer(self.embed(ids), self.embed(labels))
        return nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), labels.flatten())


def torch_encoder() -> ModelSpec:
    return ModelSpec(name="torch_encoder", preset="tiny", module=CausalEncoder(),
                     make_batch=_tokens, batch=8)


def torch_seq2seq() -> ModelSpec:
    return ModelSpec(name="torch_seq2seq", preset="tiny", module=Seq2Seq(),
                     make_batch=_tokens, batch=8)


class FixedBatchClassifier(Classifier):
    """Reshapes its hidden layer with the batch size it was built for."""

    def __init__(self, batch: int) -> None:
        super().__init__()
        self.batch = batch

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.fc1(x)).reshape(self.batch, -1)
        return nn.functional.cross_entropy(self.fc3(torch.relu(self.fc2(hidden))), y)


def mlp_fixed_batch() -> ModelSpec:
    return ModelSpec(name="mlp_fixed_batch", preset="tiny", module=FixedBatchClassifier(8),
                     make_batch=make_batch, batch=8)
