"""A Hugging Face ``config.json`` as a launch recipe, so that it is traced instead of estimated.

``launch plan train.py --model-config config.json`` describes a plain script that launch cannot
import by the model's config. Where ``transformers`` is installed, ``write_recipe`` turns that
config into a recipe (``build_model``, ``example_batch``, ``training_step``, ``wrap_modules``)
that builds the architecture with transformers itself; the traced estimator
(``launcher.estimate.traced``) then runs its training step on fake tensors like any recipe's.

The recipe's source is one fixed text (``RECIPE_SOURCE``): the config and the sequence length
reach it as data, in ``recipe.json`` next to it, never spliced into code. What it builds:

- the config: transformers' config class for ``model_type``, ``from_dict`` of the file (its
  ``auto_map`` dropped: no remote code is ever run), with ``use_cache=False`` (training keeps no
  KV cache);
- the model: the class named first in ``architectures`` when transformers has it and it is a
  causal, masked or sequence-to-sequence language-model head (``LlamaForCausalLM``,
  ``BertForMaskedLM``, ``T5ForConditionalGeneration``) or a sequence classifier
  (``BertForSequenceClassification``, ``LlamaForSequenceClassification``: a fine-tune for
  labels, whose logits are a row of labels, not of the vocabulary; a decoder's without a pad
  token gets token 0 as one, which it needs to find each row's last token; an encoder-decoder's
  classifier is not built: its LM head is); otherwise, for an encoder-decoder
  config (T5, BART, Whisper), the head ``AutoModelForSeq2SeqLM`` maps it to, else
  ``AutoModelForSpeechSeq2Seq``'s; for the others the head ``AutoModelForMaskedLM`` maps the
  config to (encoders: BERT, RoBERTa), else the one ``AutoModelForCausalLM`` does (decoder
  LLMs). fp32 weights whatever the config's ``dtype`` (the precision is the launch's to apply),
  in training mode. A config that says ``tie_word_embeddings: false`` gets an output layer of
  its own even where transformers ties it regardless (T5 and mT5 since transformers 5: their
  FLAN-T5 and mT5 checkpoints hold both weights, and loading one unties them);
- attention: ``sdpa``, what a GPU run of transformers uses by default (eager only for a model
  that does not support it, as transformers itself falls back);
- ``example_batch(b)``: ``input_ids`` and ``labels`` of ``[b, seq_len]`` random token ids (a
  classifier's ``labels`` as its ``problem_type`` reads them: ``[b]`` classes, ``[b, labels]``
  0/1 for multi-label, values for regression); for
  a sequence-to-sequence head, ``input_ids`` (Whisper: ``input_features``, ``[b, mel bins,
  2 max_source_positions]``, the length its encoder requires) and ``decoder_input_ids`` and
  ``labels`` of ``[b, seq_len]``: the decoder is as long as the encoder unless the config fixes
  the encoder's length (the analytic estimate's assumption, launcher/estimate/analytic.py);
  ``training_step``: ``model(**batch).loss``;
- ``wrap_modules()``: the block classes named by the model's ``_no_split_modules`` that repeat
  in a ``ModuleList`` (the decoder or encoder layers), found in the built model.

Two transformers paths that differ on fake tensors are set to what a real run takes (the packed-
sequence test; see ``_as_on_real_tensors`` in the recipe and docs/estimator.md, "Hugging Face
configs").

A model_type or architecture transformers does not know raises ``UnknownArchitecture`` in the
recipe, which the trace reports as a ``TraceError``; the caller falls back to the analytic
estimate. This module imports neither torch nor transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

RECIPE_NAME = "recipe.py"
SIDECAR_NAME = "recipe.json"
#: The attention implementation the recipe asks transformers for (see the module docstring).
ATTN_IMPLEMENTATION = "sdpa"

RECIPE_SOURCE = '''\
"""A launch recipe for a Hugging Face architecture, written by launcher.estimate.hf_recipe.

This text is the same for every model: the config and the sequence length are data, read from
recipe.json next to this file.
"""

import functools
import json
import weakref
from pathlib import Path

import torch

_SETTINGS = json.loads(Path(__file__).with_name("recipe.json").read_text(encoding="utf-8"))
SEQ_LEN = int(_SETTINGS["seq_len"])
# "sdpa" unless the plan says the model runs eager attention (launch's --attention math)
ATTN_IMPLEMENTATION = _SETTINGS.get("attn_implementation", "sdpa")
_built = []  # a weak reference to the last model build_model() made, for wrap_modules()


class UnknownArchitecture(LookupError):
    """transformers has no class for this config."""


def _names(value):
    return [value] if isinstance(value, str) else list(value or ())


@functools.cache
def _config():
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    data = dict(_SETTINGS["config"])
    data.pop("auto_map", None)  # remote code is never run
    for key in ("torch_dtype", "dtype"):  # fp32 weights: the precision is launch's to apply
        data.pop(key, None)
    kind = data.get("model_type")
    if kind not in CONFIG_MAPPING:
        raise UnknownArchitecture(
            f"transformers {transformers.__version__} does not know model_type {kind!r}")
    config = CONFIG_MAPPING[kind].from_dict(data)
    config.use_cache = False
    first = _names(data.get("architectures"))[:1]
    if first and first[0].endswith("ForSequenceClassification") and getattr(
            config, "pad_token_id", None) is None:
        # a decoder's classifier pools each row's last non-pad token and refuses a batch of
        # more than one row without a pad token; which token it is changes no memory
        config.pad_token_id = 0
    return config


def _heads(*mappings):
    return {name for mapping in mappings for names in mapping.values() for name in _names(names)}


@functools.cache
def _seq2seq_heads():
    """Encoder-decoder heads with a language-model loss: text (T5, BART) and speech (Whisper)."""
    from transformers.models.auto import modeling_auto

    return _heads(modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
                  modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES)


@functools.cache
def _classifier_heads():
    """Sequence classifiers: a fine-tune for labels (BertForSequenceClassification...)."""
    from transformers.models.auto import modeling_auto

    return _heads(modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)


@functools.cache
def _model_class():
    import transformers
    from transformers.models.auto import modeling_auto

    config = _config()
    kind = config.model_type
    heads = _heads(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                   modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES) | _seq2seq_heads()
    architectures = _names(_SETTINGS["config"].get("architectures"))
    if architectures:
        name = architectures[0]
        if not hasattr(transformers, name):
            raise UnknownArchitecture(
                f"transformers {transformers.__version__} has no class {name} "
                "(the config's architectures)")
        if name in heads or (name in _classifier_heads()
                             and not getattr(config, "is_encoder_decoder", False)):
            return getattr(transformers, name)
    # No architectures, or a class without a language-model loss (BertModel, T5Model): the LM
    # head. An encoder-decoder's is its sequence-to-sequence head (BART also has a causal one:
    # its decoder alone, not what the config describes).
    candidates = []
    if getattr(config, "is_encoder_decoder", False):
        candidates += _names(modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.get(kind))
        candidates += _names(modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES.get(kind))
    elif not getattr(config, "is_decoder", False):
        candidates += _names(modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES.get(kind))
    if not candidates:
        candidates += _names(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(kind))
    if candidates:
        return getattr(transformers, candidates[0])
    raise UnknownArchitecture(
        f"transformers {transformers.__version__} has no causal, masked or sequence-to-sequence "
        f"language-model head for model_type {kind!r}")


def _is_seq2seq():
    return _model_class().__name__ in _seq2seq_heads()


def _unpacked(position_ids):
    return None


@functools.cache
def _as_on_real_tensors():
    """Where transformers, given fake tensors, would not run what it runs on real ones.

    It checks whether the positions pack several sequences in one row, a data-dependent test it
    skips on fake tensors, assuming packing: it then builds a [b, 1, s, s] mask, and with a mask
    SDPA copies GQA's keys and values for every head. The batches here are never packed, so the
    answer is known: no packing, as a run on real tensors finds. (Mixture-of-experts layers'
    grouped_mm, whose meta kernel takes only bf16, is the trace child's to handle, for every
    recipe: launcher.estimate.child._trace_run._fake_grouped_mm.)
    """
    from transformers import masking_utils

    if hasattr(masking_utils, "find_packed_sequence_indices"):
        masking_utils.find_packed_sequence_indices = _unpacked


def build_model():
    _as_on_real_tensors()
    cls = _model_class()
    try:
        model = cls._from_config(_config(), attn_implementation=ATTN_IMPLEMENTATION)
    except ValueError as exc:
        if not any(w in str(exc) for w in ("scaled_dot_product_attention", "sdpa", "SDPA")):
            raise
        # The model does not support SDPA: transformers (and so a GPU run) uses eager.
        model = cls._from_config(_config(), attn_implementation="eager")
    _untie_output(model)
    model.train()
    _built[:] = [weakref.ref(model)]
    return model


def _untie_output(model):
    """The output layer a checkpoint whose config says tie_word_embeddings false loads with.

    T5 and mT5 tie it to the input embedding whatever the config says (transformers 5), but
    FLAN-T5's and mT5's checkpoints hold both weights, and loading one unties them: a training
    run of such a model holds and trains both.
    """
    if _SETTINGS["config"].get("tie_word_embeddings") is not False:
        return
    output, inputs = model.get_output_embeddings(), model.get_input_embeddings()
    if output is None or inputs is None or output.weight is not inputs.weight:
        return
    output.weight = torch.nn.Parameter(inputs.weight.detach().clone())


def _vocab_size():
    config = _config()
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.vocab_size)


def _tokens(batch_size):
    return torch.randint(0, _vocab_size(), (batch_size, SEQ_LEN), dtype=torch.long)


def example_batch(batch_size):
    input_ids = _tokens(batch_size)
    if _model_class().__name__ in _classifier_heads():
        return {"input_ids": input_ids, "labels": _classifier_labels(batch_size)}
    if not _is_seq2seq():
        return {"input_ids": input_ids, "labels": input_ids.clone()}
    # Encoder-decoder: the decoder's inputs given (the labels shifted right, as the model would
    # make them: the same bytes, and no start or pad token needed from the config).
    decoder_ids = _tokens(batch_size)
    batch = {"decoder_input_ids": decoder_ids, "labels": decoder_ids.clone()}
    name = _model_class().main_input_name
    if name == "input_ids":
        batch["input_ids"] = input_ids
        return batch
    config = _config()
    if name == "input_features" and hasattr(config, "num_mel_bins") and hasattr(
            config, "max_source_positions"):
        # Whisper: log-mel frames, exactly 2 per encoder position (its convolutions' stride);
        # the model refuses any other length.
        frames = 2 * config.max_source_positions
        batch[name] = torch.randn(batch_size, config.num_mel_bins, frames)
        return batch
    raise UnknownArchitecture(f"no example batch for {_model_class().__name__}'s {name}")


def _classifier_labels(batch_size):
    """Labels of the loss the classifier picks (transformers' problem_type): one class per
    row, a 0/1 row of every label (multi-label), or values (regression, one label)."""
    config = _config()
    labels = config.num_labels
    kind = getattr(config, "problem_type", None)
    if kind == "multi_label_classification":
        return torch.randint(0, 2, (batch_size, labels)).float()
    if kind == "regression" or labels == 1:
        return torch.randn(batch_size, labels) if labels > 1 else torch.randn(batch_size)
    return torch.randint(0, labels, (batch_size,), dtype=torch.long)


def training_step(model, batch):
    return model(**batch).loss


def wrap_modules():
    model = _built[0]() if _built else None
    if model is None:
        with torch.device("meta"):
            model = build_model()
    named = set(_names(getattr(model, "_no_split_modules", None)))
    repeated = {}
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            for block in module:
                repeated.setdefault(type(block), 0)
                repeated[type(block)] += sum(p.numel() for p in block.parameters())
    blocks = [t for t in repeated if t.__name__ in named]
    if not blocks:
        found = {type(m) for m in model.modules() if type(m).__name__ in named}
        blocks = sorted(found, key=lambda t: t.__name__)
    if not blocks and repeated:
        blocks = [max(repeated, key=repeated.get)]
    return tuple(blocks)
'''


def write_recipe(config_path: str | os.PathLike[str], seq_len: int,
                 directory: str | os.PathLike[str], attention: str | None = None) -> Path:
    """Write the recipe for ``config_path`` at ``seq_len`` tokens; return the recipe's path.

    ``attention`` is launch's ``--attention``: ``math`` builds the model with transformers'
    eager attention (explicit scores, softmax and dropout, kept for the backward), ``flash`` and
    ``efficient`` (and None) with SDPA, whose kernel the trace picks as CUDA would for the dtype.

    Files go to ``directory/<hash>/`` (``recipe.py`` and ``recipe.json``), the hash of both
    texts: the same config and length reuse one folder, and an older launch's recipe is never
    taken for this one's. The config is read as the analytic estimate reads it
    (``model_config.read_config``: a ``UsageError`` naming the file for one that is missing, a
    folder or not a JSON object); a ``seq_len`` below 1 is a ``ValueError``.
    """
    from launcher.estimate.model_config import read_config

    config = read_config(Path(config_path))
    if isinstance(seq_len, bool) or int(seq_len) < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    settings: dict[str, Any] = {"config": config, "seq_len": int(seq_len)}
    if attention == "math":
        settings["attn_implementation"] = "eager"
    sidecar = json.dumps(settings, indent=1, sort_keys=True) + "\n"
    digest = hashlib.sha256(f"{RECIPE_SOURCE}\0{sidecar}".encode()).hexdigest()[:16]
    folder = Path(directory) / digest
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / SIDECAR_NAME, sidecar)
    _write(folder / RECIPE_NAME, RECIPE_SOURCE)
    return folder / RECIPE_NAME


def _write(path: Path, text: str) -> None:
    """Write ``text`` unless it is there already; atomically (two launches may share a folder)."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
