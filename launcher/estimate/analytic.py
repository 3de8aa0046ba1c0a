"""The analytic estimate: the memory of a model known by its shape (``ModelShape``), not traced.

For models too large to trace on a laptop, or scripts launch cannot import; the shape comes from
a Hugging Face ``config.json`` or from ``--params`` (``launcher.estimate.model_config``, whose
parameter counts are exact).
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
blocks) keeps each layer's 2 s h input and recomputes one layer at a time. The loss's backward
(the 12 B per logit) is over before the last layer is recomputed: under checkpointing the peak
holds the larger of the two, not both (without it every layer's activations are alive at the
loss, and the two add up).
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

from dataclasses import dataclass

#: The attention kernels an estimate can assume (``--attention``): flash attention and the
#: memory-efficient kernel keep O(s) statistics per head; math keeps the s x s scores,
#: probabilities and dropout mask (the 5 a s^2 term).
ATTENTION = ("flash", "efficient", "math")
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
    #: fp32; launcher/estimate/child/_sdpa_cuda.py has the rules).
    attention: str | None = None
    #: The output layer is the token embedding's matrix (``tie_word_embeddings``): autocast casts
    #: that matrix for the logits' matmul although the lookup never is.
    tied_output: bool = False
    #: A sequence-classification head (the config's ``architectures`` names a
    #: ``*ForSequenceClassification`` class) with this many labels, in place of the
    #: language-model head: no ``s x vocab`` logits, no output matrix. None: the LM head.
    labels: int | None = None

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
        if self.tied_output and self.labels is None:
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
        # a classifier's logits: at most one row of labels per token (a decoder scores every
        # position, then pools the last; BERT scores its pooled first token)
        logits = s * (v if self.labels is None else self.labels) * LOSS_BYTES_PER_LOGIT
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
            return int(n * decoder + ne * encoder + max(whole, logits) + edges)
        if checkpointing:  # one layer recomputed at a time: the larger of the two kinds
            return int(kept + max(layer, layer_at(e) if ne else 0, logits) + edges)
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
