"""Why each option was not chosen, in words a person can check, with the numbers.

Two kinds: the rungs of the ladder that were tried and did not fit (``for_failed``), and the
tempting alternatives an expert would rule out for this situation (``alternatives``): the seeds'
"why not model parallelism, accumulation alone, fp16" and "why not SMDDP, more instances,
accumulation".
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.estimate.overheads import SAFETY_MARGIN
from launcher.plan.plan import Plan
from launcher.remedies import CHECKPOINTING, checkpointing_label
from launcher.units import format_bytes, format_count


@dataclass(frozen=True)
class Rejection:
    """One option not chosen and why, as ``launch plan`` lists it (``PlanResult.rejected``).
    Defined here, with the sentences that fill it; the planner imports it from here."""

    option: str
    reason: str


def _rejection(option: str, reason: str) -> Rejection:
    return Rejection(option=option, reason=reason)


def _where(plan: Plan) -> str:
    layout = f"{plan.nodes} x {plan.gpus_per_node}" if plan.nodes > 1 else f"{plan.gpus_per_node}"
    return f"{plan.strategy_label} on {layout} x {plan.machine}"


def _checkpointed(plan: Plan) -> str:
    """ " with selective activation checkpointing", " with activation checkpointing" (full), ""."""
    label = checkpointing_label(plan.checkpointing or "none")
    return f" with {label}" if label else ""


def _states_overflow(plan: Plan) -> bool:
    m = plan.memory
    return (m.model_states is not None and m.capacity is not None
            and m.model_states + (m.framework_overhead or 0) > m.capacity)


def _ratio(a: int, b: int) -> str:
    return f"{a / b:.1f}x"


def _per_param(plan: Plan, parameters: int | None) -> str:
    """ "(16 bytes per parameter x 30.00B = 480 GB)": the arithmetic a person can redo."""
    states = plan.memory.model_states
    if not parameters or states is None or plan.strategy not in ("single", "ddp"):
        return ""
    per = states / parameters
    return f" ({per:.0f} bytes per parameter x {format_count(parameters)} = {_decimal(states)})"


def _decimal(n: int) -> str:
    """Decimal units, as parameter arithmetic is done: 16 x 30B = 480 GB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.3g} {unit}"
    return f"{n} B"


def for_failed(failed: list[Plan], parameters: int | None) -> list[Rejection]:
    out = []
    for plan in failed:
        m = plan.memory
        option = f"{_where(plan)}, micro-batch {plan.micro_batch_size}" + _checkpointed(plan) + (
            ", reduce-scatter every micro-step" if plan.reduce_every_micro_step else "")
        if _states_overflow(plan):
            assert m.model_states is not None and m.capacity is not None
            out.append(_rejection(option, (
                f"weights, gradients and optimizer state alone need {format_bytes(m.model_states)}"
                f"{_per_param(plan, parameters)}"
                f" per GPU, {_ratio(m.model_states, m.capacity)} the {format_bytes(m.capacity)}"
                f" it has; {_what_changes_states(plan)}")))
        elif m.total is not None and m.capacity is not None:
            out.append(_rejection(option, (
                f"needs {format_bytes(m.total)} per GPU ({format_bytes(m.activations)} of it "
                f"activations at micro-batch {plan.micro_batch_size}), more than the "
                f"{format_bytes(int(m.capacity * (1 - SAFETY_MARGIN)))} usable of its "
                f"{format_bytes(m.capacity)} ({SAFETY_MARGIN:.0%} kept free)") + (
                "; ZeRO-2 keeps every block's gathered weights from its forward to its "
                "backward, the whole model's at the end of the forward" if plan.zero2 else "")))
        else:
            out.append(_rejection(option, "does not fit"))
    return out


def _what_changes_states(plan: Plan) -> str:
    """Model states do not depend on the micro-batch, except a sharded plan's gradients when
    they accumulate unsharded until the last micro-step: then reduce-scattering every micro-step
    (a rung the planner tries) shards them, and saying "nothing changes that" would contradict
    the plan it may choose."""
    if (plan.strategy in ("fsdp", "hybrid_shard") and plan.grad_accum_steps > 1
            and not plan.reduce_every_micro_step):
        return (f"the gradients held unsharded over its {plan.grad_accum_steps} micro-steps are "
                "part of that; reduce-scattering on every micro-step shards them")
    return "no micro-batch changes that"


def reduce_every_micro_step(chosen: Plan, failed: list[Plan]) -> list[Rejection]:
    """The trade-off of a plan that reduce-scatters on every micro-step, against the same plan
    reducing on the last micro-step only (the planner puts that one among ``failed``)."""
    if not chosen.reduce_every_micro_step:
        return []
    same = [p for p in failed if not p.reduce_every_micro_step and (
        p.strategy, p.nodes, p.gpus_per_node, p.micro_batch_size, p.checkpointing,
        p.reshard_after_forward, p.machine) == (
            chosen.strategy, chosen.nodes, chosen.gpus_per_node, chosen.micro_batch_size,
            chosen.checkpointing, chosen.reshard_after_forward, chosen.machine)]
    n = chosen.grad_accum_steps
    before = same[0].memory.gradients if same else None
    after = chosen.memory.gradients
    held = (f"gradients {format_bytes(before)} -> {format_bytes(after)} per GPU, "
            if before is not None and after is not None else "")
    step = ""
    if same and same[0].step_time_s is not None and chosen.step_time_s is not None:
        step = f" (step {same[0].step_time_s:.2f} s -> {chosen.step_time_s:.2f} s)"
    m = same[0].memory if same else None
    needs = (f" and needs {format_bytes(m.total)}, more than the "
             f"{format_bytes(int(m.capacity * (1 - SAFETY_MARGIN)))} usable"
             if m is not None and m.total is not None and m.capacity is not None
             else " and does not fit")
    return [_rejection(
        f"{_where(chosen)}, gradients reduced on the last micro-step only", (
            f"reduce-scatter every micro-step: {held}{n} x the gradient communication{step}; "
            "reducing on the last one only, each GPU holds the whole unsharded gradient "
            f"through the {n} micro-steps{needs}"))]


def checkpointing_and_zero2(chosen: Plan) -> list[Rejection]:
    """Why the chosen plan stops where it does on the two ladders of degree: selective before
    full checkpointing, ZeRO-2 before full sharding (planner.py's docstring has the order)."""
    out = []
    if chosen.checkpointing == "selective":
        out.append(_rejection(f"full {CHECKPOINTING.label}", (
            "selective checkpointing fits: each block keeps its matmul and attention outputs and "
            "recomputes the rest (about 1/6 more compute); full checkpointing recomputes every "
            "block's whole forward (1/3 more) to keep its input only")))
    if chosen.zero2:
        m = chosen.memory
        fits = (f" ({format_bytes(m.total)} of the "
                f"{format_bytes(int(m.capacity * (1 - SAFETY_MARGIN)))} usable per GPU)"
                if m.total is not None and m.capacity is not None else "")
        out.append(_rejection(f"full sharding ({chosen.strategy}, parameters resharded after "
                              "forward)", (
            f"ZeRO-2 fits{fits} with gradients and optimizer state sharded; freeing each "
            "block's gathered weights after its forward means gathering them again in the "
            "backward: 1.5 x the communication (two all-gathers and a reduce-scatter per step "
            "instead of one and one), for memory this plan does not need")))
    return out


def alternatives(chosen: Plan, failed: list[Plan], provider: str) -> list[Rejection]:
    out: list[Rejection] = reduce_every_micro_step(chosen, failed) + checkpointing_and_zero2(
        chosen)
    states_bound = [p for p in failed if _states_overflow(p)]
    if states_bound:
        first = states_bound[0]
        states = format_bytes(first.memory.model_states)
        out.append(_rejection("more nodes or GPUs under DDP", (
            f"data parallelism puts a full replica on every GPU: each of them would still hold "
            f"{states} of model state; more replicas only add copies")))
        if provider == "sagemaker":
            out.append(_rejection("SMDDP (SageMaker's data-parallel library)", (
                f"it speeds up DDP's gradient all-reduce, but every GPU still holds all "
                f"{states} of weights, gradients and optimizer state")))
        out.append(_rejection("a smaller micro-batch or gradient accumulation", (
            f"they shrink activations only; the {states} of model state is the same at "
            f"micro-batch 1")))
        if chosen.strategy in ("fsdp", "hybrid_shard", "smp_v2"):
            out.append(_rejection("tensor parallelism", (
                f"not needed first: sharding the model states ({_where(chosen)}) brings them to "
                f"{format_bytes(chosen.memory.model_states)} per GPU, and tensor parallelism "
                "needs model-specific layouts and fast intra-node links")))
        return out
    if failed and chosen.grad_accum_steps > failed[0].grad_accum_steps:
        before = failed[0]
        m = chosen.memory
        if chosen.world_size == 1:
            mp_reason = (f"the failure is on a single GPU and the model states "
                         f"({format_bytes(m.model_states)}) fit on it; model parallelism needs "
                         "more GPUs and changes the code, and activations are what overflow")
        else:
            mp_reason = (f"the model states ({format_bytes(m.model_states)} per GPU) fit; "
                         "sharding adds communication for a problem the micro-batch solves")
        out.append(_rejection("model parallelism or sharding (FSDP)", mp_reason))
        out.append(_rejection("gradient accumulation alone", (
            f"accumulation does not shrink the micro-batch: at micro-batch "
            f"{before.micro_batch_size} the activations stay "
            f"{format_bytes(before.memory.activations)}; it is what keeps the global batch at "
            f"{chosen.global_batch_size} once the micro-batch is {chosen.micro_batch_size}")))
        if chosen.precision == "fp32":
            out.append(_rejection("fp16 / bf16 mixed precision", (
                "mixed precision keeps fp32 master weights, so weights, gradients and optimizer "
                "state stay 16 bytes per parameter; it changes the numerics, and it is not "
                "needed when a smaller micro-batch fits")))
        if not chosen.activation_checkpointing:
            out.append(_rejection(CHECKPOINTING.label, (
                "it recomputes the forward pass during backward (about a third more compute); a "
                "smaller micro-batch fits without it")))
    return out
