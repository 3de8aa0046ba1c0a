"""Re-run, on the GPU at hand, the published single-GPU measurements that bench_published.py cites.

    python bench/gpu_published.py --out "$OUT"                    # every row, < 3 min on an H200
    python bench/gpu_published.py --device cpu --tiny --out /tmp/gp   # CPU smoke: tiny shapes

bench/bench_published.py compares the launcher with figures others measured on their GPUs (a
V100 in 2022, an A100 in 2024). Those figures mix the setting with that machine's CUDA, torch
and transformers; this script measures the same settings here, so the launcher's estimate can be
held against a measurement whose every version is known, and the published figure against a
re-run of itself:

* the Hugging Face "Efficient Training on a Single GPU" runs (perf_train_gpu_one.mdx at
  98513dfd): bert-large-uncased + a 2-class head, sequence 512, eager attention, AdamW one
  parameter at a time (the 2022 Trainer's ``adamw_hf``), fp32 or fp16 autocast with a
  GradScaler, micro-batch x accumulation, gradient checkpointing; Adafactor from transformers.
  The 8-bit Adam rows need bitsandbytes and are skipped with that reason where it is missing.
* torchtune's "+ Packed Dataset" row (README at 1814feb1): Llama 3.2 3B, pure bf16 (weights,
  gradients and AdamW's moments), batch 2 x 4096 tokens, SDPA, no checkpointing, the loss on
  logits upcast to fp32 (transformers' LlamaForCausalLM, not torchtune's model code).

Each row runs in its own process (a fresh CUDA context) for ``--steps`` optimizer steps on random
tokens and records: ``context_used`` (device memory in use, by ``cudaMemGetInfo``, after the first
CUDA tensor: the context the HF page's 1,343 MiB row measures), ``peak_allocated``,
``peak_reserved`` and ``peak_active`` (torch's allocator statistics), and ``nvml_used_at_peak``
= context_used + peak_reserved (what the HF page's "GPU memory occupied" reads). Rows are written
to ``OUT/gpu_published.json`` atomically after each one. Weights are random (no download): the
memory of a step does not depend on their values.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUTPUT_NAME = "gpu_published.json"

BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
              "intermediate_size": 4096, "vocab_size": 30522, "max_position_embeddings": 512,
              "type_vocab_size": 2, "num_labels": 2}
LLAMA32_3B = {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
              "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
              "vocab_size": 128256, "max_position_embeddings": 131072,
              "tie_word_embeddings": True, "rope_theta": 500000.0}
TINY = {"bert": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "intermediate_size": 128},
        "llama": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                  "vocab_size": 1000}}

#: (name, model, micro-batch, accumulation, checkpointing, precision, optimizer, sequence,
#:  published figure, its unit and what it measured).
ROWS: tuple[tuple[Any, ...], ...] = (
    ("hf vanilla", "bert", 4, 1, False, "fp32", "adamw", 512, 14949, "MiB", "nvml_used"),
    ("hf gradient accumulation", "bert", 1, 4, False, "fp32", "adamw", 512, 8681, "MiB",
     "nvml_used"),
    ("hf accumulation + gradient checkpointing", "bert", 1, 4, True, "fp32", "adamw", 512, 6775,
     "MiB", "nvml_used"),
    ("hf fp16", "bert", 4, 1, False, "fp16", "adamw", 512, 13939, "MiB", "nvml_used"),
    ("hf accumulation + checkpointing + fp16", "bert", 1, 4, True, "fp16", "adamw", 512, 7275,
     "MiB", "nvml_used"),
    ("hf adafactor", "bert", 4, 1, False, "fp32", "adafactor", 512, 12295, "MiB", "nvml_used"),
    ("hf accumulation + checkpointing + fp16 + adafactor", "bert", 1, 4, True, "fp16",
     "adafactor", 512, 4847, "MiB", "nvml_used"),
    ("hf 8-bit Adam", "bert", 4, 1, False, "fp32", "adam8bit", 512, 13085, "MiB", "nvml_used"),
    ("torchtune + Packed Dataset", "llama", 2, 1, False, "bf16", "adamw", 4096, 60.0, "GiB",
     "peak_active"),
)


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """One row, in this process: build the model, run the steps, read the allocator."""
    import torch
    import transformers

    device = torch.device(spec["device"])
    cuda = device.type == "cuda"
    if cuda:
        torch.ones(1, device=device)
        free, total = torch.cuda.mem_get_info()
        context_used = total - free
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    # Built on the device, in its dtype: a 3B model initialised on the CPU in fp32 takes minutes.
    dtype = torch.bfloat16 if spec["precision"] == "bf16" else torch.float32
    torch.set_default_dtype(dtype)
    with torch.device(device):
        if spec["model"] == "bert":
            config = transformers.BertConfig(**{**BERT_LARGE, **spec["tiny"]})
            config._attn_implementation = "eager"
            model = transformers.BertForSequenceClassification(config)
        else:
            config = transformers.LlamaConfig(**{**LLAMA32_3B, **spec["tiny"]})
            config._attn_implementation = "sdpa"
            model = transformers.LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    model = model.train()
    if spec["checkpointing"]:
        model.gradient_checkpointing_enable()
    params = [p for p in model.parameters() if p.requires_grad]
    if spec["optimizer"] == "adamw":
        # The 2022 Trainer's adamw_hf stepped one parameter at a time; torchtune's is foreach.
        optimizer = torch.optim.AdamW(params, lr=1e-5, foreach=spec["model"] != "bert")
    elif spec["optimizer"] == "adafactor":
        optimizer = transformers.Adafactor(params, lr=1e-5, relative_step=False,
                                           scale_parameter=False, warmup_init=False)
    else:
        import bitsandbytes  # noqa: F401  (skipped by the parent when missing)
        optimizer = bitsandbytes.optim.Adam8bit(params, lr=1e-5)
    fp16 = spec["precision"] == "fp16"
    scaler = torch.amp.GradScaler(device.type, enabled=fp16)
    b, seq = spec["batch"], spec["seq"]
    vocab = config.vocab_size
    t0 = time.perf_counter()
    for _ in range(spec["steps"]):
        for _ in range(spec["accumulation"]):
            ids = torch.randint(0, vocab, (b, seq), device=device)
            with torch.autocast(device.type, dtype=torch.float16, enabled=fp16):
                if spec["model"] == "bert":
                    labels = torch.randint(0, 2, (b,), device=device)
                    loss = model(input_ids=ids, labels=labels).loss
                else:
                    logits = model(input_ids=ids).logits
                    loss = torch.nn.functional.cross_entropy(
                        logits[:, :-1].float().reshape(-1, vocab), ids[:, 1:].reshape(-1))
            scaler.scale(loss / spec["accumulation"]).backward()
            del loss
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = {"seconds": round(seconds, 2),
                           "parameters": sum(p.numel() for p in model.parameters())}
    if cuda:
        stats = torch.cuda.memory_stats()
        reserved = torch.cuda.max_memory_reserved()
        out.update(context_used=context_used, peak_allocated=torch.cuda.max_memory_allocated(),
                   peak_reserved=reserved, peak_active=stats.get("active_bytes.all.peak"),
                   nvml_used_at_peak=context_used + reserved)
    return out


def compare(measured_file: Path) -> list[dict[str, Any]]:
    """The launcher's figures for each measured BERT row, on an H200 with this file's CUDA:
    ``launch plan --model-config bert-large.json --seq-len 512 --attention math`` traced
    (bench_published.traced_memory: ``footprints.hf_traced``) and the analytic path, each
    row's peak allocated and reserved (no context) next to the allocator's, and the context."""
    import bench_published as bp

    data = json.loads(measured_file.read_text(encoding="utf-8"))
    cuda = tuple(int(x) for x in (data["environment"].get("cuda") or "12.4").split(".")[:2])
    target = bp._context_target("H200", int(data["environment"].get("gpu_memory") or 141 * 2**30),
                                "hopper", cuda, gpus=1)  # type: ignore[arg-type]
    bp.TRACE["on"] = True
    eager = bp._bert_shape("math")
    out = []
    for row in data["rows"]:
        if row.get("status") != "done" or row["model"] != "bert":
            continue
        precision = "bf16_mixed" if row["precision"] == "fp16" else "fp32"
        b, accum, ckpt, optimizer = (row["micro_batch"], row["accumulation"],
                                     row["checkpointing"], row["optimizer"])
        fp = bp.from_shape(eager, precision=precision, optimizer=optimizer, checkpointing=ckpt,
                           flash=False, **bp._HF_2022_LOOP)
        analytic = bp.per_gpu_memory(fp, target, "single", 1, 1, b, accum)
        traced, how = bp.traced_memory(bp.BERT_LARGE_CLASSIFIER, 512, precision, optimizer,
                                       ckpt, target, "single", 1, 1, b, accum, attention="math",
                                       optimizer_impl="for-loop" if optimizer == "adamw" else None)
        entry = {"name": row["name"], "measured_allocated": row["peak_allocated"],
                 "measured_reserved": row["peak_reserved"],
                 "measured_context": row["context_used"],
                 "launcher_overhead": analytic.framework_overhead,
                 "traced_how": how}
        for label, memory in (("analytic", analytic), ("traced", traced)):
            for what in ("allocated", "reserved"):
                value = None if memory is None else getattr(memory, f"peak_{what}")
                entry[f"{label}_{what}"] = value
                entry[f"{label}_{what}_error"] = (
                    None if value is None else
                    round((value - row[f"peak_{what}"]) / row[f"peak_{what}"], 4))
        print(json.dumps(entry), flush=True)
        out.append(entry)
    return out


def _environment(device: str) -> dict[str, Any]:
    code = ("import json, torch, transformers; d = {'torch': torch.__version__, "
            "'cuda': torch.version.cuda, 'transformers': transformers.__version__}\n"
            "if torch.cuda.is_available(): d['gpu'] = torch.cuda.get_device_name(0); "
            "d['gpu_memory'] = torch.cuda.get_device_properties(0).total_memory\n"
            "print(json.dumps(d))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-500:]}


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu_published_out"))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU smoke mode)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=170.0)
    parser.add_argument("--only", default="", help="comma-separated substrings of row names")
    parser.add_argument("--compare", type=Path, metavar="GPU_PUBLISHED_JSON",
                        help="the launcher's figures beside a measured file's BERT rows")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compare:
        sys.path.insert(0, str(HERE))
        sys.path.insert(0, str(HERE.parent))
        compare(args.compare)
        return 0
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / OUTPUT_NAME
    data: dict[str, Any] = {"environment": _environment(args.device), "steps": args.steps,
                            "rows": []}
    _write(path, data)
    deadline = time.monotonic() + args.budget_s
    wanted = [w for w in args.only.split(",") if w]
    for (name, model, b, acc, ckpt, precision, optimizer, seq, published, unit,
         measures) in ROWS:
        if wanted and not any(w in name for w in wanted):
            continue
        row: dict[str, Any] = {"name": name, "model": model, "micro_batch": b,
                               "accumulation": acc, "checkpointing": ckpt,
                               "precision": precision, "optimizer": optimizer, "seq": seq,
                               "published": published, "unit": unit,
                               "published_measures": measures}
        data["rows"].append(row)
        left = deadline - time.monotonic()
        if optimizer == "adam8bit":
            try:
                import bitsandbytes  # noqa: F401
            except ImportError:
                row.update(status="skipped", reason="bitsandbytes is not installed here")
                _write(path, data)
                continue
        if left < 10:
            row.update(status="skipped", reason="budget spent")
            _write(path, data)
            continue
        spec = {"device": args.device, "model": model, "batch": b, "accumulation": acc,
                "checkpointing": ckpt, "precision": precision, "optimizer": optimizer,
                "seq": 64 if args.tiny else seq, "steps": args.steps,
                "tiny": TINY[model] if args.tiny else {}}
        try:
            done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                                  capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            row.update(status="failed", reason=f"timed out after {left:.0f} s")
        else:
            if done.returncode == 0:
                row.update(status="done", **json.loads(done.stdout.strip().splitlines()[-1]))
                scale = 2**20 if unit == "MiB" else 2**30
                value = row.get(f"{measures}_at_peak" if measures == "nvml_used"
                                else measures)
                if value is not None:
                    row["measured_here"] = round(value / scale, 2)
                    row["published_vs_here"] = round((published - value / scale)
                                                     / (value / scale), 4)
            else:
                row.update(status="failed", reason=done.stderr.strip()[-800:])
        print(json.dumps(row), flush=True)
        _write(path, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
