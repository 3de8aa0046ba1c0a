"""The processes launch starts, and how it makes sure none outlives its purpose (Linux, /proc).

Three mechanisms, each for a way a process tree gets cut:

- ``die_with_parent``: the kernel's parent-death signal (``PR_SET_PDEATHSIG``). A trace child, its
  workers and torchrun under the local runner get it, so ``kill -9`` of their parent (``launch``
  itself, or the runner) takes them down too: nothing is left to reap.
- A job token: every process of a local job carries ``LAUNCH_JOB_TOKEN`` in its environment,
  inherited down the tree. torchrun starts each worker in a session of its own, and a worker whose
  torchrun was killed is re-parented away, so neither the process group nor the parent chain
  reaches everything; the token does (``tagged``), for ``cancel`` and for a runner found dead.
- ``become_subreaper``: orphans of the runner's tree are re-parented to the runner, not to init,
  so it still sees (and stops) workers whose torchrun died.

Only the standard library: the local runner imports this and must start fast.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

TOKEN_VAR = "LAUNCH_JOB_TOKEN"

#: Environment variables that carry cloud credentials (or point at them): kept from every
#: process that runs the user's code on this machine (the recipe probe, the trace, a local job).
#: Regions, profiles' names and endpoints are not secrets and stay.
CREDENTIAL_ENV = re.compile(
    r"^(AWS_(ACCESS_KEY_ID|SECRET_ACCESS_KEY|SESSION_TOKEN|SECURITY_TOKEN|SHARED_CREDENTIALS_FILE"
    r"|WEB_IDENTITY_TOKEN_FILE|CONTAINER_CREDENTIALS_\w+|CONTAINER_AUTHORIZATION_TOKEN\w*"
    r"|BEARER_TOKEN_\w+)"
    r"|GOOGLE_APPLICATION_CREDENTIALS|GOOGLE_OAUTH_ACCESS_TOKEN|GOOGLE_CREDENTIALS"
    r"|CLOUDSDK_AUTH_\w+|GCE_METADATA_\w*TOKEN\w*"
    r"|AZURE_(CLIENT_SECRET|CLIENT_CERTIFICATE_\w+|PASSWORD|FEDERATED_TOKEN_FILE))$")


def user_environ(environ: dict[str, str]) -> dict[str, str]:
    """The environment for a process that runs the user's code: the launcher's, less cloud
    credentials (the code needs none to be traced or run locally, and one that logs its
    environment must not log them), unless ``LAUNCH_LOCAL_PASS_CREDENTIALS=1`` asks for them."""
    if environ.get("LAUNCH_LOCAL_PASS_CREDENTIALS") == "1":
        return dict(environ)
    return {k: v for k, v in environ.items() if not CREDENTIAL_ENV.match(k)}


_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not Linux: no parent-death signal, no subreaper
        return None


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> Callable[[], None]:
    """A ``preexec_fn`` (or a call right after ``fork``) that makes the child get ``sig`` when
    its parent dies. Resolved here, in the parent, so the child only calls into libc; a parent
    that died before the call is caught by comparing ``getppid`` with the pid it had.

    A child can also arm itself at its start with the ``parent`` pid it was given: that keeps
    its parent's ``subprocess`` off the ``preexec_fn`` path, whose real ``fork`` runs torch's
    at-fork handlers in a parent that has an OpenMP pool.

    The signal follows the parent *thread*: from any thread but the main one it would come when
    that thread ends, not when the process dies, so there it arms nothing (launch spawns from its
    main thread; tests trace from thread pools).
    """
    prctl = _prctl() if threading.current_thread() is threading.main_thread() else None
    parent = os.getpid() if parent is None else parent

    def arm() -> None:
        if prctl is None:
            return
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return arm


def become_subreaper() -> None:
    """Orphans among this process's descendants are re-parented to it (where Linux allows)."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, read from /proc (no psutil needed on Linux)."""
    parents: dict[int, list[int]] = {}
    for entry in _proc_entries():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def tagged(token: str) -> list[int]:
    """The live processes whose environment carries ``LAUNCH_JOB_TOKEN=token`` (the current
    process excluded). Zombies are skipped: they have exited, only their parent's wait is due."""
    return carrying(TOKEN_VAR, token)


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot: with the pid, it names one process even
    after the pid is reused."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int, started: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, given ``started``, is still the same process.
    A value that is no valid pid is not alive (``kill(-1, 0)`` would ask about every process)."""
    if valid_pid(pid) is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return started is None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return started is None  # no /proc: trust kill(0)
    if fields[0] in ("Z", "X"):
        return False
    return started is None or fields[19] == str(started)


def pid_max() -> int:
    """The largest pid this kernel hands out (``/proc/sys/kernel/pid_max``; Linux's ceiling,
    2**22, where it cannot be read)."""
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 1 << 22


def valid_pid(value: object) -> int | None:
    """``value`` as a pid launch may ever signal, or ``None``: an ``int`` (not a bool, not a
    float: ``1.5`` is no pid) above 1 (0 is the caller's group, 1 is init, -1 is every process
    it may signal) and within the kernel's range. What a state file says is data, not orders."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 1 < value <= pid_max() else None


def owned(pid: int, started: object, token: str, marker: bytes | None = None) -> bool:
    """Whether ``pid`` is provably a process launch started: alive, started at clock tick
    ``started`` (so a reused pid is not it), and carrying the job ``token`` in its environment
    (or, with ``marker``, naming it in its command line: runners started before the token was
    given to them). Anything that cannot be read (another user's process, no /proc) is not
    proven, and a process that is not proven is never signalled."""
    pid_ok = valid_pid(pid)
    if pid_ok is None or isinstance(started, bool) or not isinstance(started, int):
        return False
    if not alive(pid_ok, started):
        return False
    proc = Path(f"/proc/{pid_ok}")
    try:
        if f"{TOKEN_VAR}={token}".encode() in (proc / "environ").read_bytes().split(b"\0"):
            return True
        return marker is not None and marker in (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def signal_all(pids: Iterable[int], sig: int) -> None:
    """Signal each pid; one that is not a valid pid (``valid_pid``) is skipped, never sent
    (``os.kill(0, ...)`` or ``-1`` would reach a whole group or every process)."""
    for pid in pids:
        checked = valid_pid(pid)
        if checked is None:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(checked, sig)


def kill_tagged(token: str, timeout_s: float = 5.0) -> list[int]:
    """SIGKILL every process of the job ``token`` until none is left (or ``timeout_s``); return
    the ones still alive at the end (an empty list is the proof that nothing is left)."""
    deadline = time.monotonic() + timeout_s
    left = tagged(token)
    while left and time.monotonic() < deadline:
        signal_all(left, signal.SIGKILL)
        time.sleep(0.05)
        left = tagged(token)
    return left


def reap_orphans() -> None:
    """Collect the exit status of every child that has exited, without waiting for the others
    (a subreaper's re-parented orphans): none is left a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _proc_entries() -> list[Path]:
    try:
        return [e for e in Path("/proc").iterdir() if e.name.isdigit()]
    except OSError:
        return []


# --- a preflight's processes ------------------------------------------------------------------

#: Every process a preflight starts to run the user's code (the recipe probe, the framework
#: capture, the trace child) carries a fresh random ``LAUNCH_PREFLIGHT_TOKEN`` of its own, and so
#: does what that code starts (a ``Popen``, a fork, a multiprocessing pool: they inherit it), in a
#: session of its own or not. Once the preflight is done with the process, ``end_preflight``
#: kills whatever still carries the token or descends from it.
PREFLIGHT_VAR = "LAUNCH_PREFLIGHT_TOKEN"


def new_token() -> str:
    """A fresh token (``PREFLIGHT_VAR``'s value for one child process)."""
    import secrets

    return secrets.token_hex(16)


def carrying(var: str, token: str) -> list[int]:
    """The live processes whose environment (as they were started, /proc/PID/environ) carries
    ``var=token``, the current process excluded (zombies too: they have exited)."""
    needle = f"{var}={token}".encode()
    found = []
    for entry in _proc_entries():
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if needle in environ.split(b"\0") and alive(pid):
            found.append(pid)
    return found


def end_preflight(token: str | None, root: int | None = None, *, keep_root: bool = False,
                  timeout_s: float = 5.0) -> list[int]:
    """SIGKILL, until none is left (or ``timeout_s``), every live process that carries
    ``PREFLIGHT_VAR=token`` and every live descendant of ``root`` (``root`` itself too, unless
    ``keep_root``); return those still alive at the end (none: an empty list).

    ``root`` must be a child of the caller that it has not reaped yet (or the caller itself),
    so that its pid cannot have been reused; nothing that neither carries the token nor descends
    from ``root`` is ever signalled. The current process never is."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = set(carrying(PREFLIGHT_VAR, token)) if token else set()
        if root is not None:
            left.update(pid for pid in descendants(root) if alive(pid))
            if not keep_root and alive(root):
                left.add(root)
        left.discard(os.getpid())
        if keep_root and root is not None:
            left.discard(root)
        if not left or time.monotonic() >= deadline:
            return sorted(left)
        signal_all(left, signal.SIGKILL)
        time.sleep(0.02)


def wait_unreaped(pid: int, timeout_s: float | None) -> bool:
    """Wait until the child ``pid`` has exited, at most ``timeout_s`` seconds (None: no limit),
    without reaping it: its pid, and so its process group's id, stay reserved for the caller's
    clean-up (``end_preflight``, ``killpg``) until it is waited for. True once it has exited.

    Only the child itself is waited for, never its children: one that holds an inherited pipe
    or outlives it does not make this wait."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(pid)  # readable once the process has exited (Linux 5.3)
    try:
        while True:
            try:
                if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    return True
            except ChildProcessError:  # already reaped: it has exited
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if pidfd is not None:
                import select

                select.select([pidfd], [], [], left)
            else:
                time.sleep(0.02 if left is None else min(0.02, left))
    finally:
        if pidfd is not None:
            os.close(pidfd)
