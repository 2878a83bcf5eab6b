"""Operator-level training graphs, for the placer's benchmarks at scale.

    python -m benchmarks.op_graphs OUT_DIR [--granularity decomposed] [--models bert3 ...]

Writes OUT_DIR/<model>_training.json for BERT with 3, 6 and 12 layers (transformers
`BertForMaskedLM`, BERT-base width: hidden 768, 12 heads, sequence 128, its own
masked-LM loss on 15% of the tokens, dropout 0.1 as published) and ResNet-50
(`ResNetForImageClassification`, bottleneck blocks [3, 4, 6, 3], 224x224 images, its own
classification loss), batch 8; and T5 (`T5ForConditionalGeneration`, T5-small's sizes:
6 encoder and 6 decoder layers, d_model 512, 8 heads of 64, d_ff 2048, vocabulary
32,128, its embedding shared by the encoder, the decoder and the LM head; dropout rate
0, sequence 128 in and out, its own cross-entropy loss), batch 64; GPT-2 small
(`GPT2LMHeadModel`: 12 layers of width 768, 12 heads, vocabulary 50,257, its embedding
tied to the LM head, dropout 0.1 as published, sequence 128, its own shifted LM loss),
batch 8; a Llama of the same depth and width (`LlamaForCausalLM`: 12 layers of width
768, 12 query heads sharing 4 key-value heads, SwiGLU of 2,048, rotary positions, RMS
norms, vocabulary 32,000, untied LM head, sequence 128), batch 8; ViT-Base/16
(`ViTForImageClassification`: 224x224 images in 196 patches, 12 layers of width 768,
1,000 classes, its own classification loss), batch 8; BART-base
(`BartForConditionalGeneration`: 6 + 6 layers of width 768, its embedding shared by
encoder, decoder and LM head), batch 8; and a Mixtral mixture of experts of the
Llama's depth and width (8 experts a layer, 2 per token), batch 8. T5, GPT-2, Llama,
ViT, BART and Mixtral are models the planner was not tuned on. Each is profiled (`orchestrator.profile.profile_model`,
`paper` preset, `--device meta`: no weight is allocated (at operator granularity the
model is captured on fake CPU tensors, so the graph is the one a worker captures), and
shapes, FLOPs and bytes are exact, times projected by the roofline for cpu, v100, a100
and h100) at operator granularity (default `decomposed`: ResNet-50's batch norms as their
arithmetic, so that it has about as many ops as BERT-12). Each file is the graph
`orchestrator profile` writes, the one the product plans on: forward ops carrying their
backward times, which the planner unrolls into a forward and a backward task per op on
one device (`placement.tasks.build_tasks`), each gradient summed per reading device
before it crosses back, as the executor runs it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

from orchestrator.models import ModelSpec
from orchestrator.profile import profile_model
from orchestrator.profile.capture import GRANULARITIES
from placement.io import save_graph

BATCH = 8
SEQ = 128
BERT_VOCAB = 30522
IMAGE = 224
CLASSES = 1000
T5_VOCAB = 32128
T5_BATCH = 64
LLAMA_VOCAB = 32000
#: Share of the tokens a masked-LM step predicts (Devlin et al. 2019).
MASKED = 0.15


class WithLabels(nn.Module):
    """`forward(inputs, labels)` -> the transformers model's own loss."""

    def __init__(self, model: nn.Module, input_name: str) -> None:
        super().__init__()
        self.model = model
        self.input_name = input_name

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.input_name: inputs}, labels=labels).loss


def _bert(preset: str, num_layers: int) -> ModelSpec:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(num_hidden_layers=num_layers, max_position_embeddings=SEQ)

    def make_batch(batch: int, *, device="cpu", seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, BERT_VOCAB, (batch, SEQ), generator=generator)
        masked = torch.rand(batch, SEQ, generator=generator) < MASKED
        return ids.to(device), torch.where(masked, ids, -100).to(device)

    return ModelSpec(name=f"bert{num_layers}", preset=preset,
                     module=WithLabels(BertForMaskedLM(config), "input_ids"),
                     make_batch=make_batch, batch=BATCH)


def bert3(preset: str = "paper") -> ModelSpec:
    return _bert(preset, 3)


def bert6(preset: str = "paper") -> ModelSpec:
    return _bert(preset, 6)


def bert12(preset: str = "paper") -> ModelSpec:
    return _bert(preset, 12)


def resnet50(preset: str = "paper") -> ModelSpec:
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(layer_type="bottleneck", depths=[3, 4, 6, 3], num_labels=CLASSES)
    return ModelSpec(name="resnet50", preset=preset,
                     module=WithLabels(ResNetForImageClassification(config), "pixel_values"),
                     make_batch=_labelled_images, batch=BATCH)


def _labelled_images(batch: int, *, device="cpu", seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, IMAGE, IMAGE, generator=generator)
    return images.to(device), torch.randint(0, CLASSES, (batch,),
                                            generator=generator).to(device)


def t5(preset: str = "paper") -> ModelSpec:
    """T5-small's sizes at `paper`; `tiny`: 2 + 2 layers of width 128, vocabulary 512,
    sequence 16, batch 8 (for tests)."""
    from transformers import T5Config, T5ForConditionalGeneration

    tiny = preset == "tiny"
    config = T5Config(vocab_size=512 if tiny else T5_VOCAB, d_model=128 if tiny else 512,
                      d_kv=32 if tiny else 64, d_ff=256 if tiny else 2048,
                      num_layers=2 if tiny else 6, num_decoder_layers=2 if tiny else 6,
                      num_heads=4 if tiny else 8, dropout_rate=0.0,
                      decoder_start_token_id=0, pad_token_id=0)
    # Token 0 is the pad and decoder start token: neither input nor label uses it.
    return ModelSpec(name="t5", preset=preset,
                     module=WithLabels(T5ForConditionalGeneration(config), "input_ids"),
                     make_batch=_reversed_tokens(1, config.vocab_size, 16 if tiny else SEQ),
                     batch=BATCH if tiny else T5_BATCH)


def bart(preset: str = "paper") -> ModelSpec:
    """BART-base's sizes: 6 encoder and 6 decoder layers of width 768, 12 heads, feed
    forward 3,072, vocabulary 50,265, its embedding shared by the encoder, the decoder
    and the LM head, dropout 0.1 as published; sequence 128 in and out, batch 8."""
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(d_model=768, encoder_layers=6, decoder_layers=6,
                        encoder_attention_heads=12, decoder_attention_heads=12,
                        encoder_ffn_dim=3072, decoder_ffn_dim=3072, max_position_embeddings=SEQ)
    # Ids 0-3 are BART's special tokens (start, pad, end, unknown): no sample uses them.
    return ModelSpec(name="bart", preset=preset,
                     module=WithLabels(BartForConditionalGeneration(config), "input_ids"),
                     make_batch=_reversed_tokens(4, config.vocab_size, SEQ), batch=BATCH)


def _reversed_tokens(first: int, vocab: int, seq: int):
    """Batches of `seq` tokens drawn from ids `first`..`vocab` - 1, each labelled with
    its own sequence reversed (a translation an encoder-decoder can learn)."""
    def make_batch(batch: int, *, device="cpu", seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(first, vocab, (batch, seq), generator=generator)
        return ids.to(device), ids.flip(1).to(device)

    return make_batch


def gpt2(preset: str = "paper") -> ModelSpec:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_positions=SEQ)
    return ModelSpec(name="gpt2", preset=preset,
                     module=WithLabels(GPT2LMHeadModel(config), "input_ids"),
                     make_batch=_next_tokens(config.vocab_size), batch=BATCH)


def llama(preset: str = "paper") -> ModelSpec:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=LLAMA_VOCAB, hidden_size=768, intermediate_size=2048,
                         num_hidden_layers=12, num_attention_heads=12,
                         num_key_value_heads=4, max_position_embeddings=SEQ)
    return ModelSpec(name="llama", preset=preset,
                     module=WithLabels(LlamaForCausalLM(config), "input_ids"),
                     make_batch=_next_tokens(LLAMA_VOCAB), batch=BATCH)


def mixtral(preset: str = "paper") -> ModelSpec:
    """A mixture of experts of the Llama's depth and width (`MixtralForCausalLM`: 12
    layers of width 768, 12 query heads sharing 4 key-value heads, 8 SwiGLU experts of
    2,048 per layer, 2 chosen per token), vocabulary 32,000, sequence 128, batch 8."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=LLAMA_VOCAB, hidden_size=768, intermediate_size=2048,
                           num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                           num_local_experts=8, num_experts_per_tok=2,
                           max_position_embeddings=SEQ)
    return ModelSpec(name="mixtral", preset=preset,
                     module=WithLabels(MixtralForCausalLM(config), "input_ids"),
                     make_batch=_next_tokens(LLAMA_VOCAB), batch=BATCH)


def _next_tokens(vocab: int):
    """Token batches whose labels are the inputs: a causal LM shifts them itself, each
    position predicting the next token."""
    def make_batch(batch: int, *, device="cpu", seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (batch, SEQ), generator=generator)
        return ids.to(device), ids.to(device)

    return make_batch


def vit(preset: str = "paper") -> ModelSpec:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=IMAGE, patch_size=16, num_labels=CLASSES)
    return ModelSpec(name="vit", preset=preset,
                     module=WithLabels(ViTForImageClassification(config), "pixel_values"),
                     make_batch=_labelled_images, batch=BATCH)


MODELS = {"bert3": bert3, "bert6": bert6, "bert12": bert12, "resnet50": resnet50, "t5": t5,
          "bart": bart, "gpt2": gpt2, "llama": llama, "mixtral": mixtral, "vit": vit}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.op_graphs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to write <model>_training.json into")
    parser.add_argument("--granularity", default="decomposed", choices=GRANULARITIES[1:])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        started = time.perf_counter()
        graph = profile_model(f"{__name__}:{name}", preset="paper", target="v100",
                              granularity=args.granularity)
        path = out / f"{name}_training.json"
        save_graph(graph, path)
        print(f"{path}: {len(graph.ops)} ops, {len(graph.edges)} edges, "
              f"{len(graph.colocation_groups())} colocation groups, "
              f"{graph.total_param_bytes() / 2**20:,.1f} MiB of parameters "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
