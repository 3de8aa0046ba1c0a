"""How the trace child runs the user's code: in worker processes, never in itself.

The trace child (``_trace_child.main``, serving ``_trace_protocol``) is started ahead of its
requests and pays torch's import and the fake-tensor warm-up once (seconds). Each request then
runs in a worker process: forked from the child while that is safe, otherwise a fresh
interpreter. The child itself only waits.

Why the child never runs user code: GNU OpenMP, the intra-op thread pool of PyTorch's CPU
wheels, is not fork-safe. Once a process has run a parallel region (filling a tensor large
enough to be split is enough), its pool exists; a forked child inherits the pool's bookkeeping
but not its threads, and waits forever at its next parallel region's barrier
(``gomp_team_barrier_wait_end``). A recipe that builds a real model at import, or a probe that
runs ``build_model``, would leave the child in that state. So:

- the child sets one intra-op thread before anything runs (``prepare``), so nothing it runs
  itself starts a pool; it runs no user code (the probe, the traces, the measurements all run
  in workers); the only code of the user's world it runs is the import of installed packages the
  recipe names (``preimport``: transformers takes seconds to import, and sharing it is what
  forking buys);
- before every fork it checks that the process still has the threads it had when it was
  prepared (``fork_safe``); a pool, or a thread an import started, means the next workers are
  fresh interpreters instead: slower (a torch import each), never stuck.

Why not always spawn: a fresh interpreter pays torch's import and the fake-tensor warm-up (about
4 s on two cores) for every worker; a forked one starts with both done.

What the user's code starts in a worker (a ``Popen`` at import, a fork, a pool) must neither
stall the answer nor outlive the request: a worker answers in a file, read once the worker has
exited (a pipe would wait for every process that inherited it), and after every request the
child kills what the workers left (``end_leftovers``): it is their subreaper (``become_reaper``),
so even a daemon in a session of its own is still its descendant.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_TASKS = Path("/proc/self/task")


class _State:
    threads = 1          # intra-op threads a worker may use in all (the child's own default)
    baseline: int | None = None  # the child's thread count once prepared
    reaper = False       # orphans of the workers' children are re-parented to this process


def become_reaper() -> None:
    """Make this process (the trace child) the subreaper of everything its workers start, so
    that ``end_leftovers`` finds it all among its descendants."""
    from launcher.processes import become_subreaper

    become_subreaper()
    _State.reaper = True


def end_leftovers() -> None:
    """Kill what the workers' user code left running (every worker has answered and been
    waited for): the processes that carry this child's token (``processes.PREFLIGHT_VAR``, given
    by the parent) and, when this process is their subreaper, all its descendants; then reap the
    orphans it adopted."""
    from launcher.processes import PREFLIGHT_VAR, end_preflight, reap_orphans

    token = os.environ.get(PREFLIGHT_VAR)
    if token is None and not _State.reaper:
        return
    end_preflight(token, os.getpid() if _State.reaper else None, keep_root=True)
    if _State.reaper:
        reap_orphans()


def prepare(max_threads: int = 4) -> None:
    """Make this process a safe one to fork from: one intra-op thread from now on, and note its
    thread count (the baseline ``fork_safe`` compares with). Call before any tensor op runs."""
    import torch

    _State.threads = max(1, min(torch.get_num_threads(), max_threads))
    torch.set_num_threads(1)
    mark_baseline()


def mark_baseline() -> None:
    """Record the current thread count as the safe one (after a warm-up that started none)."""
    _State.baseline = _thread_count()


def _thread_count() -> int | None:
    try:
        return len(os.listdir(_TASKS))
    except OSError:
        return None  # not Linux: thread count unknown


def fork_safe() -> bool:
    """Whether forking now cannot leave a worker without threads it expects: Linux, prepared,
    and no thread started since (an OpenMP pool, a library's background thread)."""
    now = _thread_count()
    return (hasattr(os, "fork") and now is not None and _State.baseline is not None
            and now <= _State.baseline)


def preimport(recipe_file: str | os.PathLike[str]) -> list[str]:
    """Import the installed packages ``recipe_file`` imports (transformers, timm...), so that
    forked workers share the import instead of each paying it. Local modules (next to the
    recipe, or anywhere outside the interpreter's own library folders) are the user's code and
    are left to the workers. Returns the names imported; an import that fails is left to the
    worker too, which reports it with the user's file and line.

    For a recipe a capture wrote, the user's script is read too, what its ``from X import Y``
    names is fetched (transformers loads ``Trainer`` lazily, on first access), and the modules
    of the model's and its blocks' classes (``capture.json``) are imported: GPT-2's took 4.5 s
    of every worker of a Trainer script's trace. numpy's OpenBLAS would start threads as
    these load, which would make every later worker a fresh interpreter (``fork_safe``): the
    trace child runs with ``OPENBLAS_NUM_THREADS=1`` (``trace_process._spawn``)."""
    recipe = Path(recipe_file)
    capture = _capture_of(recipe)
    script = capture.get("script")
    names: list[str] = []
    fetch: dict[str, list[str]] = {}
    for source in (recipe, Path(script) if isinstance(script, str) else None):
        try:
            tree = ast.parse(source.read_text(encoding="utf-8")) if source else None
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Import):
                names += [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.append(node.module.split(".")[0])
                if source is not recipe and "." not in node.module:
                    fetch.setdefault(node.module, []).extend(a.name for a in node.names)
    for qualified in [capture.get("model_class"), *(capture.get("wrap_modules") or [])]:
        if isinstance(qualified, str) and "." in qualified:
            names.append(qualified.rsplit(".", 1)[0])
    libraries = {str(Path(p).resolve()) for key, p in sysconfig.get_paths().items()
                 if key in ("stdlib", "platstdlib", "purelib", "platlib")}
    imported = []
    for name in dict.fromkeys(names):
        if name in sys.modules and not fetch.get(name):
            continue
        try:
            spec = importlib.util.find_spec(name.split(".")[0])
        except (ImportError, ValueError):
            continue
        origin = spec and (spec.origin or next(iter(spec.submodule_search_locations or []), None))
        if not origin or origin in ("built-in", "frozen"):
            continue
        if not any(str(Path(origin).resolve()).startswith(lib + os.sep) for lib in libraries):
            continue
        with contextlib.suppress(Exception):
            if name not in sys.modules:
                imported.append(name)
            module = importlib.import_module(name)
            for attribute in fetch.get(name, ()):
                with contextlib.suppress(Exception):
                    getattr(module, attribute)
    return imported


def _capture_of(recipe: Path) -> dict[str, Any]:
    """What a capture wrote beside a recipe (``capture.json``), or nothing."""
    try:
        capture = json.loads((recipe.parent / "capture.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return capture if isinstance(capture, dict) else {}


class Raw(str):
    """A worker's answer as the JSON text it wrote, for the trace child to pass on unparsed."""


def run_all(requests: list[dict[str, Any]], serve: Callable[[dict[str, Any]], dict[str, Any]],
            slots: int | None = None, raw: bool = False) -> list[Any]:
    """Answer each request in a worker of its own, ``slots`` at a time (default: all at once);
    the answers in order (``raw``: each as the ``Raw`` text its worker wrote).

    The intra-op threads are shared out among the workers that run at once (one each on two
    cores). A worker that dies without answering (a segfault, the OOM killer) is answered for,
    as a ``crash``.
    """
    return start(requests, serve, slots, raw)()


def start(requests: list[dict[str, Any]], serve: Callable[[dict[str, Any]], dict[str, Any]],
          slots: int | None = None, raw: bool = False) -> Callable[[], list[Any]]:
    """``run_all``, in two halves: the first ``slots`` workers start now, and the function
    returned waits for their answers, starting each next worker as one ends (and then ends what
    they left). Meanwhile this process may do work of its own that runs no user code (the
    warm-up, while the probe's worker loads the recipe).

    A worker started after another has answered is forked with the fake-tensor cache entries
    that one added (``take_cache``): the jobs of a batch (a configuration's two halves, the
    next configuration's) run two at a time, each next one as soon as a slot is free, instead
    of configuration by configuration with a core idle while the slower half finishes."""
    slots = len(requests) if slots is None else max(1, min(slots, len(requests)))
    threads = max(1, _State.threads // max(1, slots))
    requests = [{**r, "threads": threads} for r in requests]
    # The answers' folder: under the child's own TMPDIR (the parent removes it with the child).
    folder = tempfile.TemporaryDirectory(prefix="launch-answers-", ignore_cleanup_errors=True)
    files = [Path(folder.name) / f"answer-{i}.json" for i in range(len(requests))]
    running: dict[int, _Worker] = {}
    codes: dict[int, int] = {}
    try:
        for i in range(slots):
            running[i] = _Worker.start(requests[i], serve, files[i])
    except BaseException:
        _stop(running)
        end_leftovers()
        folder.cleanup()
        raise

    def answers() -> list[Any]:
        try:
            waiting = list(range(slots, len(requests)))
            while running:
                i = _next_exit(running, codes)
                take_cache([files[i]])  # before the next fork: it starts with them
                if waiting:
                    j = waiting.pop(0)
                    running[j] = _Worker.start(requests[j], serve, files[j])
            read = read_raw if raw else read_answer
            return [read(files[i], codes[i]) for i in range(len(requests))]
        finally:
            _stop(running)
            end_leftovers()
            folder.cleanup()

    return answers


class _Worker:
    """One worker: forked from this process while that is safe (``fork_safe``), else a fresh
    interpreter (``_spawn``)."""

    def __init__(self, pid: int | None, proc: subprocess.Popen[str] | None) -> None:
        self.pid, self.proc = pid, proc

    @classmethod
    def start(cls, request: dict[str, Any], serve: Callable[[dict[str, Any]], dict[str, Any]],
              answer_file: Path) -> _Worker:
        if fork_safe():
            return cls(_fork(request, serve, answer_file), None)
        return cls(None, _spawn(request, answer_file))

    def poll(self) -> int | None:
        """The worker's exit code once it has exited (reaped), else None."""
        if self.proc is not None:
            return self.proc.poll()
        assert self.pid is not None
        pid, status = os.waitpid(self.pid, os.WNOHANG)  # the worker, not what it started
        return os.waitstatus_to_exitcode(status) if pid else None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc is not None:
                self.proc.kill()
                self.proc.wait()
            elif self.pid is not None:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)


#: How often a batch polls its running workers for the one that ended (seconds).
_POLL_S = 0.005


def _next_exit(running: dict[int, _Worker], codes: dict[int, int]) -> int:
    """Wait for one of the ``running`` workers to exit; its index (its code in ``codes``).
    Polled: ``os.wait`` would also reap what the user's code left to this subreaper, and the
    wait for any of two or three workers costs nothing measurable at 5 ms."""
    while True:
        for i, worker in running.items():
            code = worker.poll()
            if code is not None:
                codes[i] = code
                del running[i]
                return i
        time.sleep(_POLL_S)


def _stop(running: dict[int, _Worker]) -> None:
    """Kill and reap the workers still running (an interrupted batch)."""
    for worker in running.values():
        worker.kill()
    running.clear()


def _fork(request: dict[str, Any], serve: Callable[[dict[str, Any]], dict[str, Any]],
          answer_file: Path) -> int:
    from launcher.processes import die_with_parent

    arm = die_with_parent()  # a worker dies with the child, however the child dies
    pid = os.fork()
    if pid == 0:  # the worker: whatever happens, it never returns into the child's code
        try:
            arm()
            # The child's stdin carries the protocol's requests: never the user's code's.
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            answer_with_cache(answer_file, request, serve)
        finally:
            os._exit(0)
    return pid


def _spawn(request: dict[str, Any], answer_file: Path) -> subprocess.Popen[str]:
    """A worker as a fresh interpreter (``python -m launcher.estimate.child._trace_child
    --worker ANSWER``), in this process's group: the parent's timeout kills it with it. What it
    prints goes to this process's stderr."""
    proc = subprocess.Popen(  # it arms its own parent-death signal (see main)
        [sys.executable, "-m", "launcher.estimate.child._trace_child", "--worker",
         str(answer_file)],
        stdin=subprocess.PIPE, stdout=sys.stderr.fileno(), text=True,
        env={**os.environ, PARENT_VAR: str(os.getpid())})
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(request))
    proc.stdin.close()
    return proc


def answer_with_cache(path: Path, request: dict[str, Any],
                      serve: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """A worker's request answered into ``path``, and the fake-tensor cache entries it added
    beside it (``_shared_cache``: the child takes them in for the next workers)."""
    from launcher.estimate.child import _shared_cache

    before = _shared_cache.keys()
    answer = work(request, serve)
    with contextlib.suppress(Exception):  # an optimisation: never the answer's failure
        _shared_cache.export(before, _cache_file(path))
    write_answer(path, answer)


def take_cache(files: list[Path]) -> None:
    """Take in what the workers that answered into ``files`` added to the fake-tensor cache:
    the workers forked from now on start with it (``_shared_cache``)."""
    from launcher.estimate.child import _shared_cache

    for path in files:
        with contextlib.suppress(Exception):
            _shared_cache.absorb(_cache_file(path))


def _cache_file(answer_file: Path) -> Path:
    return answer_file.with_name(answer_file.name + ".fakecache")


def write_answer(path: Path, answer: dict[str, Any]) -> None:
    """A worker's answer, written whole and then named: ``read_answer`` never sees half."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(answer), encoding="utf-8")
    partial.replace(path)


def read_answer(path: Path, code: int) -> dict[str, Any]:
    """The answer of a worker that has exited with ``code``: its file, or a crash."""
    try:
        answer = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return _died(code)
    return answer if isinstance(answer, dict) else _died(code)


def read_raw(path: Path, code: int) -> Raw:
    """``read_answer``, as the text the worker wrote: whole, since it is written whole and then
    named (``write_answer``), and a JSON object, since only ``json.dumps`` of one writes it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        text = ""
    return Raw(text if text.startswith("{") and text.endswith("}") else json.dumps(_died(code)))


#: A spawned worker's parent, so that it dies with it (armed by the worker itself).
PARENT_VAR = "LAUNCH_TRACE_PARENT"


def work(request: dict[str, Any], serve: Callable[[dict[str, Any]], dict[str, Any]],
         ) -> dict[str, Any]:
    """A worker's whole life: its share of threads, the request, an answer whatever happens."""
    import torch

    if os.environ.get(PARENT_VAR, "").isdigit():  # spawned, not forked: arm it here
        from launcher.processes import die_with_parent

        die_with_parent(parent=int(os.environ[PARENT_VAR]))()

    torch.set_num_threads(int(request.get("threads", 1)))
    try:
        return serve(request)
    except BaseException as exc:  # noqa: BLE001 - a bug here must still answer in JSON
        import traceback

        return {"ok": False, "error": {
            "message": f"{type(exc).__name__}: {exc}", "file": None, "line": None,
            "kind": "internal", "traceback": traceback.format_exc()}}


def _died(code: int) -> dict[str, Any]:
    how = (f"was killed by {signal.Signals(-code).name}" if code < 0
           else f"exited with status {code}")
    return {"ok": False, "error": {"message": f"the trace worker {how} without an answer",
                                   "file": None, "line": None, "kind": "crash"}}
