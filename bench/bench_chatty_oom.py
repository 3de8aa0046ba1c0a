"""How fast an out-of-memory error stops a job that logs a lot (issue 18, local provider).

The recipe writes about 4 MB of log per micro-step (20,000 lines of 200 bytes) and raises a real
CPU out-of-memory error (DefaultCPUAllocator) at step 12; in the 2-rank variant only rank 1 does,
and rank 0 then waits in DDP's gradient all-reduce until it is stopped. The installed `launch`
runs it on the local provider (`--max-attempts 1`). Measured: the seconds from the moment the
recipe raised (its own timestamp) to the runner's record that the job ended (exit.json), and to
the end of `launch` (it reads the rest of the log after the stop, to show it).

    .venv/bin/python bench/bench_chatty_oom.py [--ranks 1 2] [--repeat 2] [--view]

``--view`` runs it as a person at a terminal sees it (the live view, not --json) and also times
the first line that says "out of memory" (issue 29: said within 3 s of the OOM, whatever the
log's volume); ``--terminal-mbps 2`` makes that terminal show at most 2 MB/s, slower than the
job writes (a real terminal emulator, or ssh), which is when a backlog of log holds the news back.
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
        print(f"step line {{i:06d}} " + LINE[:185], flush=False)  # 200 bytes with its newline
    if CALLS[0] == 12 and os.environ.get("RANK", "0") == "{oom_rank}":
        with open({stamp!r}, "w") as out:
            out.write(repr(time.time()))
        torch.empty(1 << 42, dtype=torch.uint8)  # 4 TiB: the CPU allocator refuses
    return model(batch).pow(2).mean()
'''


def run(ranks: int, folder: Path, view: bool = False, terminal_mbps: float = 0.0) -> dict:
    """One run. ``view``: as a person at a terminal sees it (no --json; the live view's lines
    read as they arrive), also timing the first line that says "out of memory"."""
    stamp = folder / f"oom-{ranks}.time"
    script = folder / f"chatty_{ranks}.py"
    script.write_text(RECIPE.format(ranks=ranks, oom_rank=ranks - 1, stamp=str(stamp)))
    state = folder / f"state-{ranks}"
    env = {**os.environ, "LAUNCH_STATE_DIR": str(state), "LAUNCH_NO_TRACE": "1",
           "LAUNCH_HOME": str(folder / "home"),  # the runs index: not the user's
           "PYTHONUNBUFFERED": "1"}  # a terminal is line-buffered; a pipe would hold lines back
    launch = Path(sys.executable).parent / "launch"
    command = [str(launch), str(script), "--gpus-per-node", str(ranks), "--max-attempts", "1"]
    said = None
    shown = 0
    if view:  # under a pseudo-terminal, as a person runs it: rich renders for a terminal
        import pty
        import select

        main_fd, tty_fd = pty.openpty()
        proc = subprocess.Popen(command, stdin=tty_fd, stdout=tty_fd, stderr=tty_fd, env={
            **env, "COLUMNS": "100", "TERM": "xterm-256color"}, cwd=folder)
        os.close(tty_fd)
        tail = b""
        shown = 0
        while True:  # drained as fast as a terminal would take it
            ready, _, _ = select.select([main_fd], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(main_fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            shown += len(chunk)
            tail = (tail + chunk)[-4096:]
            if said is None and b"out of memory" in tail:
                said = time.time()
            if terminal_mbps:  # a terminal that shows text slower than the job writes it
                time.sleep(len(chunk) / (terminal_mbps * 1e6))
        os.close(main_fd)
        returncode = proc.wait()
        outcome = None
    else:
        done = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env,
                              cwd=folder, check=False)
        returncode = done.returncode
        outcome = json.loads(done.stdout)["attempts"][0]["outcome"]
    finished = time.time()
    attempt_dir = next(state.glob("runs/*/attempt-1"))
    if outcome is None:
        record = json.loads((attempt_dir.parent / "attempts.jsonl").read_text().splitlines()[-1])
        outcome = record.get("outcome")
    ended = json.loads((attempt_dir / "exit.json").read_text())["ended_at"]
    raised = float(stamp.read_text())
    log_mb = (attempt_dir / "output.log").stat().st_size / 1e6
    row = {"ranks": ranks, "view": view, "exit": returncode, "outcome": outcome,
           "stopped_after_oom_s": round(ended - raised, 2),
           "launch_done_after_oom_s": round(finished - raised, 2), "log_mb": round(log_mb, 1)}
    if view:
        row["terminal_mbps"] = terminal_mbps or None
        row["shown_mb"] = round(shown / 1e6, 1)
        row["said_after_oom_s"] = None if said is None else round(said - raised, 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--view", action="store_true",
                        help="as at a terminal: time the first 'out of memory' line shown")
    parser.add_argument("--terminal-mbps", type=float, default=0.0,
                        help="with --view: the terminal shows at most this many MB/s")
    args = parser.parse_args()
    for ranks in args.ranks:
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                print(json.dumps(run(ranks, Path(tmp), view=args.view,
                                     terminal_mbps=args.terminal_mbps)), flush=True)


if __name__ == "__main__":
    main()
