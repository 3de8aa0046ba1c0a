"""From the out-of-memory line to the job stopped, on the local provider.

    .venv/bin/python bench/bench_stop_latency.py [--runs 3]

A 2-process DDP job where rank 1 runs out of memory in its forward pass (a real CPU allocator
failure under `--memory-limit`) while rank 0 goes on into backward and waits in the gradient
all-reduce for a peer that will never come: the case where, without `launch`, the healthy ranks
hang until the collective's timeout (30 minutes by default). The supervisor stops the whole job
when it reads the failure; the attempt records the seconds from that line to the job's end
(`stop_latency_s`). Target: under 2 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

RECIPE = textwrap.dedent('''
    import os
    import torch

    LAUNCH = {"global_batch_size": 8, "steps": 3, "lr": 0.01}

    def build_model():
        return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def example_batch(batch_size):
        x = torch.randn(batch_size, 16)
        return {"x": x, "y": x.sum(dim=1, keepdim=True)}

    def training_step(model, batch):
        if os.environ.get("RANK") == "1":  # only in the job, and only on rank 1
            torch.ones(batch["x"].shape[0], 1024 * 1024 * 1024)  # 16 GiB: over the cap
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
''')


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    latencies = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(RECIPE)
        for _ in range(args.runs):
            proc = subprocess.run(
                [sys.executable, "-m", "launcher.cli", str(script), "--json",
                 "--gpus-per-node", "2", "--memory-limit", "3GiB", "--max-attempts", "1"],
                capture_output=True, text=True, cwd=tmp, check=False)
            attempt = json.loads(proc.stdout)["attempts"][0]
            assert attempt["outcome"] == "oom", attempt
            latencies.append(attempt["summary"]["stop_latency_s"])
            print(f"exit {proc.returncode}: OOM on rank {attempt['diagnosis'].get('rank')}, "
                  f"stopped {attempt['summary']['stop_latency_s']:.2f} s after the line")
    print(f"stop latency over {args.runs} runs: median {statistics.median(latencies):.2f} s, "
          f"max {max(latencies):.2f} s (target < 2 s)")
    return 0 if max(latencies) < 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
