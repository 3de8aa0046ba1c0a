"""The run folder: everything one launch wrote, so any later `launch` process can pick it up.

    .launch/runs/<run-id>/
        run.json          what was asked (script, provider, spec; never credentials)
        attempts.jsonl    one line per attempt: plan, what changed and why, job id, state, outcome
        attempt-<n>/      the rendered job, the exact provider request, the job's output
        checkpoints/      shared by all attempts, so a resubmission resumes

Every file is replaced atomically (write a temporary file, fsync, rename), so a launcher killed at
any moment leaves either the old or the new content, never half of one.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from launcher.status import UsageError


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


@dataclass
class Attempt:
    """One submission of a plan. ``state``: pending, running, succeeded, failed, cancelled."""

    number: int
    plan: dict[str, Any]
    change: str = ""            # what changed from the previous attempt, and why
    job_id: str | None = None
    state: str = "pending"
    outcome: str | None = None  # success | oom | failed | cancelled | detached
    diagnosis: dict[str, Any] | None = None
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    exit_code: int | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    cost_usd: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class Run:
    """A run folder on disk; cheap to open, every read goes to the files."""

    def __init__(self, path: Path):
        self.path = path
        self.id = path.name

    @classmethod
    def create(cls, state_dir: Path, stem: str, info: dict[str, Any]) -> Run:
        runs = state_dir / "runs"
        try:
            runs.mkdir(parents=True, exist_ok=True)
            probe = runs / f".write-test-{secrets.token_hex(4)}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise UsageError(f"cannot write the state folder {state_dir}: {exc.strerror}",
                             "set LAUNCH_STATE_DIR to a writable folder") from None
        run_id = f"{_slug(stem)}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        run = cls(runs / run_id)
        run.path.mkdir()
        write_json(run.path / "run.json", {"id": run_id, "created_at": time.time(), **info})
        return run

    @classmethod
    def open(cls, state_dir: Path, run_id: str | None) -> Run:
        """Open a run by id, unique id prefix, or (``None``/``last``) the newest one."""
        runs = state_dir / "runs"
        found = sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
        if not found:
            raise UsageError(f"no runs under {runs}", "start one with `launch SCRIPT`")
        if run_id in (None, "last"):
            return cls(max(found, key=lambda p: p.stat().st_mtime))
        matches = [p for p in found if p.name == run_id] or [
            p for p in found if p.name.startswith(run_id)]
        if len(matches) != 1:
            what = "no run" if not matches else "more than one run"
            raise UsageError(f"{what} matches {run_id!r}", "see `launch status` for run ids")
        return cls(matches[0])

    @property
    def info(self) -> dict[str, Any]:
        return json.loads((self.path / "run.json").read_text())

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    def attempt_dir(self, number: int) -> Path:
        return self.path / f"attempt-{number}"

    def attempts(self) -> list[Attempt]:
        path = self.path / "attempts.jsonl"
        if not path.exists():
            return []
        return [Attempt.from_dict(json.loads(line))
                for line in path.read_text().splitlines() if line.strip()]

    def save_attempt(self, attempt: Attempt) -> None:
        """Insert or replace the attempt's line; the whole file is replaced atomically."""
        others = [a for a in self.attempts() if a.number != attempt.number]
        lines = sorted([*others, attempt], key=lambda a: a.number)
        atomic_write(self.path / "attempts.jsonl",
                     "".join(json.dumps(asdict(a), sort_keys=True) + "\n" for a in lines))


def _slug(text: str) -> str:
    keep = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    return keep[:32] or "run"
