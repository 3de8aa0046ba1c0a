"""Why each option was not chosen, in words a person can check, with the numbers.

Two kinds: the rungs of the ladder that were tried and did not fit (``for_failed``), and the
tempting alternatives an expert would rule out for this situation (``alternatives``): the seeds'
"why not model parallelism, accumulation alone, fp16" and "why not SMDDP, more instances,
accumulation".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher import strategies
from launcher.estimate.overheads import SAFETY_MARGIN
from launcher.plan.catalog import data_parallel_library
from launcher.plan.memory import Target
from launcher.plan.plan import Plan
from launcher.providers import LOCAL
from launcher.remedies import CHECKPOINTING, checkpointing_label
from launcher.script_info import SHARDS
from launcher.spec import Spec
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
    if not parameters or states is None or strategies.get(plan.strategy).sharded:
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
    """One line per distinct reason: the rungs that failed for the same reason in the same
    words (DDP's model states at every checkpointing level) are one line that names the
    levels."""
    out: list[Rejection] = []
    levels: dict[tuple[str, str], list[str]] = {}
    for plan in failed:
        base = f"{_where(plan)}, micro-batch {plan.micro_batch_size}" + (
            ", reduce-scatter every micro-step" if plan.reduce_every_micro_step else "")
        (one,) = _failed([plan], parameters)
        key = (base, one.reason)
        if key in levels:
            levels[key].append(plan.checkpointing or "none")
            continue
        levels[key] = [plan.checkpointing or "none"]
        out.append(one)
    grouped = []
    for rejection, ((base, _), modes) in zip(out, levels.items(), strict=True):
        if len(modes) > 1:
            rejection = _rejection(f"{base}, with {_levels(modes)}", rejection.reason)
        grouped.append(rejection)
    return grouped


def _levels(modes: list[str]) -> str:
    """ "no, selective or full activation checkpointing" for the modes a line stands for."""
    words = {"none": "no", "selective": "selective", "full": "full"}
    named = [words[m] for m in modes]
    return f"{', '.join(named[:-1])} or {named[-1]} activation checkpointing"


def _failed(failed: list[Plan], parameters: int | None) -> list[Rejection]:
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
                f"{format_bytes(m.usable)} usable of its "
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
    if (strategies.get(plan.strategy).reduce_every_micro_step and plan.grad_accum_steps > 1
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
             f"{format_bytes(m.usable)} usable"
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
                f"{format_bytes(m.usable)} usable per GPU)"
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
        library = data_parallel_library(provider)  # SageMaker's SMDDP, from its catalog
        if library is not None:
            out.append(_rejection(library, (
                f"it speeds up DDP's gradient all-reduce, but every GPU still holds all "
                f"{states} of weights, gradients and optimizer state")))
        out.append(_rejection("a smaller micro-batch or gradient accumulation", (
            f"they shrink activations only; the {states} of model state is the same at "
            f"micro-batch 1")))
        if strategies.get(chosen.strategy).sharded:
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


def _usd(value: float | None) -> str:
    return "an unknown amount" if value is None else f"${value:,.2f}"


def _lost_to(chosen: Plan, other: Plan) -> str:
    """Why ``other``, a plan that fits on another machine, was not chosen over ``chosen``, in
    the planner's order (``planner.plan``'s ``rank``)."""
    if other.fits is not True and chosen.fits:
        return "whether it fits is not known; the chosen plan is known to fit"
    if other.total_cost_usd is None and chosen.total_cost_usd is not None:
        return (f"{other.machine} has no price in the catalog: its cost cannot be compared, and "
                "a priced machine that fits comes first")
    if other.nodes > 1 and chosen.nodes == 1:
        return (f"needs {other.nodes} machines ({_usd(other.total_cost_usd)} for the run); "
                "one machine that fits comes first")
    if other.total_cost_usd is None and chosen.total_cost_usd is None:
        return (f"{other.machine} has no price in the catalog either: with no cost to tell "
                "them apart, the first in the catalog's order is taken")
    if other.total_cost_usd is not None and chosen.total_cost_usd is not None:
        more = other.total_cost_usd - chosen.total_cost_usd
        step = ("" if other.step_time_s is None or chosen.step_time_s is None else
                f", step {other.step_time_s:.3g} s against {chosen.step_time_s:.3g} s")
        if more > 0.005:
            return (f"costs {_usd(other.total_cost_usd)} for the run "
                    f"(${other.cost_per_hour_usd or 0:,.2f}/h{step}), ${more:,.2f} more than "
                    f"the chosen {_usd(chosen.total_cost_usd)}")
    return "the same cost, with more changes to what was asked"


def other_machines(chosen: Plan, ranked: list[Plan], evaluated: list[Plan],
                   parameters: int | None) -> list[Rejection]:
    """A search over machines, in a line each: why the runner-up (the next fitting plan on
    another machine, ``ranked`` in the planner's order) lost; why a cheaper machine did not do
    (its nearest miss); and why a faster plan did not win. At most three lines, none for a
    single machine."""
    out: list[Rejection] = []
    others = [p for p in ranked if p is not chosen and p.machine != chosen.machine]
    runner = others[0] if others else None
    if runner is not None:
        out.append(_rejection(f"runner-up {_where(runner)}", _lost_to(chosen, runner)))
    bound = chosen.total_cost_usd if chosen.total_cost_usd is not None else math.inf
    fitting = {p.machine for p in ranked}
    cheaper = [p for p in evaluated if p.fits is False and p.machine not in fitting
               and p.total_cost_usd is not None and p.total_cost_usd < bound
               and p.memory.total is not None and p.memory.capacity]
    if cheaper:
        near = min(cheaper, key=lambda p: (p.memory.total or 0) / (p.memory.capacity or 1))
        (failed,) = for_failed([near], parameters)
        out.append(_rejection(f"cheaper: {failed.option}", failed.reason))
    faster = [p for p in others if p is not runner and p.step_time_s is not None
              and chosen.step_time_s is not None and p.step_time_s < chosen.step_time_s]
    if faster:
        best = min(faster, key=lambda p: p.step_time_s or 0)
        out.append(_rejection(f"faster {_where(best)}", _lost_to(chosen, best)))
    return out


def beside(chosen: Plan, shown: Plan) -> Rejection:
    """Why a strategy shown beside the chosen plan (``Strategy.beside``: SMP v2 beside FSDP),
    tried on the chosen layout (``planner._beside``), was not chosen over it."""
    m, c = shown.memory, chosen.memory
    other = strategies.get(shown.strategy)
    option = (f"{_where(shown)}, micro-batch {shown.micro_batch_size}{_checkpointed(shown)} "
              f"({other.words})")
    if shown.fits is False and m.total is not None and m.capacity is not None:
        usable = format_bytes(m.usable)
        held = ""
        if m.model_states != c.model_states and shown.nodes > 1:
            held = (f"its default shard groups of one node ({shown.gpus_per_node} GPUs) hold "
                    f"{format_bytes(m.model_states)} of model states per GPU where "
                    f"{chosen.strategy_label} over {chosen.world_size} holds "
                    f"{format_bytes(c.model_states)}; ")
        elif (chosen.reduce_every_micro_step and not shown.reduce_every_micro_step
              and m.gradients is not None and c.gradients is not None
              and m.gradients > c.gradients):
            held = (f"it holds the whole unsharded gradient ({format_bytes(m.gradients)}) "
                    f"through the {shown.grad_accum_steps} micro-steps where "
                    f"{chosen.strategy_label} reduce-scatters on every one "
                    f"({format_bytes(c.gradients)}); ")
        return _rejection(option, f"{held}needs {format_bytes(m.total)} per GPU, more than the "
                          f"{usable} usable")
    if shown.fits:
        return _rejection(option, (
            f"fits too ({format_bytes(m.total)} per GPU against {format_bytes(c.total)}), but "
            f"{other.kept_over}, so {chosen.strategy_label} in the stock image is kept"))
    return _rejection(option, "whether it fits is not known")


def unpriced_note(chosen: Plan, target: Target | None, searched: bool) -> str | None:
    """The chosen machine (``target``) has no price: said, with the catalog's reason, and why
    it was chosen all the same (pinned, or, ``searched``, no priced machine fits)."""
    if chosen.total_cost_usd is not None:
        return None
    if target is None or target.cpu or target.here:
        return None
    why = f" ({target.price_note})" if target.price_note else ""
    chosen_because = ("no priced machine fits, so one without a price is chosen" if searched
                      else "it is the machine asked for")
    return (f"{chosen.machine} has no price in the catalog{why}: the plan's cost is unknown; "
            f"{chosen_because}")


def parallelism_notes(spec: Spec, provider: str, chosen: Plan | None, one_process: bool
                      ) -> list[str]:
    """What a plain script's own parallelism left out of the plan, and, when nothing fitted,
    what the script would have to change: said, never pretended. ``one_process``: the script
    runs none of its own (``planner.one_process``)."""
    if spec.script_parallelism is None:
        return []
    name = spec.script.name
    own = spec.script_parallelism
    if not spec.captured:  # described: planned as described, said where the source disagrees
        if chosen is None or chosen.nodes * chosen.gpus_per_node == 1:
            return []
        needs = strategies.get(chosen.strategy).script_parallelism
        if needs is None or needs in own:
            return []
        what = "shard its model (FSDP)" if needs == SHARDS else "run DDP"
        return [f"{name} shows no code to {what}: the plan starts it as "
                f"{chosen.nodes * chosen.gpus_per_node} processes (torchrun) as --params "
                "describes it; as written it would train that many copies"]
    notes = []
    if one_process:
        notes.append(f"{name} runs one process (no DDP or FSDP of its own): planned on one GPU"
                     + ("" if provider == LOCAL else
                        "; machines of several GPUs are left out (the others would idle)"))
    if chosen is None and SHARDS not in own:
        notes.append(f"no single GPU holds this model and {name} does not shard it: to train "
                     "it on several, it must wrap its model in FSDP (torch.distributed.fsdp."
                     "fully_shard) and be started by torchrun; launch does not change the "
                     "script's code")
    return notes
