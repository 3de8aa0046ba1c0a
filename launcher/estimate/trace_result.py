"""What a trace answers: a ``TraceResult`` (``ScaledTrace`` when depth-scaled), or a ``TraceError``.

A ``TraceResult`` holds a recipe's step as lines in the micro-batch size, one per point of the
memory timeline (``Line``), and the peaks traced directly (``SizePeak``); it answers a plan's
``Memory`` at any micro-batch, with or without gradient accumulation (``memory_at``). The
phase codes the trace child records are defined here too, one home for both sides.

No torch, no numpy: the CLI reads these results to plan (docs/estimator.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from launcher import strategies
from launcher.plan.plan import Memory

Kind = Literal["traced", "real_run", "upper_bound"]
#: The phases of a trace's timeline, by the code the child records (one home for both sides).
#: A micro-step after the first of a step runs with the earlier micro-steps' gradients alive:
#: its forward and backward are phases of their own, which a plan without accumulation leaves
#: out (``TraceResult.for_accum``).
PHASES = {0: "build", 1: "forward", 2: "backward", 3: "optimizer", 4: "zero_grad",
          5: "accum_forward", 6: "accum_backward"}
#: The timeline's micro-batch phases (forward and backward, of the first micro-step of a step
#: and of the later ones); the others are the optimizer's and the build's.
MICRO_PHASES = (1, 2, 5, 6)
#: The optimizer step's phases (the optimizer and zero_grad).
OPTIMIZER_PHASES = (3, 4)
#: Phases only a plan with gradient accumulation has: the micro-steps after the first of a step,
#: which run with the earlier micro-steps' gradients alive.
ACCUM_PHASES = frozenset({"accum_forward", "accum_backward"})


class TraceError(Exception):
    """The recipe could not be traced. ``file``/``line`` point into the user's code when the
    error came from there; ``kind`` is syntax | user_code | contract | timeout | crash | internal.
    """

    def __init__(
        self, message: str, *, file: str | None = None, line: int | None = None,
        kind: str = "user_code", detail: str = "",
    ) -> None:
        self.message, self.file, self.line, self.kind, self.detail = (
            message, file, line, kind, detail
        )
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else "")
        super().__init__(f"{where}{message}")


class TraceTimeout(TraceError):
    """The child ran past its time limit and was killed (with its whole process group)."""


@dataclass(frozen=True)
class Line:
    """One point of the step's memory timeline as a function of the micro-batch size ``b``:
    bytes of each category = ``intercept + slope * b``. ``phase`` is where in the step it is."""

    intercept: dict[str, float]
    slope: dict[str, float]
    phase: str
    segment: str

    def at(self, b: float) -> dict[str, float]:
        return {k: self.intercept[k] + self.slope[k] * b for k in self.intercept}

    def total_at(self, b: float) -> float:
        return sum(self.intercept.values()) + b * sum(self.slope.values())


@dataclass(frozen=True)
class SizePeak:
    """The directly traced peak at one micro-batch size (no fit involved).

    ``in_fit`` says whether the size ran the same ops as the fitted ones; a size that did not
    (a batch of 1 often turns a copy into a view) is still answered exactly from this record.
    """

    micro_batch: int
    peak: int
    at_peak: dict[str, int]
    phase: str
    segment: str
    ops: int
    in_fit: bool
    phases: dict[str, dict[str, int]] = field(default_factory=dict)  # each phase's own peak


@dataclass(frozen=True)
class TraceResult:
    """What one trace of a recipe says, for one precision, optimizer and checkpointing choice.

    Byte counts are per process (= per GPU), for a single-device run. ``kind`` says how sure it
    is: ``traced`` (fake tensors; exact up to what the tracker cannot see, see docs), ``real_run``
    (data-dependent shapes, rerun on real CPU tensors: exact for the example batch),
    ``upper_bound`` (data-dependent shapes sized at their maximum).
    """

    recipe_file: str
    kind: Kind
    device: str
    trace_device: str
    precision: str
    optimizer: str | None
    activation_checkpointing: bool
    grad_accum_steps: int
    micro_batch_sizes: tuple[int, ...]
    parameters: int
    trainable_parameters: int
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    optimizer_class: str
    foreach: bool | None
    lines: tuple[Line, ...]
    per_size: dict[int, SizePeak]
    alignment: str
    fit_sizes: tuple[int, ...]
    max_residual_bytes: float
    max_residual_fraction: float
    verification: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    substituted_ops: dict[str, int] = field(default_factory=dict)
    probes: dict[str, Any] = field(default_factory=dict)
    wall_s: float | None = None
    host_peak_rss_bytes: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    flops_per_sample: float | None = None  # with count_flops: forward + backward of one sample
    strategy: str = strategies.SINGLE  # the strategy traced (ddp, fsdp...: one rank of it)
    script_sha256: str | None = None  # the rendered training script whose step was traced
    #: CUDA estimates: the caching allocator replayed over the traced allocations, from the
    #: build to the end of the steady step at ``micro_batch`` (``_replay``): per allocator
    #: setting (``default``, ``expandable_segments``) its peaks in bytes.
    allocator: dict[str, Any] = field(default_factory=dict)

    @property
    def is_bound(self) -> bool:
        return self.kind == "upper_bound"

    def _line_at(self, micro_batch: int) -> Line:
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
        return max(self.lines, key=lambda ln: ln.total_at(micro_batch))

    def breakdown_at(self, micro_batch: int, accum: int | None = None) -> dict[str, int]:
        """Bytes per tracker category at the peak, with ``accum`` micro-batches per optimizer
        step (None: as traced): the traced record for a traced size, the fitted lines' maximum
        for any other."""
        phases = self.phase_breakdowns_at(micro_batch, accum)
        peak = max(phases.values(), key=lambda v: sum(v.values()))
        return {k: round(x) for k, x in peak.items()}

    def phase_breakdowns_at(self, micro_batch: int, accum: int | None = None,
                            ) -> dict[str, dict[str, float]]:
        """Each phase's own peak at ``micro_batch`` (bytes per category): traced where the size
        was, else the phase's fitted lines. ``accum`` (None: as traced) is the plan's number of
        micro-batches per optimizer step (see ``for_accum``)."""
        phases = self.for_accum(self._phase_breakdowns(micro_batch), accum)
        if strategies.get(self.strategy).sharded:
            # The sharded scripts build the model in host memory and fully_shard moves each
            # block's shard to the GPU: the build phase (the whole model) is not the GPU's.
            phases = {ph: v for ph, v in phases.items() if ph != "build"} or phases
        return phases

    def for_accum(self, phases: dict[str, Any], accum: int | None) -> dict[str, Any]:
        """The phases a plan with ``accum`` micro-batches per step goes through.

        A trace with accumulation (``grad_accum_steps`` >= 2; micro-steps 3 and on see exactly
        what the second sees) holds both plans: its first micro-step is a step without
        accumulation (nothing else alive but the weights and optimizer state), its later ones
        run with the gradients of the earlier ones alive (``ACCUM_PHASES``), and the optimizer
        phase is the same either way. So a plan with one micro-batch per step leaves those
        phases out. That holds for one device; a distributed strategy also reduces gradients
        differently with accumulation (no sync until the last micro-step), so its trace answers
        only for plans on its own side of one.
        """
        if accum is None:
            return phases
        if accum < 1:
            raise ValueError(f"accum must be >= 1, got {accum}")
        traced = self.grad_accum_steps > 1
        one = strategies.get(self.strategy).one_process
        if (accum > 1) != traced and (accum > 1 or not one):
            raise ValueError(
                f"traced with {self.grad_accum_steps} micro-batch(es) per step"
                + ("" if one else f" under {self.strategy}")
                + f": trace with grad_accum_steps={min(accum, 2)} to predict {accum}")
        if accum == 1 and traced:
            return {ph: v for ph, v in phases.items() if ph not in ACCUM_PHASES}
        return phases

    def _phase_breakdowns(self, micro_batch: int) -> dict[str, dict[str, float]]:
        record = self.per_size.get(micro_batch)
        if record is not None and record.phases:
            return {ph: {k: float(x) for k, x in v.items()} for ph, v in record.phases.items()}
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
        if len(self.fit_sizes) < 2:
            raise ValueError(
                f"traced at micro-batch {self.micro_batch_sizes[0]} only: trace two or more "
                f"sizes to predict {micro_batch}"
            )
        best: dict[str, Line] = {}
        for ln in self.lines:
            if ln.phase not in best or ln.total_at(micro_batch) > best[ln.phase].total_at(
                    micro_batch):
                best[ln.phase] = ln
        return {ph: ln.at(micro_batch) for ph, ln in best.items()}

    def predicted_at(self, micro_batch: int) -> int:
        """The fitted lines' peak, even at a traced size (to compare with the direct trace)."""
        return round(self._line_at(micro_batch).total_at(micro_batch))

    def peak_at(self, micro_batch: int, accum: int | None = None) -> int:
        """Peak allocated bytes over the first and a steady-state optimizer step."""
        return sum(self.breakdown_at(micro_batch, accum).values())

    def phase_memories_at(self, micro_batch: int, accum: int | None = None
                          ) -> dict[str, Memory]:
        """The plan's ``Memory`` at each phase's own peak (forward, backward, optimizer...):
        what a strategy that shards the model states needs, since sharding can move the peak
        from the optimizer step (states) to the backward pass (activations)."""
        return {phase: _memory({c: round(x) for c, x in v.items()}, self.optimizer_state_bytes)
                for phase, v in self.phase_breakdowns_at(micro_batch, accum).items()}

    def memory_at(self, micro_batch: int, accum: int | None = None) -> Memory:
        """The plan's ``Memory`` at ``micro_batch``: the breakdown at the peak moment.

        ``optimizer`` is the persistent state; what an optimizer step allocates on top of it
        (foreach intermediates) is ``temporary``, with the backward pass's activation gradients
        and kernels' scratch. Buffers count as parameters. ``peak_reserved`` is the caching
        allocator's (``reserve_ratio``) where the trace replayed it (CUDA estimates), else
        None. GPU-side overheads (CUDA context, libraries) are not traced:
        ``framework_overhead``, ``total`` and ``capacity`` stay None for the planner's later
        stages to fill.
        """
        memory = _memory(self.breakdown_at(micro_batch, accum), self.optimizer_state_bytes)
        ratio = self.reserve_ratio()
        if ratio is None or memory.peak_allocated is None:
            return memory
        return replace(memory, peak_reserved=math.ceil(memory.peak_allocated * ratio))

    def reserve_ratio(self, expandable_segments: bool = False) -> float | None:
        """Reserved bytes per traced byte at the peak, from the allocator's replay at the traced
        size (``allocator``), or None where nothing was replayed (a CPU estimate, a trace
        whose events were over the cap).

        The replay is at one micro-batch (the steady step's); other sizes carry its ratio (a
        ratio, not bytes: the slack grows with the blocks it comes from), and a depth-scaled
        trace carries its deeper trace's (``allocator`` is the deeper trace's). Extrapolating
        reserved and requested bytes along the depth line instead was worse: the slack is not
        linear in the blocks (a 12-block GPT: 1.00 extrapolated from 2 and 4 blocks, 1.12
        carried, 1.156 replayed whole; the 7B Llama shape: 1.009, 1.054 and 1.032).
        """
        replayed = self.allocator.get(
            "expandable_segments" if expandable_segments else "default")
        if not replayed or not replayed["peak_requested"]:
            return None
        return max(1.0, replayed["peak_reserved"] / replayed["peak_requested"])

    @property
    def model_state_bytes(self) -> int:
        return self.parameter_bytes + self.buffer_bytes + self.gradient_bytes + (
            self.optimizer_state_bytes
        )


def _memory(v: dict[str, int], optimizer_state_bytes: int) -> Memory:
    optimizer = max(0, min(v["OPT"], optimizer_state_bytes))
    return Memory(
        parameters=v["PARAM"] + v["BUFFER"],
        gradients=v["GRAD"],
        optimizer=optimizer,
        activations=v["ACT"],
        temporary=v["TEMP"] + v["OTH"] + v.get("SCRATCH", 0) + (v["OPT"] - optimizer),
        peak_allocated=sum(v.values()),
    )


#: Bytes a category may hold less at the deeper of two traced depths before the phase's peak is
#: taken for another moment (``ScaledTrace.moment_moved``): allocator rounding, not a moment.
MOVED_TOLERANCE = 64 * 1024


def _depth_factor(count: int, depths: Any) -> float:
    """How far along the line through the two traced depths the real depth lies."""
    d0, d1 = depths
    return (count - d0) / (d1 - d0)


@dataclass(frozen=True)
class ScaledTrace(TraceResult):
    """A trace of two depths of the model's stack of identical blocks, extrapolated to its real
    depth (``blocks["count"]``).

    Every category's bytes at every phase's peak are linear in the number of blocks (each block
    adds its weights, gradients, optimizer state and saved activations; the peak of a phase
    moves by the same bytes per block), so two depths give the line and the real depth is read
    off it, phase by phase, before the phases' maximum is taken: the phase that peaks at four
    blocks (often the loss, with a large vocabulary) need not be the one that peaks at 32 (the
    optimizer step). The facts (parameters, gradient and optimizer bytes) are extrapolated the
    same way and are exact. ``shallow`` and ``deep`` are the two traces themselves.
    """

    blocks: dict[str, Any] = field(default_factory=dict)
    shallow: TraceResult | None = None
    deep: TraceResult | None = None

    @classmethod
    def from_traces(cls, shallow: TraceResult, deep: TraceResult, blocks: dict[str, Any],
                    depths: tuple[int, int], **extra: Any) -> ScaledTrace:
        k = _depth_factor(blocks["count"], depths)

        def scale(name: str) -> int:
            a, b = getattr(shallow, name), getattr(deep, name)
            return round(a + k * (b - a))

        base = {f.name: getattr(deep, f.name) for f in fields(TraceResult)}
        facts: dict[str, Any] = {name: scale(name) for name in (
            "parameters", "trainable_parameters", "parameter_bytes", "buffer_bytes",
            "gradient_bytes", "optimizer_state_bytes")}
        if shallow.flops_per_sample is not None and deep.flops_per_sample is not None:
            facts["flops_per_sample"] = shallow.flops_per_sample + k * (
                deep.flops_per_sample - shallow.flops_per_sample)
        scaled = cls(**{**base, **facts, **extra, "per_size": {}, "lines": (),
                        "blocks": dict(blocks, traced_depths=list(depths)),
                        "shallow": shallow, "deep": deep})
        per_size = {}
        for b, record in deep.per_size.items():
            if b not in shallow.per_size:
                continue
            phase, v = scaled._peak(b)
            per_size[b] = replace(record, peak=sum(v.values()), at_peak=v, phase=phase,
                                  segment=record.segment, phases={})
        object.__setattr__(scaled, "per_size", per_size)
        return scaled

    def _phase_breakdowns(self, micro_batch: int) -> dict[str, dict[str, float]]:
        """Each phase's peak at the real depth: the two depths' extrapolated, per category."""
        assert self.shallow is not None and self.deep is not None
        k = _depth_factor(self.blocks["count"], self.blocks["traced_depths"])
        a = self.shallow._phase_breakdowns(micro_batch)
        b = self.deep._phase_breakdowns(micro_batch)
        return {phase: {c: max(0.0, a[phase][c] + k * (b[phase][c] - a[phase][c]))
                        for c in b[phase]}
                for phase in b if phase in a}

    def moment_moved(self, micro_batch: int, accum: int | None = None) -> bool:
        """Whether a phase's peak is a different moment at the two traced depths, by the sign
        a same moment cannot show: a category that holds less at the deeper one (every block
        adds weights, gradients, state and saved activations to the same moment; nothing
        takes any away). Then the two depths do not lie on one line and the extrapolation
        can err either way (a hybrid-sharded rank with full checkpointing at micro-batch 8:
        the backward's peak holds activations at 4 blocks and gradient shards at 6, +18% at
        12 blocks); the planner traces such a rank whole."""
        assert self.shallow is not None and self.deep is not None
        a = self.shallow.for_accum(self.shallow._phase_breakdowns(micro_batch), accum)
        b = self.deep.for_accum(self.deep._phase_breakdowns(micro_batch), accum)
        return any(b[ph][c] < a[ph][c] - MOVED_TOLERANCE for ph in b if ph in a for c in b[ph])

    def _peak(self, micro_batch: int, accum: int | None = None) -> tuple[str, dict[str, int]]:
        phases = self.phase_breakdowns_at(micro_batch, accum)
        phase = max(phases, key=lambda ph: sum(phases[ph].values()))
        return phase, {c: round(x) for c, x in phases[phase].items()}

    def predicted_at(self, micro_batch: int) -> int:
        return sum(self._peak(micro_batch)[1].values())

    def phase_at(self, micro_batch: int) -> str:
        return self._peak(micro_batch)[0]
