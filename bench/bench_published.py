"""The launcher's own estimates against published memory figures.

    .venv/bin/python bench/bench_published.py            # markdown tables, then the JSON
    .venv/bin/python bench/bench_published.py --format json
    .venv/bin/python bench/bench_published.py --no-trace # the analytic table alone, ~1 s

Every published number below is copied from the source named next to it (nothing is fitted to
them, and the estimator's constants are not tuned here). The launcher's side is computed the way
`launch plan` computes it for an analytic model: ``shape_from_config`` / ``shape_from_params`` ->
``from_shape`` -> ``plan.memory.per_gpu_memory`` (strategy sharding, allocator ratio, CUDA context,
NCCL), or ``states.model_states`` for model states alone. Each row says which launcher quantity
is compared, because the sources measure different things (peak reserved, NVML "used", ...).

Rows whose model is a Hugging Face config (bert-large, Llama 3.1 8B) also get the **traced**
figure, which is what ``launch plan --model-config`` answers when transformers is importable:
``footprints.hf_traced`` itself (estimate/hf_recipe.py's recipe traced emulating CUDA, then the
same ``per_gpu_memory``; for a sharded plan near capacity, one rank traced at its world size),
at the row's batch, sequence, precision, optimizer and checkpointing. Each setting is traced once
per run (a few minutes in all on two cores). The BERT rows are traced with ``--attention math``
(the 2022 runs' eager attention); where this launcher's recipe cannot build it, the row says so
(``traced_setting``) and its traced figure is left out of the run-setting median. ``answer``
names the figure `launch plan` gives for the row's input: the traced one wherever it traces.

Each row has a ``kind``:

* ``measured``: a measurement, and the launcher computes the same setting (what the row assumed
  where the source is silent is in ``assumptions``). The summary's median |error| is over these.
* ``measured_other_setting``: a measurement, but the launcher computes a different setting (a
  bracket: no AC or full AC where the run used selective AC; eager where the run compiled). Shown
  for what it says, left out of the median.
* ``estimate``: a figure its source computed, not measured (DeepSpeed's estimator, ZeRO's
  "about 60 GB").
* ``formula``: a published formula that the launcher implements, or a table the launcher holds:
  an identity check, not evidence.
* ``needs_feature``: the launcher cannot express the setting yet (``needs`` names what is
  missing: pipeline or tensor parallelism, torch.compile, float8, ...); no number is made up.

Features the launcher gained while this file was written (selective activation checkpointing,
the CUDA-context table per CUDA version, ZeRO-2 plans, the attention kernel) are probed
(``features()``): a row that needs one that is absent becomes ``needs_feature``.

Sources:

* ZeRO: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
  Models", arXiv 1910.02054. Section 5, Table 1 (model-state memory per device, GB = 1e9 B);
  Section 3 (1.5B GPT-2: model states "at least 24 GB"; activations at sequence 1K and batch 32
  "about 60 GB", "about 8 GB" with activation checkpointing; quoted from a public summary of
  the paper's text, ai-papers.xuzou.cn/papers/zero_2019: the PDF was not readable here).
* Hugging Face transformers docs, "Model training anatomy",
  https://huggingface.co/docs/transformers/model_memory_anatomy, and the 2022 "Efficient Training
  on a Single GPU" page, huggingface/transformers docs/source/en/perf_train_gpu_one.mdx at
  98513dfd0db6dab00d26c1ef3a0e5f7410ce2035 (the measured rows were later moved or dropped):
  bert-large-uncased + 2-class head (AutoModelForSequenceClassification), batch 4 (or 1 x 4
  accumulation), sequence 512, Trainer defaults of January 2022, one V100-SXM2-16GB, driver
  460.91.03, CUDA 11.2; NVML "used" memory (includes the CUDA context), printed as "MB" but
  computed as bytes // 2**20.
* torchtitan benchmarks/llama3_h100_202412_torchtitan.md (pytorch/torchtitan; runs at torchtitan
  9dec370, torch 1963fc8, Dec 2024), Tables 1-6: Llama 3.1 8B / 70B / 405B on H100 96 GB.
  "Memory(GiB)" is torchtitan's logged ``max_reserved_gib`` (torch.cuda.memory_stats
  reserved_bytes.all.peak; torchtitan/metrics.py and train.py at 9dec370), i.e. without the CUDA
  context and NCCL's own buffers. The page does not state the sequence length of Tables 1 and 3;
  8192 is train_configs/llama3_8b.toml's value at 9dec370. And
  benchmarks/llama3_8b_h200_2025-06_torchtitan.md (Trainy, June 2025, H200, float8, compile).
* DeepSpeed docs, "Memory Requirements" (deepspeedai/DeepSpeed docs/code-docs/source/memory.rst,
  https://deepspeed.readthedocs.io/en/latest/memory.html): the ZeRO-2 and ZeRO-3 model-state
  estimators for t5-3b (2851M params, 32M largest layer) on 1 node x 8 GPUs, and the t5-large
  ZeRO-3 "case 1" example (737.67M params, 4 GPUs). Estimates, not measurements; the
  estimators' "GB" is 2**30 bytes (6.09 = 6.5428e9 / 2**30), the example's "MB" 2**20.
* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
  arXiv 2205.05198, Section 4.1, Eq. (1) and Table 2: activations per layer sbh(34 + 5as/h)
  bytes (16-bit, no parallelism, no recomputation), 34 sbh with their selective recomputation,
  2 sbh with full recomputation. Formulas, which launcher/estimate/analytic.py implements (its
  selective policy is torchtitan's, not theirs: see the rows). GPT-3 175B shape (Brown et al.
  2020, Table 2.1: h 12288, 96 heads, sequence 2048).

Not included: the PyTorch FSDP paper (Zhao et al. 2023, arXiv 2304.11277) shows its memory
results as plots; no number stated in its text was found in the sources searched for this file.
`accelerate estimate-memory` figures (estimates of weights x 4 for Adam) were not added: their
docs' example table could not be read from a stored copy to quote it.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import replace
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.estimate import overheads  # noqa: E402
from launcher.estimate.analytic import LOSS_BYTES_PER_LOGIT, ModelShape  # noqa: E402
from launcher.estimate.footprint import Footprint, from_shape  # noqa: E402
from launcher.estimate.model_config import shape_from_config, shape_from_params  # noqa: E402
from launcher.estimate.states import model_states  # noqa: E402
from launcher.plan.memory import Target, per_gpu_memory  # noqa: E402

MiB, GiB, GB = 2**20, 2**30, 10**9

ZERO_URL = "https://arxiv.org/abs/1910.02054"
HF_URL = "https://huggingface.co/docs/transformers/model_memory_anatomy"
HF_ONE_GPU_URL = ("https://github.com/huggingface/transformers/blob/"
                  "98513dfd0db6dab00d26c1ef3a0e5f7410ce2035/docs/source/en/"
                  "perf_train_gpu_one.mdx")
TITAN_URL = ("https://github.com/pytorch/torchtitan/blob/main/benchmarks/"
             "llama3_h100_202412_torchtitan.md")
TITAN_H200_URL = ("https://github.com/pytorch/torchtitan/blob/main/benchmarks/"
                  "llama3_8b_h200_2025-06_torchtitan.md")
DS_URL = "https://deepspeed.readthedocs.io/en/latest/memory.html"
KORTHIKANTI_URL = "https://arxiv.org/abs/2205.05198"

#: The traced torchtitan rows' model: launch plan traces transformers' LlamaForCausalLM (HF's
#: RMSNorm, rotary and loss) for the config; torchtitan ran its own Llama code.
#: torchtitan PR #165 ("Used per-parameter FSDP", merged as 83c879f1), whose description and
#: commit message give FSDP1 and FSDP2 memory of Llama 7B on 8 H100s in percent of 95.0396 GiB.
TITAN_PR165_URL = "https://github.com/pytorch/torchtitan/pull/165"
#: torchtitan's "7B" flavor at that commit (dim 4096, 32 layers, 32 heads, FFN 11008 from
#: multiple_of 256, the Llama 2 tokenizer's 32,000 tokens, an untied output layer).
LLAMA_7B_TITAN = {
    "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
    "vocab_size": 32000, "max_position_embeddings": 2048, "tie_word_embeddings": False}
#: torchtune's README, "Optimization flags" (PR #2003, at 1814feb1): techniques added one at a
#: time to a full fine-tune of Llama 3.2 3B on one A100, "Peak Memory Active (GiB)".
TORCHTUNE_URL = ("https://github.com/pytorch/torchtune/blob/"
                 "1814feb17a9038e1a8053ce93111bd26774a8db6/README.md")
#: meta-llama/Llama-3.2-3B config.json (the fields the estimate reads)
LLAMA32_3B = {
    "model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192,
    "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
    "tie_word_embeddings": True, "architectures": ["LlamaForCausalLM"]}
TITAN_TRACED_MODEL = "transformers' LlamaForCausalLM, not torchtitan's own model code"

#: The row kinds, and which of them the median is over.
KINDS = ("measured", "measured_other_setting", "estimate", "formula", "needs_feature")
#: What the analytic path lacks and a trace has: a row needing only these is traced still.
TRACE_HAS = ("adafactor from a shape (Adafactor's factored state needs each weight's shape; the "
             "analytic path has only counts (optimizer None))",)
#: A row under by more than this (percent) is listed in the summary with its explanation.
UNDER_LIMIT_PCT = -5.0

#: ZeRO Table 1, as printed (GB = 1e9 bytes): model -> (Psi, {Nd: (P_os, P_os+g, P_os+g+p)}).
#: The Nd = 1 row is the baseline (no partitioning): (2 + 2 + K) Psi, K = 12.
ZERO_TABLE1: dict[str, tuple[int, dict[int, tuple[str, str, str]]]] = {
    "7.5B": (7_500_000_000, {
        1: ("120", "120", "120"), 4: ("52.5", "41.3", "30"), 16: ("35.6", "21.6", "7.5"),
        64: ("31.4", "16.6", "1.88"), 256: ("30.4", "15.4", "0.47"),
        1024: ("30.1", "15.1", "0.12")}),
    "128B": (128_000_000_000, {
        1: ("2048", "2048", "2048"), 4: ("896", "704", "512"), 16: ("608", "368", "128"),
        64: ("536", "284", "32"), 256: ("518", "263", "8"), 1024: ("513", "257", "2")}),
    "1T": (1_000_000_000_000, {
        1: ("16000", "16000", "16000"), 4: ("7000", "5500", "4000"),
        16: ("4750", "2875", "1000"), 64: ("4187", "2218", "250"),
        256: ("4046", "2054", "62.5"), 1024: ("4011", "2013", "15.6")}),
}

BERT_LARGE_UNCASED = {  # google-bert/bert-large-uncased config.json
    "model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24,
    "num_attention_heads": 16, "intermediate_size": 4096, "vocab_size": 30522,
    "max_position_embeddings": 512, "type_vocab_size": 2}

#: The runs' model: AutoModelForSequenceClassification.from_pretrained("bert-large-uncased"),
#: a 2-class head on the pooled first token (what a fine-tune's config.json names).
BERT_LARGE_CLASSIFIER = {**BERT_LARGE_UNCASED, "architectures": ["BertForSequenceClassification"]}

LLAMA31_8B = {  # meta-llama/Llama-3.1-8B config.json (the fields the analytic path reads)
    "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": False}


#: How the traced BERT rows differ from the runs where launch's recipe cannot build eager
#: attention (``features()["traced attention"]``): SDPA where the run's was eager.
BERT_TRACED_SETTING = "SDPA attention (this launcher's recipe ignores --attention math)"

GPT2_XL = {  # openai-community/gpt2-xl config.json: the 1.5B GPT-2 shape
    "model_type": "gpt2", "n_embd": 1600, "n_layer": 48, "n_head": 25, "vocab_size": 50257,
    "n_positions": 1024, "n_ctx": 1024}


# ----------------------------------------------------------------------------------------------
# The traced column: what `launch plan --model-config` answers where transformers is importable

#: Whether rows are traced (``--no-trace``: the analytic table alone, in about a second).
TRACE = {"on": False}
#: Traces made in this run: (config, seq, precision, optimizer, checkpointing) -> footprint, or
#: why there is none. Each row that shares a setting reuses the trace.
_TRACED: dict[tuple[str, int, str, str, str], Footprint | str] = {}
_TRACE_DIR: list[Path] = []


def traced_footprint(config: dict[str, Any], seq: int, precision: str, optimizer: str,
                     checkpointing: bool | str, attention: str | None = None,
                     optimizer_impl: str | None = None) -> Footprint | str:
    """The footprint `launch plan --model-config config.json --seq-len seq [--attention ...]`
    plans with when transformers is importable: ``footprints.hf_traced`` itself
    (estimate/hf_recipe.py's recipe, ``trace_recipe`` emulating CUDA on the CPU, the spec's
    default training settings, and the rank trace at world size for a sharded plan near
    capacity), or why there is none."""
    if not TRACE["on"]:
        return "not traced (--no-trace)"
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not importable: launch plan would answer analytically"
    text = json.dumps(config, sort_keys=True)
    key = (text, seq, precision, optimizer, f"{checkpointing}/{attention}/{optimizer_impl}")
    if key not in _TRACED:
        _TRACED[key] = _trace(config, text, seq, precision, optimizer, checkpointing, attention,
                              optimizer_impl)
    return _TRACED[key]


def _trace(config: dict[str, Any], text: str, seq: int, precision: str, optimizer: str,
           checkpointing: bool | str, attention: str | None,
           optimizer_impl: str | None = None) -> Footprint | str:
    """One trace through ``footprints.hf_traced``, as ``launch plan`` makes it."""
    from launcher.footprints import hf_traced

    if not _TRACE_DIR:
        _TRACE_DIR.append(Path(tempfile.mkdtemp(prefix="bench-published-")))
        atexit.register(shutil.rmtree, _TRACE_DIR[0], ignore_errors=True)
    folder = _TRACE_DIR[0]
    path = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    path.write_text(text, encoding="utf-8")
    shape = shape_from_config(config, seq_len=seq)
    # Spec's defaults for what a trace reads from it (launcher/spec.py DEFAULTS)
    spec = SimpleNamespace(model_config=path, max_grad_norm=1.0, lr=3e-4, weight_decay=0.0,
                           seed=0, attention=attention, optimizer_impl=optimizer_impl)
    failed: dict[str, str] = {}
    environ = {"LAUNCH_TRACE_TIMEOUT": "1200", **os.environ}
    fp = hf_traced(spec, shape, precision, optimizer, checkpointing,  # type: ignore[arg-type]
                    "cuda", environ, folder, failed)
    if fp.kind in ("traced", "upper_bound"):
        return fp
    return failed.get("note") or fp.note or "the trace failed"


def traced_memory(config: dict[str, Any], seq: int, precision: str, optimizer: str,
                  checkpointing: bool | str, target: Target, strategy: str, nodes: int,
                  gpus: int, micro: int, accum: int = 1, attention: str | None = None,
                  optimizer_impl: str | None = None) -> tuple[Any, str]:
    """``per_gpu_memory`` of the traced footprint (None and why where there is none), and how
    the planner sized it: the single device's trace, sharded phase by phase, or one rank traced
    at the plan's world size."""
    fp = traced_footprint(config, seq, precision, optimizer, checkpointing, attention,
                          optimizer_impl)
    if isinstance(fp, str):
        return None, fp
    ranks: list[Any] = []
    rank_at = fp.rank_memory_at
    if rank_at is not None:
        def recording(*args: Any, **kw: Any) -> Any:
            ranks.append(rank_at(*args, **kw))
            return ranks[-1]
        fp = replace(fp, rank_memory_at=recording)
    memory = per_gpu_memory(fp, target, strategy, nodes, gpus, micro, accum)
    detail = ""
    if memory.peak_allocated and memory.peak_reserved:
        detail = (f" (peak allocated {memory.peak_allocated / GiB:.2f} GiB, reserved / "
                  f"allocated {memory.peak_reserved / memory.peak_allocated:.3f})")
    if strategy == "single":
        how = "traced single device"
    elif any(r is not None for r in ranks):
        how = f"one rank traced at world size {nodes * gpus}"
    else:
        how = (f"single-device trace sharded phase by phase (the planner traces the rank at "
               f"world size {nodes * gpus} only within 15% of capacity)")
    if fp.kind == "upper_bound":
        how += f"; an upper bound ({fp.note})"
    return memory, how + detail


# ----------------------------------------------------------------------------------------------
# What the launcher can express today


#: Settings no launcher code models yet: a row needing one of them gets no number.
NOT_MODELLED = {
    "torch.compile": "no compiled-graph memory model (fusion frees or keeps other tensors)",
    "float8": "no float8 linears (saved fp8 casts, fp8 all-gathers)",
    "tensor parallel": "no tensor parallelism outside SageMaker smp_v2, none in the analytic "
                       "per-GPU memory",
    "pipeline parallel": "no pipeline parallelism (stages, in-flight micro-batches)",
    "context parallel": "no context parallelism (sequence split across GPUs)",
    "chunked cross-entropy": "no loss computed in chunks of the logits (torchtune's "
                             "CEWithChunkedOutputLoss): the launcher counts the whole 12 B a logit",
    "adafactor from a shape": "Adafactor's factored state needs each weight's shape; the "
                              "analytic path has only counts (optimizer None)",
}


def features() -> dict[str, str | None]:
    """Features being added to the launcher, probed: name -> None when present, else why not.

    Probed by behaviour or signature, so that a feature that lands (or changes its API) shows
    here without editing the rows."""
    out: dict[str, str | None] = {}
    tiny = ModelShape(parameters=1, model_type="llama", layers=2, hidden=64, heads=4,
                      kv_heads=4, intermediate=172, vocab=100, seq_len=32)
    try:
        selective = tiny.activation_bytes_per_sample(checkpointing="selective")
        full = tiny.activation_bytes_per_sample(checkpointing=True)
        out["selective AC"] = (None if selective is not None and selective != full else
                               "checkpointing='selective' is full AC in the analytic model")
    except Exception as exc:  # noqa: BLE001 - absent or changed: that is the answer
        out["selective AC"] = f"analytic model refuses checkpointing='selective': {exc}"
    context = getattr(overheads, "cuda_context_bytes", None)
    out["CUDA context by CUDA version"] = (
        None if context is not None and "cuda" in inspect.signature(context).parameters
        and "cuda" in {f.name for f in dataclasses.fields(Target)}
        else "overheads.cuda_context_bytes(generation, cuda) / Target.cuda absent")
    out["ZeRO-2"] = (None if "reshard_after_forward" in inspect.signature(
        per_gpu_memory).parameters else "per_gpu_memory has no reshard_after_forward")
    out["attention kernel"] = (None if "attention" in {f.name for f in dataclasses.fields(
        ModelShape)} else "ModelShape has no attention kernel")
    from launcher.estimate import hf_recipe
    out["traced attention"] = (None if "attention" in inspect.signature(
        hf_recipe.write_recipe).parameters else "the Hugging Face recipe builds SDPA attention "
        "whatever --attention says")
    for name, why in NOT_MODELLED.items():
        out[name] = why
    return out


FEATURES = features()


def _missing(needs: list[str]) -> list[str]:
    return [f"{n} ({FEATURES[n]})" for n in needs if FEATURES.get(n)]


def _row(*, source: str, url: str, where: str, config: str, published: float, unit: str,
         measures: str, kind: str, estimate: float | None = None, compared: str = "",
         assumptions: list[str] | None = None, needs: list[str] | None = None,
         explanation: str = "", note: str = "", traced: float | None = None,
         traced_how: str = "", traced_setting: str = "",
         traced_run: float | None = None) -> dict[str, Any]:
    """One published figure next to the launcher's, or next to what the launcher lacks.

    ``estimate`` is the analytic figure; ``traced`` the traced one where the row's model is a
    Hugging Face config (``traced_how``: how it was sized, or why there is none;
    ``traced_setting``: where the trace's setting differs from the run's; ``traced_run``: the
    trace in the run's setting where launch's differs). ``answer`` is what ``launch plan``
    answers for the row's input: the traced figure wherever it traces."""
    assert kind in KINDS
    missing = _missing(needs or [])
    if kind != "needs_feature" and missing and kind in ("measured", "estimate"):
        kind, estimate = "needs_feature", None  # a feature it needs went missing
    error = None if estimate is None else 100 * (estimate - published) / published
    traced_error = None if traced is None else 100 * (traced - published) / published
    answer = "traced" if traced is not None else "analytic"
    if traced_run is None and traced is not None and not traced_setting:
        traced_run = traced
    run_error = None if traced_run is None else 100 * (traced_run - published) / published
    return {"source": source, "url": url, "where": where, "configuration": config,
            "published": round(published, 6), "unit": unit, "published_measures": measures,
            "kind": kind, "launcher": None if estimate is None else round(estimate, 3),
            "launcher_quantity": compared,
            "error_pct": None if error is None else round(error, 2),
            "under_estimate": error is not None and error < 0,
            "traced": None if traced is None else round(traced, 3),
            "traced_error_pct": None if traced_error is None else round(traced_error, 2),
            "traced_how": traced_how, "traced_setting": traced_setting,
            "traced_run": None if traced_run is None else round(traced_run, 3),
            "traced_run_error_pct": None if run_error is None else round(run_error, 2),
            "answer": answer,
            "answer_error_pct": round(traced_error, 2) if traced_error is not None else (
                None if error is None else round(error, 2)),
            "assumptions": assumptions or [], "needs": missing or list(needs or []),
            "explanation": explanation, "note": note}


def _context_target(name: str, memory: int, generation: str, cuda: tuple[int, int] | None,
                    **kw: Any) -> Target:
    """A Target with its CUDA version where the launcher knows CUDA versions."""
    if FEATURES["CUDA context by CUDA version"] is None and cuda is not None:
        kw["cuda"] = cuda
    return Target(name=name, memory_bytes=memory, generation=generation, **kw)


def _context_bytes(generation: str, cuda: tuple[int, int] | None) -> int:
    if FEATURES["CUDA context by CUDA version"] is None:
        return overheads.cuda_context_bytes(generation, cuda)
    return overheads.CUDA_CONTEXT_BYTES[generation]


# ----------------------------------------------------------------------------------------------
# Hugging Face: bert-large-uncased on a V100 (NVML used)

#: perf_train_gpu_one.mdx at 98513dfd (Jan 2022), each experiment's "GPU memory occupied"
#: (NVML used, MiB): (label, micro-batch, accumulation, gradient checkpointing, Trainer
#: precision, optimizer, MiB). "fp16" is Trainer(fp16=True): torch.cuda.amp autocast.
HF_ONE_GPU = (
    ("vanilla", 4, 1, False, "fp32", "adamw", 14949),
    ("gradient accumulation", 1, 4, False, "fp32", "adamw", 8681),
    ("accumulation + gradient checkpointing", 1, 4, True, "fp32", "adamw", 6775),
    ("fp16", 4, 1, False, "fp16", "adamw", 13939),
    ("accumulation + checkpointing + fp16", 1, 4, True, "fp16", "adamw", 7275),
    ("adafactor", 4, 1, False, "fp32", "adafactor", 12295),
    ("accumulation + checkpointing + fp16 + adafactor", 1, 4, True, "fp16", "adafactor", 4847),
    ("8-bit Adam (bitsandbytes Adam8bit)", 4, 1, False, "fp32", "adam8bit", 13085),
    ("accumulation + checkpointing + fp16 + 8-bit Adam", 1, 4, True, "fp16", "adam8bit", 5363),
)
V100_CUDA = (11, 2)
#: The 2022 Trainer's AdamW (adamw_hf: transformers.AdamW, one parameter at a time), where the
#: launcher can say so (``from_shape(optimizer_implementation=...)``).
_HF_2022_LOOP: dict[str, str] = (
    {"optimizer_implementation": "for-loop"}
    if "optimizer_implementation" in inspect.signature(from_shape).parameters else {})


def _bert_shape(attention: str | None) -> ModelShape:
    if FEATURES["attention kernel"] is None:
        return shape_from_config(BERT_LARGE_CLASSIFIER, seq_len=512, attention=attention)
    return shape_from_config(BERT_LARGE_CLASSIFIER, seq_len=512)


def hf_bert_rows() -> list[dict[str, Any]]:
    """HF "Model training anatomy" and the 2022 single-GPU page: bert-large-uncased, V100."""
    v100 = _context_target("V100-SXM2-16GB", 16_913_530_880, "volta", V100_CUDA, gpus=1)
    src = "HF transformers docs, Model training anatomy"
    rows = []
    context = _context_bytes("volta", V100_CUDA)
    by_version = FEATURES["CUDA context by CUDA version"] is None
    rows.append(_row(
        source=src, url=HF_URL, where="torch.ones((1, 1)).to('cuda'), print_gpu_utilization",
        config="CUDA context on a V100-SXM2-16GB, CUDA 11.2 (eager module loading)",
        published=1343, unit="MiB",
        measures="NVML used after the first CUDA tensor (context + kernels + one 2 MiB segment)",
        kind="formula" if by_version else "measured", estimate=context / MiB,
        compared=("overheads.cuda_context_bytes('volta', cuda=(11, 2))" if by_version
                  else "overheads.CUDA_CONTEXT_BYTES['volta'] (lazy loading)"),
        needs=["CUDA context by CUDA version"],
        explanation=("" if by_version else "CUDA 11.2 predates lazy module loading: every "
                     "kernel image is loaded at start-up; the launcher's constant assumes lazy"),
        note=("identity: this very reading is the launcher's eager-Volta table row"
              if by_version else "")))
    shape = _bert_shape(None)
    weights = model_states(shape.parameters, "fp32", "adamw").parameters
    rows.append(_row(
        source=src, url=HF_URL, where="from_pretrained(...).to('cuda'), print_gpu_utilization",
        config="bert-large-uncased weights on the GPU: 2631 - 1343 MiB (NVML used)",
        published=2631 - 1343, unit="MiB",
        measures="NVML used with the model loaded, minus the context reading",
        kind="measured", estimate=weights / MiB,
        compared="model_states(...).parameters (BertForSequenceClassification, 2 labels: "
                 f"{shape.parameters:,} params)",
        assumptions=["fp32 weights, 4 B each"],
        explanation="allocator granularity (2 MiB segments, 20 MiB for large tensors)"))
    math = "math" if FEATURES["attention kernel"] is None else None
    eager = _bert_shape(math)
    common = [
        "Trainer's 2022 attention was BERT's eager one (scores, softmax, dropout kept): "
        "launcher attention 'math' (flash=False)",
        "the run's model is a 2-class sequence classifier: the config names "
        "BertForSequenceClassification (no s x 30522 logits, no tied decoder to cast)",
        "AdamW as the run ran it: Trainer's 2022 default optimizer (optim 'adamw_hf', "
        "transformers PR #14744) is transformers.AdamW, a per-parameter Python loop: launcher "
        "optimizer implementation 'for-loop' (two copies of the largest parameter, the "
        "embedding, at the step; foreach, the launcher's default, holds 4 B/param)",
        "Trainer's 2022 model.zero_grad() (torch 1.10: set_to_none=False) kept every "
        "gradient allocated through the next step's forward and backward: the analytic model "
        "counts the gradients with the activations' peak (its upper bound is this run's case); "
        "a trace steps with set_to_none, as the launcher's scripts do, so its figure for the "
        "run's setting ('traced, run's setting') lacks them at the activations' peak",
        "the CUDA context is the launcher's, for CUDA 11.2" + (
            " (from this page's own 1343 MiB reading)" if by_version else " (lazy constant)"),
    ]
    for label, b, accum, ckpt, trainer_precision, optimizer, published in HF_ONE_GPU:
        precision = "bf16_mixed" if trainer_precision == "fp16" else "fp32"
        assumptions = list(common)
        if trainer_precision == "fp16":
            assumptions.append("fp16 autocast with a GradScaler = the launcher's bf16_mixed "
                               "(16-bit activations, fp32 weights, gradients and moments)")
        if ckpt:
            assumptions.append("gradient_checkpointing_enable(): every BertLayer checkpointed "
                               "= launcher full AC")
        needs = ["adafactor from a shape"] if optimizer == "adafactor" else []
        fp = from_shape(eager, precision=precision, optimizer=optimizer, checkpointing=ckpt,
                        flash=False, **_HF_2022_LOOP)
        memory = per_gpu_memory(fp, v100, "single", 1, 1, b, accum)
        # launch plan --model-config bert-large.json --seq-len 512 --attention math
        traced, how = traced_memory(BERT_LARGE_CLASSIFIER, 512, precision, optimizer, ckpt, v100,
                                    "single", 1, 1, b, accum, attention=math)
        explanation = _bert_explanation(precision, optimizer, ckpt, b, memory, published,
                                        context)
        url, where = ((HF_URL, "Vanilla training (also on the anatomy page)")
                      if label == "vanilla" else (HF_ONE_GPU_URL, f"section: {label}"))
        rows.append(_row(
            source="HF transformers docs, Efficient Training on a Single GPU (2022)", url=url,
            where=where,
            config=(f"bert-large-uncased + 2-class head, {trainer_precision}, {optimizer}, "
                    f"batch {b} x {accum} accumulation, seq 512"
                    f"{', gradient checkpointing' if ckpt else ''}, 1x V100-SXM2-16GB"),
            published=published, unit="MiB",
            measures="NVML used after trainer.train() (context + the allocator's reserved "
                     "memory, which it keeps: the peak reserved)",
            kind="measured",
            estimate=None if memory.total is None else memory.total / MiB,
            compared="per_gpu_memory(single).total = peak_reserved + CUDA context",
            assumptions=assumptions, needs=needs, explanation=explanation,
            traced=None if traced is None or traced.total is None else traced.total / MiB,
            traced_how=how, traced_setting=(
                BERT_TRACED_SETTING if traced is not None and FEATURES["traced attention"]
                else "")))
    # What `launch plan` assumes by default for the same run: SDPA's fused attention.
    fp = from_shape(_bert_shape(None), precision="fp32", optimizer="adamw",
                    checkpointing=False, flash=True)
    memory = per_gpu_memory(fp, v100, "single", 1, 1, 4)
    assert memory.total is not None
    traced, how = traced_memory(BERT_LARGE_CLASSIFIER, 512, "fp32", "adamw", False, v100,
                                "single", 1, 1, 4)
    rows.append(_row(
        source="HF transformers docs, Model training anatomy", url=HF_URL,
        where="Vanilla training", config="the vanilla run (batch 4, fp32, AdamW) with the "
        "launcher's default attention (fused SDPA) instead of the run's eager one",
        published=14949, unit="MiB", measures="NVML used after trainer.train()",
        kind="measured_other_setting", estimate=memory.total / MiB,
        compared="per_gpu_memory(single).total, flash=True",
        explanation="the run kept 16 heads x 512^2 scores, softmax and dropout per layer (5as^2 "
                    "bytes per layer in 16-bit, 3.8 GiB here in fp32) that fused attention "
                    "does not; the default is right for today's SDPA, not for this 2022 run",
        traced=None if traced is None or traced.total is None else traced.total / MiB,
        traced_how=how))
    return rows


def _bert_explanation(precision: str, optimizer: str, ckpt: bool, b: int, memory: Any,
                      published_mib: float, context: int) -> str:
    """Why a BERT row is off, as far as it is understood ("probable": not verified on a GPU),
    with the reserve the run's reading implies: (NVML used - the context) / (the launcher's
    peak allocated + cuBLAS's workspace), against the analytic plan's fixed 1.08."""
    if memory.peak_allocated is None:
        return ""
    implied = (published_mib * MiB - context) / (
        memory.peak_allocated + overheads.CUBLAS_WORKSPACE_BYTES)
    reading = (f"the run's reading implies {implied:.2f} x the launcher's allocated peak "
               f"({memory.peak_allocated / MiB:,.0f} MiB) where an analytic plan reserves 1.08")
    if b > 1:
        return ("under, missing feature, probable (docs/estimator.md, Not done yet: the "
                "analytic plan's allocator reserve): " + reading + "; the launcher's replay of "
                "its own traced step finds 1.03-1.07 for these settings, so the 2022 run "
                "(torch 1.10, the Trainer's gradients kept from step to step) fragmented more "
                "than the replay does, by a cause not found without a GPU. Before the rows "
                "computed the run's classifier, the MLM head's logits (715 MiB at batch 4) hid "
                "this")
    if ckpt and optimizer == "adamw":
        return ("over, probable: with the run's adamw_hf (a for-loop: two copies of the "
                "125 MB embedding at the step) the peak is the model states (4.99 GiB) with a "
                "few hundred MiB of activations: " + reading + ", about what large blocks "
                "allocated once cost (2 MiB rounding, no reuse by other sizes)")
    return "over, probable: " + reading


# ----------------------------------------------------------------------------------------------
# torchtitan: Llama 3.1 on H100 / H200


def _titan_memory(seq: int, checkpointing: bool | str, nodes: int, local_batch: int,
                  ) -> Any:
    shape = shape_from_config(LLAMA31_8B, seq_len=seq)
    fp = from_shape(shape, precision="bf16_mixed", optimizer="adamw",
                    checkpointing=checkpointing, flash=True)
    target = Target(name="H100 96GB (Grand Teton)", gpus=8, memory_bytes=96 * GiB,
                    generation="hopper", max_nodes=nodes)
    memory = per_gpu_memory(fp, target, "fsdp", nodes, 8, local_batch)
    assert memory.peak_reserved is not None
    return memory


def _titan_traced(checkpointing: bool | str, nodes: int, local_batch: int) -> tuple[Any, str]:
    target = Target(name="H100 96GB (Grand Teton)", gpus=8, memory_bytes=96 * GiB,
                    generation="hopper", max_nodes=nodes)
    return traced_memory(LLAMA31_8B, 8192, "bf16_mixed", "adamw", checkpointing, target,
                         "fsdp", nodes, 8, local_batch)


def torchtitan_rows() -> list[dict[str, Any]]:
    """torchtitan's Llama 3.1 tables: the FSDP rows computed, the rest what they need."""
    measures = "torch.cuda max reserved (torchtitan max_reserved_gib); no context, no NCCL"
    base = ["sequence 8192 (not stated; train_configs/llama3_8b.toml at 9dec370)",
            "bf16 parameters, fp32 gradient reduction (FSDP2 MixedPrecisionPolicy) = launcher "
            "bf16_mixed under fsdp", "SDPA flash attention (bf16 on H100)",
            "AdamW (torchtitan's default optimizer)"]
    rows = []
    selective = FEATURES["selective AC"] is None
    for table, gpus_total, published in (("Table 1", 8, 82.4), ("Table 3", 128, 67.0)):
        nodes = gpus_total // 8
        config = (f"Llama 3.1 8B, FSDP2 over {gpus_total} H100 96GB, local batch 2, bf16, "
                  "AdamW, selective (op) AC, no compile, no float8")
        memory = _titan_memory(8192, "selective", nodes, 2) if selective else None
        traced, how = _titan_traced("selective", nodes, 2)
        rows.append(_row(
            source="torchtitan benchmarks (Dec 2024)", url=TITAN_URL,
            where=f"{table}, FSDP row", config=config, published=published, unit="GiB",
            measures=measures, kind="measured",
            estimate=None if memory is None else memory.peak_reserved / GiB,
            compared="per_gpu_memory(fsdp).peak_reserved, checkpointing='selective'",
            assumptions=base + ["torchtitan's op-level SAC (every other matmul output kept, "
                                "attention outputs kept) = launcher 'selective'"],
            needs=["selective AC"],
            explanation=("missing feature, probable (docs/estimator.md, Not done yet: the "
                         "analytic plan's allocator reserve): an analytic plan reserves the "
                         "fixed 1.08 x its peak, with no allocator replay (the traced plan "
                         "replays its own events) and none of the blocks FSDP2's all-gather "
                         "and reduce-scatter streams keep cached. The loss's 12 B per logit "
                         "(3.9 GiB more here than the 10 B counted before) is in. Not "
                         "settled: the traced Table 3 figure (-0.8%) shards the single "
                         "device's trace with its replayed 1.088, near 1.08, and allocates "
                         "about 2.4 GiB more than the analytic 58.7 GiB (transformers' Llama "
                         "traced), so part of the gap may be allocated bytes, not the "
                         "reserve"),
            traced=None if traced is None else traced.peak_reserved / GiB,
            traced_how=how + ("; " + TITAN_TRACED_MODEL if traced is not None else "")))
        if table == "Table 1":
            for ac, how in ((False, "no AC"), (True, "full per-layer AC")):
                memory = _titan_memory(8192, ac, nodes, 2)
                rows.append(_row(
                    source="torchtitan benchmarks (Dec 2024)", url=TITAN_URL,
                    where=f"{table}, FSDP row", config=f"{config}; launcher {how} (a bracket)",
                    published=published, unit="GiB", measures=measures,
                    kind="measured_other_setting", estimate=memory.peak_reserved / GiB,
                    compared=f"per_gpu_memory(fsdp).peak_reserved, {how}",
                    assumptions=base,
                    explanation="selective AC lies between the two: no AC keeps every "
                                "activation of 32 layers, full AC only the layer inputs"))
        for label, value in (("FSDP + torch.compile", 77.0 if gpus_total == 8 else 62.0),
                             ("FSDP + torch.compile + Float8", 76.8 if gpus_total == 8
                              else 61.8)):
            needs = ["torch.compile"] + (["float8"] if "Float8" in label else [])
            rows.append(_row(
                source="torchtitan benchmarks (Dec 2024)", url=TITAN_URL,
                where=f"{table}, {label} row",
                config=f"Llama 3.1 8B, {label} over {gpus_total} H100, local batch 2, "
                       "selective AC", published=value, unit="GiB", measures=measures,
                kind="needs_feature", needs=needs))
    # Same local batch on 8 and on 128 GPUs: the activations are the same, so the difference of
    # the two published peaks is what sharding the model states 8 ways instead of 128 saves.
    peaks = [_titan_memory(8192, False, nodes, 2).peak_reserved for nodes in (1, 16)]
    rows.append(_row(
        source="torchtitan benchmarks (Dec 2024)", url=TITAN_URL,
        where="Table 1 minus Table 3 (FSDP rows)",
        config="the same run on 8 and on 128 GPUs: the difference is the model-state sharding "
               "alone (16 B/param x 8.03 B x (1/8 - 1/128))", published=82.4 - 67.0,
        unit="GiB", measures="difference of two max-reserved readings", kind="measured",
        estimate=(peaks[0] - peaks[1]) / GiB,
        compared="difference of per_gpu_memory(fsdp).peak_reserved, 1x8 vs 16x8",
        assumptions=["activations and their checkpointing cancel: the same per-GPU batch"],
        note="the part of the estimate that does not depend on activation checkpointing"))
    # Table 2, first row: full AC (the launcher's own mode), seq 32768, but compile + float8.
    memory = _titan_memory(32768, True, 1, 1)
    rows.append(_row(
        source="torchtitan benchmarks (Dec 2024)", url=TITAN_URL,
        where="Table 2, FSDP 8 / CP 1 row",
        config="Llama 3.1 8B, FSDP2 over 8 H100 96GB, local batch 1, seq 32768, full AC, "
               "torch.compile + Float8 linears; launcher eager bf16 (a bracket)",
        published=83.9, unit="GiB", measures=measures, kind="measured_other_setting",
        estimate=memory.peak_reserved / GiB, compared="per_gpu_memory(fsdp).peak_reserved",
        assumptions=base[1:], needs=["torch.compile", "float8"],
        explanation=(f"the estimate's activations are {memory.activations / GiB:.0f} GiB, "
                     f"{32768 * 128256 * LOSS_BYTES_PER_LOGIT / GiB:.0f} of them the logits "
                     "and the loss (s V 12 B); compile fuses the loss and float8 changes what "
                     "the linears save")))
    for seq, cp, value in ((65536, 2, 84.2), (131072, 4, 84.0), (262144, 8, 84.5)):
        rows.append(_row(
            source="torchtitan benchmarks (Dec 2024)", url=TITAN_URL,
            where=f"Table 2, FSDP {8 // cp} / CP {cp} row",
            config=f"Llama 3.1 8B, 8 H100, local batch 1, seq {seq}, full AC, compile, float8",
            published=value, unit="GiB", measures=measures, kind="needs_feature",
            needs=["context parallel", "torch.compile", "float8"]))
    for where, config, value, needs in (
            ("Table 4, 2D row", "Llama 3.1 70B, 256 H100 (FSDP 32, TP 8), local batch 16, "
             "full AC, compile, float8", 71.9, ["tensor parallel", "torch.compile", "float8"]),
            ("Table 4, 2D + AsyncTP row", "the same with async TP", 67.6,
             ["tensor parallel", "torch.compile", "float8"]),
            ("Table 5, 1F1B row", "Llama 3.1 405B, 512 H100 (FSDP 8, TP 8, PP 8), local batch "
             "32, full AC, compile, float8, async TP", 82.5,
             ["pipeline parallel", "tensor parallel", "torch.compile", "float8"]),
            ("Table 5, Interleaved 1F1B row", "the same, interleaved 1F1B", 72.7,
             ["pipeline parallel", "tensor parallel", "torch.compile", "float8"])):
        rows.append(_row(source="torchtitan benchmarks (Dec 2024)", url=TITAN_URL, where=where,
                         config=config, published=value, unit="GiB", measures=measures,
                         kind="needs_feature", needs=needs))
    for fsdp, cp, seq, value in ((8, 1, 32768, 75.3), (4, 2, 65536, 75.9), (2, 4, 131072, 77.1),
                                 (1, 8, 262144, 84.9)):
        needs = ["pipeline parallel", "tensor parallel", "torch.compile", "float8"]
        rows.append(_row(
            source="torchtitan benchmarks (Dec 2024)", url=TITAN_URL,
            where=f"Table 6, FSDP {fsdp} / CP {cp} row",
            config=f"Llama 3.1 405B, 512 H100 (TP 8, PP 8), local batch 8, seq {seq}, full AC, "
                   "compile, float8, async TP, 1F1B", published=value, unit="GiB",
            measures=measures, kind="needs_feature",
            needs=needs + (["context parallel"] if cp > 1 else [])))
    rows += _titan_pr165_rows()
    for nodes, value in ((4, 47.96), (8, 46.97)):
        rows.append(_row(
            source="torchtitan benchmarks, Trainy H200 (June 2025)", url=TITAN_H200_URL,
            where=f"Results table, NUM_NODES {nodes}",
            config=f"Llama 3.1 8B, FSDP over {8 * nodes} H200, local batch 2, compile, float8 "
                   "(fp8 all-gather), llama3_8b.toml at e7c0cae", published=value, unit="GiB",
            measures="torchtitan's logged memory at step 100 (max reserved)",
            kind="needs_feature", needs=["torch.compile", "float8"]))
    return rows


def _rank_traced_note(config: dict[str, Any], seq: int, checkpointing: bool | str,
                      published_ratio: float) -> str:
    """One rank traced at world size 8 whatever the plan's distance from capacity (the planner
    does so only within 15% of it): its allocator replay against the run's reserved / active.
    Empty without traces."""
    fp = traced_footprint(config, seq, "bf16_mixed", "adamw", checkpointing)
    if isinstance(fp, str) or fp.rank_memory_at is None:
        return ""
    rank = fp.rank_memory_at("fsdp", 1, 8, 8, 1)
    if rank is None or not rank.peak_allocated or not rank.peak_reserved:
        return ""
    return (f"one rank traced at world size 8 ({TITAN_TRACED_MODEL}): allocated "
            f"{rank.peak_allocated / GiB:.2f} GiB, reserved {rank.peak_reserved / GiB:.2f} GiB "
            f"by the allocator replay, {rank.peak_reserved / rank.peak_allocated:.2f} x, "
            f"against the run's {published_ratio:.2f} x")


def _titan_pr165_rows() -> list[dict[str, Any]]:
    """torchtitan PR #165: Llama 7B, FSDP2 over 8 H100s, local batch 8, sequence 2048, bf16
    parameters with fp32 reduce-scatter, eager; full AC and selective AC. Each run's peak active
    and peak reserved, printed as percent of 95.0396 GiB (torchtitan's memory monitor: torch's
    ``active_bytes.all.peak`` and ``reserved_bytes.all.peak``, no context, no NCCL)."""
    capacity = 95.0396  # GiB, as the PR says to convert
    target = Target(name="H100 (95.04 GiB)", gpus=8, memory_bytes=int(capacity * GiB),
                    generation="hopper")
    shape = shape_from_config(LLAMA_7B_TITAN, seq_len=2048)
    base = ["the model is torchtitan's 7B flavor (docs/fsdp.md: 'some Llama-7B runs on 8x "
            "H100s'; train_configs/llama_7b.toml: AdamW, batch 8, seq_len 2048)",
            "every row 2048 tokens: torchtitan's dataloader packs the text into fixed rows",
            "bf16 parameters, fp32 gradient reduction (MixedPrecisionPolicy) = launcher "
            "bf16_mixed under fsdp; the last block is not resharded after forward (the "
            "launcher's plan counts three gathered units)",
            "AdamW foreach (torchtitan's build at that commit), SDPA flash attention",
            "peak active = torch's active_bytes peak: allocated blocks and those whose free "
            "waits on another stream, compared with the launcher's peak allocated"]
    rows = []
    for ac, label, active_pct, reserved_pct in ((True, "AC", 23.92, 32.64),
                                                ("selective", "SAC", 52.13, 62.51)):
        fp = from_shape(shape, precision="bf16_mixed", optimizer="adamw", checkpointing=ac,
                        flash=True)
        memory = per_gpu_memory(fp, target, "fsdp", 1, 8, 8)
        assert memory.peak_allocated is not None and memory.peak_reserved is not None
        # launch plan --model-config (transformers' LlamaForCausalLM with the 7B shape)
        traced, how = traced_memory(LLAMA_7B_TITAN, 2048, "bf16_mixed", "adamw", ac, target,
                                    "fsdp", 1, 8, 8)
        how += "; " + TITAN_TRACED_MODEL if traced is not None else ""
        rank_note = _rank_traced_note(LLAMA_7B_TITAN, 2048, ac, reserved_pct / active_pct)
        assumptions = base + (
            ["full AC: every TransformerBlock checkpointed = launcher full AC"] if ac is True
            else ["SAC: torchtitan's op-level policy (every other matmul output and the "
                  "attention output kept) = launcher 'selective'; the policy as the later "
                  "code has it (the commit's own policy text was not read)"])
        config = (f"Llama 7B (torchtitan), FSDP2 over 8 H100, local batch 8, seq 2048, bf16, "
                  f"AdamW, {'full' if ac is True else 'selective (op)'} AC, eager")
        ratio = reserved_pct / active_pct
        reserve = (f"the run reserved {ratio:.2f} x its active peak where an analytic plan "
                   "assumes 1.08 (and the launcher's replay of a traced rank found 1.21 for the "
                   "Llama 3.1 8B run of Table 1): FSDP2's all-gather and reduce-scatter streams "
                   "keep their own cached blocks, which no model here has (docs/estimator.md, "
                   "Not done yet: the analytic plan's allocator reserve)")
        rows.append(_row(
            source="torchtitan PR #165 (per-parameter FSDP, 2024)", url=TITAN_PR165_URL,
            where=f"PR description, 1D FSDP, Eager, FSDP2 ({label})",
            config=config + ": peak active", published=round(active_pct / 100 * capacity, 2),
            unit="GiB", measures=f"peak active, {active_pct}% of {capacity} GiB",
            kind="measured", estimate=memory.peak_allocated / GiB,
            compared="per_gpu_memory(fsdp).peak_allocated", assumptions=assumptions,
            needs=[] if ac is True else ["selective AC"],
            explanation="the allocated side of the run: model states sharded 8 ways, the kept "
                        "layer inputs (or the policy's outputs) and the loss's 12 B per logit",
            traced=None if traced is None else traced.peak_allocated / GiB, traced_how=how))
        rows.append(_row(
            source="torchtitan PR #165 (per-parameter FSDP, 2024)", url=TITAN_PR165_URL,
            where=f"PR description, 1D FSDP, Eager, FSDP2 ({label})",
            config=config + ": peak reserved",
            published=round(reserved_pct / 100 * capacity, 2), unit="GiB",
            measures=f"peak reserved, {reserved_pct}% of {capacity} GiB", kind="measured",
            estimate=memory.peak_reserved / GiB,
            compared="per_gpu_memory(fsdp).peak_reserved", assumptions=assumptions,
            needs=[] if ac is True else ["selective AC"],
            explanation=("missing feature: " if memory.peak_reserved / GiB
                         < 0.95 * reserved_pct / 100 * capacity else "") + reserve,
            note=rank_note,
            traced=None if traced is None else traced.peak_reserved / GiB, traced_how=how))
    return rows


# ----------------------------------------------------------------------------------------------
# DeepSpeed's estimators


def deepspeed_rows() -> list[dict[str, Any]]:
    """DeepSpeed's model-state estimators (ZeRO-2, ZeRO-3; t5-3b on 8 GPUs, t5-large on 4)."""
    src = "DeepSpeed docs, Memory Requirements"
    rows = []

    def states(params: int, gpus: int, **kw: Any) -> int:
        fp = from_shape(shape_from_params(params), precision="bf16_mixed", optimizer="adamw",
                        checkpointing=False, kind="declared")
        target = Target(name=f"{gpus} GPUs", gpus=gpus, memory_bytes=80 * GiB,
                        generation="ampere")
        value = per_gpu_memory(fp, target, "fsdp", 1, gpus, 1, **kw).model_states
        assert value is not None
        return value

    rows.append(_row(
        source=src, url=DS_URL, where="ZeRO3 example, estimate_zero3_model_states_mem_needs_"
        "all_cold, offload none, zero_init=1",
        config="t5-3b, 2851M params, 32M largest layer, ZeRO-3 over 1 node x 8 GPUs",
        published=6.09, unit="GiB",
        measures="DeepSpeed's own estimate (18 B/param / 8 + 4 B x largest layer)",
        kind="estimate", estimate=states(2_851_000_000, 8) / GiB,
        compared="per_gpu_memory(fsdp).model_states (--params 2851M)",
        explanation="DeepSpeed ZeRO-3 keeps a 2-byte fp16 partition beside the fp32 master "
                    "(18 B/param) and adds the gathered largest layer; FSDP2, which the launcher "
                    "renders, keeps 16 B/param and casts at all-gather"))
    rows.append(_row(
        source=src, url=DS_URL, where="ZeRO-3 GPU RAM example, case 1 (t5-large)",
        config="t5-large, 737.67M params, 32.90M largest layer, ZeRO-3 over 4 GPUs, no offload",
        published=3291, unit="MiB",
        measures="DeepSpeed's formula: 4 B x largest layer + 18 B/param / 4",
        kind="estimate", estimate=states(737_670_000, 4) / MiB,
        compared="per_gpu_memory(fsdp).model_states (--params 737.67M)",
        explanation="as above: 16 B/param instead of 18, and no gathered-layer term without a "
                    "shape"))
    zero2 = FEATURES["ZeRO-2"] is None
    rows.append(_row(
        source=src, url=DS_URL, where="ZeRO2 example, estimate_zero2_model_states_mem_needs_"
        "all_cold, offload_optimizer=none",
        config="t5-3b, 2851M params, ZeRO-2 over 1 node x 8 GPUs",
        published=15.93, unit="GiB",
        measures="DeepSpeed's own estimate (4 B/param whole + 16 B/param / 8)",
        kind="estimate",
        estimate=states(2_851_000_000, 8, reshard_after_forward=False) / GiB if zero2 else None,
        compared="per_gpu_memory(fsdp, reshard_after_forward=False).model_states",
        needs=["ZeRO-2"],
        explanation="the launcher's ZeRO-2 is FSDP2 without resharding after forward: the "
                    "gathered bf16 weights (2 B/param) are held between forward and backward, "
                    "counted outside model_states and only when the shape is known; DeepSpeed's "
                    "estimate keeps whole fp16 weights and gradients (4 B/param) as states"))
    return rows


# ----------------------------------------------------------------------------------------------
# Activation figures: ZeRO-R and Korthikanti


def zero_r_rows() -> list[dict[str, Any]]:
    """ZeRO Section 3: the 1.5B GPT-2's model states and activations (seq 1K, batch 32)."""
    shape = shape_from_config(GPT2_XL, seq_len=1024)
    rows = [_row(
        source="ZeRO (Rajbhandari et al. 2020), Section 3.1", url=ZERO_URL,
        where="Section 3.1, model states of a 1.5B GPT-2",
        config="1.5B parameters, mixed-precision Adam: 'at least 24 GB'", published=24,
        unit="GB", measures="the paper's arithmetic (16 B/param)", kind="formula",
        estimate=model_states(1_500_000_000, "bf16_mixed", "adamw").total / GB,
        compared="model_states(1.5e9, bf16_mixed, adamw).total",
        note="identity: 16 B/param on both sides")]
    no_logits = replace(shape, vocab=0)
    for ckpt, published, text in ((False, 60, "about 60 GB"),
                                  (True, 8, "about 8 GB with activation checkpointing")):
        launcher = shape.activation_bytes_per_sample(flash=False, checkpointing=ckpt)
        bare = no_logits.activation_bytes_per_sample(flash=False, checkpointing=ckpt)
        assert launcher is not None and bare is not None
        rows.append(_row(
            source="ZeRO (Rajbhandari et al. 2020), Section 3.2 (ZeRO-R)", url=ZERO_URL,
            where="Section 3.2, residual states: activations",
            config=f"1.5B GPT-2 (gpt2-xl shape: 48 layers, h 1600, 25 heads), seq 1024, batch "
                   f"32, 16-bit: '{text}'", published=published, unit="GB",
            measures="the paper's approximate figure (not a measurement)", kind="estimate",
            estimate=32 * launcher / GB,
            compared=("32 x ModelShape.activation_bytes_per_sample(flash=False"
                      f"{', checkpointing=True' if ckpt else ''})"),
            assumptions=["eager attention (Megatron GPT-2, 2019): launcher flash=False",
                         "the gpt2-xl config's shape for '1.5B GPT-2'"],
            explanation=(
                f"without the logits the launcher says {32 * bare / GB:.1f} GB; the paper's "
                "figure matches 24 B per hidden unit per token per layer (24 x 1600 x 1024 x "
                "32 x 48 = 60.4 GB), which leaves out the 5as/h attention scores (80 x sbh "
                "here) and the logits" if not ckpt else
                f"without the logits the launcher says {32 * bare / GB:.1f} GB: one 16-bit "
                "layer input per layer (5.0 GB) plus one layer recomputed; with them the loss's "
                "backward (s V 12 B: "
                f"{32 * 1024 * 50257 * LOSS_BYTES_PER_LOGIT / GB:.1f} GB at batch 32) takes the "
                "recomputed layer's place, the larger of the two, which are never alive "
                "together")))
    return rows


def _per_layer(shape: ModelShape, **kw: Any) -> int:
    """One more layer's bytes: the two-layer model minus the one-layer one."""
    one, two = replace(shape, layers=1), replace(shape, layers=2)
    return (two.activation_bytes_per_sample(**kw) or 0) - (
        one.activation_bytes_per_sample(**kw) or 0)


def korthikanti_rows() -> list[dict[str, Any]]:
    """Eq. (1) and Table 2 of Korthikanti et al., one GPT-3 175B layer, against analytic.py."""
    s, h, a = 2048, 12288, 96
    one = ModelShape(parameters=175_000_000_000, model_type="gpt2", layers=1, hidden=h, heads=a,
                     kv_heads=a, intermediate=4 * h, vocab=50257, seq_len=s, gated_mlp=False)
    src = "Korthikanti et al. 2022"
    rows = [
        _row(source=src, url=KORTHIKANTI_URL, where="Eq. (1)",
             config="GPT-3 175B layer (h 12288, 96 heads), seq 2048, batch 1, 16-bit, no "
                    "recompute", published=s * h * (34 + 5 * a * s / h) / MiB, unit="MiB",
             measures="formula sbh(34 + 5as/h) bytes per layer", kind="formula",
             estimate=_per_layer(one, flash=False) / MiB,
             compared="ModelShape.activation_bytes_per_sample(flash=False), one layer",
             note="identity: analytic.py implements Eq. (1); a check that the code still does"),
        _row(source=src, url=KORTHIKANTI_URL, where="Table 2, selective recomputation (t = 1)",
             config="same layer; attention scores, softmax and dropout recomputed (or never "
                    "stored: flash / SDPA)", published=s * h * 34 / MiB, unit="MiB",
             measures="formula 34 sbh bytes per layer", kind="formula",
             estimate=_per_layer(one, flash=True) / MiB,
             compared="ModelShape.activation_bytes_per_sample(flash=True), one layer",
             note="identity: what the launcher assumes for a fused attention kernel"),
        _row(source=src, url=KORTHIKANTI_URL, where="Table 2, full recomputation",
             config="same layer, full recomputation: each layer keeps its 16-bit input",
             published=2 * s * h / MiB, unit="MiB", measures="formula 2 sbh bytes per layer",
             kind="formula", estimate=_per_layer(one, flash=True, checkpointing=True) / MiB,
             compared="one more layer under activation_bytes_per_sample(checkpointing=True)",
             note="identity: the launcher's full AC keeps each layer's input"),
    ]
    if FEATURES["selective AC"] is None:
        rows.append(_row(
            source=src, url=KORTHIKANTI_URL, where="Table 2, selective recomputation (t = 1)",
            config="same layer; the launcher's 'selective' (torchtitan's op SAC) against the "
                   "paper's selective recomputation", published=s * h * 34 / MiB, unit="MiB",
            measures="formula 34 sbh bytes per layer", kind="formula",
            estimate=_per_layer(one, flash=True, checkpointing="selective") / MiB,
            compared="one more layer under activation_bytes_per_sample(checkpointing="
                     "'selective')",
            explanation="not an error: two policies with one name (see the row's note)",
            note="two different policies with one name: the paper keeps everything but the "
                 "attention core; torchtitan's op SAC (the launcher's) keeps the layer input, "
                 "the attention output and every other matmul output"))
    return rows


def matches_printed(value: float | Decimal, printed: str) -> bool:
    """True when ``printed`` is ``value`` rounded half-up or truncated to the printed digits.

    Table 1 rounds most cells (41.25 -> 41.3, 1.875 -> 1.88) but truncates some large ones
    (4187.5 -> 4187, 513.5 -> 513); either is "exact to the paper's rounding". A ``Decimal``
    is taken as it is (exact bytes / GB); a float by its shortest repr.
    """
    p = Decimal(printed)
    v = value if isinstance(value, Decimal) else Decimal(repr(value))
    return p in (v.quantize(p, rounding=ROUND_HALF_UP), v.quantize(p, rounding=ROUND_DOWN))


def zero_cells() -> list[dict[str, Any]]:
    """Every cell of ZeRO Table 1 next to the launcher's numbers.

    P_os+g+p is what the planner does for ``fsdp`` over Nd GPUs (``per_gpu_memory``, which
    shards the footprint's weights, gradients and optimizer state). The launcher plans no ZeRO-1,
    and its ZeRO-2 (FSDP2 without resharding after forward) shards the same states as fsdp, the
    gathered 16-bit weights being held outside them; for P_os and P_os+g two numbers are given,
    both from ``model_states``:
    "recomposed", the paper's split rebuilt from the launcher's per-state bytes (16-bit weights and
    gradients = the ``bf16`` states, K = the ``bf16_mixed`` fp32 weights + Adam moments = 12), and
    "launcher split", the launcher's own ``bf16_mixed`` accounting (torch autocast: fp32 weights
    4 + fp32 gradients 4 + moments 8, no separate 16-bit copy) with the same stages applied.
    """
    cells = []
    for model, (psi, rows) in ZERO_TABLE1.items():
        half = model_states(psi, "bf16", "adamw")             # 16-bit weights and gradients
        mixed = model_states(psi, "bf16_mixed", "adamw")      # fp32 weights, fp32 grads, moments
        assert mixed.total == 16 * psi and half.parameters == half.gradients == 2 * psi
        footprint = from_shape(shape_from_params(psi), precision="bf16_mixed",
                               optimizer="adamw", checkpointing=False, kind="declared")
        for nd, printed in rows.items():
            k = model_states(psi, "bf16_mixed", "adamw", shard_degree=nd)
            k_sharded = k.parameters + k.optimizer          # (4 + 8) Psi / Nd = K Psi / Nd
            g16 = model_states(psi, "bf16", "adamw", shard_degree=nd).gradients  # 2 Psi / Nd
            recomposed = (half.parameters + half.gradients + k_sharded,
                          half.parameters + g16 + k_sharded)
            own = (mixed.parameters + mixed.gradients + k.optimizer,
                   mixed.parameters + k.gradients + k.optimizer)
            nodes, gpus = (1, nd) if nd <= 8 else (nd // 8, 8)
            target = Target(name=f"{nd} GPUs", gpus=gpus, memory_bytes=32 * GB,
                            generation="volta", max_nodes=nodes)
            strategy = "fsdp" if nd > 1 else "single"
            sharded = per_gpu_memory(footprint, target, strategy, nodes, gpus, 1).model_states
            assert sharded is not None
            values = {"P_os": (recomposed[0], own[0]), "P_os+g": (recomposed[1], own[1]),
                      "P_os+g+p": (sharded, sharded)}
            for stage, text in zip(("P_os", "P_os+g", "P_os+g+p"), printed, strict=True):
                rebuilt, launcher = values[stage]
                cells.append({
                    "model": model, "psi": psi, "nd": nd, "stage": stage,
                    "published_gb": float(text), "published_text": text,
                    "recomposed_gb": rebuilt / GB, "launcher_gb": launcher / GB,
                    "launcher_how": ("planner fsdp sharding" if stage == "P_os+g+p"
                                     else "launcher bf16_mixed split"),
                    "recomposed_matches": matches_printed(rebuilt / GB, text),
                    "launcher_matches": matches_printed(launcher / GB, text),
                    "launcher_error_pct": 100 * (launcher / GB - float(text)) / float(text),
                })
    return cells



def torchtune_rows() -> list[dict[str, Any]]:
    """torchtune's optimization-flags table: the "+ Packed Dataset" row, the first of fixed
    length (the baseline's alpaca rows vary in length), eager, before compile, chunked
    cross-entropy, checkpointing, optimizer-in-backward, offloading and 8-bit AdamW were added;
    the rows after it need what the launcher does not model."""
    target = Target(name="A100 80GB", gpus=1, memory_bytes=80 * GiB, generation="ampere")
    shape = shape_from_config(LLAMA32_3B, seq_len=4096)
    fp = from_shape(shape, precision="bf16", optimizer="adamw", checkpointing=False, flash=True)
    memory = per_gpu_memory(fp, target, "single", 1, 1, 2)
    assert memory.peak_allocated is not None
    traced, how = traced_memory(LLAMA32_3B, 4096, "bf16", "adamw", False, target, "single", 1,
                                1, 2)
    source, where = "torchtune README, Optimization flags (2024)", "row '+ Packed Dataset'"
    measures = "peak active (torch's active_bytes.all.peak), no context"
    rows = [_row(
        source=source, url=TORCHTUNE_URL, where=where,
        config="Llama 3.2 3B full fine-tune, 1 A100 80GB, batch 2 x 4096 tokens (packed), pure "
               "bf16, AdamW, no AC, no compile", published=60.0, unit="GiB", measures=measures,
        kind="measured", estimate=memory.peak_allocated / GiB,
        compared="per_gpu_memory(single).peak_allocated, precision 'bf16'",
        assumptions=["torchtune's bf16: weights, gradients and AdamW's moments in bf16, no fp32 "
                     "master copy = launcher precision 'bf16'",
                     "the baseline's flags before the techniques the later rows add: no "
                     "activation checkpointing, no compile, torch.nn.CrossEntropyLoss on the "
                     "logits the model upcasts to fp32, AdamW (torch, foreach), the step outside "
                     "the backward, nothing offloaded",
                     "the packed dataset fills every row to 4096 tokens", "SDPA flash attention "
                     "(bf16 on an A100)", "peak active compared with the launcher's peak "
                     "allocated"],
        explanation=f"over by {memory.peak_allocated / GiB - 60.0:.2f} GiB: the model states "
                    "(8 B/param: 23.9 GiB), 28 layers' activations at 2 x 4096 tokens and the "
                    "loss's 12 B per logit (11.7 GiB) at the backward's start",
        traced=None if traced is None or traced.peak_allocated is None
        else traced.peak_allocated / GiB,
        traced_how=how + ("; transformers' LlamaForCausalLM, not torchtune's model code"
                          if traced is not None else ""))]
    chunked = ["torch.compile", "chunked cross-entropy"]
    for label, value, needs in (("+ Compile", 51.0, ["torch.compile"]),
                                ("+ Chunked Cross Entropy", 42.9, chunked),
                                ("+ Activation Checkpointing", 24.9, chunked)):
        rows.append(_row(source=source, url=TORCHTUNE_URL, where=f"row '{label}'",
                         config=f"the same with each technique above added, to {label[2:]}",
                         published=value, unit="GiB", measures=measures, kind="needs_feature",
                         needs=needs))
    return rows


def all_rows() -> list[dict[str, Any]]:
    """Every published figure of this file (ZeRO Table 1's cells apart), in the order shown."""
    return (hf_bert_rows() + torchtitan_rows() + torchtune_rows() + zero_r_rows()
            + korthikanti_rows() + deepspeed_rows())


def summarize(rows: list[dict[str, Any]], cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Median |error| over the measured rows, and every row under by more than 5%."""
    measured = [r for r in rows if r["kind"] == "measured" and r["error_pct"] is not None]
    under = [{"row": f"{r['source']}, {r['where']}: {r['configuration']}", "kind": r["kind"],
              "error_pct": r["error_pct"], "why": r["explanation"] or "unexplained",
              "needs": r["needs"]}
             for r in rows if r["error_pct"] is not None and r["error_pct"] < UNDER_LIMIT_PCT]
    # The traced column: rows that are measurements (the analytic side may lack a feature the
    # trace has: Adafactor), and which of them the trace runs in the run's own setting.
    def run(r: dict[str, Any]) -> bool:
        """A measurement of the launcher's setting, or one only the analytic path lacks."""
        return r["kind"] == "measured" or (r["kind"] == "needs_feature" and bool(r["needs"])
                                           and set(r["needs"]) <= set(TRACE_HAS))

    runs = [r for r in rows if r["traced_error_pct"] is not None and run(r)]
    same = [r for r in runs if r["traced_run_error_pct"] is not None]
    answers = [r for r in rows if r["answer_error_pct"] is not None and run(r)]

    def median(values: list[float]) -> float | None:
        return None if not values else round(statistics.median(abs(v) for v in values), 2)

    traced = {
        "rows_traced": len(runs),
        "median_abs_error_pct_traced": median([r["traced_error_pct"] for r in runs]),
        "rows_traced_in_the_runs_setting": len(same),
        "median_abs_error_pct_traced_in_the_runs_setting": median(
            [r["traced_run_error_pct"] for r in same]),
        "worst_under_traced_in_the_runs_setting": min(
            (r["traced_run_error_pct"] for r in same), default=None),
        "launch_plan_answers": len(answers),
        "median_abs_error_pct_launch_plan_answer": median(
            [r["answer_error_pct"] for r in answers]),
        "traced_under_5pct": [
            {"row": f"{r['source']}, {r['where']}", "traced_error_pct": r["traced_error_pct"],
             "setting": r["traced_setting"] or "the run's", "how": r["traced_how"]}
            for r in runs if r["traced_error_pct"] < UNDER_LIMIT_PCT],
        "not_traced": sorted({r["traced_how"] for r in rows
                              if r["traced"] is None and r["traced_how"]}),
        "answer_is_traced_for": [f"{r['source']}, {r['where']}" for r in rows
                                 if r["answer"] == "traced"],
    }
    return {
        "rows": len(rows),
        "by_kind": {k: sum(r["kind"] == k for r in rows) for k in KINDS},
        "measured_rows_compared": len(measured),
        "median_abs_error_pct_measured": (
            None if not measured else round(statistics.median(abs(r["error_pct"])
                                                              for r in measured), 2)),
        "worst_under_measured": (
            None if not measured else min(measured, key=lambda r: r["error_pct"])["error_pct"]),
        f"under_{-UNDER_LIMIT_PCT:g}pct": under,
        "not_expressible": [f"{r['source']}, {r['where']}: needs {', '.join(r['needs'])}"
                            for r in rows if r["kind"] == "needs_feature"],
        "features": FEATURES,
        "traced": traced,
        "zero_table1_cells": len(cells),
        "zero_fsdp_matches_P_os+g+p": all(c["launcher_matches"] for c in cells
                                          if c["stage"] == "P_os+g+p"),
        "zero_recomposed_matches_all": all(c["recomposed_matches"] for c in cells),
        "zero_gb_is_1e9": 16 * 7_500_000_000 / GB == 120 and round(16 * 7.5e9 / GiB, 1) != 120,
    }


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.2f}"


def _verdict(row: dict[str, Any]) -> str:
    if row["error_pct"] is None:
        return "needs " + ", ".join(n.split(" (")[0] for n in row["needs"]) + " (not available)"
    if abs(row["error_pct"]) < 0.05:
        return "exact"
    return "**under**" if row["under_estimate"] else "over"


def markdown(rows: list[dict[str, Any]], cells: list[dict[str, Any]]) -> str:
    out = ["| kind | source | where | configuration | published | launcher (analytic) | error "
           "| verdict | traced | traced error | launch plan answers |",
           "| --- | --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    for r in rows:
        error = "-" if r["error_pct"] is None else f"{r['error_pct']:+.1f}%"
        launcher = "-" if r["launcher"] is None else f"{_fmt(r['launcher'])} {r['unit']}"
        traced = "-" if r["traced"] is None else f"{_fmt(r['traced'])} {r['unit']}"
        traced_error = ("-" if r["traced_error_pct"] is None
                        else f"{r['traced_error_pct']:+.1f}%")
        answer = r["answer"] + (f" ({r['traced_setting']})" if r["traced_setting"] else "")
        out.append(f"| {r['kind']} | [{r['source']}]({r['url']}) | {r['where']} | "
                   f"{r['configuration']} | {_fmt(r['published'])} {r['unit']} | {launcher} | "
                   f"{error} | {_verdict(r)} | {traced} | {traced_error} | {answer} |")
    out += ["", "ZeRO Table 1 (GB = 1e9 B), each cell `paper / launcher`; for P_os and P_os+g "
            "also `recomposed` (the paper's 2 + 2 + K split rebuilt from `model_states`):", "",
            "| model | Nd | P_os: paper / recomposed / launcher split | P_os+g: paper / "
            "recomposed / launcher split | P_os+g+p: paper / planner fsdp |",
            "| --- | ---: | --- | --- | --- |"]
    by_key: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for c in cells:
        by_key.setdefault((c["model"], c["nd"]), {})[c["stage"]] = c
    for (model, nd), stages in by_key.items():
        parts = []
        for stage in ("P_os", "P_os+g"):
            c = stages[stage]
            mark = "" if c["recomposed_matches"] else " (MISMATCH)"
            parts.append(f"{c['published_text']} / {c['recomposed_gb']:.6g}{mark} / "
                         f"{c['launcher_gb']:.6g} ({c['launcher_error_pct']:+.1f}%)")
        c = stages["P_os+g+p"]
        mark = "" if c["launcher_matches"] else " (MISMATCH)"
        parts.append(f"{c['published_text']} / {c['launcher_gb']:.6g}{mark}")
        out.append(f"| {model} | {nd} | " + " | ".join(parts) + " |")
    return "\n".join(out)


def summary_text(summary: dict[str, Any]) -> str:
    key = f"under_{-UNDER_LIMIT_PCT:g}pct"
    out = [f"{summary['measured_rows_compared']} measured rows compared: median |error| "
           f"{summary['median_abs_error_pct_measured']}%, worst under "
           f"{summary['worst_under_measured']}%; rows by kind: {summary['by_kind']}",
           f"Under by more than {-UNDER_LIMIT_PCT:g}% ({len(summary[key])}):"]
    out += [f"- {u['error_pct']:+.1f}% [{u['kind']}] {u['row']}: {u['why']}"
            for u in summary[key]]
    t = summary["traced"]
    out.append(f"Traced (launch plan --model-config, transformers importable): {t['rows_traced']}"
               f" measurement rows, median |error| {t['median_abs_error_pct_traced']}%; "
               f"in the run's own setting ({t['rows_traced_in_the_runs_setting']} rows): median "
               f"|error| {t['median_abs_error_pct_traced_in_the_runs_setting']}%, worst under "
               f"{t['worst_under_traced_in_the_runs_setting']}%")
    out.append(f"launch plan's answer (traced for {len(t['answer_is_traced_for'])} rows, the "
               f"rest analytic) over {t['launch_plan_answers']} measurement rows: median "
               f"|error| {t['median_abs_error_pct_launch_plan_answer']}%")
    out += [f"- traced {u['traced_error_pct']:+.1f}% {u['row']} ({u['setting']}; {u['how']})"
            for u in t["traced_under_5pct"]]
    out += [f"- not traced: {n}" for n in t["not_traced"]]
    out.append(f"Not expressible yet ({len(summary['not_expressible'])}):")
    out += [f"- {n}" for n in summary["not_expressible"]]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=("md", "json", "both"), default="both")
    parser.add_argument("--no-trace", action="store_true",
                        help="the analytic table alone (no transformers traces: ~1 s instead "
                             "of minutes)")
    args = parser.parse_args()
    TRACE["on"] = not args.no_trace
    cells = zero_cells()
    rows = all_rows()
    summary = summarize(rows, cells)
    if args.format in ("md", "both"):
        print(markdown(rows, cells))
        print()
        print(summary_text(summary))
        print()
    if args.format in ("json", "both"):
        print(json.dumps({"rows": rows, "zero_table1": cells, "summary": summary}, indent=1))
    ok = summary["zero_fsdp_matches_P_os+g+p"] and summary["zero_recomposed_matches_all"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
