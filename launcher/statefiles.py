"""State files: how launch writes and reads the JSON files it keeps, whatever they hold.

Every file is replaced atomically (write a temporary file, fsync, rename), so a launcher killed at
any moment leaves either the old or the new content, never half of one; a file that cannot be
written is a usage error naming its folder, and one that is not what launch wrote (edited,
truncated by a full disk) is a usage error naming the file, never an internal one. The run
folder (``runs.py``), the rendered job (``render.py``), the providers' records and the dry run's
job folder all write through here. Nothing of launch is imported but the exit statuses and the
fault points, so any module may use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any, TypeVar

from launcher import faults
from launcher.status import UsageError

T = TypeVar("T")


class StateWriteError(UsageError, OSError):
    """A state file that could not be written: a full disk, a read-only or vanished folder.
    Exit 2 naming the folder, never an internal error; an ``OSError`` still, so code that
    tolerates a failed write (the calibration store) keeps tolerating it."""

    def __init__(self, path: Path, exc: OSError):
        why = exc.strerror or str(exc)
        UsageError.__init__(self, f"cannot write the state folder {path.parent}: {why}",
                            "free space or make it writable (or set LAUNCH_STATE_DIR to "
                            "another folder); a job already started goes on: `launch attach` "
                            "it once the folder can be written, and its record is corrected")
        self.errno = exc.errno
        self.strerror = exc.strerror


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (temporary file, fsync, rename)."""
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        faults.point("state.write", path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, StateWriteError):
            raise
        raise StateWriteError(path, exc) from None
    except BaseException:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


def write_json_at(folder: int, name: str, data: Any) -> None:
    """:func:`write_json` into the folder open as descriptor ``folder``: the write lands in that
    folder wherever it has been moved to, and never recreates a path that went away (the local
    runner writes its records this way)."""
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
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
    except RecursionError:
        raise corrupt(path, "nested too deep") from None
    if not isinstance(data, kind):
        raise corrupt(path, f"expected a JSON {kind.__name__}")
    return data
