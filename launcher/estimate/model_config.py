"""A Hugging Face ``config.json`` (or ``--params``) as the analytic estimate's ``ModelShape``.

``--model-config`` names a model by its config: this module reads it (a one-line UsageError that
names the file and the field for anything it cannot size) and counts the parameters exactly as
transformers builds the architecture the config names: Llama-like decoders, GPT-2, GPT-NeoX,
BERT and RoBERTa encoders, the encoder-decoders (T5, mT5, BART, mBART, Whisper), a language
model or a sequence classifier (``architectures``), checked against published counts and
transformers' own in the tests. ``launcher.estimate.analytic`` turns the shape into bytes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from launcher.estimate.analytic import ModelShape
from launcher.status import UsageError
from launcher.userfiles import CONFIG_LIMIT, read_text

#: model_type values of decoder LLMs whose layers look like Llama's (RMSNorm, RoPE, GQA, SwiGLU).
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "gemma", "phi3")
#: model_type values of encoder-decoder models: an encoder stack, then a decoder with
#: cross-attention (T5 with its relative position biases; BART and Whisper with learned ones).
ENCODER_DECODER = ("t5", "mt5", "bart", "mbart", "whisper")
SUPPORTED = (*LLAMA_LIKE, "gpt2", "gpt_neox", "bert", "roberta", *ENCODER_DECODER)
#: A config's ``attn_implementation`` (transformers' names) -> the kernel it runs on a GPU;
#: ``sdpa`` (transformers' default) and an absent one: what PyTorch's SDPA picks (None).
CONFIG_ATTENTION = {"eager": "math", "flash_attention_2": "flash", "flash_attention_3": "flash",
                    "sdpa": None}
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
        raise UnsupportedModelType(
            f"model_type {_show(kind)} is not one launch can size from its config",
            f"supported: {', '.join(SUPPORTED)}; or give --params",
            kind if isinstance(kind, str) else None)
    if kind in ENCODER_DECODER:
        return _encoder_decoder_shape(config, kind, seq_len=seq_len)
    h = _get(config, "hidden_size", "n_embd", "d_model")
    n = _get(config, "num_hidden_layers", "n_layer", "num_layers")
    a = _get(config, "num_attention_heads", "n_head")
    v = _get(config, "vocab_size")
    if None in (h, n, a, v):
        raise UsageError("the config lacks hidden_size, num_hidden_layers, "
                         "num_attention_heads or vocab_size")
    positions = max_positions(config)
    s = seq_len or positions
    labels = _classifier_labels(config)
    tied = labels is None and _flag(config, "tie_word_embeddings",
                                    kind in ("gpt2", "bert", "roberta"))
    # The output layer: the LM head's own matrix when untied, or a classifier's (no bias on a
    # decoder's ``score``; BERT's ``classifier`` and RoBERTa's ``out_proj`` have one).
    if labels is None:
        head = 0 if tied else v * h
    else:
        head = h * labels + (labels if kind in ("bert", "roberta") else 0)
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
        total = embed + n * layer + h + head
        return ModelShape(parameters=total, model_type=kind, layers=n, hidden=h, heads=a,
                          kv_heads=kv, intermediate=i, vocab=v, seq_len=s, gated_mlp=True,
                          experts=experts, experts_per_token=top_k if experts > 1 else 1,
                          layer_parameters=layer, embedding_parameters=embed,
                          tied_output=tied, labels=labels)
    if kind == "gpt2":
        i = _get(config, "n_inner", default=4 * h)
        layer = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h)
        embed = v * h + positions * h
        total = embed + n * layer + 2 * h + head  # tied unless the config says otherwise
        return ModelShape(parameters=total, model_type=kind, layers=n, hidden=h, heads=a,
                          kv_heads=a, intermediate=i, vocab=v, seq_len=s, gated_mlp=False,
                          layer_parameters=layer, embedding_parameters=embed, tied_output=tied,
                          labels=labels)
    if kind == "gpt_neox":
        i = _get(config, "intermediate_size", default=4 * h)
        layer = 4 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
        embed = v * h
        total = embed + n * layer + 2 * h + head
        return ModelShape(parameters=total, model_type=kind, layers=n, hidden=h, heads=a,
                          kv_heads=a, intermediate=i, vocab=v, seq_len=s, gated_mlp=False,
                          layer_parameters=layer, embedding_parameters=embed, tied_output=tied,
                          labels=labels)
    # bert / roberta encoders (the base model with its pooler, as BertModel builds it; RoBERTa's
    # classifier has a dense layer of the pooler's size in its place), plus a classifier's
    # matrix.
    i = _get(config, "intermediate_size", default=4 * h)
    types = _get(config, "type_vocab_size", default=2)
    layer = 3 * (h * h + h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    embed = v * h + positions * h + types * h + 2 * h
    total = embed + n * layer + (h * h + h) + (head if labels else 0)
    return ModelShape(parameters=total, model_type=kind, layers=n, hidden=h, heads=a, kv_heads=a,
                      intermediate=i, vocab=v, seq_len=s, gated_mlp=False,
                      layer_parameters=layer, embedding_parameters=embed, tied_output=tied,
                      labels=labels)


def _classifier_labels(config: dict[str, Any]) -> int | None:
    """The label count of a sequence-classification config (``architectures`` names a
    ``*ForSequenceClassification`` class: a fine-tune of BERT or of a decoder for labels), as
    transformers 5 reads it (``num_labels`` where given, which wins over an ``id2label`` of
    another length, else ``id2label``'s length, as a saved fine-tune's config has it, else 2);
    None for a language model. Encoder-decoders keep their LM head here (their classifiers run
    the decoder on one token: not modelled)."""
    names = config.get("architectures")
    first = names[0] if isinstance(names, list) and names else names
    if not (isinstance(first, str) and first.endswith("ForSequenceClassification")):
        return None
    given = _get(config, "num_labels")
    if given is not None:
        return given
    id2label = config.get("id2label")
    return len(id2label) if isinstance(id2label, dict) and id2label else 2


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


def max_positions(config: dict[str, Any]) -> int | None:
    """The longest sequence a decoder's or encoder's config names (its positions): the
    sequence length a plan takes when ``--seq-len`` is not given."""
    return _get(config, "max_position_embeddings", "n_positions", "n_ctx")


class UnsupportedModelType(UsageError):
    """A config whose ``model_type`` this module cannot size. Not the end of the road where
    transformers is installed: it builds every architecture it knows, and preflight then traces
    that model (launcher/preflight.py, ``_config_recipe``), from ``config``, the file as read."""

    def __init__(self, message: str, hint: str = "", model_type: str | None = None,
                 config: dict[str, Any] | None = None):
        super().__init__(message, hint)
        self.model_type = model_type
        self.config = config


def load_config(path: Path, *, seq_len: int | None = None, attention: str | None = None
                ) -> ModelShape:
    """The shape of the model ``--model-config`` describes; a UsageError that names the file
    (and the field) for a file that is missing, a folder, not JSON, or not a config launch can
    size."""
    config = read_config(path)
    try:
        return shape_from_config(config, seq_len=seq_len, attention=attention)
    except UnsupportedModelType as exc:
        raise UnsupportedModelType(f"{path}: {exc.message}", exc.hint, exc.model_type,
                                   config) from None
    except UsageError as exc:
        raise UsageError(f"{path}: {exc.message}", exc.hint) from None


def read_config(path: Path) -> dict[str, Any]:
    """``--model-config``'s JSON object (also what estimate/hf_recipe.py writes its recipe
    from): a UsageError naming the file for anything else. Read bounded
    (``userfiles.read_text``): a regular file of at most ``CONFIG_LIMIT`` bytes, so
    ``/dev/zero``, a FIFO or a 1 GB file is a one-line refusal, not an unbounded read."""
    try:
        folder = path.is_dir()
    except OSError:  # a name too long: read_text says so
        folder = False
    if folder:
        inside = path / "config.json"
        raise UsageError(f"--model-config {path} is a folder",
                         f"give the file: --model-config {inside}" if inside.is_file()
                         else "give a Hugging Face config.json file")
    text = read_text(path, "model config", CONFIG_LIMIT, "give a Hugging Face config.json file")
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as exc:  # not JSON, nested too deeply
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


@dataclasses.dataclass(frozen=True)
class ReferenceDecoder:
    """A published decoder's shape (its Hugging Face ``config.json``), to stand in for a model
    known only by ``--params``: what a "7B" or "70B" model usually is."""

    name: str
    source: str  # the config.json it is copied from
    layers: int
    hidden: int
    heads: int
    kv_heads: int  # grouped-query attention where the family uses it (fewer than heads)
    intermediate: int
    vocab: int
    tied: bool = False

    def config(self, layers: int | None = None) -> dict[str, Any]:
        """The config as ``shape_from_config`` reads it, ``layers`` deep (its own depth when
        None)."""
        return {"model_type": "llama", "hidden_size": self.hidden,
                "num_hidden_layers": layers or self.layers,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
                "intermediate_size": self.intermediate, "vocab_size": self.vocab,
                "tie_word_embeddings": self.tied}


_HF = "https://huggingface.co/{}/blob/main/config.json"
#: The Llama families' published shapes, smallest first: the shape a ``--params`` count takes
#: when nothing else describes the model (``assumed_shape``). Llama 2 and LLaMA-1 30B use
#: multi-head attention (kv_heads == heads) below 70B; Code Llama 34B, Llama 2 70B and every
#: Llama 3 model group their keys and values (8 KV heads).
REFERENCE_DECODERS: tuple[ReferenceDecoder, ...] = (
    ReferenceDecoder("Llama 3.2 1B", _HF.format("meta-llama/Llama-3.2-1B"),
                     16, 2048, 32, 8, 8192, 128256, tied=True),
    ReferenceDecoder("Llama 3.2 3B", _HF.format("meta-llama/Llama-3.2-3B"),
                     28, 3072, 24, 8, 8192, 128256, tied=True),
    ReferenceDecoder("Llama 2 7B", _HF.format("meta-llama/Llama-2-7b-hf"),
                     32, 4096, 32, 32, 11008, 32000),
    ReferenceDecoder("Llama 3.1 8B", _HF.format("meta-llama/Llama-3.1-8B"),
                     32, 4096, 32, 8, 14336, 128256),
    ReferenceDecoder("Llama 2 13B", _HF.format("meta-llama/Llama-2-13b-hf"),
                     40, 5120, 40, 40, 13824, 32000),
    ReferenceDecoder("LLaMA 30B", _HF.format("huggyllama/llama-30b"),
                     60, 6656, 52, 52, 17920, 32000),
    ReferenceDecoder("Code Llama 34B", _HF.format("meta-llama/CodeLlama-34b-hf"),
                     48, 8192, 64, 8, 22016, 32000),
    ReferenceDecoder("Llama 2 70B", _HF.format("meta-llama/Llama-2-70b-hf"),
                     80, 8192, 64, 8, 28672, 32000),
    ReferenceDecoder("Llama 3.1 70B", _HF.format("meta-llama/Llama-3.1-70B"),
                     80, 8192, 64, 8, 28672, 128256),
    ReferenceDecoder("Llama 3.1 405B", _HF.format("meta-llama/Llama-3.1-405B"),
                     126, 16384, 128, 8, 53248, 128256),
)
#: The smallest parameter count a shape is assumed for (``assumed_shape``): below the published
#: references (Llama 3.2 1B: 1.24B, 262M of it embeddings), a Llama shape would be mostly
#: vocabulary and its activations nothing like the model's (``--params 9`` became a one-layer
#: decoder with a 128K vocabulary at sequence 4096, and nothing fit); such a model is planned
#: on its states, its activations unknown, as before.
ASSUMED_FROM = 1_000_000_000
#: The sequence length an assumed shape is sized at without ``--seq-len``: Llama 2's context
#: and the common fine-tuning length (torchtitan's and llama-recipes' runs use 4096 or 8192).
ASSUMED_SEQ_LEN = 4096
#: A reference this close to the declared count (either side) is taken at its own depth.
SAME_SIZE = 0.05


@dataclasses.dataclass(frozen=True)
class AssumedShape:
    """``assumed_shape``'s answer: the shape, and the words the plan says it with."""

    shape: ModelShape
    reference: ReferenceDecoder
    note: str


def assumed_shape(parameters: int, *, seq_len: int | None = None,
                  attention: str | None = None) -> AssumedShape:
    """A decoder shape for a model known only by its parameter count, so that its activations
    (and with them a yes or no to "does it fit") can be estimated at all.

    The reference is the published Llama shape nearest in parameters (by ratio); its depth is
    then changed so that the count comes out nearest ``parameters`` (a 30B is LLaMA 30B's
    layers, 6656 wide, 55 deep), unless the reference is within ``SAME_SIZE`` of it (a "70B"
    is Llama 3.1 70B as published, 80 layers), keeping the width, heads, grouping and
    vocabulary of a real model. The model states stay the declared count exactly; the shape
    only sizes the activations, FSDP's unit (one layer) and the FLOPs. At ``seq_len``
    (``ASSUMED_SEQ_LEN`` when None). The note says all this and how to give the real shape."""
    import math

    def distance(ref: ReferenceDecoder) -> float:
        return abs(math.log(parameters / _shape_from_config(ref.config()).parameters))

    ref = min(REFERENCE_DECODERS, key=distance)
    layers = ref.layers
    if distance(ref) > math.log(1 + SAME_SIZE):
        one = _shape_from_config(ref.config(layers=1))
        layer = one.layer_parameters or 1
        fixed = one.parameters - layer  # embeddings, the final norm, the output layer
        layers = max(1, round((parameters - fixed) / layer))
    s = seq_len or ASSUMED_SEQ_LEN
    shape = dataclasses.replace(shape_from_config(ref.config(layers), seq_len=s,
                                                  attention=attention), parameters=parameters)
    depth = "" if layers == ref.layers else f", {layers} layers deep (it has {ref.layers})"
    grouping = (f"{ref.kv_heads} KV heads" if ref.kv_heads < ref.heads
                else "multi-head attention")
    length = f"sequence {s}" + ("" if seq_len else " (assumed; --seq-len to change)")
    note = (f"shape assumed from the parameter count: {ref.name}'s ({ref.source}): hidden "
            f"{ref.hidden}, {ref.heads} heads, {grouping}, MLP {ref.intermediate}, vocabulary "
            f"{ref.vocab}{depth}; {length}; give the real shape with --model-config, the "
            "shape flags (--layers --hidden-size --heads --vocab-size) or a recipe to trace")
    return AssumedShape(shape=shape, reference=ref, note=note)
