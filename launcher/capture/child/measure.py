"""``--measure``: the framework's own two optimizer steps under the CPU profiler (``measure.json``).

The traced estimate of a framework script is checked against this peak, read from the CPU
allocator's events as the trace child's reference measurement reads them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from launcher.capture.child.answer import STATE, Stop


def start_profile() -> None:
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    prof.__enter__()
    STATE["profile"] = prof
    STATE["t0"] = time.perf_counter()


def profiled_peak(prof: Any, model: Any) -> tuple[int, int]:
    """A finished CPU profile's peak: the model's weights and buffers (allocated before it
    started) and the most its allocation events held above them. ``model`` may be a list of
    modules (a step of several: an encoder and a decoder), each weight counted once."""
    from launcher.estimate.child._measure import cpu_allocation_events

    live = peak = 0
    for event in cpu_allocation_events(prof):
        live += event.alloc_size
        peak = max(peak, live)
    models = model if isinstance(model, (list, tuple)) else [model]
    params = {id(p): p for m in models for p in m.parameters()}
    buffers = {id(b): b for m in models for b in m.buffers()}
    base = (sum(p.numel() * p.element_size() for p in params.values())
            + sum(b.numel() * b.element_size() for b in buffers.values()))
    return base, peak


def stop_profile() -> None:
    prof = STATE.pop("profile")
    prof.__exit__(None, None, None)
    models = list((STATE.get("measured_models") or {}).values()) or [STATE["measured_model"]]
    base, peak = profiled_peak(prof, models)
    answer = {"peak_allocated": base + peak, "above_weights": peak, "weights": base,
              "wall_s": time.perf_counter() - STATE["t0"]}
    (STATE["out"] / "measure.json").write_text(json.dumps(answer), encoding="utf-8")


def measure(run: Callable[[], None], model: Any) -> None:
    STATE["measured_model"] = model
    start_profile()
    try:
        run()
    finally:
        if "profile" in STATE:
            stop_profile()
    raise Stop
