"""BigLSTM (Jozefowicz et al. 2016, "Exploring the Limits of Language Modeling"): the
2-layer LSTM-8192-1024 of the One Billion Word benchmark, with sampled softmax.

Layout of the traced graph: the input embedding; per (layer, chunk of time steps) one
LSTM op; one op that gathers the softmax rows of the sampled and the true words (TF's
`sampled_softmax_loss` does the same single lookup); per chunk one sampled-softmax loss
op. Dropout is left out so that a step is deterministic (the executor must reproduce
single-device losses exactly); accidental hits (a true word among the samples) are not
removed, which changes the loss by a negligible amount at 8192 of 793,471 words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.models.layers import LSTMLayer, chunk_bounds, leaf_module, run_layer


@dataclass(frozen=True, kw_only=True)
class BigLSTMConfig:
    vocab_size: int
    """Words in the vocabulary (793,471 for the One Billion Word benchmark)."""
    hidden_size: int
    """LSTM cell units per layer."""
    proj_size: int
    """Recurrent projection and embedding width."""
    num_layers: int
    num_samples: int
    """Negative words drawn per step for the sampled softmax."""
    num_steps: int
    """Time steps unrolled per training sequence (BPTT length)."""
    seq_chunk: int
    """Time steps per op of the traced graph."""
    batch: int
    """Default sequences per step (per device in the paper)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "proj_size", "num_layers",
                     "num_samples", "num_steps", "seq_chunk", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"BigLSTM {name}={getattr(self, name)} must be >= 1")
        if self.num_samples > self.vocab_size:
            raise ValueError(f"num_samples={self.num_samples} exceeds the vocabulary "
                             f"({self.vocab_size})")


PRESETS = {
    # Jozefowicz et al. 2016, Table 1 "2-layer LSTM-8192-1024": 1.8 B parameters,
    # 20 unrolled steps, batch 128 per GPU, 8192 samples.
    "paper": BigLSTMConfig(vocab_size=793_471, hidden_size=8192, proj_size=1024,
                           num_layers=2, num_samples=8192, num_steps=20, seq_chunk=5,
                           batch=128),
    "tiny": BigLSTMConfig(vocab_size=2000, hidden_size=128, proj_size=64, num_layers=2,
                          num_samples=128, num_steps=8, seq_chunk=2, batch=8),
}


def log_uniform_log_prob(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log Q(w) of the log-uniform (Zipfian) sampler over frequency-sorted ids, as TF's
    `log_uniform_candidate_sampler`: Q(w) = log((w + 2) / (w + 1)) / log(V + 1)."""
    w = ids.to(torch.float32)
    return torch.log(torch.log1p(1.0 / (w + 1.0)) / math.log(vocab_size + 1.0))


@leaf_module
class SampledSoftmaxLoss(nn.Module):
    """Summed sampled-softmax cross-entropy of one chunk (Jean et al. 2015):
    logits of the true word and of the shared samples, each corrected by -log Q."""

    layer_kind = "loss"

    def forward(self, hidden: torch.Tensor, true_w: torch.Tensor, true_b: torch.Tensor,
                true_logq: torch.Tensor, sample_w: torch.Tensor, sample_b: torch.Tensor,
                sample_logq: torch.Tensor) -> torch.Tensor:
        h = hidden.reshape(-1, hidden.shape[-1])
        true_logit = (h * true_w.reshape(h.shape)).sum(-1) + true_b.reshape(-1) \
            - true_logq.reshape(-1)
        sample_logit = h @ sample_w.t() + sample_b - sample_logq
        logits = torch.cat([true_logit.unsqueeze(1), sample_logit], dim=1)
        return torch.logsumexp(logits, dim=1).sum() - true_logit.sum()


class BigLSTM(nn.Module):
    """forward(tokens, targets, samples) -> mean loss per predicted word.

    tokens, targets: (batch, num_steps) word ids; samples: (num_samples,) ids drawn
    from the log-uniform sampler (part of the batch, so a step is deterministic)."""

    def __init__(self, cfg: BigLSTMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.proj_size)
        self.lstm = nn.ModuleList(
            LSTMLayer(cfg.proj_size, cfg.hidden_size, proj_size=cfg.proj_size)
            for _ in range(cfg.num_layers))
        self.softmax_w = nn.Parameter(torch.empty(cfg.vocab_size, cfg.proj_size))
        self.softmax_b = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.loss = SampledSoftmaxLoss()
        nn.init.normal_(self.softmax_w, std=cfg.proj_size ** -0.5)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor,
                samples: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        bounds = chunk_bounds(cfg.num_steps, cfg.seq_chunk)
        x = self.embedding(tokens)
        chunks = [x[:, a:b] for a, b in bounds]
        for layer in self.lstm:
            chunks = run_layer(layer, chunks)
        # One lookup of the sampled and the true rows; each chunk reads its own slice.
        ids = torch.cat([samples, targets.reshape(-1)])
        rows_w = F.embedding(ids, self.softmax_w)
        rows_b = F.embedding(ids, self.softmax_b.unsqueeze(1)).squeeze(1)
        logq = log_uniform_log_prob(ids, cfg.vocab_size)
        s = cfg.num_samples
        true_w = rows_w[s:].reshape(tokens.shape[0], cfg.num_steps, cfg.proj_size)
        true_b = rows_b[s:].reshape(tokens.shape[0], cfg.num_steps)
        true_logq = logq[s:].reshape(tokens.shape[0], cfg.num_steps)
        total = None
        for (a, b), hidden in zip(bounds, chunks):
            part = self.loss(hidden, true_w[:, a:b], true_b[:, a:b], true_logq[:, a:b],
                             rows_w[:s], rows_b[:s], logq[:s])
            total = part if total is None else total + part
        return total / (tokens.shape[0] * cfg.num_steps)


def make_batch(cfg: BigLSTMConfig, batch: int, *, device: str | torch.device = "cpu",
               seed: int = 0) -> tuple[torch.Tensor, ...]:
    """A synthetic batch: Zipfian word ids (like sorted 1B-word ids) and the samples."""
    gen = torch.Generator().manual_seed(seed)
    stream = _log_uniform(gen, (batch, cfg.num_steps + 1), cfg.vocab_size)
    samples = _log_uniform(gen, (cfg.num_samples,), cfg.vocab_size)
    return tuple(t.to(device) for t in (stream[:, :-1], stream[:, 1:], samples))


def _log_uniform(gen: torch.Generator, shape: tuple[int, ...], vocab: int) -> torch.Tensor:
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    return (torch.exp(u * math.log(vocab + 1.0)) - 1.0).long().clamp_(0, vocab - 1)
