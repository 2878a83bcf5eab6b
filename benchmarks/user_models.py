"""Models of your own, captured and split: GPT-2, Llama and BERT from transformers 5
(built from small configs, unmodified, their own losses; torch.fx cannot trace them, so
they are captured with torch.export) and a plain MLP (torch.fx).

    python -m benchmarks.user_models [--models gpt2,llama,bert,mlp] [--trials 3]

Per model: ops in the graph, capture and profile seconds (`orchestrator profile`'s
own figures, one CPU thread, one profile), then `benchmarks.runtime.mp_speedup`'s predicted and
measured MP speedup at mp 2 on this machine's two cores (mp 1 against mp 2 with 1, 2
and 4 micro-batches, alternating runs, the median of adjacent-run ratios), in
independent profile-plan-measure trials.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from benchmarks.op_graphs import WithLabels
from benchmarks.runtime import mp_speedup, summarize
from orchestrator.models import ModelSpec
from orchestrator.profile import profile_model

SEQ = 32
VOCAB = 4096
#: One worker's batch (samples per step) for the MP figures.
BATCH = {"gpt2": 8, "llama": 8, "bert": 8, "mlp": 256}


def _tokens(batch: int, *, device="cpu", seed: int = 0):
    ids = torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(seed))
    return ids.to(device), ids.clone().to(device)


def _lm(name: str, preset: str, model: nn.Module) -> ModelSpec:
    return ModelSpec(name=name, preset=preset, module=WithLabels(model, "input_ids"),
                     make_batch=_tokens, batch=BATCH[name])


def gpt2(preset: str = "tiny") -> ModelSpec:
    from transformers import GPT2Config, GPT2LMHeadModel

    return _lm("gpt2", preset, GPT2LMHeadModel(GPT2Config(
        n_layer=4, n_embd=256, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)))


def llama(preset: str = "tiny") -> ModelSpec:
    from transformers import LlamaConfig, LlamaForCausalLM

    return _lm("llama", preset, LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=4, hidden_size=256, intermediate_size=688, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
        bos_token_id=0, eos_token_id=0, pad_token_id=0)))


def bert(preset: str = "tiny") -> ModelSpec:
    from transformers import BertConfig, BertForMaskedLM

    return _lm("bert", preset, BertForMaskedLM(BertConfig(
        num_hidden_layers=4, hidden_size=256, intermediate_size=1024, num_attention_heads=4,
        vocab_size=VOCAB, max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=0)))


def mlp(preset: str = "tiny") -> ModelSpec:
    widths = (512, 1024, 1024, 1024, 1024, 10)
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]

    def make_batch(batch: int, *, device="cpu", seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, widths[0], generator=generator).to(device),
                torch.randint(0, widths[-1], (batch,), generator=generator).to(device))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(*layers[:-1])

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(self.layers(x), y)

    return ModelSpec(name="mlp", preset=preset, module=MLP(), make_batch=make_batch,
                     batch=BATCH["mlp"])


MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert, "mlp": mlp}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.user_models")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=8,
                        help="runs of 1 + 3 steps of each executor, alternating")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = args.models.split(",")
    print("| model | batch | ops | capture | capture s | profile s |")
    print("|---|---|---|---|---|---|")
    for name in names:
        graph = profile_model(f"{__name__}:{name}", batch=BATCH[name])
        md = graph.metadata
        print(f"| {name} | {BATCH[name]} | {len(graph.ops)} | {md['capture']} | "
              f"{md['capture_seconds']:.2f} | {md['profile_seconds']:.1f} |", flush=True)
    rows = [r for name in names for _ in range(args.trials)
            for r in mp_speedup(f"{__name__}:{name}", BATCH[name], args.rounds)]
    print("\n| model | batch | K | trials | median measured speedup | median predicted "
          "speedup | median prediction error (range) |")
    print("|---|---|---|---|---|---|---|")
    for s in summarize(rows):
        print(f"| {s['model'].split(':')[-1]} | {s['batch']} | {s['micro_batches']} | "
              f"{s['trials']} | {s['measured']:.2f}x | {s['predicted']:.2f}x | "
              f"{s['error']:+.1%} ({s['error_low']:+.1%} to {s['error_high']:+.1%}) |",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
