"""The detached process that owns one local job: starts torchrun, records how it ended.

Run as ``python -m launcher.providers.local_runner JOB_DIR`` in a session of its own. It applies the
memory cap (RLIMIT_AS, inherited by torchrun and every worker, so an allocation past it fails with
the allocator's own out-of-memory error), sends all output to ``output.log``, and on SIGTERM stops
torchrun and its workers (torchrun starts each worker in a session of its own, so they are found by
parent pid, not by process group). It imports nothing heavy: it must start fast and stay small.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.runs import write_json

#: Seconds between SIGTERM and SIGKILL when a job is stopped. Short on purpose: a job is stopped
#: because a rank ran out of memory and the others hang in a collective, or on the user's word;
#: the last checkpoint is already on disk either way (bench/bench_stop_latency.py).
GRACE_S = 1.0


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid``, read from /proc (no psutil needed on Linux)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def main(job_dir: Path) -> int:
    request = json.loads((job_dir / "request.json").read_text())
    write_json(job_dir / "runner.json", {"pid": os.getpid(), "started_at": time.time()})
    env = {**os.environ, **request["env"]}
    limit = request.get("memory_limit_bytes")
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    stopping: dict[str, float | None] = {"at": None}

    with open(request["log_file"], "ab", buffering=0) as log:
        proc = subprocess.Popen(request["argv"], cwd=request["cwd"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def stop(signum: int, _frame: object) -> None:
            stopping["at"] = stopping["at"] or time.monotonic()
            tree = [proc.pid, *_children(proc.pid)]
            _signal_all(tree, signal.SIGTERM)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        while True:
            try:
                returncode = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                since = stopping["at"]
                if since is not None and time.monotonic() - since > GRACE_S:
                    _signal_all([proc.pid, *_children(proc.pid)], signal.SIGKILL)
        # Workers torchrun left behind (it was killed before it could reap them).
        _signal_all(_children(os.getpid()), signal.SIGKILL)

    if stopping["at"] is not None:
        state, message = "cancelled", "stopped on request"
    elif returncode == 0:
        state, message = "succeeded", ""
    else:
        state, message = "failed", f"torchrun exited with status {returncode}"
    write_json(job_dir / "exit.json", {"state": state, "returncode": returncode,
                                        "message": message, "ended_at": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
