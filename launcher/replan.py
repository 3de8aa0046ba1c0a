"""After an out-of-memory failure: the smallest plan change that the failure says will help.

The order is the seeds' (least invasive first). When activations overflowed (the failure came in
the forward or backward pass, or the data step), halve the micro-batch and double gradient
accumulation, so the global batch, and with it the optimization, is unchanged. When the micro-batch
is already 1, checkpoint the ``wrap_modules()`` blocks' activations. When model states overflowed
(the optimizer step, or the model's construction), no batch size helps; sharding is the fix, and
this replanner says so instead of retrying.
"""

from __future__ import annotations

from typing import Any

from launcher.plan.plan import Plan

ACTIVATION_PHASES = ("forward", "backward", "data", "eval")


def _smaller_micro_batch(plan: Plan) -> int | None:
    """The largest micro-batch <= half the current one that still divides the per-rank batch."""
    per_rank = plan.global_batch_size // plan.world_size
    for micro in range(plan.micro_batch_size // 2, 0, -1):
        if per_rank % micro == 0:
            return micro
    return None


def replan(plan: Plan, failure: dict[str, Any], *, can_checkpoint: bool = True
           ) -> tuple[Plan, str] | None:
    """(fixed plan, what changed and why), or None when no change of this kind can help."""
    phase = failure.get("phase")
    cause = failure.get("cause")
    activations = cause == "activations" or (cause in (None, "unknown")
                                             and phase in ACTIVATION_PHASES)
    if not activations:
        return None
    micro = _smaller_micro_batch(plan)
    if micro is not None:
        accum = plan.global_batch_size // (micro * plan.world_size)
        fixed = plan.replace(micro_batch_size=micro, grad_accum_steps=accum, fits=None,
                             note=f"micro-batch {plan.micro_batch_size} -> {micro}")
        return fixed, (
            f"out of memory in {phase} at micro-batch {plan.micro_batch_size}: activations grow "
            f"with the micro-batch, so micro-batch {plan.micro_batch_size} -> {micro} with "
            f"{accum} accumulation steps (global batch {plan.global_batch_size} unchanged)")
    if can_checkpoint and not plan.activation_checkpointing:
        fixed = plan.replace(activation_checkpointing=True, fits=None,
                             note="activation checkpointing")
        return fixed, (
            f"out of memory in {phase} at micro-batch 1: recompute the blocks' activations in "
            "the backward pass (activation checkpointing) instead of keeping them")
    return None
