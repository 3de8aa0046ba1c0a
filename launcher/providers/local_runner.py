"""The detached process that owns one local job: starts torchrun, records how it ended.

Run as ``python -m launcher.providers.local_runner JOB_DIR`` in a session of its own. It applies the
memory cap (RLIMIT_AS, inherited by torchrun and every worker, so an allocation past it fails with
the allocator's own out-of-memory error), sends all output to ``output.log``, and on SIGTERM stops
torchrun and its workers. No process of the job outlives it (``launcher.processes``): torchrun gets
SIGTERM from the kernel if the runner is killed (and stops its workers); the runner is the
subreaper of its tree, so workers of a torchrun that was killed come back to it; and at the end it
kills whatever still carries the job's token. It imports nothing heavy: it must start fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from launcher import faults, processes
from launcher.statefiles import write_json_at
from launcher.status import JobState

#: Seconds between SIGTERM and SIGKILL when a job is stopped. Short on purpose: a job is stopped
#: because a rank ran out of memory and the others hang in a collective, or on the user's word;
#: the last checkpoint is already on disk either way (bench/bench_stop_latency.py).
GRACE_S = 1.0


#: Seconds between tries to record how the job ended when the folder cannot be written (a full
#: disk): the runner stays, so the job reads as running until the record can be written.
RECORD_RETRY_S = 2.0
RECORD_PATIENCE_S = 24 * 3600.0


def main(job_dir: Path) -> int:
    # The folder is held open: what the runner writes lands in it wherever it is moved to, and
    # a folder that was deleted is seen (no links left) instead of recreated.
    folder = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY)
    with open(os.open("request.json", os.O_RDONLY, dir_fd=folder), encoding="utf-8") as handle:
        request = json.load(handle)
    # Recorded before anything of the job runs: launch may have been killed before it could.
    write_json_at(folder, "runner.json", runner_record(os.getpid()))
    try:  # stopped before it started (``LocalProvider.stop``): run nothing
        os.stat("exit.json", dir_fd=folder)
        return 0
    except FileNotFoundError:
        pass
    env = {**os.environ, **request["env"]}
    token = request["env"].get(processes.TOKEN_VAR)
    limit = request.get("memory_limit_bytes")
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    processes.become_subreaper()
    stopping: dict[str, float | None] = {"at": None}
    vanished = False

    fd = os.open(request["log_file"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with open(fd, "ab", buffering=0) as log:
        proc = subprocess.Popen(request["argv"], cwd=request["cwd"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=processes.die_with_parent(signal.SIGTERM))

        def everyone() -> list[int]:
            mine = processes.descendants(os.getpid())
            return sorted({*mine, *(processes.tagged(token) if token else [])})

        def stop(signum: int, _frame: object) -> None:
            stopping["at"] = stopping["at"] or time.monotonic()
            processes.signal_all(everyone(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        while True:
            try:
                returncode = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if not vanished and _gone(folder):
                    vanished = True  # nobody can follow or stop it any more: stop it now
                    stop(signal.SIGTERM, None)
                since = stopping["at"]
                if since is not None and time.monotonic() - since > GRACE_S:
                    processes.signal_all(everyone(), signal.SIGKILL)
        # Workers torchrun left behind (it was killed before it could stop them).
        processes.signal_all(everyone(), signal.SIGKILL)
        left = processes.kill_tagged(token) if token else []
        processes.reap_orphans()  # we are their subreaper

    if vanished:
        return 0  # no folder to record in
    if stopping["at"] is not None:
        state, message = JobState.CANCELLED, "stopped on request"
    elif returncode == 0:
        state, message = JobState.SUCCEEDED, ""
    elif returncode < 0:
        state = JobState.FAILED
        message = f"torchrun was killed by {signal.Signals(-returncode).name}"
    else:
        state = JobState.FAILED
        message = (_root_cause(request["log_file"])
                   or f"torchrun exited with status {returncode}")
    if left:
        message += f"; processes {left} could not be stopped"
    _record(folder, {"state": state, "returncode": returncode, "message": message,
                     "ended_at": time.time()})
    return 0


# torchrun's ChildFailedError summary, as it prints it into the job's log (its own stderr): the
# "Root Cause (first observed failure):" entry's rank and exit code (and the signal, when a
# signal ended that rank: "exitcode  : -9 (pid: 1234)" then "Signal 9 (SIGKILL) received").
_ROOT_CAUSE = "Root Cause (first observed failure):"
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)", re.M)
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)
_SIGNAL = re.compile(r"\((SIG[A-Z]+)\)")
#: How much of the log's end is read for torchrun's summary (it is the last thing it prints).
_TAIL_BYTES = 64 * 1024


def _root_cause(log_file: str) -> str | None:
    """One line from torchrun's ChildFailedError summary at the end of the log: "torchrun: rank
    1 failed with exit code 1". The summary itself (a traceback and a table) stays in the log, the
    job's output as it was printed; None when the log has no such summary."""
    try:
        with open(log_file, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - _TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    at = tail.rfind(_ROOT_CAUSE)
    if at < 0:
        return None
    entry = tail[at + len(_ROOT_CAUSE):].split("=" * 20, 1)[0]
    rank, code = _RANK.search(entry), _EXITCODE.search(entry)
    if rank is None or code is None:
        return None
    signal_name = _SIGNAL.search(entry)
    how = f" ({signal_name.group(1)})" if signal_name and code.group(1).startswith("-") else ""
    return f"torchrun: rank {rank.group(1)} failed with exit code {code.group(1)}{how}"


def runner_record(pid: int) -> dict[str, Any]:
    """What ``runner.json`` holds: the pid and its start time, which together name one process
    even after the pid is reused."""
    return {"pid": pid, "started_at": time.time(), "start_ticks": processes.start_ticks(pid)}


def _gone(folder: int) -> bool:
    """Whether the job's folder was deleted (an open folder with no links left)."""
    try:
        return os.fstat(folder).st_nlink == 0
    except OSError:
        return True


def _record(folder: int, data: dict[str, object]) -> None:
    """Write ``exit.json``; while the disk is full (or the folder read-only), keep trying: the
    job reads as running until its end can be recorded, never as a runner that died."""
    deadline = time.monotonic() + RECORD_PATIENCE_S
    while True:
        try:
            faults.point("runner.record", "exit.json")
            write_json_at(folder, "exit.json", data)
            return
        except OSError as exc:
            if _gone(folder) or time.monotonic() > deadline:
                raise
            with contextlib.suppress(OSError):  # runner.err may be on the full disk too
                print(f"cannot record the job's end yet ({exc.strerror}); retrying",
                      file=sys.stderr, flush=True)
            time.sleep(RECORD_RETRY_S)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
