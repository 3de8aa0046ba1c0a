"""Resubmissions after an out-of-memory on data that grows mid-run (issue 14, item 2).

Each case is a recipe whose sequences grow from 64 tokens to N after three steps of 16 samples,
with 256 KiB of scratch per token in the step, run by the installed `launch` on the local
provider under a 2.5 GiB address-space cap (a real CPU out-of-memory). Two replanners: the
default (the oom event's batch shapes re-traced) and halving (LAUNCH_NO_TRACE=1, which also
turns the re-trace off). Prints, per case, the attempts each needed and the micro-batches tried.

    .venv/bin/python bench/bench_replan.py [--tokens 512 1024 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECIPE = '''
import torch

LAUNCH = {{"global_batch_size": 16, "steps": 5, "lr": 0.01, "checkpoint_every": 1}}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 16)
        self.out = torch.nn.Linear(16, 1)

    def forward(self, ids):
        return self.out(self.emb(ids)).mean()


def build_model():
    return Net()


def example_batch(batch_size):
    return {{"ids": torch.randint(0, 1000, (batch_size, 64))}}


class Growing:
    def __init__(self, batch_size):
        self.batch_size = batch_size

    def __iter__(self):
        seen = 0
        while True:
            tokens = 64 if seen < 48 else {tokens}
            yield {{"ids": torch.randint(0, 1000, (self.batch_size, tokens))}}
            seen += self.batch_size


def build_dataloader(batch_size, rank, world_size):
    return Growing(batch_size)


def training_step(model, batch):
    ids = batch["ids"]
    scratch = torch.ones(ids.shape[0], ids.shape[1], 64 * 1024)
    return model(ids) + scratch.mean() * 0
'''


def run(tokens: int, retrace: bool, folder: Path) -> dict:
    script = folder / f"grow_{tokens}_{'retrace' if retrace else 'halve'}.py"
    script.write_text(RECIPE.format(tokens=tokens))
    env = {**os.environ, "LAUNCH_STATE_DIR": str(folder / "state"),
           "LAUNCH_NO_TRACE": "0" if retrace else "1"}
    launch = Path(sys.executable).parent / "launch"
    started = time.perf_counter()
    proc = subprocess.run([str(launch), str(script), "--json", "--memory-limit", "2560MiB",
                           "--max-attempts", "5"], capture_output=True, text=True, env=env,
                          cwd=folder, check=False)
    data = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    attempts = data.get("attempts", [])
    return {"tokens": tokens, "replanner": "re-trace" if retrace else "halve",
            "exit": proc.returncode, "attempts": len(attempts),
            "micro_batches": [a["plan"]["micro_batch_size"] for a in attempts],
            "wall_s": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 1024, 2048])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for tokens in args.tokens:
            for retrace in (True, False):
                row = run(tokens, retrace, Path(tmp))
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
