"""Real memory, as the allocator itself counts it: the reference a trace is checked against.

``measure`` runs the same step as a trace (``_trace_step``) on real CPU tensors under
``torch.profiler``'s memory events and returns its peak (bench/bench_estimate_cpu.py and the
tests compare it with the estimate); ``rank_main`` is one rank of a real gloo world doing the
same (``python -m launcher.estimate.child._measure``, bench/bench_estimate_dist.py).
``allocator_peak`` measures one call the same way, for the tracker's probes (``_tracker``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from launcher.estimate.child._trace_step import build, describe_error, load_recipe


def allocator_peak(device: torch.device, fn: Callable[[], Any]) -> tuple[int, int, Any]:
    """(peak bytes above the start, net bytes at the end, result) of ``fn`` per the allocator."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start, torch.cuda.memory_allocated() - start, out
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    live = peak = 0
    for event in cpu_allocation_events(prof):
        live += event.alloc_size
        peak = max(peak, live)
    return peak, live, out


def cpu_allocation_events(prof: Any) -> list[Any]:
    """The CPU allocator's own events of a finished ``torch.profiler.profile``, in order.

    Each has ``alloc_size`` (negative for a free) and ``total_allocated``, the allocator's running
    count of live bytes allocated while the profiler was recording (c10's ProfiledCPUMemoryReporter
    counts only what it saw being allocated, so frees of older blocks do not distort it).
    """
    from torch._C._profiler import _EventType

    events: list[Any] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.id, node.extra_fields))
        stack.extend(node.children)
    events.sort(key=lambda e: (e[0], e[1]))
    return [e[2] for e in events]


def measure(request: dict[str, Any]) -> dict[str, Any]:
    """A real step on the CPU, its peak read from the CPU allocator's own events.

    The reference the traced estimate is checked against (bench/bench_estimate_cpu.py, tests).
    ``torch.profiler`` with ``profile_memory=True`` records every allocation and free of the CPU
    allocator with the allocator's running total of live bytes (``total_allocated``); it is
    started before the model is built, so that total counts every byte of the run, and the peak
    is its maximum. Sequence: build, optimizer step 1 at ``micro_batch``, step 2 at it.
    """
    from torch.profiler import ProfilerActivity, profile

    started = time.perf_counter()
    recipe_file = request["recipe_file"]
    try:
        recipe = load_recipe(recipe_file)
    except BaseException as exc:  # noqa: BLE001
        return {"ok": False, "error": describe_error(exc, recipe_file)}
    b, accum, seed = request["micro_batch"], request["grad_accum_steps"], request.get("seed", 0)
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step = build(request, recipe, torch.device("cpu"), fake=False)
            step.model.train()
            launch = step.script.launch  # the script's machinery
            launch.seed_all(launch.derive_seed(seed, "train", step.runtime.rank))
            for index in (0, accum):
                step.run(b, index, lambda phase, micro: None)
            del step
    except BaseException as exc:  # noqa: BLE001
        return {"ok": False, "error": describe_error(exc, recipe_file)}
    events = cpu_allocation_events(prof)
    live = running_peak = 0
    for event in events:
        live += event.alloc_size
        running_peak = max(running_peak, live)
    extra: dict[str, Any] = {}
    if request.get("strategy"):  # a rank of a real gloo world: also without gloo's own buffers
        from launcher.estimate.child import _trace_dist

        extra["without_backend"] = _trace_dist.peak_without_backend(prof)
    return {
        **extra,
        "ok": True,
        "peak_allocated": max((e.total_allocated for e in events), default=0),
        "running_sum_peak": running_peak,
        "events": len(events),
        "wall_s": time.perf_counter() - started,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def rank_main() -> None:
    """One rank of a real CPU world: ``measure`` (a real step under the CPU allocator's own
    accounting) with the model wrapped by the strategy over a gloo process group.

    Started once per rank, torchrun-style (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT`` in the environment), with ``measure``'s JSON request on stdin (including
    ``strategy``); prints its JSON answer with ``rank`` added. The benchmark
    (``bench/bench_estimate_dist.py``) and the tests compare these per-rank peaks with the trace.
    """
    import torch.distributed as dist

    from launcher.estimate.child._trace_dist import exact_cpu_accounting

    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    request = json.loads(sys.stdin.read())
    torch.set_num_threads(int(request.get("threads", 1)))
    exact_cpu_accounting()
    dist.init_process_group("gloo")
    try:
        answer = measure(request)
        answer["rank"] = dist.get_rank()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    protocol.write(json.dumps(answer))
    protocol.flush()


if __name__ == "__main__":
    # One rank of a real gloo world (bench/bench_estimate_dist.py starts one per rank).
    rank_main()
