"""The trace child, from the parent's side: start it, send it a request, read its answer.

``python -m launcher.estimate._trace_child`` serves one JSON request per line (docs/architecture.md,
"The trace child"). A child started ahead of its first request (``prestart``) hides torch's
import; it can load a recipe for the CLI (``probe``) and stays warm for the traces that follow
(``run_child``). Each child has its own process group, killed whole on a timeout, and dies with
its parent. No torch here: the CLI imports this module.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
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


def prestart(python: str | None = None) -> None:
    """Start a trace child now, to be used by the next trace with the same interpreter.

    Importing torch and the fake-tensor machinery costs a child seconds before it can trace;
    started while the caller does something else (the CLI loads the recipe in its own child
    first), that time is hidden. The child waits for its request on stdin; one never used is
    killed at exit, and one whose parent dies reads end-of-file and exits.
    """
    python = python or sys.executable
    proc = _WARM.get(python)
    if proc is not None and proc.poll() is None:
        return
    _keep(python, _spawn(python, warm=True))


def _keep(python: str, proc: subprocess.Popen[str]) -> None:
    """Keep ``proc`` as the free trace child of ``python`` (killed at exit if never used)."""
    if not _REAPING:
        atexit.register(_reap)
        _REAPING.append(True)
    _WARM[python] = proc


def _reap() -> None:
    for proc in _WARM.values():
        _kill(proc)
        with contextlib.suppress(Exception):
            proc.communicate(timeout=5)
    _WARM.clear()
    _STDERR.clear()


def _kill(proc: subprocess.Popen[str]) -> None:
    """Kill a trace child with its whole process group (its forked half, the user's threads)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _spawn(python: str, warm: bool = False) -> subprocess.Popen[str]:
    from launcher.processes import user_environ

    env = user_environ(dict(os.environ))  # it runs the user's code: no cloud credentials
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    if warm:
        env["LAUNCH_TRACE_WARM"] = "1"  # warm up the lazily imported fake-tensor modules too
    from launcher.processes import die_with_parent

    return subprocess.Popen(
        [python, "-m", "launcher.estimate._trace_child"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env, text=True, start_new_session=True,  # its own group: a timeout kills it all
        preexec_fn=die_with_parent(),  # and a launch killed with -9 takes it along
    )


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
    proc = _WARM.pop(python, None)
    if proc is None or proc.poll() is not None:
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
    out, deadline = b"", time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout.fileno(), selectors.EVENT_READ, "out")
        if proc.stderr is not None:
            selector.register(proc.stderr.fileno(), selectors.EVENT_READ, "err")
        while b"\n" not in out:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill(proc)
                with contextlib.suppress(Exception):
                    proc.communicate(timeout=5)
                raise TimeoutError
            for key, _ in selector.select(timeout=min(left, 1.0)):
                chunk = os.read(key.fd, 1 << 16)
                if key.data == "out":
                    if not chunk:
                        return None
                    out += chunk
                elif not chunk:
                    selector.unregister(key.fd)
                else:  # the last few KiB, for the message if the child dies
                    _STDERR[proc.pid] = (_STDERR.get(proc.pid, b"") + chunk)[-8192:]
    return json.loads(out.decode())


def run_child(request: dict[str, Any], timeout_s: float, python: str) -> dict[str, Any]:
    """Answer ``request`` in a trace child: the prestarted one if it is free (it stays warm for
    the next request: the planner may ask for more traces), else a new one. A child in use is
    out of ``_WARM``, so threads tracing at once each get their own."""
    proc = _WARM.pop(python, None)
    if proc is None or proc.poll() is not None:
        proc = _spawn(python)
    try:
        answer = _ask(proc, request, timeout_s)
    except TimeoutError:
        recipe_file = request.get("recipe_file") or request["batch"][0]["recipe_file"]
        raise TraceTimeout(
            f"tracing {Path(recipe_file).name} took longer than {timeout_s:g} s",
            file=recipe_file, kind="timeout",
        ) from None
    if answer is None:
        _kill(proc)
        _, rest = proc.communicate()
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
        proc.communicate()
    return answer
