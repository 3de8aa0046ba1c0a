"""The local provider: the rendered script under torchrun on this machine (gloo on the CPU).

A job is a folder (the attempt's): ``request.json`` (the exact command), ``output.log`` (every
rank's output, prefixed ``[rankN]:`` by torchrun's tee), ``runner.json`` (the pid of the detached
runner) and, once it ends, ``exit.json``. The runner (``launcher.providers.local_runner``) is
started in its own session, so the job outlives a launcher that is killed or detached, and any
`launch` process can follow, stop or read it from the folder alone: the job id is its path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.providers.base import Job, JobStatus, Provider
from launcher.runs import write_json
from launcher.status import UsageError

#: Threads per worker: torchrun's own default, set explicitly so it does not print its banner.
OMP_THREADS = "1"


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

    def __init__(self, python: str | None = None):
        self.python = python or sys.executable

    @classmethod
    def from_settings(cls, settings: dict[str, Any], environ: dict[str, str] | None = None
                      ) -> LocalProvider:
        return cls(python=settings.get("python"))

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
            str(entrypoint),
        ]
        env = {
            **job.rendered.env,
            "LAUNCH_CHECKPOINT_DIR": str(job.checkpoint_dir),
            "LAUNCH_PLAN": str(job.job_dir / "plan.json"),
            "LAUNCH_RUN_ID": job.run_id,
            "LAUNCH_ATTEMPT": str(job.attempt),
            "OMP_NUM_THREADS": OMP_THREADS,
            "PYTHONUNBUFFERED": "1",
        }
        return LocalRequest(
            argv=argv, cwd=str(job.code_dir), env=env, job_dir=str(job.attempt_dir),
            log_file=str(job.attempt_dir / "output.log"),
            memory_limit_bytes=job.memory_limit, nproc=plan.gpus_per_node,
        )

    def schedule(self, request: LocalRequest) -> str:  # type: ignore[override]
        job_dir = Path(request.job_dir)
        write_json(job_dir / "request.json", request.to_dict())
        Path(request.log_file).touch()
        # The runner is this package's module; make sure the child imports this same copy.
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        with open(job_dir / "runner.err", "ab") as errors:
            subprocess.Popen(
                [self.python, "-m", "launcher.providers.local_runner", str(job_dir)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                start_new_session=True, env=env, close_fds=True,
            )
        # Wait (briefly) for the runner to record its pid, so an immediate stop can find it.
        deadline = time.monotonic() + 10
        while not (job_dir / "runner.json").exists() and time.monotonic() < deadline:
            if (job_dir / "exit.json").exists():
                break
            time.sleep(0.01)
        return str(job_dir)

    def poll(self, job_id: str) -> JobStatus:
        job_dir = Path(job_id)
        exit_file = job_dir / "exit.json"
        if exit_file.exists():
            data = json.loads(exit_file.read_text())
            return JobStatus(state=data["state"], exit_code=data.get("returncode"),
                             message=data.get("message", ""))
        runner = _read_json(job_dir / "runner.json")
        if runner is None:
            return JobStatus(state="pending")
        if _alive(runner["pid"]):
            return JobStatus(state="running")
        # Exited between the two reads, or killed before it could write exit.json.
        if exit_file.exists():
            return self.poll(job_id)
        return JobStatus(state="failed", message="the local runner died without an exit status")

    def logs(self, job_id: str, cursor: Any = None) -> tuple[list[str], int]:
        offset = int(cursor or 0)
        path = Path(job_id) / "output.log"
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                data = handle.read(8 << 20)
        except FileNotFoundError:
            return [], offset
        end = data.rfind(b"\n")
        if end < 0:
            return [], offset
        chunk = data[: end + 1]
        lines = chunk.decode("utf-8", errors="replace").splitlines()
        return lines, offset + len(chunk)

    def stop(self, job_id: str) -> None:
        runner = _read_json(Path(job_id) / "runner.json")
        if runner is None or (Path(job_id) / "exit.json").exists():
            return
        try:
            os.kill(runner["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it has exited all the same.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True
