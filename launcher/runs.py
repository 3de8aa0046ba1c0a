"""The run folder: everything one launch wrote, so any later `launch` process can pick it up.

    .launch/runs/<run-id>/
        run.json          what was asked (script, provider, spec; never credentials)
        attempts.jsonl    one line per attempt: plan, what changed and why, job id, state, outcome
        attempt-<n>/      the rendered job, the exact provider request, the job's output
        checkpoints/      shared by all attempts, so a resubmission resumes

Every file is replaced atomically (``statefiles.py``: write a temporary file, fsync, rename), so
a launcher killed at any moment leaves either the old or the new content, never half of one.
``attempts.jsonl`` is read-modified-written under an exclusive lock, so a `cancel` and an `attach`
at once both land. A file that is not what launch wrote (edited, truncated by a full disk) is a
usage error naming the file, never an internal one. Run folders are the user's alone (0700).
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import json
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.events import OomEvent
from launcher.plan.plan import Plan
from launcher.statefiles import StateWriteError, atomic_write, corrupt, read_state, write_json
from launcher.status import JobState, UsageError

if TYPE_CHECKING:  # imported where used: `launch runs` reads no diagnosis (the failures' rules
    # compile at import, 45 ms)
    from launcher.failures import Diagnosis
    from launcher.remedies import Failure


class Outcome(enum.StrEnum):
    """How an attempt ended, as the supervisor judged it (``Attempt.outcome``); a ``str``, so
    ``attempts.jsonl`` holds the plain value."""

    SUCCESS = "success"
    #: Out of memory: stopped, and worth a fixed plan.
    OOM = "oom"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: No job was created (the create refused, or the launcher stopped before it): not failed.
    NOT_SUBMITTED = "not_submitted"


@dataclass
class Summary:
    """How an attempt went, as its events and its provider said (``Attempt.summary``): each
    field None where nothing said. Written with every field (a CI reading ``--json`` finds the
    same keys on every attempt), plus ``extra``: what a record of another version holds."""

    message: str | None = None  # the provider's last word on the job
    steps: int | None = None  # the last step an event reported; None: no event (not 0)
    loss: float | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_rss_bytes: int | None = None
    checkpoint: str | None = None
    resumed_from_step: int | None = None
    not_reported: str | None = None  # why no event came, when none did
    stop_latency_s: float | None = None  # from the OOM seen to the stop asked
    log_behind_s: float | None = None  # how far the log shown trailed the job at most
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        known = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**self.extra, **known}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        names = {f.name for f in fields(cls)} - {"extra"}
        summary = cls(**{k: v for k, v in data.items() if k in names},
                      extra={k: v for k, v in data.items() if k not in names})
        _check_types(summary, _SUMMARY_TYPES)
        return summary


@dataclass(frozen=True)
class Diagnosed:
    """What an attempt's failure was (``Attempt.diagnosis``): the log's diagnosis (``launch
    explain``'s :class:`Diagnosis`), and the script's own ``oom`` event's other fields (step,
    micro-step, batch shapes: ``event``). The event's values win where both speak (the
    allocator's figures at the failure), so ``diagnosis`` holds them; written as one object."""

    diagnosis: Diagnosis
    event: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, diagnosis: Diagnosis, event: OomEvent | None = None) -> Diagnosed:
        fields_ = dict(event.fields) if event is not None else {}  # less "launch"
        from launcher.failures import Diagnosis

        names = {f.name for f in fields(Diagnosis)}
        over = {k: v for k, v in fields_.items() if k in names}
        return cls(replace(diagnosis, **over) if over else diagnosis,
                   {k: v for k, v in fields_.items() if k not in names})

    @property
    def failure(self) -> Failure:
        """The failure as the replanner reads it: ``Failure.of`` the record, its one reading
        (a field added to ``Failure`` is read here too)."""
        from launcher.remedies import Failure

        return Failure.of(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {**self.diagnosis.to_dict(), **self.event}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Diagnosed:
        from launcher.failures import Diagnosis

        names = {f.name for f in fields(Diagnosis)}
        if not {"failure", "cause"} <= data.keys():
            raise TypeError("diagnosis lacks failure or cause")
        diagnosis = Diagnosis(**{k: v for k, v in data.items() if k in names})
        _check_types(diagnosis, _DIAGNOSIS_TYPES)
        return cls(diagnosis, {k: v for k, v in data.items() if k not in names})


@dataclass
class Attempt:
    """One submission of a plan. ``state``: submitting (written ahead of the job), then the
    job's (:class:`JobState`).

    Typed throughout: the :class:`Plan` it ran, what failed (:class:`Diagnosed`), how it went
    (:class:`Summary`). ``attempts.jsonl`` keeps its bytes: an attempt read from the file and
    not changed since is written back as it was read (``record``), whichever version wrote
    it; a new or changed one is written from its fields."""

    number: int
    plan: Plan
    change: str = ""            # what changed from the previous attempt, and why
    job_id: str | None = None
    state: JobState = JobState.PENDING
    outcome: Outcome | None = None
    diagnosis: Diagnosed | None = None
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    exit_code: int | None = None
    summary: Summary = field(default_factory=Summary)
    cost_usd: float | None = None
    #: The line as read from ``attempts.jsonl``, written back while the attempt is unchanged.
    record: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The record as read (strings) or built: the members, so each reader compares one type.
        self.state = JobState(self.state)
        self.outcome = None if self.outcome is None else Outcome(self.outcome)

    def to_dict(self) -> dict[str, Any]:
        """The line of ``attempts.jsonl`` (and of ``--json``'s attempts)."""
        if self.record is not None and _read(self.record) == self:
            return self.record
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)
                               if f.name not in ("record", "plan", "diagnosis", "summary")}
        out["plan"] = self.plan.to_dict()
        out["diagnosis"] = None if self.diagnosis is None else self.diagnosis.to_dict()
        out["summary"] = self.summary.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        """An attempt as ``to_dict`` wrote it; ``TypeError`` for a record launch did not write
        (a hand, a tool, a disk): refused as corrupt, never acted on."""
        attempt = _read(data)
        attempt.record = data
        return attempt


def _read(data: dict[str, Any]) -> Attempt:
    names = {f.name for f in fields(Attempt)} - {"record"}
    values = {k: v for k, v in data.items() if k in names}
    for name, kinds in _ATTEMPT_TYPES.items():
        if name in values:
            _check_type(name, values[name], kinds)
    if "plan" not in values:
        raise TypeError("plan is missing")
    try:
        values["plan"] = Plan.from_dict(values["plan"])
    except (TypeError, ValueError, KeyError) as exc:
        raise TypeError(f"plan: {exc}") from None
    if values.get("diagnosis") is not None:
        values["diagnosis"] = Diagnosed.from_dict(values["diagnosis"])
    values["summary"] = Summary.from_dict(values.get("summary") or {})
    try:
        attempt = Attempt(**values)
    except ValueError as exc:  # a state or outcome launch never writes
        raise TypeError(str(exc)) from None
    if attempt.number < 1:
        raise TypeError(f"attempt number {attempt.number}")
    for name in ("started_at", "ended_at", "cost_usd"):
        value = getattr(attempt, name)
        if value is not None and not math.isfinite(value):
            raise TypeError(f"{name} is not a finite number")
    return attempt


def _check_type(name: str, value: Any, kinds: tuple[type, ...]) -> None:
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise TypeError(f"{name} is {type(value).__name__}, not "
                        f"{' or '.join(k.__name__ for k in kinds)}")


def _check_types(record: Any, types: dict[str, tuple[type, ...]]) -> None:
    for name, kinds in types.items():
        _check_type(name, getattr(record, name), kinds)


@dataclass(frozen=True)
class RunInfo:
    """What a run was asked (``run.json``, never credentials): the script, the provider, the
    spec as recorded (``Spec.to_dict``), the provider settings that are no option, and the plan
    the preflight chose. Absent fields are those of runs recorded before they existed."""

    provider: str
    id: str = ""
    created_at: float | None = None
    script: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)


#: The type of each field of ``run.json`` that launch reads back (absent ones are allowed: runs
#: recorded before the field existed).
_RUN_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,), "created_at": (int, float), "script": (str,), "provider": (str,),
    "spec": (dict,), "settings": (dict,), "plan": (dict,),
}

#: The type of each field of an attempt as launch writes it: a record that says otherwise was
#: not written by launch (a hand, a tool, a disk), and is refused as corrupt, not acted on.
_ATTEMPT_TYPES: dict[str, tuple[type, ...]] = {
    "number": (int,), "plan": (dict,), "change": (str,), "job_id": (str, type(None)),
    "diagnosis": (dict, type(None)), "started_at": (int, float), "ended_at": (int, float,
    type(None)), "exit_code": (int, type(None)), "summary": (dict,),
    "cost_usd": (int, float, type(None)),
}
_NUMBER = (int, float, type(None))
_SUMMARY_TYPES: dict[str, tuple[type, ...]] = {
    "message": (str, type(None)), "steps": (int, type(None)), "loss": _NUMBER,
    "peak_allocated_bytes": (int, type(None)), "peak_reserved_bytes": (int, type(None)),
    "peak_rss_bytes": (int, type(None)), "checkpoint": (str, type(None)),
    "resumed_from_step": (int, type(None)), "not_reported": (str, type(None)),
    "stop_latency_s": _NUMBER, "log_behind_s": _NUMBER,
}
_DIAGNOSIS_TYPES: dict[str, tuple[type, ...]] = {
    "failure": (str,), "cause": (str, type(None)), "requested_bytes": (int, type(None)),
    "capacity_bytes": (int, type(None)), "allocated_bytes": (int, type(None)),
    "reserved_bytes": (int, type(None)), "free_bytes": (int, type(None)),
    "rank": (int, type(None)), "line": (int, type(None)), "excerpt": (str,), "advice": (str,),
    "phase": (str, type(None)), "signature": (str,), "host": (str, type(None)), "note": (str,),
}


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
            from launcher.userfiles import shown, why

            raise UsageError(f"cannot write the state folder {shown(state_dir)}: {why(exc)}",
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
    def open(cls, state_dir: Path, run_id: str | None,
             elsewhere: Callable[[str], Run | None] | None = None) -> Run:
        """Open a run by id, unique id prefix, or (``None``/``last``) the newest one. An id or
        prefix that no run of ``state_dir`` has is asked of ``elsewhere`` (the index of every
        run, ``launcher.run_index.indexed_run``: a run started from another folder)."""
        runs = state_dir / "runs"
        try:
            found = sorted(p for p in runs.iterdir() if p.is_dir() and p.name != "dry-run"
                           ) if runs.is_dir() else []
        except OSError as exc:
            from launcher.userfiles import shown

            raise UsageError(f"cannot read the state folder {shown(runs)}: {exc.strerror}",
                             "set LAUNCH_STATE_DIR to the folder launch wrote") from None
        if run_id is not None and run_id != "last" and not run_id.strip():
            raise UsageError("an empty run id names no run", "see `launch runs` for run ids")
        if not found:
            found_elsewhere = (elsewhere(run_id) if elsewhere is not None and run_id is not None
                               and run_id != "last" else None)
            if found_elsewhere is not None:
                return found_elsewhere
            raise UsageError(f"no runs under {runs}", "start one with `launch SCRIPT`")
        if run_id is None or run_id == "last":
            return cls(max(found, key=created_time))
        matches = [p for p in found if p.name == run_id] or [
            p for p in found if p.name.startswith(run_id)]
        if not matches and elsewhere is not None:
            found_elsewhere = elsewhere(run_id)
            if found_elsewhere is not None:
                return found_elsewhere
        if len(matches) != 1:
            what = "no run" if not matches else "more than one run"
            raise UsageError(f"{what} matches {run_id!r}", "see `launch runs` for run ids")
        return cls(matches[0])

    @property
    def info(self) -> RunInfo:
        """``run.json``, read and checked (written once, by ``create``)."""
        info = read_state(self.path / "run.json", dict)
        if info is None:
            raise corrupt(self.path / "run.json", "missing")
        if not isinstance(info.get("provider"), str) or not isinstance(info.get("spec", {}), dict):
            raise corrupt(self.path / "run.json", "no provider, or a spec that is not a table")
        for name, kinds in _RUN_TYPES.items():
            if name in info and (isinstance(info[name], bool) or not isinstance(info[name], kinds)):
                raise corrupt(self.path / "run.json", f"{name} is {type(info[name]).__name__}")
        names = {f.name for f in fields(RunInfo)}
        return RunInfo(**{k: v for k, v in info.items() if k in names})

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    def attempt_dir(self, number: int) -> Path:
        return self.path / f"attempt-{number}"

    def attempts(self) -> list[Attempt]:
        """The recorded attempts. An attempt folder whose job was handed to a provider
        (``request.json``) but that no line records means the record was emptied or cut: a
        corrupt state, never "no attempts" (that would let `cancel` say "nothing running"
        beside a live job)."""
        path = self.path / "attempts.jsonl"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = ""
        except (OSError, UnicodeDecodeError) as exc:
            raise corrupt(path, str(getattr(exc, "strerror", None) or exc)) from None
        found = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                found.append(Attempt.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, AttributeError, RecursionError) as exc:
                raise corrupt(path, f"line {number}: {exc}") from None
        recorded = {a.number for a in found}
        for folder in self._submitted():
            if int(folder.name.removeprefix("attempt-")) not in recorded:
                raise corrupt(path, f"{folder.name} was submitted but no line records it")
        return found

    def _submitted(self) -> list[Path]:
        """Attempt folders holding a request handed to a provider."""
        try:
            return [p for p in self.path.glob("attempt-*") if p.name[8:].isdigit()
                    and (p / "request.json").exists()]
        except OSError:
            return []

    def save_attempt(self, attempt: Attempt) -> None:
        """Insert or replace the attempt's line; the whole file is replaced atomically, under an
        exclusive lock so that two launch processes never lose each other's update."""
        with self._locked():
            others = [a for a in self.attempts() if a.number != attempt.number]
            lines = sorted([*others, attempt], key=lambda a: a.number)
            atomic_write(self.path / "attempts.jsonl",
                         "".join(json.dumps(a.to_dict(), sort_keys=True) + "\n" for a in lines))

    def update_attempt(self, number: int, **changes: Any) -> Attempt:
        """Change some fields of one recorded attempt, reading it under the lock (a concurrent
        writer's other fields survive)."""
        with self._locked():
            current = {a.number: a for a in self.attempts()}
            if number not in current:
                raise UsageError(f"run {self.id} has no attempt {number}")
            attempt = current[number] = replace(current[number], **changes)  # read as recorded
            atomic_write(self.path / "attempts.jsonl", "".join(
                json.dumps(a.to_dict(), sort_keys=True) + "\n"
                for a in sorted(current.values(), key=lambda a: a.number)))
            return attempt

    @contextlib.contextmanager
    def _locked(self) -> Any:
        """The run's write lock. Under it, temporary files of ``attempts.jsonl`` are leftovers
        of a writer killed mid-write (every writer holds the lock) and are removed."""
        lock = self.path / ".attempts.lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StateWriteError(lock, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            for stale in self.path.glob(".attempts.jsonl.*.tmp"):
                with contextlib.suppress(OSError):
                    stale.unlink()
            yield
        finally:
            os.close(fd)


def created_time(path: Path) -> float:
    """When a run was created, as its own record says (``run.json``), not the folder's mtime: a
    clock that jumped, a `touch` or a copy must not make an old run the newest. A run without a
    readable record sorts first (oldest); its id's timestamp is the next witness."""
    try:
        value = json.loads((path / "run.json").read_text(encoding="utf-8")).get("created_at")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(
                value):
            return float(value)
    except (OSError, ValueError, AttributeError, RecursionError):
        pass
    stamp = path.name.rsplit("-", 3)[-3:-1]  # <stem>-YYYYmmdd-HHMMSS-<hex>
    try:
        return time.mktime(time.strptime("".join(stamp), "%Y%m%d%H%M%S"))
    except ValueError:
        return float("-inf")


def _slug(text: str) -> str:
    keep = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    return keep[:32] or "run"
