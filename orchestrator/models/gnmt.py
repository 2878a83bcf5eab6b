"""GNMT (Wu et al. 2016) in the form trained today (NVIDIA's GNMT v2, MLPerf): a 4-layer
encoder whose first layer is bidirectional, a 4-layer decoder, 1024 units, residual
connections from the third layer on, additive (Bahdanau) attention computed from the
first decoder layer's output and fed to every later layer, and a 32k vocabulary whose
embedding the encoder and decoder share.

Each LSTM call covers one chunk of time steps (see `orchestrator.models.layers`), and the
attention, the classifier and the loss run per chunk too, so a chunk of the decoder can
start as soon as its inputs exist. Sequences have one fixed length (no padding or
packing) and dropout is left out, so a step is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.models.layers import LSTMLayer, chunk_bounds, leaf_module, run_layer


@dataclass(frozen=True, kw_only=True)
class GNMTConfig:
    vocab_size: int
    """Shared source/target vocabulary (32k BPE merges in GNMT v2)."""
    hidden_size: int
    num_layers: int
    """Layers of the encoder and of the decoder each."""
    src_len: int
    """Source time steps per sentence."""
    tgt_len: int
    """Target time steps per sentence."""
    seq_chunk: int
    """Time steps per op of the traced graph."""
    batch: int
    """Default sentences per step."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "src_len", "tgt_len", "seq_chunk",
                     "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"GNMT {name}={getattr(self, name)} must be >= 1")
        if self.num_layers < 2:
            raise ValueError(f"GNMT num_layers={self.num_layers} must be >= 2 "
                             "(a bidirectional first layer, then unidirectional ones)")


PRESETS = {
    # GNMT v2 as in NVIDIA's DeepLearningExamples / MLPerf: 1024 units, 4+4 layers,
    # 32,000 shared vocabulary, batch 128 per GPU; 50 tokens is the training length cap.
    "paper": GNMTConfig(vocab_size=32_000, hidden_size=1024, num_layers=4, src_len=50,
                        tgt_len=50, seq_chunk=10, batch=128),
    "tiny": GNMTConfig(vocab_size=500, hidden_size=64, num_layers=4, src_len=8,
                       tgt_len=8, seq_chunk=2, batch=8),
}


@leaf_module
class BahdanauAttention(nn.Module):
    """Additive attention of one chunk of decoder queries over all encoder steps:
    score(q, k) = v . tanh(W_q q + K), with K = W_k k computed once per sentence."""

    layer_kind = "attention"

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.query = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, queries: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor) -> torch.Tensor:
        q = self.query(queries).unsqueeze(2)          # (B, T, 1, H)
        scores = self.v(torch.tanh(q + keys.unsqueeze(1))).squeeze(-1)  # (B, T, S)
        return torch.bmm(torch.softmax(scores, dim=-1), values)          # (B, T, H)


class GNMT(nn.Module):
    """forward(src, tgt_in, tgt_out) -> mean cross-entropy per target token."""

    def __init__(self, cfg: GNMTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.embedding = nn.Embedding(cfg.vocab_size, h)
        self.encoder_fwd = LSTMLayer(h, h)
        self.encoder_bwd = LSTMLayer(h, h, reverse=True)
        self.encoder = nn.ModuleList(
            [LSTMLayer(2 * h, h)] + [LSTMLayer(h, h) for _ in range(cfg.num_layers - 2)])
        self.attention_keys = nn.Linear(h, h, bias=False)
        self.attention = BahdanauAttention(h)
        self.decoder = nn.ModuleList(
            [LSTMLayer(h, h)] + [LSTMLayer(h, h, extra_size=h)
                                 for _ in range(cfg.num_layers - 1)])
        self.classifier = nn.Linear(h, cfg.vocab_size)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor,
                tgt_out: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        src_bounds = chunk_bounds(cfg.src_len, cfg.seq_chunk)
        tgt_bounds = chunk_bounds(cfg.tgt_len, cfg.seq_chunk)

        x = self.embedding(src)
        chunks = [x[:, a:b] for a, b in src_bounds]
        fwd = run_layer(self.encoder_fwd, chunks)
        bwd = run_layer(self.encoder_bwd, chunks)
        chunks = [torch.cat([f, b], dim=-1) for f, b in zip(fwd, bwd)]
        for i, layer in enumerate(self.encoder):
            out = run_layer(layer, chunks)
            # Residual connections from the third layer on (GNMT section 3.1).
            chunks = out if i < 1 else [o + c for o, c in zip(out, chunks)]
        memory = torch.cat(chunks, dim=1)
        keys = self.attention_keys(memory)

        y = self.embedding(tgt_in)
        chunks = run_layer(self.decoder[0], [y[:, a:b] for a, b in tgt_bounds])
        context = [self.attention(q, keys, memory) for q in chunks]
        for i, layer in enumerate(self.decoder[1:]):
            out = run_layer(layer, chunks, context)
            chunks = out if i < 1 else [o + c for o, c in zip(out, chunks)]

        total = None
        for (a, b), hidden in zip(tgt_bounds, chunks):
            logits = self.classifier(hidden)
            part = F.cross_entropy(logits.reshape(-1, cfg.vocab_size),
                                   tgt_out[:, a:b].reshape(-1), reduction="sum")
            total = part if total is None else total + part
        return total / (tgt_out.shape[0] * cfg.tgt_len)


def make_batch(cfg: GNMTConfig, batch: int, *, device: str | torch.device = "cpu",
               seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Synthetic sentence pairs: uniform token ids, teacher forcing (tgt_in is tgt_out
    shifted right behind a start token 0)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, cfg.vocab_size, (batch, cfg.src_len), generator=gen)
    tgt = torch.randint(1, cfg.vocab_size, (batch, cfg.tgt_len), generator=gen)
    tgt_in = torch.cat([torch.zeros(batch, 1, dtype=torch.long), tgt[:, :-1]], dim=1)
    return tuple(t.to(device) for t in (src, tgt_in, tgt))
