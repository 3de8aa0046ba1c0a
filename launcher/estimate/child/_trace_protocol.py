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
#: An answer on its way to the parent: what this process says itself, around the workers'
#: answers as they wrote them (``_workers.Raw``: passed on, not parsed and written again).
Answer = Any


def encode(answer: Answer) -> str:
    """``answer`` as one line of JSON, each worker's answer spliced in as its file holds it
    (the 7B's rank round parsed and wrote 1.8 MB again: 0.2 s on the preflight's path)."""
    if isinstance(answer, _workers.Raw):
        return str(answer)
    if isinstance(answer, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {encode(v)}"
                               for k, v in answer.items()) + "}"
    if isinstance(answer, (list, tuple)):
        return "[" + ", ".join(encode(v) for v in answer) + "]"
    return json.dumps(answer)


def serve(work: Work, warm_up: Callable[[], None]) -> None:
    """Answer requests from stdin until its end. The protocol owns the real stdout; anything the
    user's code prints goes to stderr. ``warm_up`` runs first when ``LAUNCH_TRACE_WARM=1`` (the
    child was started ahead of its request: the wait pays for the imports), beside the
    probe's worker when the probe is already waiting (``_warm_beside_probe``)."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _workers.prepare()  # before any op: this process forks the workers

    def reply(answer: Answer) -> None:
        protocol.write(encode(answer) + "\n")
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
                       ) -> Callable[[], Answer] | None:
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


def handle(request: dict[str, Any], work: Work) -> Answer:
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
            return {"ok": True, "batch": answer_all(
                [{**common, **item} for item in request["batch"]], work)}
        return answer(request, work)
    except BaseException as exc:  # noqa: BLE001 - a bug here must still answer in JSON
        return {
            "ok": False,
            "error": {"message": f"{type(exc).__name__}: {exc}", "file": None, "line": None,
                      "kind": "internal", "traceback": traceback.format_exc()},
        }


def answer(request: dict[str, Any], work: Work) -> Answer:
    """One configuration, in workers (``answer_all``)."""
    return answer_all([request], work)[0]


def answer_all(requests: list[dict[str, Any]], work: Work) -> list[Answer]:
    """Configurations, in workers (``_workers``), two at a time: each split in two parts when
    the parent asked for that (its "step" and "micro" parts, ``fork_parts``; its two depths of a
    block stack, ``fork_depths``: a sharded rank, a trace at one micro-batch), else whole. The
    parts of every configuration share one queue, so the next configuration's first part
    starts as soon as either part of the one before ends (with the fake-tensor cache entries it
    added), not once both have."""
    jobs: list[dict[str, Any]] = []
    shapes: list[str | None] = []
    for request in requests:
        if request.get("fork_parts"):
            jobs += [{**request, "parts": [part], "fork_parts": False}
                     for part in ("step", "micro")]
            shapes.append("split")
        elif request.get("fork_depths"):
            jobs += [{**request, "depth_part": i, "fork_depths": False} for i in (0, 1)]
            shapes.append("depths")
        else:
            jobs.append(request)
            shapes.append(None)
    order = sorted(range(len(jobs)), key=lambda i: -_weight(jobs[i]))
    answers = dict(zip(order, _workers.run_all([jobs[i] for i in order], work, slots=2,
                                               raw=True), strict=True))
    found = iter(answers[i] for i in range(len(jobs)))
    return [next(found) if shape is None else {"ok": True, shape: [next(found), next(found)]}
            for shape in shapes]


def _weight(job: dict[str, Any]) -> float:
    """Roughly how long a job runs, to start the longest first (two slots, so the last to end
    is not a long one started late): a depth half of a sharded rank grows with its blocks (4 or
    6) and its micro-batch sizes (the 7B's ranks: 0.8 s at 4 blocks and one size, 1.8 s at 6
    blocks and two). The two parts of a single device's split are even by design and keep
    their order (0), so the first configuration's cache entries reach the next one's."""
    if "depth_part" not in job:
        return 0.0
    return (2 + job["depth_part"]) * (1 + len(job.get("micro_batch_sizes", ())))


def answer_probe(request: dict[str, Any]) -> dict[str, Any]:
    """``launcher.recipe``'s probe, as its own child would run it (in the script's folder); run
    in a worker, since it imports the user's script."""
    from launcher import recipe as loader

    script = Path(request["script"])
    os.chdir(script.parent)
    return loader.probe_answer(script, count_flops=request.get("count_flops", True))
