"""How close is the traced estimate to a real step, on the CPU? And how fast is a 7B trace?

Three parts (docs/benchmarks.md, section "Estimator (CPU accuracy)", has the results):

1. Accuracy, eight architectures (bench/models_zoo.py). For each: a real CPU run of two optimizer
   steps whose peak is read from the CPU allocator's own events (``measure_recipe``), against the
   traced estimate (``trace_recipe`` on fake tensors, sizes 1, 2, 4). Compared at a traced size
   (``--micro-batch``, 4) and at an untraced one (``--predict``, 8) that only the fit answers.
2. Variants on the GPT: bf16 autocast, pure bf16, activation checkpointing, accumulation, SGD,
   Adafactor, 8-bit Adam (its bytes), foreach AdamW; and the foreach optimizer-step spike on a
   model whose weights dominate (the MLP at micro-batch 1).
3. Speed: a traced preflight of a Llama-7B-shaped recipe (32 layers, 4096 wide, 32 heads, 8 KV
   heads, SwiGLU 11008, vocab 32000, sequence 2048), CUDA semantics, bf16 autocast, AdamW:
   wall time, CPU time and peak host memory of the child process.
4. Depth scaling: deep models (``--layers``) traced whole and at two depths extrapolated
   (``scale_depth``), against each other (every category, micro-batches 1 to 32) and a real step.

    .venv/bin/python bench/bench_estimate_cpu.py                 # everything (~15 min on 2 cores)
    .venv/bin/python bench/bench_estimate_cpu.py --part accuracy --archs gpt,cnn
    .venv/bin/python bench/bench_estimate_cpu.py --part speed --sizes 1,2
    .venv/bin/python bench/bench_estimate_cpu.py --part depth --layers 12

Every run is a child process (the launcher's own), so the numbers include nothing of this one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from models_zoo import ARCHS, llama_7b_config, write_recipe  # noqa: E402

from launcher.estimate.traced import measure_recipe, trace_recipe  # noqa: E402

TARGET = 0.01  # the bar: within 1% of the real step

VARIANTS: list[dict[str, Any]] = [
    {"precision": "bf16_mixed"},
    {"precision": "bf16"},
    {"activation_checkpointing": True},
    {"grad_accum_steps": 2},
    {"optimizer": "sgd"},
    {"optimizer": "adafactor"},
    {"optimizer": "adam8bit"},
    {"optimizer": "adamw", "foreach": True},
]


def _error(traced: int, real: int) -> float:
    return (traced - real) / real


def accuracy(arch: str, directory: Path, micro_batch: int, predict: int,
             sizes: tuple[int, ...], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Real vs traced for one recipe and one configuration."""
    config = dict(config or {})
    recipe = write_recipe(arch, directory)
    started = time.perf_counter()
    trace = trace_recipe(recipe, device="cpu", micro_batch_sizes=sizes, timeout_s=900, **config)
    trace_s = time.perf_counter() - started
    real = measure_recipe(recipe, micro_batch=micro_batch, timeout_s=900, **config)
    row: dict[str, Any] = {
        "arch": arch, "config": config, "kind": trace.kind, "alignment": trace.alignment,
        "fit_sizes": list(trace.fit_sizes), "residual": trace.max_residual_fraction,
        "micro_batch": micro_batch, "real": real.peak_allocated,
        "traced": trace.peak_at(micro_batch), "fitted": trace.predicted_at(micro_batch),
        "peak_phase": trace.per_size[micro_batch].phase if micro_batch in trace.per_size else None,
        "trace_wall_s": round(trace_s, 1), "probes": trace.probes, "notes": list(trace.notes),
        "parameters": trace.parameters,
    }
    row["error"] = _error(row["traced"], row["real"])
    if predict and predict not in sizes:
        real_p = measure_recipe(recipe, micro_batch=predict, timeout_s=900, **config)
        row["predict"] = predict
        row["real_predict"] = real_p.peak_allocated
        row["predicted"] = trace.peak_at(predict)
        row["error_predict"] = _error(row["predicted"], row["real_predict"])
    return row


DEPTH_ARCHS = ("gpt", "llama", "vit", "encdec", "moe")


def depth_scaling(arch: str, directory: Path, layers: int, micro_batch: int,
                  predict: int) -> dict[str, Any]:
    """The same deep model traced whole and at two depths extrapolated, and really run."""
    recipe = write_recipe(arch, directory / f"{arch}_deep{layers}", layers=layers)
    timed: dict[str, Any] = {}
    for label, scale in (("whole", False), ("scaled", True)):
        started = time.perf_counter()
        timed[label] = trace_recipe(recipe, device="cpu", micro_batch_sizes=(1, 2, 4),
                                    scale_depth=scale, timeout_s=900)
        timed[f"{label}_s"] = round(time.perf_counter() - started, 1)
    real = measure_recipe(recipe, micro_batch=micro_batch, timeout_s=900).peak_allocated
    whole, scaled = timed["whole"], timed["scaled"]
    return {
        "arch": arch, "layers": layers, "parameters": whole.parameters, "kind": scaled.kind,
        "scaled": type(scaled).__name__ == "ScaledTrace",
        "blocks": getattr(scaled, "blocks", None), "real": real,
        "whole": whole.peak_at(micro_batch), "extrapolated": scaled.peak_at(micro_batch),
        "error": _error(scaled.peak_at(micro_batch), real),
        "same_bytes": all(whole.memory_at(b) == scaled.memory_at(b)
                          for b in (1, 2, 4, predict, 32)),
        "whole_s": timed["whole_s"], "scaled_s": timed["scaled_s"],
    }


def optimizer_spike(directory: Path) -> list[dict[str, Any]]:
    """foreach vs for-loop AdamW where the optimizer step is the peak (weights dominate)."""
    rows = []
    recipe = write_recipe("mlp", directory)
    for foreach in (False, True):
        trace = trace_recipe(recipe, device="cpu", micro_batch_sizes=(1, 2), optimizer="adamw",
                             foreach=foreach, timeout_s=900)
        real = measure_recipe(recipe, micro_batch=1, optimizer="adamw", foreach=foreach)
        rows.append({
            "foreach": foreach, "real": real.peak_allocated, "traced": trace.peak_at(1),
            "error": _error(trace.peak_at(1), real.peak_allocated),
            "phase": trace.per_size[1].phase, "parameter_bytes": trace.parameter_bytes,
            "breakdown": trace.per_size[1].at_peak,
        })
    return rows


def speed(directory: Path, sizes: tuple[int, ...], kv_heads: int) -> dict[str, Any]:
    """Trace the 7B-shaped recipe; time it from the parent (child start-up included)."""
    recipe = write_recipe("llama", directory / f"llama7b_kv{kv_heads}",
                          **llama_7b_config(kv_heads=kv_heads))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    trace = trace_recipe(recipe, device="cuda", micro_batch_sizes=sizes, precision="bf16_mixed",
                         timeout_s=900)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    memory = trace.memory_at(sizes[0])
    return {
        "kv_heads": kv_heads, "sizes": list(sizes), "parameters": trace.parameters,
        "wall_s": round(wall, 1), "child_cpu_s": round(cpu, 1),
        "host_peak_rss_mib": round((trace.host_peak_rss_bytes or 0) / 2**20),
        "load_average_1min_before": round(load, 1), "timings": trace.timings,
        "peak_gib": {b: round(trace.peak_at(b) / 2**30, 2) for b in (1, 2, 4, 8)
                     if len(sizes) > 1 or b in sizes},
        "peak_phase": trace.per_size[sizes[0]].phase, "memory_b1": memory.__dict__,
        "alignment": trace.alignment, "notes": list(trace.notes),
    }


def _pct(x: float) -> str:
    return f"{x * 100:+.3f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "accuracy", "variants", "spike", "speed",
                                           "depth"),
                        default="all")
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--predict", type=int, default=8)
    parser.add_argument("--sizes", default=None, help="traced sizes (accuracy: 1,2,4; speed: 1,2)")
    parser.add_argument("--kv-heads", default="8", help="speed: KV heads of the 7B, e.g. 8,32")
    parser.add_argument("--jobs", type=int, default=2, help="child processes at a time")
    parser.add_argument("--layers", type=int, default=12, help="depth: blocks of the models")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="bench_estimate_"))
    results: dict[str, Any] = {"torch_threads_note": "children use torch's default threads"}
    failed = False

    if args.part in ("all", "accuracy"):
        sizes = tuple(int(x) for x in (args.sizes or "1,2,4").split(","))
        archs = args.archs.split(",")
        with ThreadPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(lambda a: accuracy(a, directory, args.micro_batch, args.predict,
                                                    sizes), archs))
        results["accuracy"] = rows
        print(f"\n| arch | params | real peak (B) | traced (B) | error | predicted b={args.predict}"
              " | real | error | how |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for r in rows:
            ok = abs(r["error"]) <= TARGET and abs(r.get("error_predict", 0)) <= TARGET
            failed |= not ok
            print(f"| {r['arch']} | {r['parameters']:,} | {r['real']:,} | {r['traced']:,} | "
                  f"{_pct(r['error'])} | {r.get('predicted', 0):,} | {r.get('real_predict', 0):,} "
                  f"| {_pct(r.get('error_predict', 0))} | {r['kind']}, {r['alignment']} |")

    if args.part in ("all", "variants"):
        with ThreadPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(lambda c: accuracy("gpt", directory, args.micro_batch, 0,
                                                    (1, 2, 4), c), VARIANTS))
        results["variants"] = rows
        print("\n| gpt, micro-batch 4 | real peak (B) | traced (B) | error | peak in |")
        print("| --- | ---: | ---: | ---: | --- |")
        for r in rows:
            failed |= abs(r["error"]) > TARGET
            print(f"| {json.dumps(r['config'])} | {r['real']:,} | {r['traced']:,} | "
                  f"{_pct(r['error'])} | {r['peak_phase']} |")

    if args.part in ("all", "spike"):
        rows = optimizer_spike(directory)
        results["spike"] = rows
        print("\n| MLP, micro-batch 1, AdamW | real peak (B) | traced (B) | error | peak in |")
        print("| --- | ---: | ---: | ---: | --- |")
        for r in rows:
            print(f"| foreach={r['foreach']} | {r['real']:,} | {r['traced']:,} | "
                  f"{_pct(r['error'])} | {r['phase']} |")

    if args.part in ("all", "depth"):
        archs = [a for a in args.archs.split(",") if a in DEPTH_ARCHS]
        rows = [depth_scaling(a, directory, args.layers, args.micro_batch, args.predict)
                for a in archs]
        results["depth"] = rows
        print(f"\n| arch, {args.layers} blocks | params | scaled? | real peak (B) | whole trace (B)"
              " | extrapolated (B) | error | same bytes as whole, b=1..32 | whole s | scaled s |")
        print("| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
        for r in rows:
            failed |= abs(r["error"]) > TARGET or not r["same_bytes"]
            blocks = r["blocks"] or {}
            how = f"{blocks.get('path')} {blocks.get('traced_depths')}" if r["scaled"] else "no"
            print(f"| {r['arch']} | {r['parameters']:,} | {how} | {r['real']:,} | "
                  f"{r['whole']:,} | {r['extrapolated']:,} | {_pct(r['error'])} | "
                  f"{r['same_bytes']} | {r['whole_s']} | {r['scaled_s']} |")

    if args.part in ("all", "speed"):
        sizes = tuple(int(x) for x in (args.sizes or "1,2").split(","))
        rows = [speed(directory, sizes, int(k)) for k in args.kv_heads.split(",")]
        results["speed"] = rows
        for r in rows:
            print(f"\n7B-shaped Llama (kv_heads={r['kv_heads']}, {r['parameters'] / 1e9:.2f}B "
                  f"params), sizes {r['sizes']}: wall {r['wall_s']} s, child CPU "
                  f"{r['child_cpu_s']} s, host peak RSS {r['host_peak_rss_mib']} MiB "
                  f"(1-min load average before: {r['load_average_1min_before']})")
            print(f"  predicted peak GiB by micro-batch: {r['peak_gib']} (peak in "
                  f"{r['peak_phase']})")

    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
