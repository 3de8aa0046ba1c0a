"""After an out-of-memory failure: the smallest plan change that the failure says will help.

The order is the seeds' (least invasive first). When activations overflowed (the failure came in
the forward or backward pass, or the data step), halve the micro-batch and double gradient
accumulation, so the global batch, and with it the optimization, is unchanged. When the micro-batch
is already 1, checkpoint the ``wrap_modules()`` blocks' activations. When model states overflowed
(the optimizer step, or the model's construction), no batch size helps; sharding is the fix, and
this replanner says so instead of retrying. A fragmented allocator (reserved memory that is
not one block) first gets PyTorch's expandable segments on the same plan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from launcher.estimate.overheads import SAFETY_MARGIN
from launcher.plan.plan import Plan, checkpointing_key
from launcher.plan.planner import divisors

#: (plan, batch shapes or None for the recipe's own example batch, micro-batch sizes) -> the
#: traced peak allocated bytes of one step at each size; None when it cannot be traced.
Measure = Callable[[Plan, Any, list[int]], "dict[int, int] | None"]

ACTIVATION_PHASES = ("forward", "backward", "data", "eval")


def _divisors_below(plan: Plan, limit: int) -> list[int]:
    """The micro-batches up to ``limit`` that divide the per-rank batch, largest first."""
    per_rank = plan.global_batch_size // plan.world_size
    return [m for m in reversed(divisors(per_rank)) if m <= limit]


def measured_need(plan: Plan, failure: dict[str, Any]) -> int | None:
    """What the failed step needed on its GPU, by the allocator's own figures: what it held when
    the allocation failed plus the allocation. None when the log did not say."""
    requested = failure.get("requested_bytes")
    held = failure.get("reserved_bytes") or failure.get("allocated_bytes")
    if not requested or not held:
        return None
    return int(held) + int(requested)


def _calibrated_micro_batch(plan: Plan, failure: dict[str, Any]) -> int | None:
    """The largest micro-batch that fits once the estimate is corrected by what the failure
    proved: at micro-batch m the step needed at least ``measured_need`` bytes. Model states and
    overheads do not depend on the micro-batch; the rest scales with it."""
    need = measured_need(plan, failure)
    m = plan.memory
    capacity = failure.get("capacity_bytes") or m.capacity
    if need is None or not capacity or m.model_states is None:
        return None
    fixed = m.model_states + (m.framework_overhead or 0)
    per_sample = max(0, need + (m.framework_overhead or 0) - fixed) / plan.micro_batch_size
    usable = capacity * (1 - SAFETY_MARGIN)
    for micro in _divisors_below(plan, plan.micro_batch_size - 1):
        if fixed + per_sample * micro <= usable:
            return micro
    return None


def _retraced_micro_batch(plan: Plan, failure: dict[str, Any], measure: Measure
                          ) -> int | None:
    """The largest micro-batch whose step, traced at the batch shapes the job failed at, needs
    no more than the step that ran before the data grew: the plan's micro-batch at the recipe's
    example shapes, traced the same way. What ran proved that much fits (on a GPU and under a
    CPU's address-space cap alike), so one resubmission is enough."""
    shapes = failure.get("batch_shapes")
    options = _divisors_below(plan, plan.micro_batch_size - 1)
    if not shapes or not options:
        return None
    proven = measure(plan, None, [plan.micro_batch_size])
    peaks = measure(plan, shapes, options)
    if not proven or not peaks or proven.get(plan.micro_batch_size) is None:
        return None
    bound = proven[plan.micro_batch_size]
    for micro in options:  # largest first
        if peaks.get(micro) is not None and peaks[micro] <= bound:
            return micro
    # Grown past what any micro-batch proved: the smallest is the best guess (then
    # checkpointing, on the next failure).
    return options[-1] if peaks.get(options[-1]) is not None else None


def retrace(recipe_file: str, timeout_s: float = 120.0) -> Measure:
    """A ``Measure`` that traces ``recipe_file`` (seconds, on fake tensors)."""

    def measure(plan: Plan, shapes: Any, sizes: list[int]) -> dict[int, int] | None:
        from launcher.estimate.traced import TraceError, trace_recipe

        try:
            result = trace_recipe(
                recipe_file, micro_batch_sizes=sorted({1, *sizes}), precision=plan.precision,
                optimizer=plan.optimizer, activation_checkpointing=checkpointing_key(
                    plan.checkpointing or "none"),
                device="cpu" if plan.machine.startswith("local-cpu") else "cuda",
                timeout_s=timeout_s, batch_shapes=shapes)
        except (TraceError, ValueError):
            return None
        return {b: result.memory_at(b, 1).peak_allocated for b in sizes}

    return measure


def _smaller_micro_batch(plan: Plan) -> int | None:
    """The largest micro-batch <= half the current one that still divides the per-rank batch."""
    options = _divisors_below(plan, plan.micro_batch_size // 2)
    return options[0] if options else None


def replan(plan: Plan, failure: dict[str, Any], *, can_checkpoint: bool = True,
           measure: Measure | None = None) -> tuple[Plan, str] | None:
    """(fixed plan, what changed and why), or None when no change of this kind can help.

    ``measure`` re-traces the step: with it, a failure that reports the batch shapes it died at
    is sized at those shapes (data that grew mid-run) instead of halving and trying again."""
    phase = failure.get("phase")
    cause = failure.get("cause")
    if cause == "fragmentation" and not plan.expandable_segments:
        fixed = plan.replace(expandable_segments=True, fits=None,
                             note="expandable segments")
        return fixed, (
            "out of memory with the memory reserved but split into pieces (fragmentation): the "
            "same plan with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, so the allocator "
            "grows segments instead of splitting them")
    if cause == "fragmentation":
        cause = "activations"  # fragmented even so: less memory per step is what is left
    activations = cause == "activations" or (cause in (None, "unknown")
                                             and phase in ACTIVATION_PHASES)
    if not activations:
        return None
    micro, how = None, ""
    if measure is not None and failure.get("batch_shapes"):
        micro = _retraced_micro_batch(plan, failure, measure)
        how = "re-traced at the batch shapes it failed at"
    if micro is None:
        micro = _calibrated_micro_batch(plan, failure)
        how = "by the allocator's figures in the failure"
    if micro is None:
        micro, how = _smaller_micro_batch(plan), "halved (the failure gave no figures)"
    if micro is not None:
        accum = plan.global_batch_size // (micro * plan.world_size)
        fixed = plan.replace(micro_batch_size=micro, grad_accum_steps=accum, fits=None,
                             note=f"micro-batch {plan.micro_batch_size} -> {micro}")
        return fixed, (
            f"out of memory in {phase} at micro-batch {plan.micro_batch_size}: activations grow "
            f"with the micro-batch, so micro-batch {plan.micro_batch_size} -> {micro} ({how}) "
            f"with {accum} accumulation steps (global batch {plan.global_batch_size} "
            "unchanged)")
    if can_checkpoint and plan.checkpointing != "full":
        # full, also from selective: after an out-of-memory at micro-batch 1 the remedy that
        # frees the most (each block keeps its input only), not one more try in between
        fixed = plan.replace(checkpointing="full", fits=None, note="activation checkpointing")
        return fixed, (
            f"out of memory in {phase} at micro-batch 1: recompute the blocks' activations in "
            "the backward pass (activation checkpointing"
            + (", full instead of selective" if plan.checkpointing == "selective" else "")
            + ") instead of keeping them")
    return None
