"""A HuggingFace transformers model as a model of your own: GPT-2 built from a small
config (nothing downloaded), trained with its own loss (labels passed in).

    orchestrator train --model examples.gpt2:build --mp 2 --steps 10
    ray job submit --working-dir . -- python jobs/train.py --model examples.gpt2:build

`preset` "paper" is GPT-2 small (124M parameters); "tiny" has 4 blocks of 128.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from orchestrator.models import ModelSpec

#: Tokens per sample.
SEQ_LEN = 32

CONFIGS = {
    "tiny": dict(n_layer=4, n_embd=128, n_head=4, vocab_size=1000, n_positions=SEQ_LEN,
                 bos_token_id=999, eos_token_id=999),
    "paper": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
}


class LanguageModel(nn.Module):
    """forward(input_ids, labels) -> the LM's own next-token loss."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.lm = GPT2LMHeadModel(config)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, labels=labels).loss


def build(preset: str = "tiny") -> ModelSpec:
    # Dropout off: a split model draws its random numbers in another order.
    config = GPT2Config(**CONFIGS[preset], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    vocab = config.vocab_size

    def make_batch(n: int, *, device="cpu", seed: int = 0):
        ids = torch.randint(0, vocab, (n, SEQ_LEN), generator=torch.Generator().manual_seed(seed))
        return ids.to(device), ids.to(device)

    return ModelSpec(name="gpt2", preset=preset, module=LanguageModel(config),
                     make_batch=make_batch, batch=8)
