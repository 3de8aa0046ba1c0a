"""Choosing the plan: candidates, whether each fits, its cost, and why the others were not chosen.

The remedies are tried in the order the seeds teach, least invasive first, on each machine
(``launcher/remedies.py`` holds the order as data, ``LADDER``; why this order is said here):

    0. as asked: single process, or DDP over the GPUs, the whole per-rank batch at once
    1. a smaller micro-batch with gradient accumulation (the global batch is kept)
    2. activation checkpointing of the ``wrap_modules()`` blocks: selective first (it keeps the
       matmul and attention outputs and recomputes the cheap rest, about +1/6 compute), then
       full (each block's input only, +1/3 compute)
    3. sharding the model states, with 1 and 2 again: ZeRO-2 first (FSDP with
       ``reshard_after_forward=False``: gradients and optimizer state sharded, each unit's
       gathered parameters kept from its forward to its backward: one all-gather per step, as
       much communication as DDP's all-reduce), then full sharding (FSDP; hybrid sharding across
       nodes: the backward gathers each unit again, 1.5 x the communication, for the whole
       model's compute-dtype parameters less per GPU)
    4. more nodes, sharded

Checkpointing comes before sharding although full checkpointing costs more step time than
ZeRO-2 on fast links: it leaves the strategy, and with it the script's state dicts and the
number of collectives, as asked (the seeds' order); ZeRO-2 + full checkpointing is not a rung of
its own unless full is pinned (FSDP holds less at the same compute, so it comes first).

What the user pinned stays pinned. With ``--machine`` the answer is the first rung that fits on
that machine; without it, every machine of the provider's catalog is planned this way and the
cheapest fitting plan wins: a priced machine before one without a price (an unpriced machine is
chosen only when nothing priced fits, and a note says so), one machine before several, then the
cost, then the fewest changes. Why the runner-up, a cheaper machine and a faster plan lost is a
line each (``reasons.other_machines``); on SageMaker, SMP v2 is tried beside the chosen FSDP plan,
on its settings (``_beside``). Each rung below the chosen one becomes a
rejected option with its numbers. Memory per GPU comes from a ``Footprint`` (single device, per
micro-batch) scaled by the strategy, plus the GPU-side overheads (``plan/memory.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from launcher import strategies
from launcher.estimate.footprint import Footprint
from launcher.plan import precision as precisions
from launcher.plan import reasons
from launcher.plan.cost import Hardware, step_cost
from launcher.plan.memory import (
    Target,
    fits,
    per_gpu_memory,
    reduces_every_micro_step,
    shard_degree,
)
from launcher.plan.plan import Plan, checkpointing_key, checkpointing_mode
from launcher.plan.reasons import Rejection
from launcher.providers import LOCAL
from launcher.remedies import (
    AS_ASKED,
    CHECKPOINTING,
    CHECKPOINTING_ORDER,
    LADDER,
    MORE_NODES,
    SHARDING,
    SMALLER_MICRO_BATCH,
    checkpointing_label,
    divisors,
)
from launcher.script_info import REPLICATES, SHARDS
from launcher.spec import Spec
from launcher.status import ExitStatus, UsageError

#: (precision, optimizer, activation checkpointing) -> the single-device footprint. Checkpointing
#: is False, True (full) or "selective" (``plan.checkpointing_key``): False and True as before.
Estimator = Callable[[str, str, bool | str], Footprint]
#: (precision, optimizer) -> the model states needed at least, without a trace, or None.
Floor = Callable[[str, str], Footprint | None]


@dataclass(frozen=True)
class PlanResult:
    """The planner's answer; ``to_dict`` is the `launch plan --json` contract, less ``request``."""

    parameters: int | None
    source: str  # traced | config | declared
    plans: list[Plan]
    chosen: Plan | None
    rejected: list[Rejection] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: ExitStatus = ExitStatus.SUCCESS
    #: Where each of the plan's settings came from (``Spec.origins``): ``--steps``, ``the
    #: script's own: 1 epoch of 2 batches``, ``launch's default``.
    origins: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": {"parameters": self.parameters, "source": self.source},
            "plans": [p.to_dict() for p in self.plans],
            "chosen": self.chosen.to_dict() if self.chosen else None,
            "rejected": [asdict(r) for r in self.rejected],
            "notes": list(self.notes),
            "origins": dict(self.origins),
        }


def batch_split(global_batch: int, world: int, micro: int | None) -> tuple[int, int]:
    """(micro-batch, accumulation steps) with micro x accumulation x world == global batch."""
    step = (micro or 1) * world
    if global_batch % step:
        lower = global_batch - global_batch % step
        options = " or ".join(str(n) for n in (lower, lower + step) if n > 0)
        if micro is None:
            raise UsageError(
                f"global batch {global_batch} cannot be split evenly over {world} processes",
                f"use --global-batch-size {options}")
        hint = f"use --global-batch-size {options}"
        if global_batch % world == 0:
            micros = divisors(global_batch // world)
            hint += f", or a micro-batch that divides it ({', '.join(map(str, micros[:8]))})"
        raise UsageError(
            f"global batch {global_batch} is not a multiple of micro-batch {micro} x "
            f"{world} process{'es' if world > 1 else ''} (= {step})", hint)
    if micro is None:
        return global_batch // world, 1
    return micro, global_batch // step


def global_batch(spec: Spec, world: int) -> int:
    """The global batch of a layout: the one given, or, when nobody gave one, the default
    rounded up to the nearest multiple of micro-batch x processes (16 on 16 GPUs, not an
    error)."""
    if spec.global_batch_given:
        return spec.global_batch_size
    step = (spec.micro_batch_size or 1) * world
    return max(step, -(-spec.global_batch_size // step) * step)


@dataclass(frozen=True)
class Rung:
    level: int
    label: str
    strategy: str
    nodes: int
    checkpointing: str  # none | selective | full
    smaller_micro: bool  # may the micro-batch shrink below the whole per-rank batch
    reshard_after_forward: bool = True  # False: ZeRO-2 (a ``Strategy.zero2`` strategy)


def pinned_checkpointing(spec: Spec) -> str | None:
    """The checkpointing the user pinned (``--checkpointing``, or the older on/off flag: on is
    full), or None: the planner chooses."""
    if spec.checkpointing is not None:
        return checkpointing_mode(spec.checkpointing)
    if spec.activation_checkpointing is not None:
        return checkpointing_mode(spec.activation_checkpointing)
    return None


_CHECKPOINTED = {"none": "", "selective": " + selective checkpointing",
                 "full": " + checkpointing"}


def ladder(spec: Spec, target: Target, provider: str, can_checkpoint: bool) -> Iterator[Rung]:
    """The remedies for one machine in ``remedies.LADDER``'s order, least invasive first, with
    the user's pins honoured (why that order: this module's docstring)."""
    gpus = spec.gpus_per_node or target.gpus
    base_nodes = spec.nodes or 1
    base = spec.strategy or (strategies.SINGLE if base_nodes * gpus == 1 else
                             strategies.REPLICATED)
    base_sharded = strategies.get(base).sharded
    pinned = pinned_checkpointing(spec)
    ac_options = [pinned] if pinned is not None else (
        list(CHECKPOINTING_ORDER) if can_checkpoint else ["none"])
    # ZeRO-2 keeps the whole model's compute-dtype weights through the step: with full
    # checkpointing, FSDP (which does not) costs the same compute and holds less, so it is not
    # a rung of its own unless full checkpointing is what the user pinned.
    zero2_ac = [ac for ac in ac_options if ac != "full"] or ac_options
    may_shrink = spec.micro_batch_size is None
    world = base_nodes * gpus
    sharded = [base] if base_sharded else (
        [] if spec.strategy else [s.name for s in strategies.sharding_rungs(base_nodes)])
    sharded = [s for s in sharded if strategies.get(s).runs_on(provider)]
    shards_itself = not bounded(spec) or SHARDS in (spec.script_parallelism or ())
    if not shards_itself and not spec.strategy:
        sharded = []  # a plain script that does not shard is never planned as if it did

    def as_asked(level: int) -> Iterator[Rung]:
        if not base_sharded:
            yield Rung(level, AS_ASKED.label, base, base_nodes, ac_options[0], False)

    def smaller_micro_batch(level: int) -> Iterator[Rung]:
        if not base_sharded and may_shrink:
            yield Rung(level, SMALLER_MICRO_BATCH.label, base, base_nodes, ac_options[0], True)

    def checkpointing(level: int) -> Iterator[Rung]:
        if not base_sharded:
            for ac in ac_options[1:]:
                yield Rung(level, checkpointing_label(ac), base, base_nodes, ac, True)

    # --reshard-after-forward pins full sharding, --no-reshard-after-forward ZeRO-2
    degrees = [d for d in SHARDING.degrees if spec.reshard_after_forward is None
               or (d == "zero2") != spec.reshard_after_forward]

    def sharded_on(level: int, nodes: int, strategy: str, prefix: str = "") -> Iterator[Rung]:
        for degree in degrees:  # ZeRO-2, then full sharding
            if degree == "zero2":
                if strategies.get(strategy).zero2:
                    for ac in zero2_ac:
                        yield Rung(level, f"{prefix}{strategy} zero2{_CHECKPOINTED[ac]}",
                                   strategy, nodes, ac, may_shrink, reshard_after_forward=False)
            else:
                for ac in ac_options:
                    yield Rung(level, f"{prefix}{strategy}{_CHECKPOINTED[ac]}", strategy, nodes,
                               ac, may_shrink)

    def sharding(level: int) -> Iterator[Rung]:
        if world > 1:
            for strategy in sharded:
                yield from sharded_on(level, base_nodes, strategy)

    def more_nodes(level: int) -> Iterator[Rung]:
        if spec.nodes is None and target.max_nodes > 1 and not spec.strategy and shards_itself:
            for nodes in (2, 4, 8, 16):
                if nodes > target.max_nodes:
                    break
                for strategy in strategies.sharding_rungs(nodes):
                    yield from sharded_on(level, nodes, strategy.name, f"{nodes} nodes, ")

    rungs: dict[str, Callable[[int], Iterator[Rung]]] = {
        AS_ASKED.name: as_asked, SMALLER_MICRO_BATCH.name: smaller_micro_batch,
        CHECKPOINTING.name: checkpointing, SHARDING.name: sharding, MORE_NODES.name: more_nodes}
    for remedy in LADDER:
        assert remedy.level is not None
        yield from rungs[remedy.name](remedy.level)


def _hardware(target: Target, precision: str) -> Hardware:
    tflops = target.fp32_tflops if precision == "fp32" else target.bf16_tflops
    return Hardware(peak_tflops=tflops, intra_node_gbytes_per_s=target.intra_node_gbytes_per_s,
                    inter_node_gbps=target.inter_node_gbps, price_per_hour=target.price_per_hour)


def _evaluate(spec: Spec, fp: Footprint, target: Target, rung: Rung, gpus: int, micro: int,
              accum: int, reduce_every: bool = False, exact: bool = False) -> Plan:
    reduce_every = reduces_every_micro_step(rung.strategy, rung.nodes, gpus, accum, reduce_every)
    memory = per_gpu_memory(fp, target, rung.strategy, rung.nodes, gpus, micro, accum,
                            reduce_every, rung.reshard_after_forward, exact)
    world = rung.nodes * gpus
    compute_bytes = 4 if fp.precision == "fp32" else 2
    cost = step_cost(
        flops_per_sample=fp.flops_per_sample, global_batch=spec.global_batch_size, world=world,
        nodes=rung.nodes, strategy=rung.strategy, checkpointing=rung.checkpointing,
        gradient_bytes=(memory.gradients or 0) * shard_degree(rung.strategy, rung.nodes, gpus),
        parameter_bytes_compute=fp.parameters * compute_bytes, steps=spec.steps,
        hw=_hardware(target, fp.precision), reduce_scatters=accum if reduce_every else 1,
        gathers=1 if rung.reshard_after_forward is False else 2)
    return Plan(
        strategy=rung.strategy,  # type: ignore[arg-type]
        machine=target.name, nodes=rung.nodes, gpus_per_node=gpus, micro_batch_size=micro,
        grad_accum_steps=accum, global_batch_size=spec.global_batch_size,
        precision=fp.precision,  # type: ignore[arg-type]
        optimizer=fp.optimizer,  # type: ignore[arg-type]
        optimizer_class=fp.optimizer_class,
        activation_checkpointing=rung.checkpointing != "none",
        checkpointing=rung.checkpointing,  # type: ignore[arg-type]
        reshard_after_forward=rung.reshard_after_forward, steps=spec.steps, lr=spec.lr,
        seq_len=spec.seq_len, fits=fits(memory, target),
        cost_per_hour_usd=0.0 if target.cpu or target.here else
        cost.cost_per_hour_usd,
        step_time_s=cost.step_time_s,
        total_cost_usd=0.0 if target.here else cost.total_cost_usd,
        memory=memory, reduce_every_micro_step=reduce_every,
        note=rung.label + (", reduce-scatter every micro-step" if reduce_every else ""))


def _micro_options(spec: Spec, world: int, shrink: bool, level: int) -> list[int]:
    """Micro-batches to try on a rung, largest first. Rung 1 is "a smaller micro-batch", so it
    starts below the whole per-rank batch; the later rungs start from the whole batch again."""
    per_rank = spec.global_batch_size // world
    if spec.micro_batch_size is not None:
        return [spec.micro_batch_size]
    if not shrink:
        return [per_rank]
    top = per_rank - 1 if level == 1 else per_rank
    return [m for m in reversed(divisors(per_rank)) if m <= top]


def _per_rank_pending(candidate: Plan, fp: Footprint | None = None) -> bool:
    """Whether ``candidate`` is a sharded plan whose rank could be traced and was not (``fp``
    None: not known whether its footprint can trace one)."""
    return (not candidate.memory.rank_traced and strategies.get(candidate.strategy).sized_per_rank
            and shard_degree(candidate.strategy, candidate.nodes, candidate.gpus_per_node) > 1
            and (fp is None or fp.rank_memory_at is not None))


def plan_on(spec: Spec, estimator: Estimator, target: Target, provider: str,
            can_checkpoint: bool, unsplit: list[Rejection] | None = None, exact: bool = False,
            floor: Floor | None = None) -> tuple[Plan | None, list[Plan], list[Plan]]:
    """(first fitting plan or None, every plan evaluated, the rungs' best tries that failed).

    A layout whose processes cannot split the global batch the user gave is not an error but
    a rejected option, added to ``unsplit`` (``plan`` decides whether that left anything).
    ``exact``: a sharded plan that fits is sized from one rank traced at its world size before
    it is taken (``plan`` asks that of the machine it chooses only: a trace takes seconds).
    ``floor``: a rung rejected on it is never asked for its footprint (``_states_alone``)."""
    given = spec
    gpus = spec.gpus_per_node or target.gpus
    if gpus > target.gpus:
        raise UsageError(f"--gpus-per-node {gpus}, but {target.name} has {target.gpus} GPUs")
    if spec.reshard_after_forward is not None and not (
            spec.strategy is None or strategies.get(spec.strategy).zero2):
        flag = "--" + ("" if spec.reshard_after_forward else "no-") + "reshard-after-forward"
        raise UsageError(f"{flag} is for fsdp and hybrid_shard, not --strategy {spec.strategy}",
                         "drop one of the two")
    if one_process(spec) and spec.gpus_per_node is None and gpus > 1:
        if provider != LOCAL:
            return None, [], []  # its other GPUs would be paid for and idle
        gpus = 1  # this machine's first GPU
    precision = precisions.precision_for(spec, target)
    optimizer = spec.optimizer or "adamw"
    evaluated: list[Plan] = []
    failed: list[Plan] = []
    for rung in ladder(given, target, provider, can_checkpoint):
        world = rung.nodes * gpus
        spec = dataclasses.replace(given, global_batch_size=global_batch(given, world))
        try:
            batch_split(spec.global_batch_size, world, spec.micro_batch_size)
        except UsageError as exc:
            if unsplit is not None and not any(r.option.endswith(f" {target.name}")
                                               for r in unsplit):  # one line a machine
                unsplit.append(Rejection(
                    option=f"{rung.label} on {rung.nodes} x {target.name}",
                    reason=f"{exc.message} ({exc.hint})"))
            continue
        states = _states_alone(spec, floor, precision, optimizer, target, rung, gpus, world)
        if states is not None:
            evaluated.append(states)
            failed.append(states)
            continue
        try:
            fp = estimator(precision, optimizer, checkpointing_key(rung.checkpointing))
        except UsageError:
            # The step traced without checkpointing (the first rungs), so a failure here is
            # the selective policy's with this model (an op it cannot replay): the planner
            # goes on without that rung, unless the user asked for it.
            if rung.checkpointing != "selective" or pinned_checkpointing(given) == "selective":
                raise
            continue
        micros = _micro_options(spec, world, rung.smaller_micro, rung.level)
        # A sharded rung holds the whole unsharded gradient while it accumulates (the gradient
        # is reduced on the last micro-step only). When no micro-batch fits that way, the same
        # rung is tried again reducing on every micro-step: the gradient shards only, for
        # accumulation x the gradient communication; before checkpointing or more nodes.
        passes = [False]
        if strategies.get(rung.strategy).reduce_every_micro_step and any(
                reduces_every_micro_step(rung.strategy, rung.nodes, gpus,
                                         spec.global_batch_size // (m * world), True)
                for m in micros):
            passes.append(True)
        plain: dict[int, Plan] = {}  # the plain pass's try at each micro-batch
        for reduce_every in passes:
            if reduce_every and any(p.grad_accum_steps == 1 and _states_overflow(p)
                                    for p in plain.values()):
                break  # the sharded model states overflow without any gradient held
            tried: Plan | None = None
            for micro in micros:
                accum = spec.global_batch_size // (micro * world)
                if reduce_every and not reduces_every_micro_step(
                        rung.strategy, rung.nodes, gpus, accum, True):
                    continue  # no accumulation: nothing to reduce earlier
                candidate = _evaluate(spec, fp, target, rung, gpus, micro, accum, reduce_every)
                if exact and candidate.fits is not False and _per_rank_pending(candidate, fp):
                    # The plan this machine would run: sized per rank, however far from
                    # capacity the sharded estimate put it (that estimate is tens of percent
                    # off either way); a rank that does not fit sends the search on.
                    candidate = _evaluate(spec, fp, target, rung, gpus, micro, accum,
                                          reduce_every, exact=True)
                if tried is None:
                    evaluated.append(candidate)
                tried = candidate
                if not reduce_every:
                    plain[micro] = candidate
                if candidate.fits or candidate.fits is None:
                    # fits None: not known to overflow, and no estimate can say more: the least
                    # invasive such plan stands (with a note); smaller micro-batches would be
                    # guesses.
                    if candidate is evaluated[-1]:
                        evaluated.pop()  # back last, after what it replaces
                    if reduce_every and micro in plain:
                        # what it replaces, for the plans and the reasons (the trade-off)
                        if plain[micro] not in evaluated:
                            evaluated.append(plain[micro])
                        if plain[micro] not in failed[-1:]:
                            failed.append(plain[micro])
                    evaluated.append(candidate)
                    return candidate, evaluated, failed
                if candidate.fits is False and _states_overflow(candidate):
                    break  # the model states alone overflow: smaller micro-batches cannot help
            if tried is not None and tried.fits is False:
                failed.append(tried)
    return None, evaluated, failed


def _states_alone(spec: Spec, floor: Floor | None, precision: str, optimizer: str,
                  target: Target, rung: Rung, gpus: int, world: int) -> Plan | None:
    """The rung's first try from the model states counted without a trace (``floor``) when
    the rung shards nothing and they alone overflow (so would every micro-batch); else None."""
    if floor is None or shard_degree(rung.strategy, rung.nodes, gpus) > 1:
        return None
    lower, micros = floor(precision, optimizer), _micro_options(spec, world, rung.smaller_micro,
                                                                rung.level)
    if lower is None or not micros:  # no count; or no micro-batch to try on this rung
        return None
    tried = _evaluate(spec, lower, target, rung, gpus, micros[0],
                      spec.global_batch_size // (micros[0] * world))
    return tried if tried.fits is False and _states_overflow(tried) else None


def _states_overflow(candidate: Plan) -> bool:
    states = candidate.memory.model_states
    return states is not None and states > (candidate.memory.capacity or 0)


def bounded(spec: Spec) -> bool:
    """Whether the plan keeps to a plain script's own parallelism: a script launch captured
    runs as it is, so what it does across processes is what it gets. A script described by
    ``--params`` or ``--model-config`` is planned as described (the seeds' 30B on SageMaker),
    with a note where its source shows no parallelism for the plan's processes."""
    return spec.script_parallelism is not None and spec.captured


def one_process(spec: Spec) -> bool:
    """A captured plain script that runs no parallelism of its own: started N times, it would
    train N copies. It gets one process (one GPU)."""
    return bounded(spec) and REPLICATES not in (spec.script_parallelism or ())


def plan(spec: Spec, estimator: Estimator, targets: list[Target], provider: str, *,
         parameters: int | None, source: str, can_checkpoint: bool,
         floor: Floor | None = None) -> PlanResult:
    chosen: Plan | None = None
    failed_on_chosen: list[Plan] = []
    unsplit: list[Rejection] = []
    searched = {t.name: plan_on(spec, estimator, t, provider, can_checkpoint, unsplit,
                                floor=floor) for t in targets}
    # The machine that would be chosen is searched again with its sharded plans sized per rank
    # (exact); should that change the choice (the rank needs more than the estimate said), the
    # next machine is, until the choice stands on a rank's trace.
    exact: set[str] = set()
    while True:
        # each machine's best plan, with the remedies tried before it
        options = [(best, failed) for best, _, failed in searched.values() if best is not None]
        # Under a budget, a plan whose cost is unknown cannot be shown to be within it.
        within = [o for o in options if spec.budget is None or (
            o[0].total_cost_usd is not None and o[0].total_cost_usd <= spec.budget)]
        top = min(within, key=lambda o: _rank(*o))[0] if within else None
        if top is None or top.machine in exact or not _per_rank_pending(top):
            break
        exact.add(top.machine)
        target = next(t for t in targets if t.name == top.machine)
        searched[top.machine] = plan_on(spec, estimator, target, provider, can_checkpoint,
                                        exact=True, floor=floor)
    all_plans: list[Plan] = [p for o in searched.values() for p in o[1]]
    if len(targets) == 1 and not options:
        failed_on_chosen = searched[targets[0].name][2]
    if not all_plans and unsplit:
        # Not one layout can split the batch: the pins the user wrote contradict each other.
        message, _, hint = unsplit[0].reason.partition(" (")
        raise UsageError(message, hint.removesuffix(")"))
    notes: list[str] = []
    rejected: list[Rejection] = []
    status = ExitStatus.SUCCESS
    if options:
        def rank(option: tuple[Plan, list[Plan]]) -> tuple[int, bool, bool, float, int]:
            return _rank(*option)
        if not within:
            cheapest = min(options, key=rank)[0]
            cost = ("an unknown amount" if cheapest.total_cost_usd is None
                    else f"${cheapest.total_cost_usd:,.2f}")
            rejected.append(Rejection(
                option=f"{cheapest.strategy} on {cheapest.machine}",
                reason=f"costs {cost} for {_steps_words(spec)}, over the "
                       f"${spec.budget:,.2f} budget"))
            status = ExitStatus.OVER_BUDGET
        else:
            chosen, failed_on_chosen = min(within, key=rank)
    else:
        status = ExitStatus.NO_PLAN_FITS
    rejected = [*reasons.for_failed(failed_on_chosen, parameters), *rejected, *unsplit]
    if chosen is not None:
        rejected += reasons.alternatives(chosen, failed_on_chosen, provider)
        for other in _beside(spec, estimator, targets, provider, chosen):
            all_plans.append(other)
            rejected.append(reasons.beside(chosen, other))
        ranked = [o[0] for o in sorted(options, key=rank)]
        rejected += reasons.other_machines(chosen, ranked, all_plans, parameters)
        unpriced = reasons.unpriced_note(
            chosen, next((t for t in targets if t.name == chosen.machine), None),
            searched=len(targets) > 1)
        if unpriced:
            notes.append(unpriced)
        if chosen.fits is None:
            unknown = [k for k, v in asdict(chosen.memory).items() if v is None]
            why = ("--memory-limit caps address space, which allocated bytes do not measure"
                   if spec.memory_limit and chosen.machine == "local-cpu"
                   else f"unknown: {', '.join(unknown)}")
            notes.append(f"whether the chosen plan fits is not certain ({why})")
    notes += reasons.parallelism_notes(spec, provider, chosen, one_process(spec))
    origins = dict(spec.origins)
    shown = chosen or (all_plans[0] if all_plans else None)
    target = next((t for t in targets if shown is not None and t.name == shown.machine), None)
    if target is not None:
        said = precisions.origin(spec, target)
        if said is not None:
            origins["precision"] = said
        bf16_unused = precisions.note(spec, target, shown.precision)  # type: ignore[union-attr]
        if bf16_unused:
            notes.append(bf16_unused)
    precision = shown.precision if shown is not None else spec.precision or "fp32"
    foot_note = estimator(precision, spec.optimizer or "adamw", False).note
    if foot_note:
        notes.append(foot_note)
    return PlanResult(parameters=parameters, source=source, plans=all_plans, chosen=chosen,
                      rejected=rejected, notes=notes, status=status, origins=origins)


def reevaluate(spec: Spec, estimator: Estimator, target: Target, plan: Plan) -> Plan:
    """``plan`` (a remedy's change of a plan that failed) with the memory, fit, step time and
    cost the planner works out for it on ``target``, at the run's global batch and steps; its
    settings (and the note of what changed) stay the remedy's."""
    spec = dataclasses.replace(spec, global_batch_size=plan.global_batch_size, steps=plan.steps)
    mode = plan.checkpointing or "none"
    rung = Rung(SHARDING.level or 3, plan.note, plan.strategy, plan.nodes, mode, False,
                plan.reshard_after_forward)
    fp = estimator(plan.precision, plan.optimizer, checkpointing_key(mode))
    priced = _evaluate(spec, fp, target, rung, plan.gpus_per_node, plan.micro_batch_size,
                       plan.grad_accum_steps, plan.reduce_every_micro_step, exact=True)
    return plan.replace(memory=priced.memory, fits=priced.fits,
                        cost_per_hour_usd=priced.cost_per_hour_usd,
                        step_time_s=priced.step_time_s, total_cost_usd=priced.total_cost_usd)


def _rank(p: Plan, failed: list[Plan]) -> tuple[int, bool, bool, float, int]:
    """The order of machines' best plans: known to fit first; a priced machine before an
    unpriced one (a plan whose cost nobody can know is chosen only when nothing priced fits);
    one machine before several (a second machine is the last remedy); then the cheapest; then
    the fewest changes (``failed``: the remedies tried before it)."""
    return (0 if p.fits else 1, p.total_cost_usd is None, p.nodes > 1,
            p.total_cost_usd if p.total_cost_usd is not None else math.inf, len(failed))


def _beside(spec: Spec, estimator: Estimator, targets: list[Target], provider: str,
            chosen: Plan) -> list[Plan]:
    """The strategies shown beside the chosen plan (``Strategy.beside``: SMP v2 beside a chosen
    FSDP plan), each on the chosen plan's own settings (layout, micro-batch, accumulation,
    checkpointing) and nothing more: like for like, without a trace of its own (the 7B's
    full-checkpointing trace, a sixth of its preflight, was there for this row only); why it
    lost is ``reasons.beside``. SMP v2's memory is its default configuration's: FSDP within a
    node (``Strategy.shard_degree``), no tensor parallelism, no offloading. Nothing where none
    is a candidate: another provider, a pinned strategy, a plan that does not shard."""
    if spec.strategy is not None or chosen.world_size < 2:
        return []
    target = next((t for t in targets if t.name == chosen.machine), None)
    if target is None:
        return []
    mode = chosen.checkpointing or "none"
    shown = []
    for other in strategies.STRATEGIES.values():
        if chosen.strategy not in other.beside or not other.runs_on(provider):
            continue
        rung = Rung(SHARDING.level or 3, f"{other.name}{_CHECKPOINTED[mode]}", other.name,
                    chosen.nodes, mode, False)
        fp = estimator(chosen.precision, chosen.optimizer, checkpointing_key(mode))
        shown.append(_evaluate(spec, fp, target, rung, chosen.gpus_per_node,
                               chosen.micro_batch_size, chosen.grad_accum_steps))
    return shown


def _steps_words(spec: Spec) -> str:
    if spec.steps is None:  # a framework script's own length, not known before it runs
        return "the script's own number of steps (not known before it runs)"
    return f"{spec.steps} steps"
