"""Today's transformers models, unmodified, built from tiny configs (nothing downloaded),
as `--model tests.orchestrator.hf_models:NAME` builders. Each takes its labels and
returns its own loss (`WithLabels`: the module returns the step's scalar loss, as a
ModelSpec's must); dropout is off, so split and unsplit steps compute the same."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.op_graphs import WithLabels
from orchestrator.models import ModelSpec

VOCAB = 96
SEQ = 16
BATCH = 8
IMAGE = 16
CLASSES = 10


def make_batch(batch: int, *, device: str | torch.device = "cpu", seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, SEQ), generator=generator)
    return ids.to(device), ids.clone().to(device)


def _spec(name: str, preset: str, lm: nn.Module) -> ModelSpec:
    return ModelSpec(name=name, preset=preset, module=WithLabels(lm, "input_ids"),
                     make_batch=make_batch, batch=BATCH)


def gpt2(preset: str = "tiny", num_layers: int = 2) -> ModelSpec:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=num_layers, n_embd=32, n_head=2, vocab_size=VOCAB,
                        n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    return _spec("gpt2", preset, GPT2LMHeadModel(config))


def llama(preset: str = "tiny", num_layers: int = 2) -> ModelSpec:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=num_layers, hidden_size=32, intermediate_size=64,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                         max_position_embeddings=SEQ, bos_token_id=0, eos_token_id=0,
                         pad_token_id=0)
    return _spec("llama", preset, LlamaForCausalLM(config))


def bert(preset: str = "tiny", num_layers: int = 2) -> ModelSpec:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(num_hidden_layers=num_layers, hidden_size=32, intermediate_size=64,
                        num_attention_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        pad_token_id=0)
    return _spec("bert", preset, BertForMaskedLM(config))


def mixtral(preset: str = "tiny", num_layers: int = 2) -> ModelSpec:
    """A mixture of experts: its router counts each expert's tokens (`histc` on the
    chosen experts, then `cumsum` to int32), values with no gradient."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(num_hidden_layers=num_layers, hidden_size=32, intermediate_size=64,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
                           bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return _spec("mixtral", preset, MixtralForCausalLM(config))


def bart(preset: str = "tiny", num_layers: int = 2) -> ModelSpec:
    """An encoder-decoder: the encoder's output feeds every decoder layer's cross-attention."""
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=num_layers,
                        decoder_layers=num_layers, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        max_position_embeddings=SEQ, dropout=0.0, attention_dropout=0.0,
                        activation_dropout=0.0, pad_token_id=1, bos_token_id=0,
                        eos_token_id=2, decoder_start_token_id=2)
    return _spec("bart", preset, BartForConditionalGeneration(config))


def mamba(preset: str = "tiny", num_layers: int = 1) -> ModelSpec:
    """A state-space model: its forward calls a module it does not own (a kernel-hub
    layer), which fx cannot trace."""
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(num_hidden_layers=num_layers, hidden_size=32, state_size=8,
                         vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return _spec("mamba", preset, MambaForCausalLM(config))


def vit(preset: str = "tiny") -> ModelSpec:
    """ViT, whose position embeddings are drawn by `trunc_normal_`."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=IMAGE, patch_size=4, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64, num_labels=CLASSES,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

    def make_images(batch: int, *, device: str | torch.device = "cpu", seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        images = torch.randn(batch, 3, IMAGE, IMAGE, generator=generator)
        labels = torch.randint(0, CLASSES, (batch,), generator=generator)
        return images.to(device), labels.to(device)

    return ModelSpec(name="vit", preset=preset,
                     module=WithLabels(ViTForImageClassification(config), "pixel_values"),
                     make_batch=make_images, batch=BATCH)


def deberta(preset: str = "tiny", problem_type: str | None = "single_label_classification"
            ) -> ModelSpec:
    """DeBERTa-v2 classifying sequences, with relative attention. Left to guess its
    loss (`problem_type` None), it drops ignored labels through a data-dependent branch
    (`if label_index.size(0) > 0`), which torch.export cannot capture."""
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    config = DebertaV2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=2, intermediate_size=64,
                             max_position_embeddings=SEQ, num_labels=CLASSES,
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                             relative_attention=True, pos_att_type=["p2c", "c2p"],
                             problem_type=problem_type)

    def make_sequences(batch: int, *, device: str | torch.device = "cpu", seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, VOCAB, (batch, SEQ), generator=generator)
        labels = torch.randint(0, CLASSES, (batch,), generator=generator)
        return ids.to(device), labels.to(device)

    return ModelSpec(name="deberta", preset=preset,
                     module=WithLabels(DebertaV2ForSequenceClassification(config),
                                       "input_ids"),
                     make_batch=make_sequences, batch=BATCH)


def deberta_guessing_its_loss(preset: str = "tiny") -> ModelSpec:
    return deberta(preset, problem_type=None)


class ContrastiveLoss(nn.Module):
    """CLIP's own contrastive loss (`return_loss=True`), which takes its targets from
    `torch.arange(len(logits))`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, pixel_values=pixels, return_loss=True).loss


def clip(preset: str = "tiny") -> ModelSpec:
    """CLIP's text and vision towers, trained by their contrastive loss."""
    from transformers import CLIPConfig, CLIPModel

    config = CLIPConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2,
                         max_position_embeddings=SEQ, bos_token_id=0, eos_token_id=1),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, image_size=IMAGE, patch_size=8),
        projection_dim=8)

    def make_pairs(batch: int, *, device: str | torch.device = "cpu", seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, VOCAB, (batch, SEQ), generator=generator)
        images = torch.randn(batch, 3, IMAGE, IMAGE, generator=generator)
        return ids.to(device), images.to(device)

    return ModelSpec(name="clip", preset=preset, module=ContrastiveLoss(CLIPModel(config)),
                     make_batch=make_pairs, batch=BATCH)


def gpt2_checkpointed(preset: str = "tiny") -> ModelSpec:
    """GPT-2 with transformers' activation checkpointing on in each block."""
    spec = gpt2(preset)
    spec.module.model.activation_checkpointing_enable()
    return spec
