"""What to try after what against out-of-memory, and why: the one home of the remedies.

The remedies, least invasive first (the seeds' order), as data (``REMEDIES``):

    expandable segments     a fragmented allocator: PyTorch's expandable segments, same plan
    smaller micro-batch     with gradient accumulation, so the global batch (and with it the
                            optimization) is unchanged: activations grow with the micro-batch
    activation checkpointing  of the ``wrap_modules()`` blocks: selective, then full
    sharding                of the model states: ZeRO-2, then full sharding (FSDP; hybrid
                            sharding across nodes)
    more nodes              sharded

Three readers follow it. The planner (``plan/planner.py``'s ``ladder``) walks the rungs that
have a ``level`` on each machine, after the plan as asked (the reasons for the order are in its
docstring). The replanner here (``replan``) makes the smallest change an out-of-memory failure
says will help: a fragmented allocator first gets expandable segments; activations that
overflowed (the forward or backward pass, the data step) a smaller micro-batch, sized by the
failure's own figures where it gave them, then, at micro-batch 1, full checkpointing. When model
states overflowed (the optimizer step, the model's construction) no batch size helps: sharding is
the fix, a new plan rather than a change of this one, and ``replan`` says so by returning None.
The failure classifier's advice (``failures/_diagnosis.py``) says the same remedies in words.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, fields
from typing import Any

from launcher.estimate.overheads import SAFETY_MARGIN
from launcher.events import OomEvent
from launcher.plan.plan import Plan, checkpointing_key


@dataclass(frozen=True)
class Remedy:
    """One rung: what it is called and what a person is told to do."""

    name: str
    #: The planner's rung level (``planner.Rung.level``); None: not a rung of the planner's
    #: ladder (a remedy for a failure of a plan that was already chosen).
    level: int | None
    #: The planner's name for the rung, also the replanned plan's note.
    label: str
    #: The remedy as advice, an imperative a person can follow ("" where none is given alone).
    advice: str
    #: Degrees of the remedy, least invasive first (checkpointing modes, sharding kinds).
    degrees: tuple[str, ...] = ()


#: Rung 0 of the planner's ladder: not a remedy, the plan as asked.
AS_ASKED = Remedy("as_asked", 0, "as asked", "")
EXPANDABLE_SEGMENTS = Remedy(
    "expandable_segments", None, "expandable segments",
    "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and resubmit the same plan")
SMALLER_MICRO_BATCH = Remedy(
    "smaller_micro_batch", 1, "smaller micro-batch",
    "halve the micro-batch and double gradient accumulation")
CHECKPOINTING = Remedy(
    "checkpointing", 2, "activation checkpointing", "turn on activation checkpointing",
    degrees=("selective", "full"))
#: ZeRO-2 (FSDP keeping each unit's gathered parameters from its forward to its backward), then
#: full sharding.
SHARDING = Remedy("sharding", 3, "sharding", "shard with FSDP", degrees=("zero2", "full"))
MORE_NODES = Remedy("more_nodes", 4, "more nodes", "")

#: What to try after what, least invasive first.
REMEDIES: tuple[Remedy, ...] = (EXPANDABLE_SEGMENTS, SMALLER_MICRO_BATCH, CHECKPOINTING,
                                SHARDING, MORE_NODES)
#: The planner's ladder: the plan as asked, then the remedies a plan can be chosen with.
LADDER: tuple[Remedy, ...] = (AS_ASKED, *(r for r in REMEDIES if r.level is not None))
#: Checkpointing modes in the order they are tried: none first.
CHECKPOINTING_ORDER: tuple[str, ...] = ("none", *CHECKPOINTING.degrees)


def checkpointing_label(mode: str) -> str:
    """The rung's name of a checkpointing mode: "selective activation checkpointing",
    "activation checkpointing" (full), "" (none)."""
    if mode == "none":
        return ""
    return ("selective " if mode == "selective" else "") + CHECKPOINTING.label


def can_checkpoint(hooks: Collection[str], *, described: bool = False) -> bool:
    """Whether the script's blocks can be checkpointed: the templates checkpoint the blocks its
    ``wrap_modules()`` names (a framework script's probe adds that hook when it found the
    model's blocks). ``described``: a plain script whose model is described by a config file or
    ``--params`` (``preflight.describe``), whose estimate is made of its layers: the script
    checkpoints them itself when the plan says so (``LAUNCH_CHECKPOINTING``, the script
    contract). A recipe is checkpointed by the templates, described or not: it needs the hook."""
    return described or "wrap_modules" in hooks


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, smallest first (up to its square root, not up to ``n``)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


# -- the replanner ---------------------------------------------------------------------------------

#: An evaluation loop's phase: "evaluation" as read off a traceback (``failures/_phases.py``),
#: "eval" as a script's own ``oom`` event may name it.
EVALUATION_PHASES = ("evaluation", "eval")
#: Phases whose out-of-memory is the activations' when the failure names no cause.
ACTIVATION_PHASES = ("forward", "backward", "data", *EVALUATION_PHASES)
#: What to do after an out-of-memory in an evaluation loop: it runs at its own batch size, which
#: the training micro-batch does not change, and keeps no activations for a backward pass, so
#: neither a smaller micro-batch nor checkpointing helps.
EVALUATION_ADVICE = (
    "lower the evaluation batch size, not the training micro-batch (the evaluation loop runs at "
    "its own batch size and keeps no gradients): HF Trainer's per_device_eval_batch_size, "
    "Lightning's validation/test DataLoader batch_size, or the script's own eval batch; where "
    "Trainer holds all the predictions on the GPU, set eval_accumulation_steps so they move to "
    "the CPU every few steps")


@dataclass(frozen=True)
class Failure:
    """An out-of-memory failure as the replanner reads it: the diagnosis (``launch explain``'s
    object, ``Diagnosis.to_dict``) with the templates' ``oom`` event over it, as the supervisor
    records it in ``Attempt.diagnosis``."""

    phase: str | None = None
    cause: str | None = None
    requested_bytes: int | None = None
    reserved_bytes: int | None = None
    allocated_bytes: int | None = None
    capacity_bytes: int | None = None
    #: The micro-batch's tensors' shapes and dtypes when it failed (the event's batch_shapes).
    batch_shapes: Any = None

    @classmethod
    def of(cls, diagnosis: Mapping[str, Any] | None,
           event: OomEvent | Mapping[str, Any] | None = None) -> Failure:
        """From a diagnosis (``Diagnosis.to_dict``) and the ``{"launch": "oom", ...}`` event
        (``events.OomEvent``, or the object ``events.parse_event`` read), whose values win as
        given (a None the event reports stays None); or from the record the supervisor keeps of
        both (``Attempt.diagnosis``), with no event."""
        if isinstance(event, OomEvent):
            event = event.fields
        merged = {**(diagnosis or {}),
                  **{k: v for k, v in (event or {}).items() if k != "launch"}}
        return cls(**{f.name: merged.get(f.name) for f in fields(cls)})

    @property
    def activations(self) -> bool:
        """Whether less memory per step is the lever: the activations overflowed, or a phase
        where they do when no cause is known, or a fragmented allocator (what is left once
        expandable segments are on)."""
        if self.evaluation:
            return False
        cause = "activations" if self.cause == "fragmentation" else self.cause
        return cause == "activations" or (cause in (None, "unknown")
                                          and self.phase in ACTIVATION_PHASES)

    @property
    def evaluation(self) -> bool:
        """Whether an evaluation loop ran out of its own memory: its batch is not the training
        micro-batch, and it keeps no activations for a backward pass to recompute."""
        return self.phase in EVALUATION_PHASES and self.cause in (None, "unknown", "activations",
                                                                    "fragmentation")


#: (plan, batch shapes or None for the recipe's own example batch, micro-batch sizes) -> the
#: traced peak allocated bytes of one step at each size; None when it cannot be traced.
Measure = Callable[[Plan, Any, list[int]], "dict[int, int] | None"]


def _divisors_below(plan: Plan, limit: int) -> list[int]:
    """The micro-batches up to ``limit`` that divide the per-rank batch, largest first."""
    per_rank = plan.global_batch_size // plan.world_size
    return [m for m in reversed(divisors(per_rank)) if m <= limit]


def measured_need(plan: Plan, failure: Failure | Mapping[str, Any]) -> int | None:
    """What the failed step needed on its GPU, by the allocator's own figures: what it held when
    the allocation failed plus the allocation. None when the log did not say."""
    failure = _failure(failure)
    requested = failure.requested_bytes
    held = failure.reserved_bytes or failure.allocated_bytes
    if not requested or not held:
        return None
    return int(held) + int(requested)


def _calibrated_micro_batch(plan: Plan, failure: Failure) -> int | None:
    """The largest micro-batch that fits once the estimate is corrected by what the failure
    proved: at micro-batch m the step needed at least ``measured_need`` bytes. Model states and
    overheads do not depend on the micro-batch; the rest scales with it."""
    need = measured_need(plan, failure)
    m = plan.memory
    capacity = failure.capacity_bytes or m.capacity
    if need is None or not capacity or m.model_states is None:
        return None
    fixed = m.model_states + (m.framework_overhead or 0)
    per_sample = max(0, need + (m.framework_overhead or 0) - fixed) / plan.micro_batch_size
    usable = capacity * (1 - SAFETY_MARGIN)
    for micro in _divisors_below(plan, plan.micro_batch_size - 1):
        if fixed + per_sample * micro <= usable:
            return micro
    return None


def _retraced_micro_batch(plan: Plan, failure: Failure, measure: Measure) -> int | None:
    """The largest micro-batch whose step, traced at the batch shapes the job failed at, needs
    no more than the step that ran before the data grew: the plan's micro-batch at the recipe's
    example shapes, traced the same way. What ran proved that much fits (on a GPU and under a
    CPU's address-space cap alike), so one resubmission is enough."""
    shapes = failure.batch_shapes
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


Fix = tuple[Plan, str]


def _expandable_segments(plan: Plan, failure: Failure, can_checkpoint: bool,
                         measure: Measure | None) -> Fix | None:
    if failure.cause != "fragmentation" or plan.expandable_segments:
        return None
    fixed = plan.replace(expandable_segments=True, fits=None, note=EXPANDABLE_SEGMENTS.label)
    return fixed, (
        "out of memory with the memory reserved but split into pieces (fragmentation): the "
        "same plan with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, so the allocator "
        "grows segments instead of splitting them")


def _micro_batch(plan: Plan, failure: Failure, can_checkpoint: bool,
                 measure: Measure | None) -> Fix | None:
    if not failure.activations:
        return None
    micro, how = None, ""
    if measure is not None and failure.batch_shapes:
        micro = _retraced_micro_batch(plan, failure, measure)
        how = "re-traced at the batch shapes it failed at"
    if micro is None:
        micro = _calibrated_micro_batch(plan, failure)
        how = "by the allocator's figures in the failure"
    if micro is None:
        micro, how = _smaller_micro_batch(plan), "halved (the failure gave no figures)"
    if micro is None:
        return None
    accum = plan.global_batch_size // (micro * plan.world_size)
    fixed = plan.replace(micro_batch_size=micro, grad_accum_steps=accum, fits=None,
                         note=f"micro-batch {plan.micro_batch_size} -> {micro}")
    return fixed, (
        f"out of memory in {failure.phase} at micro-batch {plan.micro_batch_size}: activations "
        f"grow with the micro-batch, so micro-batch {plan.micro_batch_size} -> {micro} ({how}) "
        f"with {accum} accumulation steps (global batch {plan.global_batch_size} unchanged)")


def _checkpointing(plan: Plan, failure: Failure, can_checkpoint: bool,
                   measure: Measure | None) -> Fix | None:
    full = CHECKPOINTING.degrees[-1]
    if not failure.activations or not can_checkpoint or plan.checkpointing == full:
        return None
    # full, also from selective: after an out-of-memory at micro-batch 1 the remedy that frees
    # the most (each block keeps its input only), not one more try in between
    fixed = plan.replace(checkpointing=full, fits=None, note=checkpointing_label(full))
    return fixed, (
        f"out of memory in {failure.phase} at micro-batch 1: recompute the blocks' activations "
        "in the backward pass (activation checkpointing"
        + (", full instead of selective" if plan.checkpointing == "selective" else "")
        + ") instead of keeping them")


#: The remedies a failed plan can be changed by, each: (plan, failure, can_checkpoint, measure)
#: -> the fix, or None when it does not apply. Sharding and more nodes are a new plan, not a
#: change of this one: the replanner stops before them.
_CHANGES: dict[str, Callable[[Plan, Failure, bool, Measure | None], Fix | None]] = {
    EXPANDABLE_SEGMENTS.name: _expandable_segments,
    SMALLER_MICRO_BATCH.name: _micro_batch,
    CHECKPOINTING.name: _checkpointing,
}


def _failure(failure: Failure | Mapping[str, Any]) -> Failure:
    return failure if isinstance(failure, Failure) else Failure.of(failure)


#: The variables through which each change of a plan reaches a plain script (any one of them,
#: or ``LAUNCH_PLAN``, the whole plan as JSON). Expandable segments are PyTorch's own variable,
#: set in the job's environment: they reach every script. A script's own flag learned from its
#: argparse counts as the variable of the setting it carries (``script_info.FLAG_VARIABLES``:
#: ``--batch-size`` as LAUNCH_MICRO_BATCH_SIZE), in the ``reads`` given to ``replan``.
REACHED_BY: dict[str, tuple[str, ...]] = {
    SMALLER_MICRO_BATCH.name: ("LAUNCH_MICRO_BATCH_SIZE",),
    CHECKPOINTING.name: ("LAUNCH_CHECKPOINTING", "LAUNCH_ACTIVATION_CHECKPOINTING"),
}


class Unreachable(str):
    """Why no change was made although one would help: the script cannot see it (a ``str``,
    the sentence the run ends with)."""


class NoPlanChange(str):
    """Why no change of the plan is made: what failed is not set by the plan (an evaluation
    loop's own batch), and the sentence the run ends with says what to change instead."""


def evaluation_answer(failure: Failure) -> NoPlanChange:
    """The answer to an out-of-memory in an evaluation loop: no change of the plan, with the
    advice."""
    return NoPlanChange(
        f"in the evaluation loop ({failure.phase}), whose batch is its own: a smaller training "
        f"micro-batch would not change it, so the job is not resubmitted; {EVALUATION_ADVICE}")


def replan(plan: Plan, failure: Failure | Mapping[str, Any], *, can_checkpoint: bool = True,
           measure: Measure | None = None, reads: Collection[str] | None = None
           ) -> Fix | Unreachable | NoPlanChange | None:
    """(fixed plan, what changed and why), or None when no change of this kind can help.

    ``failure``: a ``Failure``, or the supervisor's record of one (``Failure.of``). ``measure``
    re-traces the step: with it, a failure that reports the batch shapes it died at is sized at
    those shapes (data that grew mid-run) instead of halving and trying again. ``reads``: the
    ``LAUNCH_*`` variables a plain script reads (``None``: the plan reaches the script whole,
    as it reaches a recipe or a framework script); a change none of them carries is not made,
    and the answer says so (:class:`Unreachable`) instead of resubmitting the same job. An
    out-of-memory in an evaluation loop gets no change either (:class:`NoPlanChange`, with what
    to lower instead), once an allocator setting is not the answer: its batch is not the plan's
    micro-batch."""
    failure = _failure(failure)
    blocked: list[str] = []
    for remedy in REMEDIES:
        change = _CHANGES.get(remedy.name)
        if change is None:
            break
        fixed = change(plan, failure, can_checkpoint, measure)
        if fixed is None:
            continue
        carriers = REACHED_BY.get(remedy.name, ())
        if reads is not None and carriers and not ({*carriers, "LAUNCH_PLAN"} & set(reads)):
            blocked.append(f"{remedy.label} ({' or '.join(carriers)})")
            continue
        return fixed
    if failure.evaluation:
        return evaluation_answer(failure)
    if blocked:
        return Unreachable(
            f"{' and '.join(blocked)} would help, but the script reads none of those variables "
            "(nor LAUNCH_PLAN): a resubmission would run the same job again. Make the script "
            "take the value from that variable, or change its own setting and rerun")
    return None
