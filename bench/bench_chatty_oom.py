"""How fast an out-of-memory error stops a job that logs a lot (issue 18, local provider).

The recipe writes about 4 MB of log per micro-step (20,000 lines of 200 bytes) and raises a real
CPU out-of-memory error (DefaultCPUAllocator) at step 12; in the 2-rank variant only rank 1 does,
and rank 0 then waits in DDP's gradient all-reduce until it is stopped. The installed `launch`
runs it on the local provider (`--max-attempts 1`). Measured: the seconds from the moment the
recipe raised (its own timestamp) to the runner's record that the job ended (exit.json), and to
the end of `launch` (it reads the rest of the log after the stop, to show it).

    .venv/bin/python bench/bench_chatty_oom.py [--ranks 1 2] [--repeat 2]
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
import os, sys, time, torch

LAUNCH = {{"global_batch_size": {ranks}, "steps": 20, "lr": 0.01, "checkpoint_every": 1000}}
LINE = "x" * 199 + "\\n"
CALLS = [0]


def build_model():
    return torch.nn.Linear(16, 1)


def example_batch(batch_size):
    return torch.randn(batch_size, 16)


def training_step(model, batch):
    CALLS[0] += 1
    for i in range(20000):  # about 4 MB of log per micro-step, a line at a time
        print(f"step line {{i:06d}} " + LINE[:185], end="", flush=False)
    if CALLS[0] == 12 and os.environ.get("RANK", "0") == "{oom_rank}":
        with open({stamp!r}, "w") as out:
            out.write(repr(time.time()))
        torch.empty(1 << 42, dtype=torch.uint8)  # 4 TiB: the CPU allocator refuses
    return model(batch).pow(2).mean()
'''


def run(ranks: int, folder: Path) -> dict:
    stamp = folder / f"oom-{ranks}.time"
    script = folder / f"chatty_{ranks}.py"
    script.write_text(RECIPE.format(ranks=ranks, oom_rank=ranks - 1, stamp=str(stamp)))
    state = folder / f"state-{ranks}"
    env = {**os.environ, "LAUNCH_STATE_DIR": str(state), "LAUNCH_NO_TRACE": "1"}
    launch = Path(sys.executable).parent / "launch"
    proc = subprocess.run([str(launch), str(script), "--gpus-per-node", str(ranks),
                           "--max-attempts", "1", "--json"], capture_output=True, text=True,
                          env=env, cwd=folder, check=False)
    finished = time.time()
    data = json.loads(proc.stdout)
    attempt_dir = next(state.glob("runs/*/attempt-1"))
    ended = json.loads((attempt_dir / "exit.json").read_text())["ended_at"]
    raised = float(stamp.read_text())
    log_mb = (attempt_dir / "output.log").stat().st_size / 1e6
    return {"ranks": ranks, "exit": proc.returncode, "outcome": data["attempts"][0]["outcome"],
            "stopped_after_oom_s": round(ended - raised, 2),
            "launch_done_after_oom_s": round(finished - raised, 2), "log_mb": round(log_mb, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    for ranks in args.ranks:
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                print(json.dumps(run(ranks, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
