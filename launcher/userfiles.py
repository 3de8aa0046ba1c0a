"""Files the user names on the command line or in a config: read bounded, written through.

One home for the two rules every user-named path follows (issue 30):

- **Reads are bounded, by kind and by size.** ``--model-config``, ``launch explain``'s log (as a
  path), ``launch.toml`` are regular files read up to a cap: ``/dev/zero``, a FIFO, a folder, a
  symlink loop, ``/proc/self/mem`` or a 5,000-character name is one line naming the file and
  what to do, never an unbounded read or an internal error.
- **Writes go to a regular file or to nothing.** ``--report PATH`` writes a new file or replaces a
  regular one, atomically (a temporary file beside it, renamed over it). A symlink is written
  *through*: the link stays, the file it points at is replaced (the rule docs/security.md
  states). A device, FIFO, socket or folder at the path is refused, and folders that do not
  exist are not created: the user asked for a file, not a tree.

Only the standard library: the CLI imports this on paths where `launch --help` must stay fast.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from launcher.status import UsageError

#: The most a config file (launch.toml, a Hugging Face config.json) may hold: the largest real
#: config.json seen is a few hundred KiB (DeepSeek-V3's is 1.7 KiB, a quantization table a few
#: hundred KiB); 16 MiB leaves room and bounds the parse.
CONFIG_LIMIT = 16 << 20


def why(exc: OSError) -> str:
    """An OSError in a few words (no errno, no path: the message names the path itself)."""
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is too long"
    if exc.errno == errno.ELOOP:
        return "a symlink loop"
    return exc.strerror or str(exc)


def shown(path: Path | str, limit: int = 120) -> str:
    """A path for a one-line message: a 5,000-character one is cut in the middle."""
    text = str(path)
    return text if len(text) <= limit else text[: limit // 2] + "..." + text[-limit // 2:]


def open_regular(path: Path, what: str, hint: str = "") -> int:
    """A read-only descriptor of ``path``, checked to be a regular file (after the open, on the
    descriptor: no race with a swap). The caller closes it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {shown(path)}", hint) from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {shown(path)}: {why(exc)}", hint) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise UsageError(f"{what} {shown(path)} is {kind}", hint or "give a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: Path, what: str, limit: int = CONFIG_LIMIT, hint: str = "") -> bytes:
    """The whole of a regular file of at most ``limit`` bytes (a larger one is refused, read no
    further than ``limit + 1`` bytes: a file that grows while read is bounded too)."""
    fd = open_regular(path, what, hint)
    try:
        with os.fdopen(fd, "rb", closefd=True) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:  # /proc/self/mem: EIO on read
        raise UsageError(f"cannot read {what} {shown(path)}: {why(exc)}", hint) from None
    if len(data) > limit:
        raise UsageError(f"{what} {shown(path)} is larger than {limit >> 20} MiB",
                         hint or "give the file it should be")
    return data


def read_text(path: Path, what: str, limit: int = CONFIG_LIMIT, hint: str = "") -> str:
    """:func:`read_bytes` as UTF-8; text that is not UTF-8 is a usage error naming the file."""
    try:
        return read_bytes(path, what, limit, hint).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {shown(path)} is not UTF-8 text (byte {exc.start})",
                         hint) from None


def write_through(path: Path, text: str, what: str = "file") -> Path:
    """Write ``text`` to ``path`` atomically, by the rule above; returns the file written (a
    symlink's target). Refusals and write errors are usage errors naming the path."""
    target = path
    try:
        if path.is_symlink():
            target = path.resolve(strict=False)
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError(f"cannot write the {what} {shown(path)}: {why(exc)}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise UsageError(f"will not write the {what} over {shown(path)}: it is {kind}",
                         "give the path of a file to create or replace")
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"cannot write the {what} {shown(path)}: the folder {shown(folder)} "
                         "does not exist", "create it first, or give another path")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.name[:64]}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"cannot write the {what} {shown(path)}: {why(exc)}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o644 & ~_umask())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write the {what} {shown(path)}: {why(exc)}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
