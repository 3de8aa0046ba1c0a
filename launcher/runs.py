"""The run folder: everything one launch wrote, so any later `launch` process can pick it up.

    .launch/runs/<run-id>/
        run.json          what was asked (script, provider, spec; never credentials)
        attempts.jsonl    one line per attempt: plan, what changed and why, job id, state, outcome
        attempt-<n>/      the rendered job, the exact provider request, the job's output
        checkpoints/      shared by all attempts, so a resubmission resumes

Every file is replaced atomically (write a temporary file, fsync, rename), so a launcher killed at
any moment leaves either the old or the new content, never half of one. ``attempts.jsonl`` is
read-modified-written under an exclusive lock, so a `cancel` and an `attach` at once both land. A
file that is not what launch wrote (edited, truncated by a full disk) is a usage error naming the
file, never an internal one. Run folders are the user's alone (0700).
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import json
import os
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from launcher.status import JobState, UsageError

T = TypeVar("T")


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


def corrupt(path: Path, why: str) -> UsageError:
    return UsageError(f"the state file {path} is corrupt ({why})",
                      f"restore or delete it; `rm -r {path.parent}` forgets that run")


def read_state(path: Path, kind: type[T]) -> T | None:
    """A JSON state file, ``None`` when it does not exist; one that does not parse, or holds
    something other than ``kind``, is a usage error that says which file and what to do."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise corrupt(path, str(getattr(exc, "strerror", None) or exc)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise corrupt(path, f"not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, kind):
        raise corrupt(path, f"expected a JSON {kind.__name__}")
    return data


class Outcome(enum.StrEnum):
    """How an attempt ended, as the supervisor judged it (``Attempt.outcome``); a ``str``, so
    ``attempts.jsonl`` holds the plain value."""

    SUCCESS = "success"
    #: Out of memory: stopped, and worth a fixed plan.
    OOM = "oom"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass
class Attempt:
    """One submission of a plan. ``state``: submitting (written ahead of the job), then the
    job's (:class:`JobState`)."""

    number: int
    plan: dict[str, Any]
    change: str = ""            # what changed from the previous attempt, and why
    job_id: str | None = None
    state: JobState = JobState.PENDING
    outcome: Outcome | None = None
    diagnosis: dict[str, Any] | None = None
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    exit_code: int | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    cost_usd: float | None = None

    def __post_init__(self) -> None:
        # The record as read (strings) or built: the members, so each reader compares one type.
        self.state = JobState(self.state)
        self.outcome = None if self.outcome is None else Outcome(self.outcome)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        names = {f.name for f in fields(cls)}
        try:
            attempt = cls(**{k: v for k, v in data.items() if k in names})
        except ValueError as exc:  # a state or outcome launch never writes
            raise TypeError(str(exc)) from None
        if not isinstance(attempt.number, int) or not isinstance(attempt.plan, dict) or not (
                attempt.job_id is None or isinstance(attempt.job_id, str)):
            raise TypeError("an attempt needs an integer number, a plan and a job id")
        return attempt


class Run:
    """A run folder on disk; cheap to open, every read goes to the files."""

    def __init__(self, path: Path):
        self.path = path
        self.id = path.name

    @classmethod
    def create(cls, state_dir: Path, stem: str, info: dict[str, Any]) -> Run:
        runs = state_dir / "runs"
        try:
            runs.mkdir(mode=0o700, parents=True, exist_ok=True)
            probe = runs / f".write-test-{secrets.token_hex(4)}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise UsageError(f"cannot write the state folder {state_dir}: {exc.strerror}",
                             "set LAUNCH_STATE_DIR to a writable folder") from None
        for _ in range(8):  # 32 random bits a second: a clash is a retry, not an error
            run_id = f"{_slug(stem)}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
            run = cls(runs / run_id)
            try:
                run.path.mkdir(mode=0o700)
                break
            except FileExistsError:
                continue
        else:
            raise UsageError(f"cannot create a new run folder under {runs}")
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
        info = read_state(self.path / "run.json", dict)
        if info is None:
            raise corrupt(self.path / "run.json", "missing")
        if not isinstance(info.get("provider"), str) or not isinstance(info.get("spec", {}), dict):
            raise corrupt(self.path / "run.json", "no provider, or a spec that is not a table")
        return info

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    def attempt_dir(self, number: int) -> Path:
        return self.path / f"attempt-{number}"

    def attempts(self) -> list[Attempt]:
        path = self.path / "attempts.jsonl"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            raise corrupt(path, str(getattr(exc, "strerror", None) or exc)) from None
        found = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                found.append(Attempt.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, AttributeError) as exc:
                raise corrupt(path, f"line {number}: {exc}") from None
        return found

    def save_attempt(self, attempt: Attempt) -> None:
        """Insert or replace the attempt's line; the whole file is replaced atomically, under an
        exclusive lock so that two launch processes never lose each other's update."""
        with self._locked():
            others = [a for a in self.attempts() if a.number != attempt.number]
            lines = sorted([*others, attempt], key=lambda a: a.number)
            atomic_write(self.path / "attempts.jsonl",
                         "".join(json.dumps(asdict(a), sort_keys=True) + "\n" for a in lines))

    def update_attempt(self, number: int, **changes: Any) -> Attempt:
        """Change some fields of one recorded attempt, reading it under the lock (a concurrent
        writer's other fields survive)."""
        with self._locked():
            current = {a.number: a for a in self.attempts()}
            if number not in current:
                raise UsageError(f"run {self.id} has no attempt {number}")
            attempt = current[number] = replace(current[number], **changes)  # read as recorded
            atomic_write(self.path / "attempts.jsonl", "".join(
                json.dumps(asdict(a), sort_keys=True) + "\n"
                for a in sorted(current.values(), key=lambda a: a.number)))
            return attempt

    @contextlib.contextmanager
    def _locked(self) -> Any:
        fd = os.open(self.path / ".attempts.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _slug(text: str) -> str:
    keep = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    return keep[:32] or "run"
