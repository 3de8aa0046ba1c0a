"""An analytic preflight of a 70B config, end to end as a user waits for it.

    .venv/bin/python bench/bench_analytic.py [--runs 5]

`launch plan` on a plain script described by a Llama-2-70B-shaped config.json, for SageMaker's
ml.p4de.24xlarge with nothing else pinned: exact parameter count, formula activations, the whole
remedy ladder up to 16 nodes (the CreateTrainingJob request is not built: no role given).
Timed as a fresh process each run (Python start, imports, planning, JSON). Target: under 1 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LLAMA2_70B = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
              "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
              "vocab_size": 32000, "max_position_embeddings": 4096,
              "tie_word_embeddings": False}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps(LLAMA2_70B))
        script = Path(tmp) / "train.py"
        script.write_text("print('training')\n")
        argv = [sys.executable, "-m", "launcher.cli", "plan", str(script), "--provider",
                "sagemaker", "--model-config", str(config), "--machine", "ml.p4de.24xlarge",
                "--precision", "bf16_mixed", "--global-batch-size", "64", "--json"]
        times, chosen = [], None
        for _ in range(args.runs):
            start = time.perf_counter()
            out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=tmp)
            times.append(time.perf_counter() - start)
            chosen = json.loads(out.stdout)["chosen"]
    assert chosen is not None
    print(f"chosen: {chosen['strategy']} {chosen['nodes']}x{chosen['gpus_per_node']} "
          f"micro {chosen['micro_batch_size']} x {chosen['grad_accum_steps']}, checkpointing "
          f"{chosen['activation_checkpointing']}, {chosen['memory']['total'] / 2**30:.1f} GiB "
          "per GPU")
    print(f"70B analytic preflight: median {statistics.median(times):.2f} s, "
          f"max {max(times):.2f} s over {args.runs} runs (target < 1 s)")
    return 0 if statistics.median(times) < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
