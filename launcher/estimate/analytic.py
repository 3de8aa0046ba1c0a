"""The analytic estimate: a model described by a Hugging Face ``config.json`` or by ``--params``.

For models too large to trace on a laptop, or scripts launch cannot import. Parameter counts are
exact for the architectures below (checked against the published counts in the tests).
Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 4.1: per layer and sample, with 16-bit activations,

    attention  11 s h + 5 a s^2      (the 5 a s^2 of the scores, softmax and dropout mask
                                      vanish with a fused kernel, which keeps O(a s) statistics)
    MLP        3 s h + 4 s I         (the paper's 19 s h at I = 4h; a gated SwiGLU MLP keeps
                                      2 s h + 8 s I: gate, up, activation and product outputs)
    norms      4 s h

plus the logits and the loss, often the largest tensors: 12 s V bytes (``LOSS_BYTES_PER_LOGIT``:
at the loss's backward, the fp32 log-softmax output it saved, its gradient and the gradient of
its input, whatever the logits' dtype).

Two terms depend on the precision beyond the element size. Under autocast (``bf16_mixed``), eager
attention keeps fp32 probabilities (softmax is on autocast's fp32 list), so the s x s terms are
7 B per score there (``score_bytes``); the dropout mask is one byte in every precision. And
autocast caches a 16-bit copy of every matmul weight it casts until the forward's autocast
region exits, and the matmuls save those copies for the backward (``autocast_copy_bytes``:
2 B per matmul weight, per step, not per sample).

Activation checkpointing of each layer (what the templates apply to the ``wrap_modules()``
blocks) keeps each layer's 2 s h input and recomputes one layer at a time.
Selective checkpointing is the templates' op-level policy (torchtitan's, not Korthikanti's: the
paper's selective recomputation keeps the 34 s h and drops the 5 a s^2, which flash attention
already drops, so with SDPA it would save nothing): each layer keeps its input, its attention
output (2 s h) and the output of every other matmul in the order the layer runs them
(``_selective_layer``), and recomputes the rest, one layer at a time.
fp32 activations double every term but the scores' dropout mask (``score_bytes``). ``--params``
alone gives exact model states and says that activations are unknown.

Encoder-decoder models (T5, mT5, BART, mBART, Whisper) have an encoder stack in front of the
decoder stack that makes the logits (``encoder_layers`` in front of ``layers``). The decoder is
``seq_len`` tokens long and the encoder is too, unless the config fixes the encoder's length
(Whisper: ``max_source_positions`` audio frames after its convolutions, which the model checks),
because a config names no target length and a plan has one ``--seq-len``. An encoder layer is
the layer above at the encoder's length ``e``; a decoder layer adds cross-attention, whose query
side keeps ``5 s h`` (its norm's output, the queries, the output projection's input and dropout
mask) and whose keys and values, projected from the encoder's output in every layer, ``4 e h``
(plus ``5 a s e`` without flash), and a third norm (``2 s h``). Whisper's convolution front end
keeps its input and both convolutions' outputs and activations (``4 m e + 10 e h`` for ``m``
mel bins).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.status import UsageError

#: model_type values of decoder LLMs whose layers look like Llama's (RMSNorm, RoPE, GQA, SwiGLU).
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "gemma", "phi3")
#: model_type values of encoder-decoder models: an encoder stack, then a decoder with
#: cross-attention (T5 with its relative position biases; BART and Whisper with learned ones).
ENCODER_DECODER = ("t5", "mt5", "bart", "mbart", "whisper")
SUPPORTED = (*LLAMA_LIKE, "gpt2", "gpt_neox", "bert", "roberta", *ENCODER_DECODER)
#: The attention kernels an estimate can assume (``--attention``): flash attention and the
#: memory-efficient kernel keep O(s) statistics per head; math keeps the s x s scores,
#: probabilities and dropout mask (the 5 a s^2 term).
ATTENTION = ("flash", "efficient", "math")
#: A config's ``attn_implementation`` (transformers' names) -> the kernel it runs on a GPU;
#: ``sdpa`` (transformers' default) and an absent one: what PyTorch's SDPA picks (None).
CONFIG_ATTENTION = {"eager": "math", "flash_attention_2": "flash", "flash_attention_3": "flash",
                    "sdpa": None}
#: model_type values whose attention projects queries, keys and values in one matmul (and, for
#: phi3, whose MLP projects gate and up in one): selective checkpointing keeps every other
#: matmul output, so the grouping decides which are kept.
#: Bytes per logit at the loss's backward (the step's activation peak): cross-entropy saves its
#: fp32 log-softmax output (4 B; the logits are cast to fp32 first when 16-bit, a copy freed
#: after the log-softmax since its backward needs only the output), and the backward makes the
#: gradient of that output (nll_loss's backward, a dense fp32 tensor, 4 B) and, from both, the
#: gradient of the log-softmax's input (fp32, 4 B) before either is freed: 12 B. The forward's
#: moment at the loss holds less (16-bit logits 2 + fp32 copy 4 + log-softmax output 4 = 10;
#: fp32: 8). The 16-bit logits themselves are gone by the backward: the training step returns
#: the loss, not the model's output (torchtitan deletes ``pred``; a Trainer drops ``outputs``).
LOSS_BYTES_PER_LOGIT = 12
FUSED_QKV = ("gpt2", "gpt_neox", "phi3")
FUSED_GATE_UP = ("phi3",)
#: model_type values whose norms are ``nn.LayerNorm`` (the rest: RMSNorm, T5's scale-only norm).
#: CUDA autocast runs ``layer_norm`` in fp32 (its fp32 list): it saves an fp32 copy of its input
#: and returns fp32 whatever the weights' dtype, so under autocast the stream around these norms
#: is fp32 even when FSDP gathers bf16 weights. An RMSNorm's output takes the weights' dtype
#: (``weight * x.to(input_dtype)``): fp32 only over fp32 weights (one GPU, DDP).
LAYER_NORM = ("gpt2", "gpt_neox", "bert", "roberta", "bart", "mbart", "whisper")


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
    #: An encoder-decoder's encoder stack, in front of ``layers`` (its decoder, which makes the
    #: logits); 0 for one stack (a decoder, or an encoder alone like BERT's).
    encoder_layers: int = 0
    #: The encoder's length where the config fixes it (Whisper's audio frames after the
    #: convolutions); None: ``seq_len``, the same as the decoder's.
    encoder_seq_len: int | None = None
    #: The encoder's own weights (not the shared token embedding): they see the encoder's
    #: tokens, the rest the decoder's, which matters for FLOPs when the two lengths differ.
    encoder_parameters: int = 0
    audio_channels: int = 0  # Whisper's mel bins: the convolution front end's input channels
    #: The attention kernel (one of ATTENTION); None: what CUDA's SDPA picks, a fused kernel
    #: on an Ampere or newer GPU for every precision (flash for 16-bit, memory-efficient for
    #: fp32; launcher/estimate/_sdpa_cuda.py has the rules).
    attention: str | None = None
    #: The output layer is the token embedding's matrix (``tie_word_embeddings``): autocast casts
    #: that matrix for the logits' matmul although the lookup never is.
    tied_output: bool = False

    @property
    def fused_attention(self) -> bool:
        """Whether attention keeps O(s) statistics (flash, efficient) rather than the s x s
        scores (math: eager implementations, or SDPA's fallback)."""
        return self.attention != "math"

    @property
    def encoder_decoder(self) -> bool:
        return self.encoder_layers > 0

    @property
    def knows_activations(self) -> bool:
        return None not in (self.layers, self.hidden, self.heads, self.vocab, self.seq_len,
                            self.intermediate)

    def _selective_layer(self, t: int, cross: int = 0) -> int:
        """Elements one layer keeps under selective checkpointing at length ``t`` (``cross``:
        attending to an encoder of that length): its input, each attention's output, and the
        outputs of the 1st, 3rd, 5th... matmul it runs (projections of queries, keys and
        values, output; MLP in, out). A mixture of experts runs a data-dependent number of
        matmuls; counted as ``experts_per_token`` MLPs in a row."""
        h, a, i = self.hidden, self.heads, self.intermediate
        assert h is not None and a is not None and i is not None
        kv = h * (self.kv_heads or a) // a
        fused = self.model_type in FUSED_QKV
        outputs = [t * (h + 2 * kv)] if fused else [t * h, t * kv, t * kv]
        outputs.append(t * h)
        if cross:
            outputs += [t * h, cross * kv, cross * kv, t * h]
        if not self.gated_mlp:
            mlp = [t * i, t * h]
        elif self.model_type in FUSED_GATE_UP:
            mlp = [2 * t * i, t * h]
        else:
            mlp = [t * i, t * i, t * h]
        outputs += mlp * self.experts_per_token
        attention_outputs = t * h * (2 if cross else 1)
        return t * h + attention_outputs + sum(outputs[::2])

    def fp32_stream(self, autocast: bool, fp32_weights: bool = True) -> bool:
        """Whether the residual stream and the norms' outputs are fp32 in a 16-bit step: under
        autocast over fp32 weights always (the embedding lookup is not cast, and adding a 16-bit
        output to an fp32 input is fp32), over bf16 weights (FSDP's gathers) only where the
        norms are LayerNorms, which CUDA autocast runs in fp32 (``LAYER_NORM``)."""
        return autocast and (fp32_weights or self.model_type in LAYER_NORM)

    def _stream_layer_bytes(self, t: int, cross: int = 0) -> int:
        """Bytes one layer at length ``t`` keeps beyond the 16-bit formula when its stream is
        fp32 (``fp32_stream``): each norm saves its input in fp32 (4 B an element, not 2), and
        each matmul that reads an fp32 tensor casts it and saves a 16-bit copy of its own (the
        formula counts one per norm: separate q, k and v save two more, separate gate and up
        one more, a router one more; a decoder's cross-attention keys and values each cast the
        encoder's output, ``2 x 2 e h``). Checked against a real CPU step of transformers'
        BertForMaskedLM under CUDA's autocast lists: 8 s h a layer, to the byte
        (tests/estimate/test_analytic.py)."""
        h, a, i = self.hidden, self.heads, self.intermediate
        assert h is not None and a is not None and i is not None
        norms = 3 if cross else 2
        copies = 0 if self.model_type in FUSED_QKV else 2
        if self.gated_mlp and self.model_type not in FUSED_GATE_UP:
            copies += self.experts_per_token  # each expert's gate and up cast their tokens
        if self.experts > 1:
            copies += 1  # the router
        return 2 * t * h * (norms + copies) + (4 * cross * h if cross else 0)

    def score_bytes(self, element_bytes: int = 2, autocast: bool = False) -> int:
        """Bytes eager ("math") attention keeps per attention score (the 5 a s^2 term).

        Korthikanti's 5 B in 16-bit: the softmax output (saved by its backward), the dropout
        mask (1 B: ``native_dropout``'s bool mask, in every precision) and the dropout output
        (saved by the matmul with the values). Under CUDA autocast softmax is on the fp32 list:
        the probabilities it saves are fp32 (4 B; BERT's fp32 additive mask already makes the
        scores fp32), dropout runs on them, and the matmul with the values saves the 16-bit
        copy autocast casts of its output (2 B): 4 + 1 + 2 = 7 B. Without autocast each of the
        two tensors is ``element_bytes``: 5 B in 16-bit, 9 B in fp32."""
        probabilities = 4 if autocast else element_bytes
        return probabilities + 1 + element_bytes

    def autocast_copy_bytes(self) -> int | None:
        """autocast's 16-bit copies of the matmul weights, alive from the forward to the backward
        (bytes per step, not per sample; None where the shape is unknown).

        CUDA autocast casts an fp32 leaf that requires grad (a weight) once per autocast region
        and caches the copy until the outermost region exits (``cached_cast``, aten/src/ATen/
        autocast_mode.cpp), which is after the loss; the matmuls save the copies for their
        backward, so without checkpointing they stay until each layer's backward, and with it
        they are alive at the end of the forward with the kept layer inputs (counted in both
        cases: with checkpointing an upper side by at most one layer's recomputation). Every
        weight outside the embeddings (a lookup, never cast) is counted; a tied output layer
        casts the embedding matrix. Norm weights (fp32 ops, not cast) are counted too: fewer
        than 0.1% of the weights. Only single-device and DDP plans hold these: FSDP's mixed
        precision gathers bf16 weights, which autocast does not cast (the planner removes them)."""
        if not self.knows_activations:
            return None
        # parameters - embeddings: the layers, the head's own weights (an untied output layer)
        matmul = self.parameters - (self.embedding_parameters or 0)
        if self.tied_output:
            matmul += (self.vocab or 0) * (self.hidden or 0)
        return 2 * matmul

    def activation_bytes_per_sample(self, *, element_bytes: int = 2, flash: bool | None = None,
                                    checkpointing: bool | str = False,
                                    autocast: bool = False,
                                    fp32_weights: bool = True) -> int | None:
        """Activations alive at the step's peak, per sample (``autocast``: 16-bit compute, the
        ``bf16_mixed`` precision: see ``score_bytes``; ``fp32_weights``: autocast over the fp32
        weights one GPU or DDP holds, not FSDP's bf16 gathers: see ``fp32_stream``)."""
        if not self.knows_activations:
            return None
        s, h, a, i, v, n = (self.seq_len, self.hidden, self.heads, self.intermediate, self.vocab,
                            self.layers)
        assert None not in (s, h, a, i, v, n)
        if flash is None:
            flash = self.fused_attention
        scale = element_bytes / 2  # the formulas are for 16-bit activations
        # the s x s terms in bytes, not scaled: see score_bytes
        score = 0 if flash else self.score_bytes(element_bytes, autocast)
        # an fp32 stream under autocast: the norms' fp32 inputs and the matmuls' own casts
        stream = element_bytes == 2 and self.fp32_stream(autocast, fp32_weights)
        # the stream's own tensors (a kept layer input, the embedding output, the last norm's
        # input) are 4 B an element there, not 2
        stream_scale = 2 * scale if stream else scale

        def layer_at(t: int, cross: int = 0) -> float:
            """One layer at length ``t``; ``cross``: attending to an encoder of that length."""
            attention = 11 * t * h
            # MoE: each token goes through experts_per_token experts' MLPs.
            mlp = (2 * t * h + 8 * t * i if self.gated_mlp else 3 * t * h + 4 * t * i)
            mlp *= self.experts_per_token
            norms = 4 * t * h
            scores = a * t * t
            if cross:
                attention += 5 * t * h + 4 * cross * h
                norms += 2 * t * h
                scores += a * t * cross
            extra = self._stream_layer_bytes(t, cross) if stream else 0
            return (attention + mlp + norms) * scale + score * scores + extra

        e, ne = self.encoder_seq_len or s, self.encoder_layers
        layer = layer_at(s, cross=e if ne else 0)
        logits = s * v * LOSS_BYTES_PER_LOGIT
        edges = 4 * s * h * stream_scale  # embedding output and the final norm
        kept = n * 2 * s * h * stream_scale  # checkpointing: each layer's input
        if ne:
            edges += 4 * e * h * stream_scale + (4 * self.audio_channels * e + 10 * e * h * (
                self.audio_channels > 0)) * scale
            kept += ne * 2 * e * h * stream_scale
        if checkpointing == "selective":
            # every layer keeps its input and what the policy saves; one layer at a time has the
            # rest recomputed (that layer whole: its kept part is not counted twice)
            decoder = self._selective_layer(s, e if ne else 0) * element_bytes
            encoder = self._selective_layer(e) * element_bytes if ne else 0
            if stream:  # the kept layer input is the fp32 stream
                decoder += 2 * s * h
                encoder += 2 * e * h if ne else 0
            whole = max(layer - decoder, layer_at(e) - encoder if ne else 0)
            return int(n * decoder + ne * encoder + whole + logits + edges)
        if checkpointing:  # one layer recomputed at a time: the larger of the two kinds
            return int(kept + max(layer, layer_at(e) if ne else 0) + logits + edges)
        return int(n * layer + ne * layer_at(e) + logits + edges)

    def flops_per_sample(self, seq_len: int | None = None) -> float | None:
        """Training FLOPs of one sample: 6 N s + 12 L h s^2 (PaLM, Chowdhery et al. 2022, App. B),
        with N the parameters a token goes through (MoE: only the routed experts).

        Encoder-decoder: the encoder's weights see its ``e`` tokens and the rest the decoder's
        ``s``; attention is 12 h (L_enc e^2 + L_dec s^2 + L_dec s e), the last term the
        decoder's cross-attention."""
        s = seq_len or self.seq_len
        if s is None:
            return None
        active = self.active_parameters
        if not self.encoder_decoder:
            attention = (12 * self.layers * self.hidden * s * s if self.layers and self.hidden
                         else 0)
            return 6.0 * active * s + attention
        e = self.encoder_seq_len or s
        n, ne, h = self.layers or 0, self.encoder_layers, self.hidden or 0
        encoder = self.encoder_parameters
        attention = 12 * h * (ne * e * e + n * s * s + n * s * e)
        return 6.0 * (encoder * e + (active - encoder) * s) + attention

    @property
    def largest_parameter(self) -> int | None:
        """Elements of the largest weight tensor, where the shape says (None otherwise): the
        token embedding or an untied output layer (``vocab x hidden``), an MLP matrix, a fused
        query-key-value or gate-up projection. A for-loop optimizer's temporaries are one
        tensor's size at a time."""
        h, i, v = self.hidden, self.intermediate, self.vocab
        if h is None or i is None or v is None:
            return None
        mlp = (2 if self.model_type in FUSED_GATE_UP else 1) * h * i
        attention = h * (h + 2 * h * (self.kv_heads or self.heads or 1) // (self.heads or 1))
        return max(v * h, mlp, attention if self.model_type in FUSED_QKV else h * h)

    @property
    def active_parameters(self) -> int:
        if self.experts <= 1 or self.layers is None or self.hidden is None or not self.intermediate:
            return self.parameters
        per_expert = 3 * self.hidden * self.intermediate
        idle = (self.experts - self.experts_per_token) * per_expert * self.layers
        return self.parameters - idle


#: The most a size in a config may be: beyond any model, and small enough that every count and
#: byte figure made of it stays a finite float.
MAX_SIZE = 2**31 - 1
#: Sizes that may be 0 (BERT-like encoders without token types); every other one is at least 1.
MAY_BE_ZERO = ("type_vocab_size",)


def _get(config: dict[str, Any], *names: str, default: Any = None) -> Any:
    """The first of ``names`` the config sets (not null): a size, so a whole number from 1 to
    MAX_SIZE (a UsageError naming the field otherwise: ``"4096"``, 0 heads, -1 layers)."""
    for name in names:
        value = config.get(name)
        if value is not None:
            return _size(name, value)
    return default


def _size(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise UsageError(f"{name} must be a whole number, not {_show(value)}")
    least = 0 if name in MAY_BE_ZERO else 1
    if value < least:
        raise UsageError(f"{name} must be at least {least}, not {_show(value)}")
    if value > MAX_SIZE:
        raise UsageError(f"{name} must be at most {MAX_SIZE}, not {_show(value)}")
    return value


def _flag(config: dict[str, Any], name: str, default: bool) -> bool:
    """A true/false field (``tie_word_embeddings``): a JSON boolean, or absent/null."""
    value = config.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be true or false, not {_show(value)}")
    return value


def _show(value: Any) -> str:
    text = json.dumps(value) if _jsonable(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def shape_from_config(config: dict[str, Any], *, seq_len: int | None = None,
                      attention: str | None = None) -> ModelShape:
    """An exact parameter count and the shape from a Hugging Face ``config.json``;
    ``attention`` (``--attention``) overrides the kernel the config names."""
    shape = _shape_from_config(config, seq_len=seq_len)
    return dataclasses.replace(shape, attention=attention or _config_attention(config))


def _config_attention(config: dict[str, Any]) -> str | None:
    """The kernel a config's ``attn_implementation`` runs (None: SDPA's choice); a name launch
    does not know (flex attention, a hub kernel) is left to SDPA's choice too."""
    name = config.get("attn_implementation", config.get("_attn_implementation"))
    return CONFIG_ATTENTION.get(name) if isinstance(name, str) else None


def _shape_from_config(config: dict[str, Any], *, seq_len: int | None = None) -> ModelShape:
    kind = config.get("model_type")
    if kind not in SUPPORTED:
        raise UsageError(f"model_type {_show(kind)} is not one launch can size from its config",
                         f"supported: {', '.join(SUPPORTED)}; or give --params")
    if kind in ENCODER_DECODER:
        return _encoder_decoder_shape(config, kind, seq_len=seq_len)
    h = _get(config, "hidden_size", "n_embd", "d_model")
    n = _get(config, "num_hidden_layers", "n_layer", "num_layers")
    a = _get(config, "num_attention_heads", "n_head")
    v = _get(config, "vocab_size")
    if None in (h, n, a, v):
        raise UsageError("the config lacks hidden_size, num_hidden_layers, "
                         "num_attention_heads or vocab_size")
    positions = _get(config, "max_position_embeddings", "n_positions", "n_ctx")
    s = seq_len or positions
    tied = _flag(config, "tie_word_embeddings", kind in ("gpt2", "bert", "roberta"))
    if kind in LLAMA_LIKE:
        kv = _get(config, "num_key_value_heads", default=a)
        hd = _get(config, "head_dim", default=h // a)
        i = _get(config, "intermediate_size", "moe_intermediate_size")
        experts = _get(config, "num_local_experts", "num_experts", default=1)
        top_k = _get(config, "num_experts_per_tok", default=1)
        bias = _flag(config, "attention_bias", kind == "qwen2")
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
                          layer_parameters=layer, embedding_parameters=embed,
                          tied_output=tied)
    if kind == "gpt2":
        i = _get(config, "n_inner", default=4 * h)
        layer = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h)
        embed = v * h + positions * h
        total = embed + n * layer + 2 * h
        return ModelShape(parameters=total, model_type=kind, layers=n, hidden=h, heads=a,
                          kv_heads=a, intermediate=i, vocab=v, seq_len=s, gated_mlp=False,
                          layer_parameters=layer, embedding_parameters=embed, tied_output=tied)
    if kind == "gpt_neox":
        i = _get(config, "intermediate_size", default=4 * h)
        layer = 4 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
        embed = v * h
        total = embed + n * layer + 2 * h + (0 if tied else v * h)
        return ModelShape(parameters=total, model_type=kind, layers=n, hidden=h, heads=a,
                          kv_heads=a, intermediate=i, vocab=v, seq_len=s, gated_mlp=False,
                          layer_parameters=layer, embedding_parameters=embed, tied_output=tied)
    # bert / roberta encoders (the base model with its pooler, as BertModel builds it).
    i = _get(config, "intermediate_size", default=4 * h)
    types = _get(config, "type_vocab_size", default=2)
    layer = 3 * (h * h + h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    embed = v * h + positions * h + types * h + 2 * h
    total = embed + n * layer + (h * h + h)
    return ModelShape(parameters=total, model_type=kind, layers=n, hidden=h, heads=a, kv_heads=a,
                      intermediate=i, vocab=v, seq_len=s, gated_mlp=False,
                      layer_parameters=layer, embedding_parameters=embed, tied_output=tied)


def _encoder_decoder_shape(config: dict[str, Any], kind: str, *, seq_len: int | None
                           ) -> ModelShape:
    """T5/mT5, BART/mBART and Whisper, as ``*ForConditionalGeneration`` builds them.

    One token embedding is shared by the encoder, the decoder and (tied) the output layer. T5's
    weights have no biases; its norms are a scale only, and the first layer of each stack holds
    the relative position biases (buckets x heads). BART's and Whisper's layers have biases
    (Whisper's key projection has none) and learned positions; BART keeps 2 more rows of
    positions than ``max_position_embeddings`` (its offset), mBART adds a final norm to each
    stack. Whisper's encoder starts with two convolutions over the mel bins, and its positions
    cover ``max_source_positions`` frames.
    """
    h = _get(config, "d_model", "hidden_size")
    v = _get(config, "vocab_size")
    if kind in ("t5", "mt5"):
        ne = _get(config, "num_layers", "num_hidden_layers")
        a = _get(config, "num_heads", "num_attention_heads")
    else:
        ne = _get(config, "encoder_layers", "num_hidden_layers")
        a = _get(config, "decoder_attention_heads", "num_attention_heads")
    nd = _get(config, "num_decoder_layers", "decoder_layers", default=ne)
    if None in (h, ne, a, v):
        raise UsageError(f"the {kind} config lacks d_model, its layer counts, attention heads "
                         "or vocab_size")
    # Configs say tie_word_embeddings false for untied checkpoints (T5 v1.1, FLAN-T5, mT5): a
    # run that loads one has its own output layer, whatever transformers builds from the config.
    tied = _flag(config, "tie_word_embeddings", True)
    embed = v * h
    audio = 0
    encoder_len = None
    if kind in ("t5", "mt5"):
        inner = a * _get(config, "d_kv", default=h // a)
        i = _get(config, "d_ff", default=4 * h)
        gated = str(config.get("feed_forward_proj", "gated-gelu" if kind == "mt5" else "relu")
                    ).startswith("gated")
        attention, mlp = 4 * h * inner, (3 if gated else 2) * h * i
        bias = _get(config, "relative_attention_num_buckets", default=32) * a
        enc_layer = attention + mlp + 2 * h
        dec_layer = 2 * attention + mlp + 3 * h
        encoder = ne * enc_layer + bias + h
        decoder = nd * dec_layer + bias + h
        largest = dec_layer + bias  # the first decoder block, with the position biases
        positions = _get(config, "n_positions", "max_position_embeddings")
    else:
        i = _get(config, "decoder_ffn_dim", "intermediate_size", default=4 * h)
        i_enc = _get(config, "encoder_ffn_dim", default=i)
        gated = False
        attention = 4 * (h * h + h) - (h if kind == "whisper" else 0)  # Whisper: no k bias
        enc_layer = attention + (h * i_enc + i_enc) + (i_enc * h + h) + 4 * h
        dec_layer = 2 * attention + (h * i + i) + (i * h + h) + 6 * h
        final = 2 * h if kind in ("mbart", "whisper") else 0
        if kind == "whisper":
            audio = _get(config, "num_mel_bins", default=80)
            encoder_len = _get(config, "max_source_positions", default=1500)
            positions = _get(config, "max_target_positions", default=448)
            front = (audio * h * 3 + h) + (h * h * 3 + h)  # two convolutions, kernel 3
            encoder = front + encoder_len * h + ne * enc_layer + final
            decoder = positions * h + nd * dec_layer + final
        else:
            positions = _get(config, "max_position_embeddings", default=1024)
            # learned positions (2 rows of offset) and the embedding's norm, in each stack
            encoder = (positions + 2) * h + 2 * h + ne * enc_layer + final
            decoder = (positions + 2) * h + 2 * h + nd * dec_layer + final
        largest = dec_layer
    total = embed + encoder + decoder + (0 if tied else v * h)
    return ModelShape(parameters=total, model_type=kind, layers=nd, hidden=h, heads=a,
                      kv_heads=a, intermediate=i, vocab=v, seq_len=seq_len or positions,
                      gated_mlp=gated, layer_parameters=largest, embedding_parameters=embed,
                      encoder_layers=ne, encoder_seq_len=encoder_len,
                      encoder_parameters=encoder, audio_channels=audio, tied_output=tied)


def load_config(path: Path, *, seq_len: int | None = None, attention: str | None = None
                ) -> ModelShape:
    """The shape of the model ``--model-config`` describes; a UsageError that names the file
    (and the field) for a file that is missing, a folder, not JSON, or not a config launch can
    size."""
    config = read_config(path)
    try:
        return shape_from_config(config, seq_len=seq_len, attention=attention)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc.message}", exc.hint) from None


def read_config(path: Path) -> dict[str, Any]:
    """``--model-config``'s JSON object (also what estimate/hf_recipe.py writes its recipe
    from): a UsageError naming the file for anything else."""
    try:
        if path.is_dir():
            inside = path / "config.json"
            raise UsageError(f"--model-config {path} is a folder",
                             f"give the file: --model-config {inside}" if inside.is_file()
                             else "give a Hugging Face config.json file")
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"model config not found: {path}") from None
    except OSError as exc:
        raise UsageError(f"cannot read model config {path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deeply
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(f"{path}: not a JSON config ({detail[:200]})") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: not a Hugging Face config (expected a JSON object)")
    return config


def shape_from_params(parameters: int, *, layers: int | None = None, hidden: int | None = None,
                      heads: int | None = None, vocab: int | None = None,
                      seq_len: int | None = None, intermediate: int | None = None,
                      attention: str | None = None) -> ModelShape:
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
                      gated_mlp=gated, layer_parameters=layer, attention=attention)
