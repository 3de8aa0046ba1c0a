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

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher import faults, processes
from launcher.providers.base import Job, JobState, JobStatus, Provider, torchrun_script_args
from launcher.providers.local_runner import runner_record
from launcher.statefiles import corrupt, read_state, write_json
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


#: What a runner started before runners carried the job token has in its command line.
RUNNER_MODULE = b"launcher.providers.local_runner"

_TOKEN = re.compile(r"[0-9a-f]{24}")
_ATTEMPT = re.compile(r"attempt-[0-9]{1,6}")


class LocalProvider(Provider):
    name = "local"

    def __init__(self, python: str | None = None, environ: dict[str, str] | None = None,
                 state_dir: Path | None = None):
        self.python = python or sys.executable
        self.environ = environ  # the launcher's (injectable in tests); os.environ if None
        #: Job ids are attempt folders relative to this (``runs/<run>/attempt-<n>``), so that
        #: a state folder moved with its project keeps working; ``None``: absolute ids only.
        self.state_dir = state_dir
        #: Each job's token, read once from its request (``poll`` verifies the runner with it
        #: every fraction of a second while a job is followed; a request is never rewritten).
        self._tokens: dict[Path, str] = {}

    @classmethod
    def from_settings(cls, settings: dict[str, Any], environ: dict[str, str] | None = None
                      ) -> LocalProvider:
        state_dir = settings.get("state_dir")
        return cls(python=settings.get("python"), environ=environ,
                   state_dir=Path(state_dir) if state_dir else None)

    def job_id(self, attempt_dir: Path) -> str:
        """The id of the job in ``attempt_dir``: relative to the state folder where it lies in
        it (the record moves with the folder), else the absolute path."""
        if self.state_dir is not None:
            with contextlib.suppress(ValueError):
                return str(Path(attempt_dir).relative_to(self.state_dir))
        return str(attempt_dir)

    def _dir(self, job_id: str) -> Path:
        """The attempt folder a job id names. A relative id is the state folder's; an absolute
        one (recorded before ids were relative) that no longer exists is looked for where the
        state folder is now (``runs/<run>/attempt-<n>``: the project was moved)."""
        path = Path(job_id)
        if (len(job_id) > 4096 or ".." in path.parts or not _ATTEMPT.fullmatch(path.name)
                or "\0" in job_id):
            raise UsageError(f"{job_id[:80]!r} is not a local job id (the attempt folder "
                             "launch recorded)", "restore the run's attempts.jsonl or delete "
                             "the run")
        if not path.is_absolute():
            if self.state_dir is None:
                raise UsageError(f"the local job {job_id} is relative to a state folder, and "
                                 "none is known", "run launch from the project's folder")
            return self.state_dir / path
        if not path.exists() and self.state_dir is not None and len(path.parts) >= 3:
            moved = self.state_dir / "runs" / path.parent.name / path.name
            if path.parent.parent.name == "runs" and moved.exists():
                return moved
        return path

    def _token(self, job_dir: Path) -> str:
        """The job's token, as its request recorded it (not recomputed from the path, which a
        move changes). A request without a well-formed one is corrupt: nothing is signalled."""
        if job_dir in self._tokens:
            return self._tokens[job_dir]
        request = read_state(job_dir / "request.json", dict)
        token = ((request or {}).get("env") or {}).get(processes.TOKEN_VAR)
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise corrupt(job_dir / "request.json", "no job token: cannot verify which "
                          "processes are the job's, so none is signalled")
        self._tokens[job_dir] = token
        return token

    def _runner(self, job_dir: Path) -> tuple[int, int] | None:
        """The runner's pid and start time (clock ticks) as ``runner.json`` records them,
        ``None`` before it is written; anything but a valid pid and an integer start time is a
        corrupt record, and a corrupt record is never acted on."""
        path = job_dir / "runner.json"
        runner = read_state(path, dict)
        if runner is None:
            return None
        pid, ticks = processes.valid_pid(runner.get("pid")), runner.get("start_ticks")
        if pid is None:
            raise corrupt(path, f"pid {str(runner.get('pid'))[:40]!r} is not a process launch "
                          "could have started: cannot verify, not signalled")
        if isinstance(ticks, bool) or not isinstance(ticks, int) or ticks < 0:
            raise corrupt(path, "no start time: cannot verify the runner, not signalled")
        return pid, ticks

    def _runner_alive(self, job_dir: Path, runner: tuple[int, int]) -> bool:
        return processes.owned(runner[0], runner[1], self._token(job_dir), RUNNER_MODULE)

    def dryrun(self, job: Job) -> LocalRequest:
        plan = job.plan
        if plan.nodes != 1:
            raise UsageError("the local provider runs on one node")
        entry = job.rendered.entrypoint
        rendered = entry in job.rendered.files
        # A rendered script lives in the job folder; a plain script runs from its own folder,
        # through a shim that puts its stderr on its stdout (the rendered scripts do it
        # themselves): the log in the order the script wrote it.
        entrypoint = job.job_dir / entry if rendered else job.code_dir / entry
        script = [str(entrypoint)] if rendered else [
            "-m", "launcher.providers.local_stdio", str(entrypoint)]
        # The script's own arguments follow it, each one argv element (no shell in between):
        # local_stdio and the framework shim hand them on as its sys.argv[1:].
        if not rendered and plan.world_size == 1:
            # One process of a user's own script runs as `python SCRIPT` would: torchrun would
            # set RANK and WORLD_SIZE, and a script that reads them (nanoGPT's `ddp =
            # int(os.environ.get('RANK', -1)) != -1`) takes its distributed branch.
            argv = [self.python, *script, *job.rendered.args]
        else:
            argv = [
                self.python, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", str(plan.gpus_per_node),
                # torchrun prefixes each line with "[<role><local rank>]:"; one node, so local
                # = global.
                "--role", "rank", "--tee", "3", "--log-dir", str(job.attempt_dir / "torchrun"),
                *script, *torchrun_script_args(job.rendered.args),
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
        """Write the request, then start the runner. The identity is on disk before anything
        of the job runs (write-ahead): the request holds the job token, which the runner
        carries from its first instruction, and the runner records itself (``runner.json``)
        before it starts torchrun. A launcher killed at any instant leaves a job that
        `status`, `cancel`, `logs` and `attach` find (``adopt``) and can verify."""
        job_dir = Path(request.job_dir)
        job_dir.mkdir(parents=True, exist_ok=True)
        write_json(job_dir / "request.json", request.to_dict())
        os.close(os.open(request.log_file, os.O_WRONLY | os.O_CREAT, 0o600))
        faults.point("schedule.request")
        # The runner is this package's module; make sure the child imports this same copy.
        env = processes.user_environ(dict(os.environ if self.environ is None
                                          else self.environ))
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env[processes.TOKEN_VAR] = request.env[processes.TOKEN_VAR]
        errors_fd = os.open(job_dir / "runner.err", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with open(errors_fd, "ab") as errors:
            runner = subprocess.Popen(
                [self.python, "-m", "launcher.providers.local_runner", str(job_dir)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                start_new_session=True, env=env, close_fds=True,
            )
        faults.point("schedule.started")
        # Recorded by us too, at once: a runner that dies before it could say so is found.
        write_json(job_dir / "runner.json", runner_record(runner.pid))
        faults.point("schedule.recorded")
        return self.job_id(job_dir)

    def adopt(self, run_id: str, attempt: int, attempt_dir: Path) -> str | None:
        """The job of an attempt whose launcher died between writing its request and recording
        it: the request is on disk before the runner can start, so a job that may have started
        is always found (``poll`` then says whether it did)."""
        return self.job_id(attempt_dir) if (attempt_dir / "request.json").exists() else None

    def poll(self, job_id: str) -> JobStatus:
        job_dir = self._dir(job_id)
        exit_file = job_dir / "exit.json"
        data = read_state(exit_file, dict)
        if data is not None:
            return _exit_status(exit_file, data)
        runner = self._runner(job_dir)
        if runner is None:
            request = job_dir / "request.json"
            if processes.tagged(self._token(job_dir)):
                return JobStatus(state=JobState.PENDING)  # the runner is recording itself
            if request.exists() and time.time() - request.stat().st_mtime > START_TIMEOUT_S:
                return self._died(job_dir, "the local runner never started")
            return JobStatus(state=JobState.PENDING)
        if self._runner_alive(job_dir, runner):
            return JobStatus(state=JobState.RUNNING)
        # Exited between the two reads, or killed before it could write exit.json.
        if exit_file.exists():
            return self.poll(job_id)
        return self._died(job_dir, "the local runner died without an exit status")

    def _died(self, job_dir: Path, why: str) -> JobStatus:
        """Record a job whose runner is gone as failed, after stopping what it left running
        (only processes carrying the job's token)."""
        left = processes.kill_tagged(self._token(job_dir))
        errors = _tail(job_dir / "runner.err")
        message = why + (f" ({errors})" if errors else "") + (
            f"; processes {left} could not be stopped" if left else "")
        write_json(job_dir / "exit.json", {"state": JobState.FAILED, "returncode": None,
                                            "message": message, "ended_at": time.time()})
        return JobStatus(state=JobState.FAILED, message=message)

    def residue(self, job_id: str) -> list[int]:
        """Processes of the job still alive (after it ended, this must be empty). The runner
        itself carries the token too but is not the job: after writing ``exit.json`` it exits
        on its own, and a `cancel` that saw it in its last instant would record a finished job
        as cancelled."""
        job_dir = self._dir(job_id)
        left = processes.tagged(self._token(job_dir))
        try:
            runner = self._runner(job_dir)
        except UsageError:
            return left
        if runner is not None and (job_dir / "exit.json").exists():
            left = [pid for pid in left if pid != runner[0]
                    or not processes.alive(pid, runner[1])]
        return left

    def events(self, job_id: str, cursor: Any = None) -> tuple[list[str], int]:
        """The rendered script's event lines, from their own file beside the log."""
        return _read_lines(self._dir(job_id) / EVENTS_NAME, cursor)

    def logs(self, job_id: str, cursor: Any = None) -> tuple[list[str], int]:
        return _read_lines(self._dir(job_id) / "output.log", cursor)

    def stop(self, job_id: str) -> None:
        """SIGTERM to the runner (it stops its tree) when it is provably the runner launch
        started (pid, start time and job token: ``processes.owned``); otherwise kill only the
        processes that carry the job's token. A record that cannot be verified (a pid that is
        no pid, no start time, no token) is a usage error and nothing is signalled. Either way,
        the caller waits for a terminal state."""
        job_dir = self._dir(job_id)
        token = self._token(job_dir)
        if (job_dir / "exit.json").exists():
            processes.kill_tagged(token)
            return
        runner = self._runner(job_dir)
        if runner is not None and self._runner_alive(job_dir, runner):
            processes.signal_all([runner[0]], signal.SIGTERM)
            return
        if runner is None:
            # Not started yet (or its launcher died before it could start it): the record of
            # its end comes first, and a runner that starts after reads it and runs nothing.
            write_json(job_dir / "exit.json", {"state": JobState.CANCELLED, "returncode": None,
                                                "message": "stopped before it started",
                                                "ended_at": time.time()})
        processes.kill_tagged(token)


def _exit_status(path: Path, data: dict[str, Any]) -> JobStatus:
    """``exit.json`` as a status; a field of the wrong kind is a corrupt record naming it."""
    code, message = data.get("returncode"), data.get("message", "")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
        raise corrupt(path, f"returncode {str(code)[:40]!r} is not an integer")
    if not isinstance(message, str):
        raise corrupt(path, "message is not text")
    try:
        status = JobStatus(state=data.get("state", JobState.FAILED), exit_code=code,
                           message=message)
    except (ValueError, TypeError):
        raise corrupt(path, f"no job state {str(data.get('state'))[:40]!r}") from None
    if not status.terminal:  # the runner writes it once, at the end
        raise corrupt(path, f"an exit record of a job still {status.state}")
    return status


def _read_lines(path: Path, cursor: Any, limit: int = 8 << 20) -> tuple[list[str], int]:
    """Complete lines of ``path`` from byte offset ``cursor`` (at most ``limit`` bytes a call),
    and the offset after them. A line longer than ``limit`` is split into ``limit``-byte pieces,
    not waited on: one huge line must not blind the follower for the rest of the job."""
    offset = int(cursor or 0)
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(limit)
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        if len(data) < limit:
            return [], offset
        # Do not cut a UTF-8 character in two: back up to the start of the last one.
        cut = len(data)
        while cut > len(data) - 4 and cut > 0 and data[cut - 1] & 0xC0 == 0x80:
            cut -= 1
        if cut > 0 and data[cut - 1] >= 0xC0:
            cut -= 1
        cut = cut or len(data)
        return [data[:cut].decode("utf-8", errors="replace")], offset + cut
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
