"""Models nobody on this project wrote: transformers' own classes, as launcher recipes.

Each model is transformers' class built from a small config at random initialisation (no
download: ``AutoModelForX.from_config(Config(...))``), with ``attn_implementation="sdpa"`` where
the class supports it and ``"eager"`` where it does not. Dropout and every other setting are the
configs' defaults, as a user's would be; the loss is the model's own (``labels`` in the batch,
``model(**batch).loss``). Sizes: hidden 64-128, 2-4 layers, vocabulary 1024, 64 tokens (images
32x32), so that a real CPU step takes about a second on a 2-core machine.

| name       | class                            | blocks (``wrap_modules``)                 |
| ---------- | -------------------------------- | ----------------------------------------- |
| llama      | LlamaForCausalLM (GQA 4/2)       | LlamaDecoderLayer                         |
| llama_masked | the same, batches with an all-ones ``attention_mask`` (a tokenizer's)   |
| gpt2       | GPT2LMHeadModel (tied head)      | GPT2Block                                 |
| qwen2      | Qwen2ForCausalLM (GQA 4/2)       | Qwen2DecoderLayer                         |
| gemma2     | Gemma2ForCausalLM (sliding window, soft-capping) | Gemma2DecoderLayer        |
| opt        | OPTForCausalLM (learned positions, ReLU) | OPTDecoderLayer                   |
| falcon     | FalconForCausalLM (parallel attention, MQA) | FalconDecoderLayer             |
| olmo2      | Olmo2ForCausalLM (post-norms, QK norms) | Olmo2DecoderLayer                  |
| gptj       | GPTJForCausalLM (parallel, partial rotary) | GPTJBlock                       |
| t5         | T5ForConditionalGeneration       | T5Block                                   |
| bart       | BartForConditionalGeneration     | BartEncoderLayer, BartDecoderLayer        |
| whisper    | WhisperForConditionalGeneration  | WhisperEncoderLayer, WhisperDecoderLayer  |
| bert       | BertForMaskedLM                  | BertLayer                                 |
| roberta    | RobertaForMaskedLM               | RobertaLayer                              |
| vit        | ViTForImageClassification        | ViTLayer                                  |
| swin       | SwinForImageClassification       | SwinLayer                                 |
| convnext   | ConvNextForImageClassification   | ConvNextLayer                             |
| mixtral    | MixtralForCausalLM (4 experts)   | MixtralDecoderLayer                       |
| mixtral_eager | the same, experts_implementation="eager" (a loop over experts)         |
| qwen2_moe  | Qwen2MoeForCausalLM (4 experts)  | Qwen2MoeDecoderLayer                      |

``write_recipe(name, directory)`` writes ``<directory>/<name>.py``, a recipe whose hooks come
from here (the way ``models_zoo.write_recipe`` does), so the estimator traces it by file path as
it traces a user's script.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

VOCAB = 1024
SEQ = 64
IMAGE = 32
CLASSES = 10


@dataclass(frozen=True)
class HFModel:
    """One model's recipe hooks."""

    name: str
    build_model: Callable[[], torch.nn.Module]
    example_batch: Callable[[int], dict[str, torch.Tensor]]
    training_step: Callable[[torch.nn.Module, Any], torch.Tensor]
    wrap_modules: Callable[[], tuple[type, ...]]


def _from_config(auto: Any, config: Any, **kwargs: Any) -> torch.nn.Module:
    """``auto.from_config(config)`` with SDPA attention, eager where the class lacks SDPA."""
    try:
        model = auto.from_config(config, attn_implementation="sdpa", **kwargs)
    except ValueError as exc:
        if "sdpa" not in str(exc).lower() and "scaled_dot_product" not in str(exc):
            raise
        model = auto.from_config(config, attn_implementation="eager", **kwargs)
    model.train()
    return model


def _loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


def _tokens(batch_size: int, seq: int = SEQ, low: int = 0) -> torch.Tensor:
    return torch.randint(low, VOCAB, (batch_size, seq))


def _lm_batch(batch_size: int) -> dict[str, torch.Tensor]:
    ids = _tokens(batch_size)
    return {"input_ids": ids, "labels": ids.clone()}  # the model shifts the labels itself


def _lm_batch_masked(batch_size: int) -> dict[str, torch.Tensor]:
    # What a tokenizer gives for unpadded rows: an attention mask of ones.
    return {**_lm_batch(batch_size), "attention_mask": torch.ones(batch_size, SEQ,
                                                                  dtype=torch.long)}


def _mlm_batch(batch_size: int) -> dict[str, torch.Tensor]:
    # Tokens from 4 on, so none is a pad or special token; -100 (ignored) where not masked.
    ids = _tokens(batch_size, low=4)
    labels = ids.clone()
    labels[torch.rand(labels.shape) >= 0.15] = -100
    return {"input_ids": ids, "labels": labels}


def _seq2seq_batch(batch_size: int) -> dict[str, torch.Tensor]:
    # The labels only: the model makes its decoder's inputs by shifting them right.
    return {"input_ids": _tokens(batch_size, low=4), "labels": _tokens(batch_size, low=4)}


def _image_batch(batch_size: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(batch_size, 3, IMAGE, IMAGE),
            "labels": torch.randint(0, CLASSES, (batch_size,))}


# ----------------------------------------------------------------------------------------------
# Decoder language models


def llama() -> HFModel:
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForCausalLM, LlamaConfig(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ))

    return HFModel("llama", build, _lm_batch, _loss, lambda: (LlamaDecoderLayer,))


def llama_masked() -> HFModel:
    """The same Llama, its batches carrying the tokenizer's ``attention_mask`` (all ones)."""
    model = llama()
    return HFModel("llama_masked", model.build_model, _lm_batch_masked, _loss,
                   model.wrap_modules)


def gpt2() -> HFModel:
    from transformers import AutoModelForCausalLM, GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForCausalLM, GPT2Config(
            vocab_size=VOCAB, n_positions=SEQ, n_embd=128, n_layer=2, n_head=4,
            bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1))

    return HFModel("gpt2", build, _lm_batch, _loss, lambda: (GPT2Block,))


def qwen2() -> HFModel:
    from transformers import AutoModelForCausalLM, Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForCausalLM, Qwen2Config(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ))

    return HFModel("qwen2", build, _lm_batch, _loss, lambda: (Qwen2DecoderLayer,))


def gemma2() -> HFModel:
    """Sliding-window and global layers in turn, soft-capped attention scores and logits."""
    from transformers import AutoModelForCausalLM, Gemma2Config
    from transformers.models.gemma2.modeling_gemma2 import Gemma2DecoderLayer

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForCausalLM, Gemma2Config(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=SEQ, sliding_window=16))

    return HFModel("gemma2", build, _lm_batch, _loss, lambda: (Gemma2DecoderLayer,))


def opt() -> HFModel:
    """Learned positions, a ReLU MLP, biases everywhere."""
    from transformers import AutoModelForCausalLM, OPTConfig
    from transformers.models.opt.modeling_opt import OPTDecoderLayer

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForCausalLM, OPTConfig(
            vocab_size=VOCAB, hidden_size=128, ffn_dim=512, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=SEQ, word_embed_proj_dim=128))

    return HFModel("opt", build, _lm_batch, _loss, lambda: (OPTDecoderLayer,))


def falcon() -> HFModel:
    """Attention and MLP in parallel off one norm, multi-query attention, fused QKV."""
    from transformers import AutoModelForCausalLM, FalconConfig
    from transformers.models.falcon.modeling_falcon import FalconDecoderLayer

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForCausalLM, FalconConfig(
            vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=SEQ))

    return HFModel("falcon", build, _lm_batch, _loss, lambda: (FalconDecoderLayer,))


def olmo2() -> HFModel:
    """Norms after attention and MLP, and on queries and keys."""
    from transformers import AutoModelForCausalLM, Olmo2Config
    from transformers.models.olmo2.modeling_olmo2 import Olmo2DecoderLayer

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForCausalLM, Olmo2Config(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
            pad_token_id=0))

    return HFModel("olmo2", build, _lm_batch, _loss, lambda: (Olmo2DecoderLayer,))


def gptj() -> HFModel:
    """Attention and MLP in parallel, partial rotary embeddings, an untied head with a bias."""
    from transformers import AutoModelForCausalLM, GPTJConfig
    from transformers.models.gptj.modeling_gptj import GPTJBlock

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForCausalLM, GPTJConfig(
            vocab_size=VOCAB, n_positions=SEQ, n_embd=128, n_layer=2, n_head=4, rotary_dim=16,
            bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1))

    return HFModel("gptj", build, _lm_batch, _loss, lambda: (GPTJBlock,))


# ----------------------------------------------------------------------------------------------
# Encoder-decoders


def t5() -> HFModel:
    from transformers import AutoModelForSeq2SeqLM, T5Config
    from transformers.models.t5.modeling_t5 import T5Block

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForSeq2SeqLM, T5Config(
            vocab_size=VOCAB, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))

    return HFModel("t5", build, _seq2seq_batch, _loss, lambda: (T5Block,))


def bart() -> HFModel:
    from transformers import AutoModelForSeq2SeqLM, BartConfig
    from transformers.models.bart.modeling_bart import BartDecoderLayer, BartEncoderLayer

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForSeq2SeqLM, BartConfig(
            vocab_size=VOCAB, d_model=128, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
            decoder_ffn_dim=256, max_position_embeddings=SEQ))

    return HFModel("bart", build, _seq2seq_batch, _loss,
                   lambda: (BartEncoderLayer, BartDecoderLayer))


WHISPER_MELS = 80
WHISPER_POSITIONS = 64  # encoder positions; its input is twice as many frames


def _whisper_batch(batch_size: int) -> dict[str, torch.Tensor]:
    return {"input_features": torch.randn(batch_size, WHISPER_MELS, 2 * WHISPER_POSITIONS),
            "labels": _tokens(batch_size, seq=32, low=4)}


def whisper() -> HFModel:
    from transformers import AutoModelForSpeechSeq2Seq, WhisperConfig
    from transformers.models.whisper.modeling_whisper import (
        WhisperDecoderLayer,
        WhisperEncoderLayer,
    )

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForSpeechSeq2Seq, WhisperConfig(
            vocab_size=VOCAB, num_mel_bins=WHISPER_MELS, d_model=128, encoder_layers=2,
            decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=256, decoder_ffn_dim=256, max_source_positions=WHISPER_POSITIONS,
            max_target_positions=SEQ, pad_token_id=1, bos_token_id=2, eos_token_id=2,
            decoder_start_token_id=3, suppress_tokens=None, begin_suppress_tokens=None))

    return HFModel("whisper", build, _whisper_batch, _loss,
                   lambda: (WhisperEncoderLayer, WhisperDecoderLayer))


# ----------------------------------------------------------------------------------------------
# Encoders


def bert() -> HFModel:
    from transformers import AutoModelForMaskedLM, BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForMaskedLM, BertConfig(
            vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=512, max_position_embeddings=SEQ))

    return HFModel("bert", build, _mlm_batch, _loss, lambda: (BertLayer,))


def roberta() -> HFModel:
    from transformers import AutoModelForMaskedLM, RobertaConfig
    from transformers.models.roberta.modeling_roberta import RobertaLayer

    def build() -> torch.nn.Module:
        # RoBERTa's positions start after the pad token: 2 more than the sequence.
        return _from_config(AutoModelForMaskedLM, RobertaConfig(
            vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=512, max_position_embeddings=SEQ + 2))

    return HFModel("roberta", build, _mlm_batch, _loss, lambda: (RobertaLayer,))


# ----------------------------------------------------------------------------------------------
# Vision


def vit() -> HFModel:
    from transformers import AutoModelForImageClassification, ViTConfig
    from transformers.models.vit.modeling_vit import ViTLayer

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForImageClassification, ViTConfig(
            image_size=IMAGE, patch_size=4, hidden_size=128, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=256, num_labels=CLASSES))

    return HFModel("vit", build, _image_batch, _loss, lambda: (ViTLayer,))


def swin() -> HFModel:
    from transformers import AutoModelForImageClassification, SwinConfig
    from transformers.models.swin.modeling_swin import SwinLayer

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForImageClassification, SwinConfig(
            image_size=IMAGE, patch_size=2, embed_dim=32, depths=[2, 2], num_heads=[2, 4],
            window_size=4, num_labels=CLASSES))

    return HFModel("swin", build, _image_batch, _loss, lambda: (SwinLayer,))


def convnext() -> HFModel:
    from transformers import AutoModelForImageClassification, ConvNextConfig
    from transformers.models.convnext.modeling_convnext import ConvNextLayer

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForImageClassification, ConvNextConfig(
            num_channels=3, patch_size=2, num_stages=3, hidden_sizes=[32, 64, 128],
            depths=[1, 1, 2], num_labels=CLASSES))

    return HFModel("convnext", build, _image_batch, _loss, lambda: (ConvNextLayer,))


# ----------------------------------------------------------------------------------------------
# Mixture of experts


def mixtral(experts_implementation: str | None = None) -> HFModel:
    """transformers' default experts kernel (grouped_mm), or the one named (``"eager"``: a loop
    over the experts that routes with ``nonzero``)."""
    from transformers import AutoModelForCausalLM, MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer

    extra = {"experts_implementation": experts_implementation} if experts_implementation else {}

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForCausalLM, MixtralConfig(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
            num_experts_per_tok=2, max_position_embeddings=SEQ), **extra)

    name = "mixtral" + (f"_{experts_implementation}" if experts_implementation else "")
    return HFModel(name, build, _lm_batch, _loss, lambda: (MixtralDecoderLayer,))


def mixtral_eager() -> HFModel:
    return mixtral("eager")


def qwen2_moe() -> HFModel:
    from transformers import AutoModelForCausalLM, Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeDecoderLayer

    def build() -> torch.nn.Module:
        return _from_config(AutoModelForCausalLM, Qwen2MoeConfig(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=128, shared_expert_intermediate_size=256,
            max_position_embeddings=SEQ))

    return HFModel("qwen2_moe", build, _lm_batch, _loss, lambda: (Qwen2MoeDecoderLayer,))


MODELS: dict[str, Callable[[], HFModel]] = {
    "llama": llama, "llama_masked": llama_masked, "gpt2": gpt2, "qwen2": qwen2,
    "gemma2": gemma2, "opt": opt, "falcon": falcon, "olmo2": olmo2, "gptj": gptj,
    "t5": t5, "bart": bart, "whisper": whisper,
    "bert": bert, "roberta": roberta,
    "vit": vit, "swin": swin, "convnext": convnext,
    "mixtral": mixtral, "mixtral_eager": mixtral_eager, "qwen2_moe": qwen2_moe,
}


def get(name: str) -> HFModel:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r} ({', '.join(MODELS)})")
    return MODELS[name]()


def write_recipe(name: str, directory: str | Path) -> Path:
    """Write ``<directory>/<name>.py``: a recipe file whose hooks come from this module."""
    from models_zoo import hooks_recipe

    if name not in MODELS:
        raise ValueError(f"unknown model {name!r} ({', '.join(MODELS)})")
    return hooks_recipe(Path(directory) / f"{name}.py",
                        f"import zoo_hf\n_recipe = zoo_hf.get({name!r})")


__all__ = ["MODELS", "HFModel", "get", "write_recipe"] + list(MODELS)
