"""Choosing the plan: candidates, whether each fits, its cost, and why the others were not chosen.

The remedies are tried in the order the seeds teach, least invasive first, on each machine:

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
cheapest fitting plan on one machine wins (several machines only when no single one fits; fewest
changes on a tie). Each rung below the chosen one becomes a
rejected option with its numbers. Memory per GPU comes from a ``Footprint`` (single device, per
micro-batch) scaled by the strategy, plus the GPU-side overheads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.estimate.footprint import Footprint
from launcher.estimate.overheads import PCIE5_GBYTES_PER_S, SAFETY_MARGIN, gpu_overheads
from launcher.plan import reasons
from launcher.plan.cost import Hardware, step_cost
from launcher.plan.plan import Memory, Plan, checkpointing_key, checkpointing_mode
from launcher.plan.reasons import Rejection
from launcher.spec import Spec
from launcher.status import ExitStatus, UsageError

#: Strategies the training templates can run on any provider (smp_v2 needs SageMaker's image).
RUNNABLE_STRATEGIES = ("single", "ddp", "fsdp", "hybrid_shard")
SHARDED = ("fsdp", "hybrid_shard", "smp_v2")

#: (precision, optimizer, activation checkpointing) -> the single-device footprint. Checkpointing
#: is False, True (full) or "selective" (``plan.checkpointing_key``): False and True as before.
Estimator = Callable[[str, str, bool | str], Footprint]


@dataclass(frozen=True)
class Target:
    """A machine to plan on: a catalog entry, or this machine for the local provider."""

    name: str
    gpus: int                        # per node (processes per node on the local CPU)
    memory_bytes: int | None         # per GPU (per process on the CPU)
    cpu: bool = False
    generation: str | None = None
    gpu_name: str | None = None
    price_per_hour: float | None = None
    bf16_tflops: float | None = None
    fp32_tflops: float | None = None
    intra_node_gbytes_per_s: float | None = None
    inter_node_gbps: float | None = None
    max_nodes: int = 1
    #: An address-space cap (local --memory-limit): not comparable with allocated bytes.
    address_space_cap: bool = False
    #: From calibration (real runs on this machine type): allocator slack, and how much more
    #: than predicted this model allocated. Defaults: the overheads module's, and 1.
    reserve_ratio: float | None = None
    allocated_scale: float = 1.0
    #: The CUDA (major, minor) the job's image runs (``overheads.image_cuda``); None: one with
    #: lazy module loading (CUDA 11.7+), as every default image. Sizes the CUDA context.
    cuda: tuple[int, int] | None = None


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": {"parameters": self.parameters, "source": self.source},
            "plans": [p.to_dict() for p in self.plans],
            "chosen": self.chosen.to_dict() if self.chosen else None,
            "rejected": [asdict(r) for r in self.rejected],
            "notes": list(self.notes),
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


def global_batch(spec: Spec, world: int) -> int:
    """The global batch of a layout: the one given, or, when nobody gave one, the default
    rounded up to the nearest multiple of micro-batch x processes (16 on 16 GPUs, not an
    error)."""
    if spec.global_batch_given:
        return spec.global_batch_size
    step = (spec.micro_batch_size or 1) * world
    return max(step, -(-spec.global_batch_size // step) * step)


def shard_degree(strategy: str, nodes: int, gpus: int) -> int:
    if strategy == "fsdp":
        return nodes * gpus
    if strategy in ("hybrid_shard", "smp_v2"):
        return gpus  # shard within a node, replicate across nodes
    return 1


#: Strategies a recipe's trace can run at their world size (one rank, a fake process group).
TRACED_AT_WORLD_SIZE = ("fsdp", "hybrid_shard")
#: Sharded strategies that can keep the gathered parameters from forward to backward (ZeRO-2:
#: FSDP2's ``reshard_after_forward=False``, ``Plan.reshard_after_forward``).
ZERO2 = ("fsdp", "hybrid_shard")
#: Sharded strategies whose script can reduce-scatter on every micro-step
#: (``Plan.reduce_every_micro_step``, FSDP2's ``set_requires_gradient_sync``).
REDUCE_EVERY_MICRO_STEP = ("fsdp", "hybrid_shard")
#: A sharded candidate whose scaled estimate is this close to the usable memory (either side) is
#: traced at its world size: the scaled estimate is on the safe side by tens of percent
#: (docs/benchmarks.md), enough to reject a plan that fits or to report the wrong margin.
NEAR_CAPACITY = 0.15


def reduces_every_micro_step(strategy: str, nodes: int, gpus: int, accum: int,
                             reduce_every: bool) -> bool:
    """Whether ``reduce_every`` changes anything: a sharded plan (more than one shard) that
    accumulates gradients."""
    return (reduce_every and accum > 1 and strategy in REDUCE_EVERY_MICRO_STEP
            and shard_degree(strategy, nodes, gpus) > 1)


def per_gpu_memory(fp: Footprint, target: Target, strategy: str, nodes: int, gpus: int,
                   micro: int, accum: int = 1, reduce_every: bool = False,
                   reshard_after_forward: bool = True) -> Memory:
    """The footprint at ``micro`` under ``strategy``, with the GPU-side overheads.

    A sharded plan is first sized by sharding the single-device footprint phase by phase; when
    that lands near the machine's capacity and the footprint can trace one rank of the strategy
    (``Footprint.rank_memory_at``: a recipe), the rank's own trace replaces it.
    ``reduce_every``: the plan reduce-scatters on every micro-step (``Plan.
    reduce_every_micro_step``), so its ranks hold gradient shards, not the unsharded gradient.
    ``reshard_after_forward`` False: ZeRO-2 (``ZERO2`` strategies), each unit's gathered
    parameters held from its forward to its backward."""
    reduce_every = reduces_every_micro_step(strategy, nodes, gpus, accum, reduce_every)
    zero2 = not reshard_after_forward and strategy in ZERO2
    memory = _scaled_gpu_memory(fp, target, strategy, nodes, gpus, micro, accum, reduce_every,
                                zero2)
    usable = None if memory.capacity is None else memory.capacity * (1 - SAFETY_MARGIN)
    if (fp.rank_memory_at is not None and strategy in TRACED_AT_WORLD_SIZE
            and memory.total is not None and usable and not target.address_space_cap
            and abs(memory.total - usable) <= NEAR_CAPACITY * usable):
        # ZeRO-2 is traced as such (the trace writes reshard_after_forward into the script's
        # plan values); the keyword only where it differs, for footprints that predate it.
        kept = {"reshard_after_forward": False} if zero2 else {}
        if reduce_every:
            rank = _rank_reducing_every_micro_step(fp, strategy, nodes, gpus, micro, accum,
                                                   **kept)
        else:
            rank = fp.rank_memory_at(strategy, nodes, gpus, micro, accum, **kept)
        if rank is not None:
            traced = _with_overheads(rank.parameters, rank.gradients, rank.optimizer,
                                     rank.activations, rank.temporary, rank.peak_allocated,
                                     target, nodes * gpus, _replayed_ratio(rank))
            if not reduce_every or (traced.peak_allocated or 0) < (memory.peak_allocated
                                                                  or math.inf):
                return traced
    return memory


def _rank_reducing_every_micro_step(fp: Footprint, strategy: str, nodes: int, gpus: int,
                                    micro: int, accum: int, **kept: bool) -> Memory | None:
    """One rank of a plan that reduce-scatters on every micro-step, from its trace without
    accumulation.

    Not traced as such: the trace child writes the script's plan values itself
    (``_trace_step.script_plan``), without ``reduce_every_micro_step``, so a trace at
    ``accum > 1`` would hold the whole unsharded gradient. But such a rank's first micro-step
    reduce-scatters as it goes, exactly as a step without accumulation does, and its optimizer
    phase is the same; every later micro-step is the first one plus the gradient shards of the
    earlier ones, and, while each unit's reduce-scatter output is added into them, one unit's
    shard more. So: the trace at ``accum=1`` plus those bytes. When that trace peaks in the
    optimizer step (whose gradient shards it already counts) this is on the safe side by the
    shards; ``per_gpu_memory`` keeps the smaller of it and the scaled estimate, both bounds."""
    assert fp.rank_memory_at is not None
    rank = fp.rank_memory_at(strategy, nodes, gpus, micro, 1, **kept)
    whole = fp.memory_at(micro, accum).gradients
    if rank is None or rank.peak_allocated is None or whole is None:
        return None
    degree = shard_degree(strategy, nodes, gpus)
    held = -(-whole // degree)
    if fp.unit_parameters and fp.parameters:
        held += -(-whole * fp.unit_parameters // (fp.parameters * degree))
    return dataclasses.replace(rank, gradients=(rank.gradients or 0) + held,
                               peak_allocated=rank.peak_allocated + held)


def _scaled_gpu_memory(fp: Footprint, target: Target, strategy: str, nodes: int, gpus: int,
                       micro: int, accum: int, reduce_every: bool = False,
                       zero2: bool = False) -> Memory:
    """The single-device footprint at ``micro`` sharded as ``strategy`` shards it (``zero2``:
    keeping the gathered parameters from forward to backward)."""
    single = fp.memory_at(micro, accum)
    degree = shard_degree(strategy, nodes, gpus)

    def div(x: int | None) -> int | None:
        return None if x is None else -(-x // degree)

    params, grads, opt = div(single.parameters), div(single.gradients), div(single.optimizer)
    if degree > 1 and accum > 1 and not reduce_every:
        # The templates accumulate without a reduce-scatter until the last micro-step (FSDP2's
        # set_requires_gradient_sync(False)): each GPU holds the whole unsharded gradient.
        # With reduce_every_micro_step each micro-step reduce-scatters: only the shards stay.
        grads = single.gradients
    temporary, activations = div(single.temporary), single.activations
    if degree == 1:
        peak = single.peak_allocated
    else:
        compute_bytes = 4 if fp.precision == "fp32" else 2
        # ZeRO-2 keeps every unit it gathered until that unit's backward: at the end of the
        # forward, the whole model in the compute dtype. Counted as parameters (the rank holds
        # them whatever the micro-batch), in forward and backward; resharded for the optimizer.
        held = fp.parameters * compute_bytes if zero2 else 0
        if fp.unit_parameters is None:
            gather = None
        elif zero2:
            # and, in the backward, each unit's unsharded gradients before their reduce-scatter
            gather = fp.unit_parameters * compute_bytes
        else:
            # FSDP holds the current unit unsharded, prefetches the next, and the unit's
            # unsharded gradients before their reduce-scatter: three units' worth at the peak.
            gather = 3 * fp.unit_parameters * compute_bytes
        if fp.phases_at is not None and gather is not None:
            # A traced footprint says what is alive at each phase's own peak. Sharding divides
            # the model states, not the activations, so the single device's peak (often the
            # optimizer step, where activations are gone) is not the sharded one (often the
            # backward pass): shard every phase, then take the largest.
            casts = _autocast_weight_cache(fp, accum) if fp.precision == "bf16_mixed" else {}
            worst = max(_sharded_phases(fp.phases_at(micro, accum), div, gather, accum,
                                        reduce_every, casts, held),
                        key=lambda m: m.peak_allocated or 0, default=None)
            peak = None
            if worst is not None:
                params, grads, opt = worst.parameters, worst.gradients, worst.optimizer
                activations, temporary = worst.activations, worst.temporary
                peak = worst.peak_allocated
        else:
            if fp.precision == "bf16_mixed" and activations is not None:
                # an analytic footprint's activations hold autocast's bf16 weight copies (a
                # constant in the micro-batch, as _autocast_weight_cache reads them off a trace),
                # which a sharded rank does not: its gathered weights (``gather``) are bf16
                activations -= _analytic_weight_cache(fp, accum)
            parts = (params, grads, opt, activations, temporary, gather)
            peak = None if any(p is None for p in parts) else (
                params + grads + opt + max(activations + gather + held, temporary))  # type: ignore
            params = None if params is None else params + held
    return _with_overheads(params, grads, opt, activations, temporary, peak, target,
                           nodes * gpus, _replayed_ratio(single))


def _replayed_ratio(memory: Memory) -> float | None:
    """The caching allocator's reserved / allocated as a trace replayed it (a traced
    footprint's ``peak_reserved``), or None (analytic footprints leave it unset)."""
    if memory.peak_reserved is None or not memory.peak_allocated:
        return None
    return memory.peak_reserved / memory.peak_allocated


def _with_overheads(params: int | None, grads: int | None, opt: int | None,
                    activations: int | None, temporary: int | None, peak: int | None,
                    target: Target, world: int, replayed_ratio: float | None = None) -> Memory:
    """One rank's allocated bytes as a GPU (or this CPU) holds them: calibrated, then the
    caching allocator's reserve and the CUDA context and libraries on top. The reserve ratio is
    the calibrated one (measured on this GPU type), else the trace's replay of the allocator
    (``replayed_ratio``), else the overheads module's default."""
    if peak is not None and target.allocated_scale != 1.0:
        peak = math.ceil(peak * target.allocated_scale)
    capacity = target.memory_bytes
    if target.cpu:
        return Memory(parameters=params, gradients=grads, optimizer=opt, activations=activations,
                      temporary=temporary, peak_allocated=peak, total=peak, capacity=capacity)
    over = gpu_overheads(target.generation, world, target.reserve_ratio or replayed_ratio,
                         cuda=target.cuda,  # NCCL's channels: the catalog names NVLink only
                         nvlink=(target.intra_node_gbytes_per_s or 0) > PCIE5_GBYTES_PER_S)
    reserved = None if peak is None else math.ceil((peak + over.cublas) * over.reserve_ratio)
    total = None if reserved is None else reserved + over.framework
    return Memory(parameters=params, gradients=grads, optimizer=opt, activations=activations,
                  temporary=temporary, framework_overhead=over.framework, peak_allocated=peak,
                  peak_reserved=reserved, total=total, capacity=capacity)


def _autocast_weight_cache(fp: Footprint, accum: int) -> dict[str, int]:
    """Per phase, the bytes of the single device's activations that do not grow with the
    micro-batch: under bf16_mixed, autocast's bf16 copies of the matmul weights, which the
    backward keeps (the fits are lines in the micro-batch: this is their activations' value at
    zero, ``2 a(1) - a(2)``).

    A sharded plan's ranks have no such copies: FSDP's MixedPrecisionPolicy gathers the weights
    in bf16 (the ``gather`` term of ``_sharded_phases``), and autocast casts nothing that is
    already bf16. Counting them as well put the scaled figure 38-48% over the traced rank for a
    150M Llama (docs/benchmarks.md). Under checkpointing the blocks' copies are not kept, and
    this is (nearly) zero by itself."""
    if fp.phases_at is None:
        return {}
    one, two = fp.phases_at(1, accum), fp.phases_at(2, accum)
    most = 2 * fp.parameters  # a bf16 copy of every weight: what autocast can cache at most
    out = {}
    for phase, m in one.items():
        other = two.get(phase)
        if m.activations is not None and other is not None and other.activations is not None:
            out[phase] = min(most, max(0, 2 * m.activations - other.activations))
    return out


def _analytic_weight_cache(fp: Footprint, accum: int) -> int:
    """An analytic footprint's activations at zero micro-batch, ``2 a(1) - a(2)``: autocast's
    bf16 copies of the weights (``ModelShape.autocast_copy_bytes``), at most 2 B per weight."""
    one, two = fp.memory_at(1, accum).activations, fp.memory_at(2, accum).activations
    if one is None or two is None:
        return 0
    return min(2 * fp.parameters, max(0, 2 * one - two))


def _sharded_phases(phases: dict[str, Memory], div: Callable[[int | None], int | None],
                    gather: int, accum: int, reduce_every: bool = False,
                    casts: dict[str, int] | None = None, held: int = 0) -> list[Memory]:
    """Each phase's single-device ``Memory`` under a sharding of the model states.

    The build is left out: the sharded templates move each block to the GPU as ``fully_shard``
    shards it. Under bf16_mixed the single device's activations include autocast's bf16 copies
    of the weights (``casts``, from ``_autocast_weight_cache``), which FSDP replaces by its bf16
    gathers (``gather``): they leave the activations, so each byte is counted once. Weights and
    optimizer state are divided
    everywhere; gradients too, except while accumulating (the templates keep the whole
    unsharded gradient until the last micro-step), unless the plan reduce-scatters on every
    micro-step (``reduce_every``: each rank adds into its shard; the unit being reduced is in
    ``gather``). Activations are the rank's own.
    Temporaries are the optimizer's foreach buffers in the optimizer phase (sharded with the
    state) and activation gradients in forward and backward (not sharded), where FSDP also
    holds its gathered units (``gather``, counted as temporary). ZeRO-2 holds the whole
    model's gathered weights (``held``) in forward and backward: parameters there.
    """
    out = []
    for phase, m in phases.items():
        if phase == "build":
            continue  # the sharded templates shard each block as it reaches the GPU
        if None in (m.parameters, m.gradients, m.optimizer, m.activations, m.temporary):
            return []
        compute = phase in ("forward", "backward", "accum_forward", "accum_backward")
        params, opt = div(m.parameters), div(m.optimizer)
        params += held if compute else 0  # type: ignore[operator]
        grads = m.gradients if accum > 1 and not reduce_every else div(m.gradients)
        temporary = m.temporary + gather if compute else div(m.temporary)
        activations = m.activations - min(m.activations, (casts or {}).get(phase, 0))
        out.append(Memory(parameters=params, gradients=grads, optimizer=opt,
                          activations=activations, temporary=temporary,
                          peak_allocated=sum((params, grads, opt, activations,  # type: ignore
                                              temporary))))
    return out


def _fits(memory: Memory, target: Target) -> bool | None:
    cap = memory.capacity
    if cap is None:
        return None
    usable = cap * (1 - SAFETY_MARGIN)
    floor = memory.model_states
    if floor is not None and floor + (memory.framework_overhead or 0) > usable:
        return False  # model states alone: no batch size changes that
    if memory.total is None or target.address_space_cap:
        return None
    return memory.total <= usable


@dataclass(frozen=True)
class Rung:
    level: int
    label: str
    strategy: str
    nodes: int
    checkpointing: str  # none | selective | full
    smaller_micro: bool  # may the micro-batch shrink below the whole per-rank batch
    reshard_after_forward: bool = True  # False: ZeRO-2 (sharded strategies in ``ZERO2``)


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
    """The remedies for one machine, least invasive first, with the user's pins honoured (the
    order and why: this module's docstring)."""
    gpus = spec.gpus_per_node or target.gpus
    base_nodes = spec.nodes or 1
    base = spec.strategy or ("single" if base_nodes * gpus == 1 else "ddp")
    pinned = pinned_checkpointing(spec)
    ac_options = [pinned] if pinned is not None else (
        ["none", "selective", "full"] if can_checkpoint else ["none"])
    # ZeRO-2 keeps the whole model's compute-dtype weights through the step: with full
    # checkpointing, FSDP (which does not) costs the same compute and holds less, so it is not
    # a rung of its own unless full checkpointing is what the user pinned.
    zero2_ac = [ac for ac in ac_options if ac != "full"] or ac_options
    may_shrink = spec.micro_batch_size is None
    if base not in SHARDED:
        yield Rung(0, "as asked", base, base_nodes, ac_options[0], False)
        if may_shrink:
            yield Rung(1, "smaller micro-batch", base, base_nodes, ac_options[0], True)
        for ac in ac_options[1:]:
            yield Rung(2, ("selective " if ac == "selective" else "") + "activation checkpointing",
                       base, base_nodes, ac, True)
    world = base_nodes * gpus
    sharded = [spec.strategy] if spec.strategy in SHARDED else (
        [] if spec.strategy else (["hybrid_shard", "fsdp"] if base_nodes > 1 else ["fsdp"]))
    if provider == "local":
        sharded = [s for s in sharded if s in RUNNABLE_STRATEGIES]

    def sharding(level: int, nodes: int, strategy: str, prefix: str = "") -> Iterator[Rung]:
        if strategy in ZERO2:
            for ac in zero2_ac:
                yield Rung(level, f"{prefix}{strategy} zero2{_CHECKPOINTED[ac]}", strategy,
                           nodes, ac, may_shrink, reshard_after_forward=False)
        for ac in ac_options:
            yield Rung(level, f"{prefix}{strategy}{_CHECKPOINTED[ac]}", strategy, nodes, ac,
                       may_shrink)

    if world > 1:
        for strategy in sharded:
            yield from sharding(3, base_nodes, strategy)
    if spec.nodes is None and target.max_nodes > 1 and not spec.strategy:
        for nodes in (2, 4, 8, 16):
            if nodes > target.max_nodes:
                break
            for strategy in ("hybrid_shard", "fsdp"):
                yield from sharding(4, nodes, strategy, f"{nodes} nodes, ")


def _hardware(target: Target, precision: str) -> Hardware:
    tflops = target.fp32_tflops if precision == "fp32" else target.bf16_tflops
    return Hardware(peak_tflops=tflops, intra_node_gbytes_per_s=target.intra_node_gbytes_per_s,
                    inter_node_gbps=target.inter_node_gbps, price_per_hour=target.price_per_hour)


def _evaluate(spec: Spec, fp: Footprint, target: Target, rung: Rung, gpus: int, micro: int,
              accum: int, reduce_every: bool = False) -> Plan:
    reduce_every = reduces_every_micro_step(rung.strategy, rung.nodes, gpus, accum, reduce_every)
    memory = per_gpu_memory(fp, target, rung.strategy, rung.nodes, gpus, micro, accum,
                            reduce_every, rung.reshard_after_forward)
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
        activation_checkpointing=rung.checkpointing != "none",
        checkpointing=rung.checkpointing,  # type: ignore[arg-type]
        reshard_after_forward=rung.reshard_after_forward, steps=spec.steps, lr=spec.lr,
        seq_len=spec.seq_len, fits=_fits(memory, target),
        cost_per_hour_usd=0.0 if target.cpu or target.name.startswith("local") else
        cost.cost_per_hour_usd,
        step_time_s=cost.step_time_s,
        total_cost_usd=0.0 if target.name.startswith("local") else cost.total_cost_usd,
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


def plan_on(spec: Spec, estimator: Estimator, target: Target, provider: str,
            can_checkpoint: bool, unsplit: list[Rejection] | None = None,
            ) -> tuple[Plan | None, list[Plan], list[Plan]]:
    """(first fitting plan or None, every plan evaluated, the rungs' best tries that failed).

    A layout whose processes cannot split the global batch the user gave is not an error but
    a rejected option, added to ``unsplit`` (``plan`` decides whether that left anything)."""
    given = spec
    gpus = spec.gpus_per_node or target.gpus
    if gpus > target.gpus:
        raise UsageError(f"--gpus-per-node {gpus}, but {target.name} has {target.gpus} GPUs")
    precision = spec.precision or "fp32"
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
        if rung.strategy in REDUCE_EVERY_MICRO_STEP and any(
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


def _states_overflow(candidate: Plan) -> bool:
    states = candidate.memory.model_states
    return states is not None and states > (candidate.memory.capacity or 0)


def plan(spec: Spec, estimator: Estimator, targets: list[Target], provider: str, *,
         parameters: int | None, source: str, can_checkpoint: bool) -> PlanResult:
    chosen: Plan | None = None
    all_plans: list[Plan] = []
    failed_on_chosen: list[Plan] = []
    options: list[tuple[Plan, list[Plan]]] = []
    unsplit: list[Rejection] = []
    for target in targets:
        best, evaluated, failed = plan_on(spec, estimator, target, provider, can_checkpoint,
                                          unsplit)
        all_plans.extend(evaluated)
        if best is not None:
            options.append((best, failed))
        elif len(targets) == 1:
            failed_on_chosen = failed
    if not all_plans and unsplit:
        # Not one layout can split the batch: the pins the user wrote contradict each other.
        message, _, hint = unsplit[0].reason.partition(" (")
        raise UsageError(message, hint.removesuffix(")"))
    notes: list[str] = []
    rejected: list[Rejection] = []
    status = ExitStatus.SUCCESS
    if options:
        def rank(option: tuple[Plan, list[Plan]]) -> tuple[int, int, float, int]:
            # Known to fit first; one machine before several (a second machine is the last
            # remedy); then the cheapest; then the fewest changes.
            p = option[0]
            return (0 if p.fits else 1, p.nodes > 1, p.total_cost_usd
                    if p.total_cost_usd is not None else math.inf, len(option[1]))
        # Under a budget, a plan whose cost is unknown cannot be shown to be within it.
        within = [o for o in options if spec.budget is None or (
            o[0].total_cost_usd is not None and o[0].total_cost_usd <= spec.budget)]
        if not within:
            cheapest = min(options, key=rank)[0]
            cost = ("an unknown amount" if cheapest.total_cost_usd is None
                    else f"${cheapest.total_cost_usd:,.2f}")
            rejected.append(Rejection(
                option=f"{cheapest.strategy} on {cheapest.machine}",
                reason=f"costs {cost} for {spec.steps} steps, over the ${spec.budget:,.2f} "
                       "budget"))
            status = ExitStatus.OVER_BUDGET
        else:
            chosen, failed_on_chosen = min(within, key=rank)
    else:
        status = ExitStatus.NO_PLAN_FITS
    rejected = [*reasons.for_failed(failed_on_chosen, parameters), *rejected, *unsplit]
    if chosen is not None:
        rejected += reasons.alternatives(chosen, failed_on_chosen, provider)
        if chosen.fits is None:
            unknown = [k for k, v in asdict(chosen.memory).items() if v is None]
            why = ("--memory-limit caps address space, which allocated bytes do not measure"
                   if spec.memory_limit and chosen.machine == "local-cpu"
                   else f"unknown: {', '.join(unknown)}")
            notes.append(f"whether the chosen plan fits is not certain ({why})")
    foot_note = estimator(spec.precision or "fp32", spec.optimizer or "adamw", False).note
    if foot_note:
        notes.append(foot_note)
    return PlanResult(parameters=parameters, source=source, plans=all_plans, chosen=chosen,
                      rejected=rejected, notes=notes, status=status)
