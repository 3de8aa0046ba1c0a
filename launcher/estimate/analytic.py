"""The analytic estimate: a model described by a Hugging Face ``config.json`` or by ``--params``.

For models too large to trace on a laptop, or scripts launch cannot import. Parameter counts are
exact for the architectures below (checked against the published counts in the tests).
Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 4.1: per layer and sample, with 16-bit activations,

    attention  11 s h + 5 a s^2      (the 5 a s^2 of the scores and softmax vanish with
                                      flash / SDPA attention, which keeps O(a s) statistics)
    MLP        3 s h + 4 s I         (the paper's 19 s h at I = 4h; a gated SwiGLU MLP keeps
                                      2 s h + 8 s I: gate, up, activation and product outputs)
    norms      4 s h

plus the logits, often the largest tensor: s V bytes of 16-bit logits, and the loss's fp32 copy
and its gradient (8 s V). Activation checkpointing of each layer (what the templates apply to the
``wrap_modules()`` blocks) keeps each layer's 2 s h input and recomputes one layer at a time.
fp32 activations double every term. ``--params`` alone gives exact model states and says that
activations are unknown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.status import UsageError

#: model_type values of decoder LLMs whose layers look like Llama's (RMSNorm, RoPE, GQA, SwiGLU).
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "gemma", "phi3")
SUPPORTED = (*LLAMA_LIKE, "gpt2", "gpt_neox", "bert", "roberta")


@dataclass(frozen=True)
class ModelShape:
    """What the analytic estimate needs; ``None`` where the input does not say."""

    parameters: int
    model_type: str = "declared"
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    intermediate: int | None = None
    vocab: int | None = None
    seq_len: int | None = None
    gated_mlp: bool = True
    experts: int = 1
    experts_per_token: int = 1
    layer_parameters: int | None = None  # one transformer block: the FSDP unit
    embedding_parameters: int | None = None

    @property
    def knows_activations(self) -> bool:
        return None not in (self.layers, self.hidden, self.heads, self.vocab, self.seq_len,
                            self.intermediate)

    def activation_bytes_per_sample(self, *, element_bytes: int = 2, flash: bool = True,
                                    checkpointing: bool = False) -> int | None:
        if not self.knows_activations:
            return None
        s, h, a, i, v, n = (self.seq_len, self.hidden, self.heads, self.intermediate, self.vocab,
                            self.layers)
        assert None not in (s, h, a, i, v, n)
        scale = element_bytes / 2  # the formulas are for 16-bit activations
        attention = 11 * s * h + (0 if flash else 5 * a * s * s)
        # MoE: each token goes through experts_per_token experts' MLPs.
        mlp = (2 * s * h + 8 * s * i if self.gated_mlp else 3 * s * h + 4 * s * i)
        mlp *= self.experts_per_token
        layer = (attention + mlp + 4 * s * h) * scale
        logits = s * v * (element_bytes + 8)
        edges = 4 * s * h * scale  # embedding output and the final norm
        if checkpointing:
            return int(n * 2 * s * h * scale + layer + logits + edges)
        return int(n * layer + logits + edges)

    def flops_per_sample(self, seq_len: int | None = None) -> float | None:
        """Training FLOPs of one sample: 6 N s + 12 L h s^2 (PaLM, Chowdhery et al. 2022, App. B),
        with N the parameters a token goes through (MoE: only the routed experts)."""
        s = seq_len or self.seq_len
        if s is None:
            return None
        active = self.active_parameters
        attention = 12 * self.layers * self.hidden * s * s if self.layers and self.hidden else 0
        return 6.0 * active * s + attention

    @property
    def active_parameters(self) -> int:
        if self.experts <= 1 or self.layers is None or self.hidden is None or not self.intermediate:
            return self.parameters
        per_expert = 3 * self.hidden * self.intermediate
        idle = (self.experts - self.experts_per_token) * per_expert * self.layers
        return self.parameters - idle


def _get(config: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


def shape_from_config(config: dict[str, Any], *, seq_len: int | None = None) -> ModelShape:
    """An exact parameter count and the shape from a Hugging Face ``config.json``."""
    kind = config.get("model_type")
    if kind not in SUPPORTED:
        raise UsageError(f"model_type {kind!r} is not one launch can size from its config",
                         f"supported: {', '.join(SUPPORTED)}; or give --params")
    h = _get(config, "hidden_size", "n_embd", "d_model")
    n = _get(config, "num_hidden_layers", "n_layer", "num_layers")
    a = _get(config, "num_attention_heads", "n_head")
    v = _get(config, "vocab_size")
    if None in (h, n, a, v):
        raise UsageError("the config lacks hidden_size, num_hidden_layers, "
                         "num_attention_heads or vocab_size")
    positions = _get(config, "max_position_embeddings", "n_positions", "n_ctx")
    s = seq_len or positions
    tied = bool(config.get("tie_word_embeddings", kind in ("gpt2", "bert", "roberta")))
    if kind in LLAMA_LIKE:
        kv = _get(config, "num_key_value_heads", default=a)
        hd = _get(config, "head_dim", default=h // a)
        i = _get(config, "intermediate_size", "moe_intermediate_size")
        experts = _get(config, "num_local_experts", "num_experts", default=1)
        top_k = _get(config, "num_experts_per_tok", default=1)
        bias = bool(config.get("attention_bias", kind == "qwen2"))
        attention = h * a * hd + 2 * h * kv * hd + a * hd * h
        if bias:
            attention += a * hd + 2 * kv * hd
        mlp = 3 * h * i * experts + (h * experts if experts > 1 else 0)  # + router
        layer = attention + mlp + 2 * h
        embed = v * h
        total = embed + n * layer + h + (0 if tied else v * h)
        return ModelShape(parameters=total, model_type=kind, layers=n, hidden=h, heads=a,
                          kv_heads=kv, intermediate=i, vocab=v, seq_len=s, gated_mlp=True,
                          experts=experts, experts_per_token=top_k if experts > 1 else 1,
                          layer_parameters=layer, embedding_parameters=embed)
    if kind == "gpt2":
        i = _get(config, "n_inner", default=4 * h)
        layer = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h)
        embed = v * h + positions * h
        total = embed + n * layer + 2 * h
        return ModelShape(parameters=total, model_type=kind, layers=n, hidden=h, heads=a,
                          kv_heads=a, intermediate=i, vocab=v, seq_len=s, gated_mlp=False,
                          layer_parameters=layer, embedding_parameters=embed)
    if kind == "gpt_neox":
        i = _get(config, "intermediate_size", default=4 * h)
        layer = 4 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
        embed = v * h
        total = embed + n * layer + 2 * h + (0 if tied else v * h)
        return ModelShape(parameters=total, model_type=kind, layers=n, hidden=h, heads=a,
                          kv_heads=a, intermediate=i, vocab=v, seq_len=s, gated_mlp=False,
                          layer_parameters=layer, embedding_parameters=embed)
    # bert / roberta encoders (the base model with its pooler, as BertModel builds it).
    i = _get(config, "intermediate_size", default=4 * h)
    types = _get(config, "type_vocab_size", default=2)
    layer = 3 * (h * h + h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    embed = v * h + positions * h + types * h + 2 * h
    total = embed + n * layer + (h * h + h)
    return ModelShape(parameters=total, model_type=kind, layers=n, hidden=h, heads=a, kv_heads=a,
                      intermediate=i, vocab=v, seq_len=s, gated_mlp=False,
                      layer_parameters=layer, embedding_parameters=embed)


def load_config(path: Path, *, seq_len: int | None = None) -> ModelShape:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"model config not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not a JSON config ({exc})") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: not a Hugging Face config (expected a JSON object)")
    return shape_from_config(config, seq_len=seq_len)


def shape_from_params(parameters: int, *, layers: int | None = None, hidden: int | None = None,
                      heads: int | None = None, vocab: int | None = None,
                      seq_len: int | None = None, intermediate: int | None = None) -> ModelShape:
    """``--params 30B`` with whatever shape flags were given; the rest stays unknown."""
    if intermediate is None and hidden is not None:
        intermediate = 4 * hidden
        gated = False
    else:
        gated = True
    layer = None
    if layers:
        embed = vocab * hidden if vocab and hidden else 0
        layer = (parameters - embed) // layers
    return ModelShape(parameters=parameters, layers=layers, hidden=hidden, heads=heads,
                      kv_heads=heads, intermediate=intermediate, vocab=vocab, seq_len=seq_len,
                      gated_mlp=gated, layer_parameters=layer)
