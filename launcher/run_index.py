"""The index of every run, wherever it was started: `launch runs` and `launch status RUN` from
any folder.

``<home>/runs.jsonl`` (home: :func:`state_home`): one line per run created, ``{"id", "path",
"created_at"}``, appended (never rewritten) by one ``write`` of one line with ``O_APPEND``, so
that launch processes starting runs at once never interleave or lose a line. An index line is
data, not trust: it only says where to look. A run is read from its own folder, and only from a
folder ``<somewhere>/runs/<id>/`` reached through no symlink that holds a regular ``run.json``;
any other line is skipped with a note, never an error.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.runs import Run, created_time
from launcher.statefiles import corrupt
from launcher.status import UsageError

INDEX_NAME = "runs.jsonl"
#: The most of the index read (its newest lines: the tail), and the longest line taken.
INDEX_LIMIT = 8 << 20
INDEX_LINE_LIMIT = 8192
#: The largest ``run.json`` / ``attempts.jsonl`` the listing reads (launch writes a few KiB per
#: attempt); a larger one is skipped as corrupt, not read.
LISTED_FILE_LIMIT = 16 << 20


def state_home(environ: Mapping[str, str], cwd: Path | None = None) -> Path:
    """The user's launch state home, which keeps the index of every run: ``$LAUNCH_HOME``, else
    ``$XDG_STATE_HOME/launch``, else ``~/.local/state/launch`` (the XDG base directory rule: a
    relative ``XDG_STATE_HOME`` is ignored)."""
    configured = environ.get("LAUNCH_HOME")
    if configured:
        path = Path(configured).expanduser()
        return path if path.is_absolute() else (cwd or Path.cwd()) / path
    xdg = environ.get("XDG_STATE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "launch"
    home = environ.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".local" / "state" / "launch"


def register(home: Path, run: Run, created_at: float | None = None) -> None:
    """Add ``run`` (its folder, as an absolute path with no symlink in it) to the index in
    ``home``. Raises ``OSError`` (the caller says so in a note: the run itself goes on)."""
    line = json.dumps({"id": run.id, "path": os.path.realpath(run.path),
                       "created_at": time.time() if created_at is None else created_at},
                      sort_keys=True) + "\n"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(home / INDEX_NAME, flags | os.O_NONBLOCK, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(home / INDEX_NAME))
        # One writer at a time between the check of the last byte and the append: a size read
        # while another launch's line was being copied in looked like a cut line (a CI run saw
        # an empty line added). Released when the descriptor closes.
        fcntl.flock(fd, fcntl.LOCK_EX)
        st = os.fstat(fd)
        # A line cut by a writer killed mid-write (or a full disk) must not swallow this one.
        if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n":
            line = "\n" + line
        data = line.encode("utf-8")
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(errno.ENOSPC, "the index line was cut short", str(home / INDEX_NAME))
        os.fsync(fd)
    finally:
        os.close(fd)


def index_run(home: Path, run: Run) -> str | None:
    """:func:`register`, or the note that says why the run is not in the index: a home that
    cannot be written costs the run nothing."""
    from launcher.userfiles import shown, why

    try:
        register(home, run)
    except OSError as exc:
        return (f"the run is not in the index of runs in {shown(home)} ({why(exc)}): "
                "`launch runs --here` in this folder still lists it")
    return None


def _index_lines(home: Path | None, notes: list[str]) -> list[tuple[int, str]]:
    """The index's lines (numbered), its newest ``INDEX_LIMIT`` bytes at most; what could not be
    read goes to ``notes``."""
    if home is None:
        return []
    path = home / INDEX_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return []
    except OSError as exc:
        notes.append(f"cannot read the index of runs {_shown(path)}: {exc.strerror or exc}")
        return []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            notes.append(f"the index of runs {_shown(path)} is not a regular file: not read")
            return []
        start = max(0, st.st_size - INDEX_LIMIT)
        data = os.pread(fd, INDEX_LIMIT, start)
    except OSError as exc:
        notes.append(f"cannot read the index of runs {_shown(path)}: {exc.strerror or exc}")
        return []
    finally:
        os.close(fd)
    lines = data.decode("utf-8", errors="replace").splitlines()
    if not start:
        return list(enumerate(lines, 1))
    notes.append(f"the index of runs {_shown(path)} is larger than {INDEX_LIMIT >> 20} MiB: "
                 "only its newest runs are listed")
    return [(0, line) for line in lines[1:]]  # the first is cut; the numbers are unknown


def _indexed_folder(number: int, line: str) -> tuple[str, Path] | str:
    """The run id and folder an index line names, or why the line is skipped."""
    where = f"index line {number}" if number else "an index line"
    if not line.strip():
        return ""
    if len(line) > INDEX_LINE_LIMIT:
        return f"{where} is longer than {INDEX_LINE_LIMIT} characters: skipped"
    try:
        entry = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return f"{where} is not JSON: skipped"
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or not isinstance(
            entry.get("id"), str):
        return f"{where} is not a run's entry (no id and path): skipped"
    text = entry["path"]
    if "\0" in text or not os.path.isabs(text):
        return f"{where} names no absolute path: skipped"
    path = Path(text)
    if path.name != entry["id"] or path.parent.name != "runs":
        return f"{where} names {_shown(path)}, which is no run folder (runs/<run-id>): skipped"
    return entry["id"], path


def _check_folder(path: Path, indexed: bool = True) -> str | None:
    """Why the run folder ``path`` is not read, or None: gone (``""``), a symlink, not a
    folder; from the index (``indexed``, recorded with no symlink in it), reached through a
    symlink too (a state folder's own path may go through one: ``LAUNCH_STATE_DIR``)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"cannot read the run folder {_shown(path)}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"the run folder {_shown(path)} is a symlink: skipped"
    if not stat.S_ISDIR(st.st_mode):
        return f"{_shown(path)} is not a folder: skipped"
    if indexed and os.path.realpath(path) != os.path.normpath(path):
        return f"the run folder {_shown(path)} is reached through a symlink: skipped"
    return None


def indexed_run(home: Path | None, run_id: str | None) -> Run | None:
    """The run of the index whose id is ``run_id`` (else starts with it, when only one does),
    or None. An entry that is not a readable run folder is passed over."""
    if not run_id:
        return None
    found: dict[str, Path] = {}
    for number, line in _index_lines(home, []):
        entry = _indexed_folder(number, line)
        if isinstance(entry, tuple) and entry[0].startswith(run_id):
            found[os.path.normpath(entry[1])] = entry[1]
    usable = [p for p in found.values() if _check_folder(p) is None and _regular(
        p / "run.json")]
    matches = [p for p in usable if p.name == run_id] or usable
    if len(matches) > 1:
        raise UsageError(f"more than one run matches {run_id!r}", "see `launch runs` for run ids")
    return Run(matches[0]) if matches else None


def _regular(path: Path, limit: int = LISTED_FILE_LIMIT) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size <= limit


@dataclass
class RunSummary:
    """One line of `launch runs`: a run as its folder records it (no provider is asked)."""

    run_id: str
    path: Path
    script: str | None
    provider: str | None
    created_at: float
    #: The last attempt's recorded state and outcome; None before any attempt.
    state: str | None
    outcome: str | None
    attempts: int
    #: The attempts' recorded costs added up; None when none is known.
    cost_usd: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "script": self.script, "provider": self.provider,
                "state": self.state, "outcome": self.outcome, "attempts": self.attempts,
                "cost_usd": self.cost_usd,
                "created_at": self.created_at if math.isfinite(self.created_at) else None,
                "path": str(self.path), "state_dir": str(self.path.parent.parent)}


def summarize(path: Path) -> RunSummary:
    """The listing's line for the run folder ``path``; a usage error naming the file when the
    folder is no readable run (no ``run.json``, a corrupt or oversized record)."""
    for name in ("run.json", "attempts.jsonl"):
        file = path / name
        try:
            st = os.lstat(file)
        except FileNotFoundError:
            if name == "run.json":
                raise corrupt(file, "missing") from None
            continue
        except OSError as exc:
            raise corrupt(file, exc.strerror or str(exc)) from None
        if not stat.S_ISREG(st.st_mode):
            raise corrupt(file, "not a regular file")
        if st.st_size > LISTED_FILE_LIMIT:
            raise corrupt(file, f"larger than {LISTED_FILE_LIMIT >> 20} MiB")
    run = Run(path)
    info = run.info
    attempts = run.attempts()
    last = attempts[-1] if attempts else None
    costs = [a.cost_usd for a in attempts if a.cost_usd is not None]
    created = info.created_at
    return RunSummary(
        run_id=run.id, path=path, script=info.script, provider=info.provider,
        created_at=float(created) if isinstance(created, (int, float)) and math.isfinite(
            created) else created_time(path),
        state=None if last is None else str(last.state),
        outcome=None if last is None or last.outcome is None else str(last.outcome),
        attempts=len(attempts), cost_usd=float(sum(costs)) if costs else None)


@dataclass
class RunList:
    """`launch runs`: the runs found, newest first, and a note for each one skipped."""

    runs: list[RunSummary]
    notes: list[str] = field(default_factory=list)


def list_runs(state_dir: Path, home: Path | None, here: bool = False) -> RunList:
    """Every run the index in ``home`` knows and every run of ``state_dir`` (``here``: only
    those), newest first, once each; and a note for each one skipped (a vanished folder is
    counted, not named: deleting a run folder is how a run is forgotten)."""
    notes: list[str] = []
    folders: dict[str, Path] = {}
    gone = 0
    if not here:
        for number, line in _index_lines(home, notes):
            entry = _indexed_folder(number, line)
            if isinstance(entry, str):
                if entry:
                    notes.append(entry)
                continue
            why = _check_folder(entry[1])
            if why == "":
                gone += 1
            elif why:
                notes.append(why)
            else:
                folders.setdefault(os.path.normpath(entry[1]), entry[1])
    runs = state_dir / "runs"
    try:
        local = sorted(runs.iterdir()) if runs.is_dir() else []
    except OSError as exc:
        notes.append(f"cannot read the state folder {_shown(runs)}: {exc.strerror or exc}")
        local = []
    for path in local:
        if path.name == "dry-run" or path.name.startswith("."):
            continue
        why = _check_folder(path, indexed=False)
        if why:
            if "symlink" in why:
                notes.append(why)
            continue  # a stray file beside the run folders is none of them
        folders.setdefault(os.path.normpath(os.path.realpath(path)), path)
    found = []
    for path in folders.values():
        try:
            found.append(summarize(path))
        except UsageError as exc:
            notes.append(f"skipped {_shown(path)}: {exc.message}")
    if gone:
        notes.append(f"{gone} indexed run{'s' if gone != 1 else ''} no longer exist"
                     f"{'s' if gone == 1 else ''} (the folder was removed): not listed")
    found.sort(key=lambda r: r.created_at, reverse=True)
    return RunList(found, notes)


def _shown(path: Path | str) -> str:
    from launcher.userfiles import shown

    return shown(path)
