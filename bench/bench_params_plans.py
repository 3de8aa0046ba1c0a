"""What `launch plan` answers for 7B / 13B / 30B / 70B Llama-shaped models on both clouds
(issue 25), and whether the published runs it can be held against fit by its answer.

    .venv/bin/python bench/bench_params_plans.py            # the markdown tables
    .venv/bin/python bench/bench_params_plans.py --json     # the same rows as JSON

Each row is one `launch plan ... --json` in-process (no script: the model is described), nothing
pinned but the model: first ``--params`` alone (the shape is then assumed from the parameter
count: ``model_config.assumed_shape``), then with the reference's own ``config.json`` (written
from ``model_config.REFERENCE_DECODERS``, sized analytically: ``LAUNCH_NO_TRACE=1``, no
transformers trace). The published runs are pinned to their own layout, batch, sequence,
precision and checkpointing. Columns: the chosen plan, its per-GPU peak (``memory.total``: the
allocator's reserve, the CUDA context and NCCL included), its headroom under the usable memory
(95% of the GPU's), $/h and the total for launch's default 100 steps, and why the runner-up (the
next machine in the planner's order) lost.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from launcher.cli import main as cli_main
from launcher.context import Environment
from launcher.estimate.model_config import REFERENCE_DECODERS
from launcher.units import format_bytes

SIZES = (("7B", "Llama 2 7B"), ("13B", "Llama 2 13B"), ("30B", "LLaMA 30B"),
         ("70B", "Llama 3.1 70B"))
PROVIDERS = ("sagemaker", "vertex")

#: Published runs, pinned to their settings (sources in docs/benchmarks.md, "Estimator vs
#: published figures", and bench/bench_published.py).
PUBLISHED: tuple[tuple[str, str, list[str]], ...] = (
    ("torchtitan Table 1: Llama 3.1 8B, FSDP over 8 H100, local batch 2, seq 8192, "
     "selective AC (82.40 GiB reserved of 95 GiB)", "Llama 3.1 8B",
     ["--provider", "sagemaker", "--machine", "ml.p5.48xlarge", "--nodes", "1",
      "--strategy", "fsdp", "--micro-batch-size", "2", "--global-batch-size", "16",
      "--seq-len", "8192", "--precision", "bf16_mixed", "--checkpointing", "selective"]),
    ("torchtitan Table 3: the same over 128 H100 (67.00 GiB)", "Llama 3.1 8B",
     ["--provider", "sagemaker", "--machine", "ml.p5.48xlarge", "--nodes", "16",
      "--strategy", "fsdp", "--micro-batch-size", "2", "--global-batch-size", "256",
      "--seq-len", "8192", "--precision", "bf16_mixed", "--checkpointing", "selective"]),
    ("torchtitan Table 4: Llama 3.1 70B on 256 H100 with TP 8 (local batch 16, full AC; "
     "71.90 GiB): launch has no TP, so FSDP over the 256 at the same 512 sequences a step",
     "Llama 3.1 70B",
     ["--provider", "sagemaker", "--machine", "ml.p5.48xlarge", "--nodes", "32",
      "--strategy", "fsdp", "--micro-batch-size", "2", "--global-batch-size", "512",
      "--seq-len", "8192", "--precision", "bf16_mixed", "--checkpointing", "full"]),
    ("llama-recipes #120: Llama 2 70B, FSDP over 16 A100-80GB, pure bf16 (63 GB reserved; "
     "batch and sequence not stated: 1 x 4096 here)", "Llama 2 70B",
     ["--provider", "sagemaker", "--machine", "ml.p4de.24xlarge", "--nodes", "2",
      "--strategy", "fsdp", "--micro-batch-size", "1", "--global-batch-size", "16",
      "--seq-len", "4096", "--precision", "bf16"]),
)


def plan(args: list[str], cwd: Path) -> dict[str, Any]:
    """One `launch plan --json`, in-process, with its own state under ``cwd``."""
    out, err = io.StringIO(), io.StringIO()
    environ = {k: v for k, v in os.environ.items() if k != "CI"}
    environ.update({"LAUNCH_STATE_DIR": str(cwd / "state"), "LAUNCH_NO_TRACE": "1",
                    "LAUNCH_HOME": str(cwd / "home")})
    env = Environment(stdout=out, stderr=err, cwd=cwd, environ=environ)
    cli_main(["plan", *args, "--json"], env)
    return json.loads(out.getvalue())


def config_file(name: str, folder: Path) -> Path:
    ref = next(r for r in REFERENCE_DECODERS if r.name == name)
    path = folder / (name.replace(" ", "_") + ".json")
    path.write_text(json.dumps({**ref.config(), "max_position_embeddings": 4096}))
    return path


def row(data: dict[str, Any]) -> dict[str, Any]:
    """The columns of one answer."""
    c = data.get("chosen")
    if c is None:
        # the last rung tried (full sharding after ZeRO-2), as its rejection says it
        tried = [r for r in data.get("rejected", []) if "micro-batch" in r["option"]]
        why = f"{tried[-1]['option']}: {tried[-1]['reason']}" if tried else "nothing fits"
        return {"chosen": "none fits", "peak": "-", "headroom": "-", "per_hour": "-",
                "total": "-", "runner_up": why}
    m = c["memory"]
    usable = int(m["capacity"] * 0.95)
    ckpt = {"none": "", "selective": ", selective AC", "full": ", full AC"}[c["checkpointing"]]
    strategy = c["strategy"] + (" zero2" if not c["reshard_after_forward"]
                                and c["strategy"] in ("fsdp", "hybrid_shard") else "")
    runner = next((r for r in data["rejected"] if r["option"].startswith("runner-up ")), None)
    return {
        "chosen": (f"{strategy} on {c['nodes']} x {c['machine']} ({c['gpus_per_node']} GPUs), "
                   f"micro {c['micro_batch_size']} x {c['grad_accum_steps']}{ckpt}, "
                   f"{c['precision']}, fits {'yes' if c['fits'] else c['fits']}"),
        "peak": format_bytes(m["total"]), "headroom": format_bytes(usable - m["total"]),
        "per_hour": "-" if c["cost_per_hour_usd"] is None else f"{c['cost_per_hour_usd']:,.2f}",
        "total": "-" if c["total_cost_usd"] is None else f"{c['total_cost_usd']:,.2f}",
        "runner_up": ("-" if runner is None else
                      f"{runner['option'].removeprefix('runner-up ')}: {runner['reason']}"),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for size, reference in SIZES:
            config = config_file(reference, folder)
            for provider in PROVIDERS:
                for given, argv in (("--params " + size, ["--params", size]),
                                    (f"--model-config ({reference})",
                                     ["--model-config", str(config)])):
                    rows.append({"model": size, "cloud": provider, "input": given,
                                 **row(plan(["--provider", provider, *argv], folder))})
        published = []
        for label, reference, argv in PUBLISHED:
            config = config_file(reference, folder)
            published.append({"run": label,
                              **row(plan(["--model-config", str(config), *argv], folder))})
    if args.json:
        print(json.dumps({"plans": rows, "published": published}, indent=1))
        return 0
    print("| model | cloud | input | chosen plan | per-GPU peak | headroom | $/h | total $ "
          "(100 steps) | why the runner-up lost |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['cloud']} | {r['input']} | {r['chosen']} | {r['peak']} | "
              f"{r['headroom']} | {r['per_hour']} | {r['total']} | {r['runner_up']} |")
    print()
    print("| published run | launch's answer at its settings | per-GPU peak | headroom | "
          "why not, where it does not fit |")
    print("| --- | --- | --- | --- | --- |")
    for r in published:
        why = r["runner_up"] if r["chosen"] == "none fits" else ""
        print(f"| {r['run']} | {r['chosen']} | {r['peak']} | {r['headroom']} | {why} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
