"""The trace child's line protocol: one JSON request per line on stdin, one JSON answer each.

The parent (``estimate.trace_process``) starts the child ahead of its requests; a prestarted
child first answers the CLI's recipe probe (``action: probe``, what ``python -m launcher.recipe``
would answer), then the trace requests: one configuration, a ``batch`` of them (torch imported
once), or one split in two parts traced at once (``fork_parts``: the steady step and the other
micro-batches; ``fork_depths``: the two depths of a block stack). This module owns the real
stdout and hands every request that runs the user's code to worker processes (``_workers``);
what a worker does with it (``work``) is the entry point's (``_trace_child._work``), passed in.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.estimate.child import _workers

#: What a worker does with one request: its answer.
Work = Callable[[dict[str, Any]], dict[str, Any]]


def serve(work: Work, warm_up: Callable[[], None]) -> None:
    """Answer requests from stdin until its end. The protocol owns the real stdout; anything the
    user's code prints goes to stderr. ``warm_up`` runs first when ``LAUNCH_TRACE_WARM=1`` (the
    child was started ahead of its request: the wait pays for the imports), beside the
    probe's worker when the probe is already waiting (``_warm_beside_probe``)."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _workers.prepare()  # before any op: this process forks the workers

    def reply(answer: dict[str, Any]) -> None:
        protocol.write(json.dumps(answer) + "\n")
        protocol.flush()

    if os.environ.get("LAUNCH_TRACE_WARM") == "1":
        def warm() -> None:
            warm_up()
            _workers.mark_baseline()  # it started no thread: the count it leaves is safe

        first = _warm_beside_probe(work, warm)
        if first is not None:
            reply(first())
    # One JSON request per line, one answer line each, until end of input: a prestarted child
    # first loads the recipe for the CLI (``probe``), then traces it. A child started ahead
    # and never asked (the parent is gone, or did not need a trace) just reads the end.
    for line in sys.stdin:
        if line.strip():
            reply(handle(json.loads(line), work))


def _warm_beside_probe(work: Work, warm: Callable[[], None]
                       ) -> Callable[[], dict[str, Any]] | None:
    """Warm up; and when the CLI's probe has already arrived (it is sent as the child starts,
    and waits out torch's import), start its worker first: the recipe loads on one core while
    the warm-up runs on the other, instead of after it (the 7B preflight's first four seconds
    ran on one core). Returns what waits for the probe's answer, or None (no probe yet: it is
    read and answered as any request)."""
    import select

    request = None
    if select.select([sys.stdin], [], [], 0)[0]:
        line = sys.stdin.readline()
        request = json.loads(line) if line.strip() else None
    if request is None or request.get("action") != "probe":
        warm()
        if request is None:
            return None
        answer = handle(request, work)
        return lambda: answer
    try:
        _workers.preimport(request["script"])
        answers = _workers.start([request], work)
    except BaseException:  # noqa: BLE001 - answered the usual way, which reports it
        warm()
        answer = handle(request, work)
        return lambda: answer
    warm()  # in this process, beside the worker: it runs no user code
    return lambda: answers()[0]


def handle(request: dict[str, Any], work: Work) -> dict[str, Any]:
    """One request of the line protocol. Everything that runs the user's code runs in workers;
    this process only imports the packages the recipe names, to share them with its workers."""
    try:
        recipe_file = request.get("script") or request.get("recipe_file") or next(
            (item.get("recipe_file") for item in request.get("batch", ())), None)
        if recipe_file:
            _workers.preimport(recipe_file)
        if request.get("strategy") or any(i.get("strategy") for i in request.get("batch", ())):
            from launcher.estimate.child import _trace_dist

            _trace_dist.preimport()  # starts no thread: the workers are still forked
        if request.get("action") == "probe":
            return _workers.run_all([request], work)[0]
        if "batch" in request:
            # Several configurations of one recipe from one process: torch is imported once.
            common = {k: v for k, v in request.items() if k != "batch"}
            return {"ok": True, "batch": [answer({**common, **item}, work)
                                          for item in request["batch"]]}
        return answer(request, work)
    except BaseException as exc:  # noqa: BLE001 - a bug here must still answer in JSON
        return {
            "ok": False,
            "error": {"message": f"{type(exc).__name__}: {exc}", "file": None, "line": None,
                      "kind": "internal", "traceback": traceback.format_exc()},
        }


def answer(request: dict[str, Any], work: Work) -> dict[str, Any]:
    """One configuration, in workers (``_workers``): its "step" and "micro" parts in two at once
    when the parent asked for that split, its two depths of a block stack in two at once when
    it asked for that one (a sharded rank, a trace at one micro-batch), else all of it in
    one."""
    if request.get("fork_parts"):
        parts = [{**request, "parts": [part], "fork_parts": False} for part in ("step", "micro")]
        return {"ok": True, "split": _workers.run_all(parts, work)}
    if request.get("fork_depths"):
        depths = [{**request, "depth_part": i, "fork_depths": False} for i in (0, 1)]
        return {"ok": True, "depths": _workers.run_all(depths, work)}
    return _workers.run_all([request], work)[0]


def answer_probe(request: dict[str, Any]) -> dict[str, Any]:
    """``launcher.recipe``'s probe, as its own child would run it (in the script's folder); run
    in a worker, since it imports the user's script."""
    from launcher import recipe as loader

    script = Path(request["script"])
    os.chdir(script.parent)
    return loader.probe_answer(script, count_flops=request.get("count_flops", True))
