"""How long does a traced preflight of a 7B Llama-shaped recipe take, end to end?

``launch plan`` in a fresh process, as a user runs it: the CLI's start-up, the recipe probe (its
own child: LAUNCH, the parameter count on the meta device, training FLOPs), the planner, and
every trace the planner asks for (one child; the recipe's training step on fake tensors, with
and without activation checkpointing, depth-scaled: docs/estimator.md). The model: Llama-2-7B's
shape (32 layers, 4096 wide, 32 heads, 8 KV heads, SwiGLU 11008, vocab 32000, sequence 2048),
planned for SageMaker's ``ml.p4d.24xlarge`` (8 x A100 40 GB), global batch 64.

Host memory is the largest sum of the resident sizes of the whole process tree (the CLI and its
children), sampled every 100 ms from /proc: what the machine must hold at once.

    .venv/bin/python bench/bench_preflight.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from models_zoo import llama_7b_config, write_recipe  # noqa: E402


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants, from /proc (the kernel's list of each
    task's children: cheap enough to sample often without slowing what is measured)."""
    total, frontier, page = 0, [root], os.sysconf("SC_PAGE_SIZE")
    while frontier:
        pid = frontier.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    frontier.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total


def run_once(recipe: Path, launch: str) -> dict[str, object]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    env = {**os.environ, "LAUNCH_STATE_DIR": tempfile.mkdtemp(prefix="bench_preflight_")}
    env.pop("LAUNCH_NO_TRACE", None)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [launch, "plan", str(recipe), "--provider", "sagemaker", "--machine", "ml.p4d.24xlarge",
         "--global-batch-size", "64", "--seq-len", "2048", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=recipe.parent)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.1)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    data = json.loads(stdout) if stdout.strip() else {}
    chosen = data.get("chosen") or {}
    return {
        "exit": proc.returncode, "wall_s": round(wall, 1),
        "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
        "host_peak_mib": round(peak / 2**20), "load_before": round(load, 1),
        "parameters": (data.get("model") or {}).get("parameters"),
        "chosen": f"{chosen.get('strategy')} {chosen.get('nodes')}x{chosen.get('gpus_per_node')}"
                  f" micro {chosen.get('micro_batch_size')} x {chosen.get('grad_accum_steps')}"
                  f" ckpt {chosen.get('activation_checkpointing')}",
        "per_gpu_gib": round(((chosen.get("memory") or {}).get("total") or 0) / 2**30, 1),
        "stderr": stderr.strip().splitlines()[-1:] if proc.returncode else [],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kv-heads", type=int, default=8)
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="bench_preflight_"))
    recipe = write_recipe("llama", directory, **llama_7b_config(kv_heads=args.kv_heads))
    launch = str(Path(sys.executable).with_name("launch"))
    rows = [run_once(recipe, launch) for _ in range(args.runs)]
    for r in rows:
        print(json.dumps(r))
    walls = [r["wall_s"] for r in rows]
    print(f"\nmedian wall {statistics.median(walls)} s (min {min(walls)}, max {max(walls)}); "
          f"CPU {statistics.median(r['cpu_s'] for r in rows)} s; host peak "
          f"{max(r['host_peak_mib'] for r in rows)} MiB; chosen {rows[0]['chosen']}, "
          f"{rows[0]['per_gpu_gib']} GiB per GPU")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
