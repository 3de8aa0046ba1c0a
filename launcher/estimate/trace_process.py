"""The trace child, from the parent's side: start it, send it a request, read its answer.

``python -m launcher.estimate.child._trace_child`` serves one JSON request per line
(docs/architecture.md, "The trace child"). A child started ahead of its first request (``prestart``)
hides torch's import; it can load a recipe for the CLI (``probe``) and stays warm for the traces
that follow (``run_child``). Each child has its own process group and dies with its parent. It
carries a token of its own (``processes.PREFLIGHT_VAR``), as does everything the user's code starts
in it, and a temporary folder of its own (its ``TMPDIR``): when the child is killed (a timeout, a
crash, the end of the CLI) so is everything that carries the token or descends from it, and the
folder is removed. Between requests the child ends what its workers left itself (``_workers``). Its
pipes are read with a deadline, never to their end: a process the user's code started may hold them.
No torch here: the CLI imports this module.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from launcher.estimate.trace_result import TraceError, TraceTimeout

_REPO_ROOT = Path(__file__).resolve().parents[2]

#: Trace children started ahead of their request (``prestart``), by interpreter.
_WARM: dict[str, subprocess.Popen[str]] = {}
_REAPING: list[bool] = []
#: The end of each running child's stderr, by pid (read while waiting for its answers).
_STDERR: dict[int, bytes] = {}
#: Every trace child started and not yet killed, by pid: its token and temporary folder.
_LIVE: dict[int, tuple[str, str]] = {}


def prestart(python: str | None = None) -> None:
    """Start a trace child now, to be used by the next trace with the same interpreter.

    Importing torch and the fake-tensor machinery costs a child seconds before it can trace;
    started while the caller does something else (the CLI loads the recipe in its own child
    first), that time is hidden. The child waits for its request on stdin; one never used is
    killed at exit, and one whose parent dies reads end-of-file and exits.
    """
    python = python or sys.executable
    if _take(python, keep=True) is not None:
        return
    _keep(python, _spawn(python, warm=True))
    _import_ahead()


#: What the parent imports later to read the child's answers: numpy (the fits), the readers.
_LATER = ("numpy", "launcher.estimate.traced", "launcher.estimate._answer",
          "launcher.estimate.allocator")


def _import_ahead() -> None:
    """Import ``_LATER`` while the child just started imports torch (about a second before it
    reads a request): each import then costs the plan nothing, where it sat on the 7B
    preflight's path between the rounds (0.1 s)."""
    import importlib

    for name in _LATER:
        importlib.import_module(name)


def _take(python: str, keep: bool = False) -> subprocess.Popen[str] | None:
    """The free trace child of ``python`` if it still runs (out of ``_WARM`` unless ``keep``);
    one that died is cleaned up (its processes killed, its folder removed) and None returned."""
    proc = _WARM.get(python) if keep else _WARM.pop(python, None)
    if proc is None:
        return None
    if proc.poll() is not None:
        _WARM.pop(python, None)
        _kill(proc)
        return None
    return proc


def _keep(python: str, proc: subprocess.Popen[str]) -> None:
    """Keep ``proc`` as the free trace child of ``python`` (killed at exit if never used)."""
    if not _REAPING:
        atexit.register(_reap)
        _REAPING.append(True)
    _WARM[python] = proc


def _reap() -> None:
    """Kill every trace child this process started (at exit, or when a test wants none)."""
    for proc in list(_WARM.values()):
        _kill(proc)
    _WARM.clear()
    _STDERR.clear()
    for pid, (token, folder) in list(_LIVE.items()):  # one whose caller never came back
        from launcher.processes import end_preflight

        end_preflight(token, pid if _unreaped(pid) else None)
        shutil.rmtree(folder, ignore_errors=True)
        _LIVE.pop(pid, None)


def _unreaped(pid: int) -> bool:
    """Whether ``pid`` is a child of this process that has not been reaped (its pid is still
    its own: safe to name it, its group and its descendants)."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _kill(proc: subprocess.Popen[str]) -> str:
    """Kill a trace child with everything it started: its process group (its forked workers),
    its descendants and every process that carries its token (the user's children, in a session
    of their own or not); reap it, close its pipes and remove its temporary folder. Returns the
    end of its stderr (what it wrote and nobody read yet), read without waiting for its end."""
    from launcher.processes import end_preflight

    token, folder = _LIVE.pop(proc.pid, (None, None))
    if proc.returncode is None:  # not reaped: its pid and group are still its own
        end_preflight(token, proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    else:
        end_preflight(token)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)
    rest = _drain(proc.stderr)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(Exception):
            if pipe is not None:
                pipe.close()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    return rest


def _drain(pipe: Any) -> str:
    """What can be read from ``pipe`` now, without waiting for its end (another process may
    still hold it open)."""
    if pipe is None:
        return ""
    chunks = []
    with contextlib.suppress(Exception):
        fd = pipe.fileno()
        os.set_blocking(fd, False)
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
            if sum(map(len, chunks)) > 1 << 20:
                break
    return b"".join(chunks).decode(errors="replace")


def _spawn(python: str, warm: bool = False) -> subprocess.Popen[str]:
    from launcher.processes import user_environ

    env = user_environ(dict(os.environ))  # it runs the user's code: no cloud credentials
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    # numpy's OpenBLAS starts its thread pool when numpy loads (a model's module imports it),
    # and a thread makes every later worker a fresh interpreter (_workers.fork_safe): the
    # workers trace on fake tensors, and need no BLAS threads
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if warm:
        env["LAUNCH_TRACE_WARM"] = "1"  # warm up the lazily imported fake-tensor modules too
    from launcher.processes import PREFLIGHT_VAR, die_with_parent, new_token

    token = env[PREFLIGHT_VAR] = new_token()  # what the user's code starts in it carries it
    # Its temporary files (the rendered scripts it imports, the workers' answers, the user's
    # own) in a folder of its own, under this process's TMPDIR, removed when it is killed.
    folder = tempfile.mkdtemp(prefix="launch-trace-")
    env["TMPDIR"] = folder
    try:
        proc = subprocess.Popen(
            [python, "-m", "launcher.estimate.child._trace_child"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, text=True, start_new_session=True,  # its own group: a timeout kills it all
            preexec_fn=die_with_parent(),  # and a launch killed with -9 takes it along
        )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if not _REAPING:
        atexit.register(_reap)
        _REAPING.append(True)
    _LIVE[proc.pid] = (token, folder)
    return proc


def probe(script: str | os.PathLike[str], *, count_flops: bool, timeout_s: float,
          python: str | None = None) -> dict[str, Any] | None:
    """Load a recipe in the prestarted trace child (``launcher.recipe``'s probe: LAUNCH, the
    model's size on the meta device, the machine's GPUs) and keep the child for the trace.

    One process instead of two: the probe no longer pays its own torch import, and the trace
    that follows starts in a process that has already imported the recipe's packages. Returns
    the probe's answer, or None when no child was prestarted (or it died): the caller probes the
    usual way. Raises ``TimeoutError`` (the child is killed) when loading takes longer than
    ``timeout_s``.
    """
    python = python or sys.executable
    proc = _take(python)
    if proc is None:
        return None
    request = {"action": "probe", "script": str(Path(script).resolve()),
               "count_flops": count_flops}
    try:
        answer = _ask(proc, request, timeout_s)
    except TimeoutError:
        raise TimeoutError(
            f"loading {Path(script).name} took longer than {timeout_s:g} s") from None
    if answer is not None:
        _keep(python, proc)
    else:  # it died: the caller probes the usual way
        _kill(proc)
    return answer


def _ask(proc: subprocess.Popen[str], request: dict[str, Any], timeout_s: float,
         ) -> dict[str, Any] | None:
    """One request line to a running trace child, its one answer line back (None if the child
    died first). Its stderr is drained meanwhile, so a chatty recipe never blocks on a full
    pipe. Past ``timeout_s`` the child is killed with its process group (its workers) and
    ``TimeoutError`` raised."""
    import selectors

    if proc.stdin is None or proc.stdout is None:
        return None
    try:
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
    except OSError:
        return None
    # the answer's chunks, kept apart: a batch's answer is megabytes, read 1 MiB at a time
    out: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout.fileno(), selectors.EVENT_READ, "out")
        if proc.stderr is not None:
            selector.register(proc.stderr.fileno(), selectors.EVENT_READ, "err")
        while not out or b"\n" not in out[-1]:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill(proc)
                raise TimeoutError
            for key, _ in selector.select(timeout=min(left, 1.0)):
                if key.data == "out":
                    chunk = os.read(key.fd, 1 << 20)
                    if not chunk:
                        return None
                    out.append(chunk)
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fd)
                else:  # the last few KiB, for the message if the child dies
                    _STDERR[proc.pid] = (_STDERR.get(proc.pid, b"") + chunk)[-8192:]
    return json.loads(b"".join(out).decode())


def run_child(request: dict[str, Any], timeout_s: float, python: str) -> dict[str, Any]:
    """Answer ``request`` in a trace child: the prestarted one if it is free (it stays warm for
    the next request: the planner may ask for more traces), else a new one. A child in use is
    out of ``_WARM``, so threads tracing at once each get their own."""
    proc = _take(python) or _spawn(python)
    try:
        answer = _ask(proc, request, timeout_s)
    except TimeoutError:
        recipe_file = request.get("recipe_file") or request["batch"][0]["recipe_file"]
        raise TraceTimeout(
            f"tracing {Path(recipe_file).name} took longer than {timeout_s:g} s",
            file=recipe_file, kind="timeout",
        ) from None
    if answer is None:
        rest = _kill(proc)
        stderr = _STDERR.pop(proc.pid, b"").decode(errors="replace") + rest
        tail = "\n".join(stderr.strip().splitlines()[-5:])
        raise TraceError(
            f"the trace process exited with status {proc.returncode} without an answer"
            + (f": {tail}" if tail else ""),
            kind="crash", detail=stderr,
        )
    if python not in _WARM:
        _keep(python, proc)
    else:
        _kill(proc)
    return answer
