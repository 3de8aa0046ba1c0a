"""A trace child's answer read into a ``TraceResult``.

The child sends raw timelines; here they are fitted (``_fit``), the two halves of a trace split
over two processes joined as one process would have made them (``join``), the traces of two
depths of a block stack extrapolated to the model's depth (``scale``), and the caching allocator
replayed over the recorded allocations (CUDA estimates). An answer that is an error is raised as
a ``TraceError`` (``result_or_raise``).
"""

from __future__ import annotations

from typing import Any

from launcher import strategies
from launcher.estimate._fit import fit
from launcher.estimate.trace_result import (
    PHASES,
    Line,
    ScaledTrace,
    SizePeak,
    TraceError,
    TraceResult,
)


def per_depth(answer: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The answer of each traced depth, with the process's own facts (wall time, notes...)."""
    top = {k: v for k, v in answer.items() if k not in ("by_depth", "blocks")}
    return {int(d): {**top, **sub} for d, sub in answer["by_depth"].items()}


def scale(results: dict[int, TraceResult], answer: dict[str, Any],
           blocks: dict[str, Any]) -> ScaledTrace:
    """The traces of two depths of the block stack, extrapolated to its real depth."""
    d0, d1 = sorted(results)
    note = (f"traced {d0} and {d1} of the {blocks['count']} identical blocks of "
            f"{blocks['path']} and extrapolated to {blocks['count']} (exact when the blocks "
            "use memory alike; LAUNCH_TRACE_DEPTH=full traces them all)")
    deep = results[d1]
    return ScaledTrace.from_traces(
        results[d0], deep, blocks, (d0, d1),
        notes=(note, *deep.notes), wall_s=answer.get("wall_s"),
        host_peak_rss_bytes=answer.get("host_peak_rss_bytes"),
        timings={**{f"depth{d0}_{k}": v for k, v in results[d0].timings.items()},
                 **{f"depth{d1}_{k}": v for k, v in deep.timings.items()}})



def join(step: dict[str, Any], micro: dict[str, Any]) -> dict[str, Any]:
    """One answer from the two halves of a split trace.

    The micro-batch process ran no optimizer, so its timelines lack the optimizer state, which
    is inert during forward and backward: it is added to every point of theirs.
    """
    cats = step["categories"]
    opt = cats.index("OPT")
    state = step["facts"]["optimizer_state_bytes"]
    joined = dict(step)
    joined["segments"] = dict(step["segments"])
    joined["boundary"] = dict(step["boundary"])
    for label, segment in micro["segments"].items():
        if label == "build":
            continue
        points = [list(p) for p in segment["points"]]
        for p in points:
            p[1 + opt] += state
        joined["segments"][label] = {"points": points, "ops": segment["ops"]}
        bound = list(micro["boundary"][label])
        bound[opt] += state
        joined["boundary"][label] = bound
    joined["timings"] = {**{f"micro_{k}": v for k, v in micro["timings"].items()},
                         **step["timings"]}
    joined["host_peak_rss_bytes"] = step["host_peak_rss_bytes"] + micro["host_peak_rss_bytes"]
    joined["wall_s"] = max(step["wall_s"], micro["wall_s"])
    joined["processes"] = 2
    substituted = dict(step.get("substituted", {}))
    for op, n in micro.get("substituted", {}).items():
        substituted[op] = substituted.get(op, 0) + n
    if substituted:
        joined["substituted"] = substituted
    probes = step.get("probes")
    if probes is not None and micro.get("probes") is not None:
        joined["probes"] = {
            "probed": probes["probed"] + micro["probes"]["probed"],
            "skipped": {**probes["skipped"], **micro["probes"]["skipped"]},
        }
    return joined


def result_or_raise(answer: dict[str, Any], request: dict[str, Any]) -> TraceResult:
    """One process's answer as a ``TraceResult`` (depth-scaled if it traced two depths), or
    its error raised as a ``TraceError``."""
    if not answer.get("ok"):
        error = answer.get("error") or {}
        raise TraceError(
            error.get("message", "the trace failed"),
            file=error.get("file"), line=error.get("line"), kind=error.get("kind", "user_code"),
            detail=error.get("traceback", ""),
        )
    if "by_depth" in answer:
        return scale({d: result(a, request) for d, a in per_depth(answer).items()}, answer,
                      answer["blocks"])
    return result(answer, request)



def result(answer: dict[str, Any], request: dict[str, Any]) -> TraceResult:
    """One depth's timelines (``answer``) as a ``TraceResult``: fitted, allocator replayed."""
    segments = {
        label: ([(int(p[0]), tuple(p[1:])) for p in seg["points"]], seg["ops"])
        for label, seg in answer["segments"].items()
    }
    boundary = {label: tuple(v) for label, v in answer["boundary"].items()}
    verify = sorted({b for b in request["verify_sizes"] if b not in request["micro_batch_sizes"]})
    answer = {**answer, **fit(segments, boundary, answer["categories"],
                               list(request["micro_batch_sizes"]), verify, answer["b0"])}
    cats: list[str] = answer["categories"]
    lines = tuple(
        Line(
            intercept=dict(zip(cats, ln["intercept"], strict=True)),
            slope=dict(zip(cats, ln["slope"], strict=True)),
            phase=PHASES.get(ln["phase"], str(ln["phase"])),
            segment=ln["segment"],
        )
        for ln in answer["lines"]
    )
    per_size = {}
    for label, info in answer["per_size"].items():
        b = int(label)
        per_size[b] = SizePeak(
            micro_batch=b, peak=round(info["peak"]),
            at_peak=dict(zip(cats, (round(x) for x in info["at_peak"]), strict=True)),
            phase=PHASES.get(info["phase"], str(info["phase"])), segment=info["segment"],
            ops=int(info["ops"]), in_fit=bool(info["fit"]),
            phases={PHASES.get(int(ph), str(ph)): dict(zip(cats, (round(x) for x in v),
                                                            strict=True))
                    for ph, v in info.get("phases", {}).items()},
        )
    facts = answer["facts"]
    return TraceResult(
        recipe_file=request["recipe_file"],
        kind=answer["kind"],
        device=answer["device"],
        trace_device=answer["trace_device"],
        precision=request["precision"],
        optimizer=request["optimizer"],
        activation_checkpointing=request["activation_checkpointing"],
        grad_accum_steps=request["grad_accum_steps"],
        micro_batch_sizes=tuple(request["micro_batch_sizes"]),
        parameters=facts["parameters"],
        trainable_parameters=facts["trainable_parameters"],
        parameter_bytes=facts["parameter_bytes"],
        buffer_bytes=facts["buffer_bytes"],
        gradient_bytes=facts["gradient_bytes"],
        optimizer_state_bytes=facts["optimizer_state_bytes"],
        optimizer_class=facts["optimizer_class"],
        foreach=facts["foreach"],
        lines=lines,
        per_size=per_size,
        alignment=answer["alignment"],
        fit_sizes=tuple(answer["fit_sizes"]),
        max_residual_bytes=answer["max_residual_bytes"],
        max_residual_fraction=answer["max_residual_fraction"],
        verification=tuple(answer.get("verification", ())),
        notes=tuple(answer.get("notes", ())),
        substituted_ops=dict(answer.get("substituted", {})),
        probes=dict(answer.get("probes", {})),
        wall_s=answer.get("wall_s"),
        host_peak_rss_bytes=answer.get("host_peak_rss_bytes"),
        timings=dict(answer.get("timings", {})),
        flops_per_sample=facts.get("flops_per_sample"),
        strategy=(request.get("strategy") or {}).get("name", strategies.SINGLE),
        script_sha256=answer.get("script_sha256"),
        allocator=_replay(answer),
    )


def _replay(answer: dict[str, Any]) -> dict[str, Any]:
    """The caching allocator over the allocations the child recorded (``allocator_events``:
    build, step 1 and the steady step at ``b0``, in order), with the default settings and with
    ``expandable_segments:True``. Empty when none were recorded."""
    from launcher.estimate.allocator import AllocatorConfig, replay

    events = answer.get("allocator_events")
    if not events:
        return {}
    out: dict[str, Any] = {"micro_batch": answer["b0"], "events": len(events)}
    for name, config in (("default", AllocatorConfig()),
                         ("expandable_segments", AllocatorConfig(expandable_segments=True))):
        r = replay(events, config)
        out[name] = {"peak_requested": r.peak_requested, "peak_allocated": r.peak_allocated,
                     "peak_reserved": r.peak_reserved, "segments": r.segments}
    return out
