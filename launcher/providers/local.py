"""The local provider: the rendered script under torchrun on this machine (gloo on the CPU).

A job is a folder (the attempt's): ``request.json`` (the exact command), ``output.log`` (every
rank's output, prefixed ``[rankN]:`` by torchrun's tee), ``runner.json`` (the pid of the detached
runner) and, once it ends, ``exit.json``. The runner (``launcher.providers.local_runner``) is
started in its own session, so the job outlives a launcher that is killed or detached, and any
`launch` process can follow, stop or read it from the folder alone: the job id is its path.

The job sees the launcher's environment without cloud credentials (``CREDENTIAL_ENV``): a local
run needs none, and a script that logs its environment must not log them. Set
``LAUNCH_LOCAL_PASS_CREDENTIALS=1`` for a script that reads from a bucket itself. Its log files
are the user's alone (0600, in a 0700 run folder), like the rest of the state.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher import processes
from launcher.providers.base import Job, JobState, JobStatus, Provider
from launcher.runs import corrupt, read_state, write_json
from launcher.status import UsageError

#: Threads per worker: torchrun's own default, set explicitly so it does not print its banner.
OMP_THREADS = "1"

#: The file of the job's event lines (``LAUNCH_EVENTS_FILE``), beside ``output.log``.
EVENTS_NAME = "events.jsonl"

#: How long a job may be recorded without a runner before it counts as never started.
START_TIMEOUT_S = 30.0


def job_token(attempt_dir: Path) -> str:
    """The token every process of one local job carries (``launcher.processes``): derived from
    the attempt's folder, so a later `launch cancel` finds the same processes."""
    return hashlib.sha256(str(Path(attempt_dir).resolve()).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class LocalRequest:
    argv: list[str]
    cwd: str
    env: dict[str, str]                  # added to the launcher's environment when the job starts
    job_dir: str
    log_file: str
    memory_limit_bytes: int | None = None
    nproc: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LocalProvider(Provider):
    name = "local"

    def __init__(self, python: str | None = None, environ: dict[str, str] | None = None):
        self.python = python or sys.executable
        self.environ = environ  # the launcher's (injectable in tests); os.environ if None

    @classmethod
    def from_settings(cls, settings: dict[str, Any], environ: dict[str, str] | None = None
                      ) -> LocalProvider:
        return cls(python=settings.get("python"), environ=environ)

    def dryrun(self, job: Job) -> LocalRequest:
        plan = job.plan
        if plan.nodes != 1:
            raise UsageError("the local provider runs on one node")
        entry = job.rendered.entrypoint
        # A rendered script lives in the job folder; a plain script runs from its own folder.
        entrypoint = job.job_dir / entry if entry in job.rendered.files else job.code_dir / entry
        argv = [
            self.python, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node", str(plan.gpus_per_node),
            # torchrun prefixes each line with "[<role><local rank>]:"; one node, so local = global.
            "--role", "rank", "--tee", "3", "--log-dir", str(job.attempt_dir / "torchrun"),
            # A plain script runs through a shim that puts its stderr on its stdout (the
            # rendered scripts do it themselves): the log in the order the script wrote it.
            *([str(entrypoint)] if entry in job.rendered.files
              else ["-m", "launcher.providers.local_stdio", str(entrypoint)]),
        ]
        env = {
            **job.rendered.env,
            "LAUNCH_CHECKPOINT_DIR": str(job.checkpoint_dir),
            "LAUNCH_PLAN": str(job.job_dir / "plan.json"),
            "LAUNCH_RUN_ID": job.run_id,
            "LAUNCH_ATTEMPT": str(job.attempt),
            "OMP_NUM_THREADS": OMP_THREADS,
            "PYTHONUNBUFFERED": "1",
            processes.TOKEN_VAR: job_token(job.attempt_dir),
            "LAUNCH_EVENTS_FILE": str(job.attempt_dir / EVENTS_NAME),
            "LAUNCH_MERGE_STDERR": "1",  # the log in the order the script wrote it
        }
        return LocalRequest(
            argv=argv, cwd=str(job.code_dir), env=env, job_dir=str(job.attempt_dir),
            log_file=str(job.attempt_dir / "output.log"),
            memory_limit_bytes=job.memory_limit, nproc=plan.gpus_per_node,
        )

    def schedule(self, request: LocalRequest) -> str:  # type: ignore[override]
        job_dir = Path(request.job_dir)
        job_dir.mkdir(parents=True, exist_ok=True)
        write_json(job_dir / "request.json", request.to_dict())
        os.close(os.open(request.log_file, os.O_WRONLY | os.O_CREAT, 0o600))
        # The runner is this package's module; make sure the child imports this same copy.
        env = processes.user_environ(dict(os.environ if self.environ is None
                                          else self.environ))
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        errors_fd = os.open(job_dir / "runner.err", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with open(errors_fd, "ab") as errors:
            runner = subprocess.Popen(
                [self.python, "-m", "launcher.providers.local_runner", str(job_dir)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                start_new_session=True, env=env, close_fds=True,
            )
        # Recorded by us, at once: a runner that dies before it could say so is still found.
        write_json(job_dir / "runner.json", {"pid": runner.pid, "started_at": time.time(),
                                              "start_ticks": processes.start_ticks(runner.pid)})
        return str(job_dir)

    def adopt(self, run_id: str, attempt: int, attempt_dir: Path) -> str | None:
        """The job of an attempt whose launcher died between starting it and recording it."""
        return str(attempt_dir) if (attempt_dir / "runner.json").exists() else None

    def poll(self, job_id: str) -> JobStatus:
        job_dir = Path(job_id)
        exit_file = job_dir / "exit.json"
        data = read_state(exit_file, dict)
        if data is not None:
            try:
                return JobStatus(state=data.get("state", JobState.FAILED),
                                 exit_code=data.get("returncode"), message=data.get("message", ""))
            except ValueError:
                raise corrupt(exit_file, f"no job state {data.get('state')!r}") from None
        runner = read_state(job_dir / "runner.json", dict)
        if runner is None:
            request = job_dir / "request.json"
            if request.exists() and time.time() - request.stat().st_mtime > START_TIMEOUT_S:
                return self._died(job_dir, "the local runner never started")
            return JobStatus(state=JobState.PENDING)
        if processes.alive(int(runner["pid"]), runner.get("start_ticks")):
            return JobStatus(state=JobState.RUNNING)
        # Exited between the two reads, or killed before it could write exit.json.
        if exit_file.exists():
            return self.poll(job_id)
        return self._died(job_dir, "the local runner died without an exit status")

    def _died(self, job_dir: Path, why: str) -> JobStatus:
        """Record a job whose runner is gone as failed, after stopping what it left running."""
        left = processes.kill_tagged(job_token(job_dir))
        errors = _tail(job_dir / "runner.err")
        message = why + (f" ({errors})" if errors else "") + (
            f"; processes {left} could not be stopped" if left else "")
        write_json(job_dir / "exit.json", {"state": JobState.FAILED, "returncode": None,
                                            "message": message, "ended_at": time.time()})
        return JobStatus(state=JobState.FAILED, message=message)

    def residue(self, job_id: str) -> list[int]:
        """Processes of the job still alive (after it ended, this must be empty)."""
        return processes.tagged(job_token(Path(job_id)))

    def events(self, job_id: str, cursor: Any = None) -> tuple[list[str], int]:
        """The rendered script's event lines, from their own file beside the log."""
        return _read_lines(Path(job_id) / EVENTS_NAME, cursor)

    def logs(self, job_id: str, cursor: Any = None) -> tuple[list[str], int]:
        return _read_lines(Path(job_id) / "output.log", cursor)

    def stop(self, job_id: str) -> None:
        """SIGTERM to the runner (it stops its tree); with no runner left, kill the job's
        processes directly. Either way, the caller waits for a terminal state."""
        job_dir = Path(job_id)
        if (job_dir / "exit.json").exists():
            processes.kill_tagged(job_token(job_dir))
            return
        runner = read_state(job_dir / "runner.json", dict)
        if runner is not None and processes.alive(int(runner["pid"]), runner.get("start_ticks")):
            processes.signal_all([int(runner["pid"])], signal.SIGTERM)
        else:
            processes.kill_tagged(job_token(job_dir))


def _read_lines(path: Path, cursor: Any, limit: int = 8 << 20) -> tuple[list[str], int]:
    """Complete lines of ``path`` from byte offset ``cursor`` (at most ``limit`` bytes a call),
    and the offset after them."""
    offset = int(cursor or 0)
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(limit)
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    chunk = data[: end + 1]
    return chunk.decode("utf-8", errors="replace").splitlines(), offset + len(chunk)


def _tail(path: Path, limit: int = 300) -> str:
    """The runner's last words, on one line."""
    try:
        text = path.read_bytes()[-4096:].decode("utf-8", errors="replace").strip()
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else ""
