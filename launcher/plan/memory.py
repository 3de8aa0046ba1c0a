"""Per-GPU memory of a plan: a single-device footprint under a strategy, plus the GPU's overheads.

The planner asks this module one question per candidate (``per_gpu_memory``): how much does one
GPU hold at this micro-batch, with the model states sharded the strategy's way (FSDP over every
GPU, hybrid sharding and SMP v2 within a node, ZeRO-2 keeping the gathered parameters from
forward to backward), the gradients reduced every micro-step or held whole, autocast's weight
copies counted once, and the CUDA context, NCCL buffers and allocator reserve added
(``estimate/overheads.py``). A sharded plan near the machine's capacity, and the plan the
planner chooses, is sized from a trace of one rank at its world size instead when the footprint
can make one (a recipe, a script, a config transformers builds). ``fits`` says
whether the result fits the machine (``Target``). Kept apart from the search
(``plan/planner.py``): this is arithmetic over a footprint, the planner is the order of the
remedies and the choice between machines.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from launcher import strategies
from launcher.estimate.footprint import Footprint
from launcher.estimate.overheads import PCIE5_GBYTES_PER_S, SAFETY_MARGIN, gpu_overheads
from launcher.plan.plan import Memory


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
    #: Whether the GPU computes in bf16 (``catalog.GpuType.supports_bf16``); None: not known
    #: (this machine's GPU of no catalog family). Decides the default precision
    #: (``plan/precision.py``).
    bf16: bool | None = None
    #: Why the catalog has no price for it (``price_per_hour`` None), in its words.
    price_note: str | None = None
    intra_node_gbytes_per_s: float | None = None
    inter_node_gbps: float | None = None
    max_nodes: int = 1
    #: An address-space cap (local --memory-limit): not comparable with allocated bytes.
    address_space_cap: bool = False
    #: This machine (the local provider's): nothing to pay for, whatever it is.
    here: bool = False
    #: From calibration (real runs on this machine type): allocator slack, and how much more
    #: than predicted this model allocated. Defaults: the overheads module's, and 1.
    reserve_ratio: float | None = None
    allocated_scale: float = 1.0
    #: The CUDA (major, minor) the job's image runs (``overheads.image_cuda``); None: one with
    #: lazy module loading (CUDA 11.7+), as every default image. Sizes the CUDA context.
    cuda: tuple[int, int] | None = None




def shard_degree(strategy: str, nodes: int, gpus: int) -> int:
    """Over how many processes ``strategy`` splits each model state (``Strategy.shard_degree``)."""
    return strategies.get(strategy).shard_degree(nodes, gpus)


#: A sharded candidate whose scaled estimate is this close to the usable memory (either side) is
#: traced at its world size: the scaled estimate is on the safe side by tens of percent
#: (docs/benchmarks.md), enough to reject a plan that fits or to report the wrong margin.
NEAR_CAPACITY = 0.15


def reduces_every_micro_step(strategy: str, nodes: int, gpus: int, accum: int,
                             reduce_every: bool) -> bool:
    """Whether ``reduce_every`` changes anything: a sharded plan (more than one shard) that
    accumulates gradients."""
    return (reduce_every and accum > 1 and strategies.get(strategy).reduce_every_micro_step
            and shard_degree(strategy, nodes, gpus) > 1)


def per_gpu_memory(fp: Footprint, target: Target, strategy: str, nodes: int, gpus: int,
                   micro: int, accum: int = 1, reduce_every: bool = False,
                   reshard_after_forward: bool = True, exact: bool = False) -> Memory:
    """The footprint at ``micro`` under ``strategy``, with the GPU-side overheads.

    A sharded plan is first sized by sharding the single-device footprint phase by phase; when
    that lands near the machine's capacity and the footprint can trace one rank of the strategy
    (``Footprint.rank_memory_at``: a recipe), the rank's own trace replaces it.
    ``reduce_every``: the plan reduce-scatters on every micro-step (``Plan.
    reduce_every_micro_step``), so its ranks hold gradient shards, not the unsharded gradient.
    ``reshard_after_forward`` False: ZeRO-2 (a ``Strategy.zero2`` strategy), each unit's gathered
    parameters held from its forward to its backward. ``exact``: trace the rank whatever the
    margin (the planner's chosen plan), where the footprint can."""
    reduce_every = reduces_every_micro_step(strategy, nodes, gpus, accum, reduce_every)
    zero2 = not reshard_after_forward and strategies.get(strategy).zero2
    memory = _scaled_gpu_memory(fp, target, strategy, nodes, gpus, micro, accum, reduce_every,
                                zero2)
    usable = None if memory.capacity is None else memory.capacity * (1 - SAFETY_MARGIN)
    if (fp.rank_memory_at is not None and strategies.get(strategy).sized_per_rank
            and shard_degree(strategy, nodes, gpus) > 1 and not target.address_space_cap
            and (exact or (memory.total is not None and usable
                           and abs(memory.total - usable) <= NEAR_CAPACITY * usable))):
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
            return dataclasses.replace(traced, rank_traced=True)
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
    shards (1/world of the gradient): a bound from the rank itself, which ``per_gpu_memory``
    takes over the scaled estimate (tens of percent off either way)."""
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
                # and an RMSNorm model's fp32 stream, which is bf16 over bf16 weights
                activations -= fp.fp32_weight_bytes_per_sample * micro
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


def fits(memory: Memory, target: Target) -> bool | None:
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


