"""Traced estimate: the per-device memory of a recipe's training step, from a run on fake tensors.

``trace_recipe`` runs the user's ``train.py`` in a child process (``_trace_child``) with a time
limit. The child imports the training script ``launch`` renders for the strategy and runs its
own functions (model build, wrapping, optimizer, ``optimizer_step``: the program that will run)
on ``FakeTensorMode`` tensors under PyTorch's ``MemTracker``, so nothing is
allocated and a 7B model is traced on a laptop. It traces a few micro-batch sizes, fits every point
of the step's memory timeline linearly in the micro-batch size and keeps the upper envelope of
those lines: ``TraceResult.memory_at(b, accum)`` then answers for any micro-batch, with or
without accumulation, without another trace.

This module does not import torch: the CLI imports it to plan, and ``launch --help`` must stay
instant. docs/estimator.md has the method, its evidence and its limits.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from launcher.plan.plan import Memory, checkpointing_key

Kind = Literal["traced", "real_run", "upper_bound"]
DEFAULT_SIZES: tuple[int, ...] = (1, 2, 4)
DEFAULT_TIMEOUT_S = 300.0
#: The phases of a trace's timeline, by the code the child records (one home for both sides).
#: A micro-step after the first of a step runs with the earlier micro-steps' gradients alive:
#: its forward and backward are phases of their own, which a plan without accumulation leaves
#: out (``TraceResult.for_accum``).
PHASES = {0: "build", 1: "forward", 2: "backward", 3: "optimizer", 4: "zero_grad",
          5: "accum_forward", 6: "accum_backward"}
#: The timeline's micro-batch phases (forward and backward, of the first micro-step of a step
#: and of the later ones); the others are the optimizer's and the build's.
MICRO_PHASES = (1, 2, 5, 6)
_OPTIMIZER_PHASES = (3, 4)
#: Phases only a plan with gradient accumulation has: the micro-steps after the first of a step,
#: which run with the earlier micro-steps' gradients alive.
ACCUM_PHASES = frozenset({"accum_forward", "accum_backward"})
_REPO_ROOT = Path(__file__).resolve().parents[2]


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
    strategy: str = "single"  # the strategy traced (ddp, fsdp, hybrid_shard: one rank of it)
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
        if self.strategy in ("fsdp", "hybrid_shard"):
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
        if (accum > 1) != traced and (accum > 1 or self.strategy != "single"):
            raise ValueError(
                f"traced with {self.grad_accum_steps} micro-batch(es) per step"
                + (f" under {self.strategy}" if self.strategy != "single" else "")
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

    def _peak(self, micro_batch: int, accum: int | None = None) -> tuple[str, dict[str, int]]:
        phases = self.phase_breakdowns_at(micro_batch, accum)
        phase = max(phases, key=lambda ph: sum(phases[ph].values()))
        return phase, {c: round(x) for c, x in phases[phase].items()}

    def predicted_at(self, micro_batch: int) -> int:
        return sum(self._peak(micro_batch)[1].values())

    def phase_at(self, micro_batch: int) -> str:
        return self._peak(micro_batch)[0]


def trace_recipe(
    recipe_file: str | os.PathLike[str],
    *,
    micro_batch_sizes: tuple[int, ...] | list[int] = DEFAULT_SIZES,
    precision: str = "fp32",
    optimizer: str | None = None,
    activation_checkpointing: bool | str = False,  # True: full; "selective"
    grad_accum_steps: int = 1,
    device: Literal["cuda", "cpu"] = "cuda",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_grad_norm: float | None = 1.0,
    lr: float = 3e-4,
    weight_decay: float = 0.0,
    seed: int = 0,
    verify_sizes: tuple[int, ...] | list[int] = (),
    data_dependent: Literal["auto", "real", "bound"] = "auto",
    real_run_limit_bytes: int | None = None,
    foreach: bool | None = None,
    scale_depth: bool = True,
    strategy: dict[str, Any] | None = None,
    count_flops: bool = False,
    gpu_generation: str | None = None,
    jobs: int = 2,
    python: str | None = None,
    batch_shapes: Any = None,
) -> TraceResult:
    """Trace ``recipe_file``'s optimizer step at each of ``micro_batch_sizes`` in a child process.

    ``batch_shapes``: trace at these batch shapes (an out-of-memory report's, the templates'
    ``batch_shapes``) instead of the recipe's ``example_batch``.

    The optimizer is the script's choice: the recipe's ``build_optimizer`` if it has one, else
    ``optimizer`` (adamw | sgd | adafactor | adam8bit; None is adamw). ``grad_accum_steps`` >= 2
    answers plans with and without accumulation alike (``TraceResult.for_accum``). ``device="cuda"``
    counts as a GPU would (512-byte blocks, foreach optimizers); on a machine without CUDA it
    is emulated on the CPU (see the result's ``notes``). ``verify_sizes`` are traced too but
    kept out of the fit, to check the prediction there. ``data_dependent`` chooses what to do
    with shapes that depend on values: ``auto`` reruns small models on real CPU tensors and
    bounds large ones. ``scale_depth`` traces a model with a stack of at least eight identical
    blocks (a transformer's layers) at two and four blocks and extrapolates to its real depth
    (a ``ScaledTrace``); it is several times faster on a deep model, exact when every block uses
    memory alike (docs/estimator.md). ``strategy`` traces one rank of a distributed job at its
    real world size in one process (a fake process group): ``{"name": "ddp" | "fsdp" |
    "hybrid_shard", "world_size": N, "replicas": R (hybrid: R replicas of N / R shards),
    "reshard_after_forward": bool}``; the result is rank 0's memory (docs/estimator.md).
    ``count_flops`` also counts one sample's training FLOPs (``flops_per_sample``).
    ``gpu_generation`` (a catalog generation: ampere, hopper, volta...) is the GPU whose attention
    kernels a CUDA trace emulated on the CPU picks by PyTorch's rules (default: Ampere or newer).

    Raises ``TraceError`` (with the user's file:line when the error is in their code) or
    ``TraceTimeout``.
    """
    request = _request(
        recipe_file, micro_batch_sizes=micro_batch_sizes, precision=precision,
        optimizer=optimizer, activation_checkpointing=activation_checkpointing,
        grad_accum_steps=grad_accum_steps, device=device, max_grad_norm=max_grad_norm, lr=lr,
        weight_decay=weight_decay, seed=seed, verify_sizes=verify_sizes,
        data_dependent=data_dependent, real_run_limit_bytes=real_run_limit_bytes,
        foreach=foreach, scale_depth=scale_depth, strategy=strategy, count_flops=count_flops,
        gpu_generation=gpu_generation,
    )
    if batch_shapes is not None:
        request["batch_shapes"] = batch_shapes
    python = python or sys.executable
    return _finish(_run_child(_forking(request, jobs), timeout_s, python), request, timeout_s,
                   python)


def _forking(request: dict[str, Any], jobs: int) -> dict[str, Any]:
    """The request, asking the child to split it over two processes when that pays: the steady
    step at b0 (with step 1 and the optimizer) in one, the micro-batches of every other size in
    the other (the child forks once torch is imported). ``_finish`` joins their timelines as
    one process would have made them."""
    b0 = _b0(request)
    others = [b for b in request["micro_batch_sizes"] + request["verify_sizes"] if b != b0]
    if jobs < 2 or not others:
        return request
    return {**request, "b0": b0, "fork_parts": True}


def _finish(answer: dict[str, Any], request: dict[str, Any], timeout_s: float,
            python: str) -> TraceResult:
    """One configuration's answer as a ``TraceResult``: joined if the child split it, scaled to
    the model's depth if it traced two depths. Raises the child's error as a ``TraceError``."""
    if not answer.get("ok") or "split" not in answer:
        return _result_or_raise(answer, request)
    step, micro = answer["split"]
    for part in (step, micro):
        if not part.get("ok"):
            return _result_or_raise(part, request)  # raises
    if step.get("kind") != micro.get("kind") or ("by_depth" in step) != ("by_depth" in micro):
        # one process fell back (data-dependent shapes, a truncated model that would not run)
        # and the other did not: start over in one
        return _result_or_raise(_run_child(request, timeout_s, python), request)
    if "by_depth" not in step:
        return _result(_join(step, micro), request)
    steps, micros = _per_depth(step), _per_depth(micro)
    return _scale({d: _result(_join(steps[d], micros[d]), request) for d in steps},
                  {"wall_s": max(step["wall_s"], micro["wall_s"]),
                   "host_peak_rss_bytes": step["host_peak_rss_bytes"]
                   + micro["host_peak_rss_bytes"]}, step["blocks"])


def _per_depth(answer: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The answer of each traced depth, with the process's own facts (wall time, notes...)."""
    top = {k: v for k, v in answer.items() if k not in ("by_depth", "blocks")}
    return {int(d): {**top, **sub} for d, sub in answer["by_depth"].items()}


def _scale(results: dict[int, TraceResult], answer: dict[str, Any],
           blocks: dict[str, Any]) -> ScaledTrace:
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


def _b0(request: dict[str, Any]) -> int:
    """The size of the full steady step: the second smallest (a batch of 1 is often special)."""
    sizes = request["micro_batch_sizes"]
    return sizes[1] if len(sizes) > 1 else sizes[0]


def _join(step: dict[str, Any], micro: dict[str, Any]) -> dict[str, Any]:
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


def trace_recipe_configs(
    recipe_file: str | os.PathLike[str],
    configs: list[dict[str, Any]],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    python: str | None = None,
    jobs: int = 2,
    **common: Any,
) -> list[TraceResult | TraceError]:
    """Trace several configurations of one recipe in one child process (torch imported once).

    Each entry of ``configs`` overrides ``common``; both take ``trace_recipe``'s keyword
    arguments. A planner comparing precisions, optimizers and checkpointing asks this once.
    Errors come back in place (a ``TraceError`` per failed configuration); a timeout or a crash
    of the child raises for all of them. ``device`` must be the same for every entry.
    """
    requests = [_request(recipe_file, **{**common, **config}) for config in configs]
    if len({r["device"] for r in requests}) > 1:
        raise ValueError("one batch traces one device; split cuda and cpu configurations")
    python = python or sys.executable
    answer = _run_child({"batch": [_forking(r, jobs) for r in requests]}, timeout_s, python)
    if not answer.get("ok"):
        return [_result_or_raise(answer, requests[0])]  # raises
    results: list[TraceResult | TraceError] = []
    for item, request in zip(answer["batch"], requests, strict=True):
        try:
            results.append(_finish(item, request, timeout_s, python))
        except TraceTimeout:
            raise
        except TraceError as exc:
            results.append(exc)
    return results


def _request(
    recipe_file: str | os.PathLike[str],
    *,
    micro_batch_sizes: tuple[int, ...] | list[int] = DEFAULT_SIZES,
    precision: str = "fp32",
    optimizer: str | None = None,
    activation_checkpointing: bool | str = False,  # True: full; "selective"
    grad_accum_steps: int = 1,
    device: str = "cuda",
    max_grad_norm: float | None = 1.0,
    lr: float = 3e-4,
    weight_decay: float = 0.0,
    seed: int = 0,
    verify_sizes: tuple[int, ...] | list[int] = (),
    data_dependent: str = "auto",
    real_run_limit_bytes: int | None = None,
    foreach: bool | None = None,
    scale_depth: bool = True,
    strategy: dict[str, Any] | None = None,
    count_flops: bool = False,
    gpu_generation: str | None = None,
) -> dict[str, Any]:
    """Validate the arguments (here, not in the child: a usage error costs no process)."""
    sizes = tuple(sorted({int(b) for b in micro_batch_sizes}))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"micro_batch_sizes must be positive integers, got {micro_batch_sizes}")
    if grad_accum_steps < 1:
        raise ValueError(f"grad_accum_steps must be >= 1, got {grad_accum_steps}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if precision not in ("fp32", "bf16_mixed", "bf16"):
        raise ValueError(f"precision must be fp32, bf16_mixed or bf16, got {precision!r}")
    if optimizer not in (None, "adamw", "sgd", "adafactor", "adam8bit"):
        raise ValueError(f"optimizer must be adamw, sgd, adafactor, adam8bit or None, "
                         f"got {optimizer!r}")
    if data_dependent not in ("auto", "real", "bound"):
        raise ValueError(f"data_dependent must be auto, real or bound, got {data_dependent!r}")
    request: dict[str, Any] = {
        "recipe_file": str(Path(recipe_file).resolve()),
        "micro_batch_sizes": list(sizes),
        "verify_sizes": [int(b) for b in verify_sizes],
        "precision": precision,
        "optimizer": optimizer,
        "activation_checkpointing": checkpointing_key(activation_checkpointing),
        "grad_accum_steps": int(grad_accum_steps),
        "device": device,
        "max_grad_norm": max_grad_norm,
        "lr": lr,
        "weight_decay": weight_decay,
        "seed": seed,
        "data_dependent": data_dependent,
        "foreach": foreach,
        "scale_depth": bool(scale_depth),
        "count_flops": bool(count_flops),
    }
    if real_run_limit_bytes is not None:
        request["real_run_limit_bytes"] = int(real_run_limit_bytes)
    if gpu_generation is not None:
        request["gpu_generation"] = str(gpu_generation)
    if strategy is not None:
        request["strategy"] = _strategy(strategy)
        # Traced whole: a rank's peak is not linear in the depth. DDP's gradient buckets are
        # cut by size, not by block (2 and 4 blocks extrapolated to 8: +15%); under FSDP the
        # backward's peak moves between blocks with checkpointing (+10% at 8 blocks, +26% for
        # a 32-block 7B at 8 ranks) and at micro-batch 1 (+13% for the 7B). A whole 7B rank
        # traces in 10-14 s here (docs/benchmarks.md, "depth scaling under a strategy").
        request["scale_depth"] = False
    return request


def _strategy(strategy: dict[str, Any]) -> dict[str, Any]:
    """A distributed strategy to trace (the script's ``wrap_model`` applies it), checked
    here."""
    names = ("ddp", "fsdp", "hybrid_shard")
    unknown = set(strategy) - {"name", "world_size", "replicas", "reshard_after_forward"}
    if unknown:
        raise ValueError(f"unknown strategy keys: {', '.join(sorted(unknown))}")
    name, world = strategy.get("name"), strategy.get("world_size")
    if name not in names:
        raise ValueError(f"strategy name must be ddp, fsdp or hybrid_shard, got {name!r}")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"strategy world_size must be a positive integer, got {world!r}")
    replicas = strategy.get("replicas", 1)
    if name != "hybrid_shard" and replicas != 1:
        raise ValueError(f"replicas is for hybrid_shard only, got {replicas!r} for {name}")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1 or (
        world % replicas
    ):
        raise ValueError(f"replicas ({replicas!r}) must be a positive divisor of world_size "
                         f"({world})")
    return {"name": name, "world_size": world, "replicas": replicas,
            "reshard_after_forward": bool(strategy.get("reshard_after_forward", True))}


def _result_or_raise(answer: dict[str, Any], request: dict[str, Any]) -> TraceResult:
    if not answer.get("ok"):
        error = answer.get("error") or {}
        raise TraceError(
            error.get("message", "the trace failed"),
            file=error.get("file"), line=error.get("line"), kind=error.get("kind", "user_code"),
            detail=error.get("traceback", ""),
        )
    if "by_depth" in answer:
        return _scale({d: _result(a, request) for d, a in _per_depth(answer).items()}, answer,
                      answer["blocks"])
    return _result(answer, request)


@dataclass(frozen=True)
class Measurement:
    """A real CPU step's peak, from the CPU allocator's own events (see ``measure_recipe``)."""

    micro_batch: int
    peak_allocated: int
    running_sum_peak: int
    events: int
    wall_s: float
    threads: int


def measure_recipe(
    recipe_file: str | os.PathLike[str],
    *,
    micro_batch: int,
    precision: str = "fp32",
    optimizer: str | None = None,
    activation_checkpointing: bool | str = False,  # True: full; "selective"
    grad_accum_steps: int = 1,
    max_grad_norm: float | None = 1.0,
    seed: int = 0,
    foreach: bool | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    python: str | None = None,
) -> Measurement:
    """Run two real optimizer steps of the recipe on the CPU and return their peak.

    This is the ground truth the traced estimate is checked against on a machine without a GPU:
    ``torch.profiler``'s memory events are the CPU allocator's own record of every allocation
    and free, with its running total of live bytes. It uses real memory; keep models small.
    """
    request = {
        "action": "measure",
        "recipe_file": str(Path(recipe_file).resolve()),
        "micro_batch": int(micro_batch),
        "precision": precision,
        "optimizer": optimizer,
        "activation_checkpointing": checkpointing_key(activation_checkpointing),
        "grad_accum_steps": int(grad_accum_steps),
        "max_grad_norm": max_grad_norm,
        "seed": seed,
        "foreach": foreach,
    }
    answer = _run_child(request, timeout_s, python or sys.executable)
    if not answer.get("ok"):
        error = answer.get("error") or {}
        raise TraceError(error.get("message", "the measurement failed"), file=error.get("file"),
                         line=error.get("line"), kind=error.get("kind", "user_code"))
    return Measurement(
        micro_batch=int(micro_batch), peak_allocated=int(answer["peak_allocated"]),
        running_sum_peak=int(answer["running_sum_peak"]), events=int(answer["events"]),
        wall_s=float(answer["wall_s"]), threads=int(answer["threads"]),
    )


#: Trace children started ahead of their request (``prestart``), by interpreter.
_WARM: dict[str, subprocess.Popen[str]] = {}
_REAPING: list[bool] = []
#: The end of each running child's stderr, by pid (read while waiting for its answers).
_STDERR: dict[int, bytes] = {}


def prestart(python: str | None = None) -> None:
    """Start a trace child now, to be used by the next trace with the same interpreter.

    Importing torch and the fake-tensor machinery costs a child seconds before it can trace;
    started while the caller does something else (the CLI loads the recipe in its own child
    first), that time is hidden. The child waits for its request on stdin; one never used is
    killed at exit, and one whose parent dies reads end-of-file and exits.
    """
    python = python or sys.executable
    proc = _WARM.get(python)
    if proc is not None and proc.poll() is None:
        return
    _keep(python, _spawn(python, warm=True))


def _keep(python: str, proc: subprocess.Popen[str]) -> None:
    """Keep ``proc`` as the free trace child of ``python`` (killed at exit if never used)."""
    if not _REAPING:
        atexit.register(_reap)
        _REAPING.append(True)
    _WARM[python] = proc


def _reap() -> None:
    for proc in _WARM.values():
        _kill(proc)
        with contextlib.suppress(Exception):
            proc.communicate(timeout=5)
    _WARM.clear()
    _STDERR.clear()


def _kill(proc: subprocess.Popen[str]) -> None:
    """Kill a trace child with its whole process group (its forked half, the user's threads)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _spawn(python: str, warm: bool = False) -> subprocess.Popen[str]:
    from launcher.processes import user_environ

    env = user_environ(dict(os.environ))  # it runs the user's code: no cloud credentials
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    if warm:
        env["LAUNCH_TRACE_WARM"] = "1"  # warm up the lazily imported fake-tensor modules too
    from launcher.processes import die_with_parent

    return subprocess.Popen(
        [python, "-m", "launcher.estimate._trace_child"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env, text=True, start_new_session=True,  # its own group: a timeout kills it all
        preexec_fn=die_with_parent(),  # and a launch killed with -9 takes it along
    )


def probe(script: str | os.PathLike[str], *, count_flops: bool, timeout_s: float,
          python: str | None = None) -> dict[str, Any] | None:
    """Load a recipe in the prestarted trace child (``launcher.recipe``'s probe: LAUNCH, the
    model's size on the meta device, the machine's GPUs) and keep the child for the trace.

    One process instead of two: the probe no longer pays its own torch import, and the trace
    that follows starts in a process that has already imported the recipe's packages. Returns
    the probe's answer, or None when no child was prestarted (or it died): the caller probes the
    usual way. Raises ``TimeoutError`` (the child is killed) when loading takes longer than
    ``timeout_s``.
    """
    python = python or sys.executable
    proc = _WARM.pop(python, None)
    if proc is None or proc.poll() is not None:
        return None
    request = {"action": "probe", "script": str(Path(script).resolve()),
               "count_flops": count_flops}
    try:
        answer = _ask(proc, request, timeout_s)
    except TimeoutError:
        raise TimeoutError(
            f"loading {Path(script).name} took longer than {timeout_s:g} s") from None
    if answer is not None:
        _keep(python, proc)
    return answer


def _ask(proc: subprocess.Popen[str], request: dict[str, Any], timeout_s: float,
         ) -> dict[str, Any] | None:
    """One request line to a running trace child, its one answer line back (None if the child
    died first). Its stderr is drained meanwhile, so a chatty recipe never blocks on a full
    pipe. Past ``timeout_s`` the child is killed with its process group (its workers) and
    ``TimeoutError`` raised."""
    import selectors

    if proc.stdin is None or proc.stdout is None:
        return None
    try:
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
    except OSError:
        return None
    out, deadline = b"", time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout.fileno(), selectors.EVENT_READ, "out")
        if proc.stderr is not None:
            selector.register(proc.stderr.fileno(), selectors.EVENT_READ, "err")
        while b"\n" not in out:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill(proc)
                with contextlib.suppress(Exception):
                    proc.communicate(timeout=5)
                raise TimeoutError
            for key, _ in selector.select(timeout=min(left, 1.0)):
                chunk = os.read(key.fd, 1 << 16)
                if key.data == "out":
                    if not chunk:
                        return None
                    out += chunk
                elif not chunk:
                    selector.unregister(key.fd)
                else:  # the last few KiB, for the message if the child dies
                    _STDERR[proc.pid] = (_STDERR.get(proc.pid, b"") + chunk)[-8192:]
    return json.loads(out.decode())


def _run_child(request: dict[str, Any], timeout_s: float, python: str) -> dict[str, Any]:
    """Answer ``request`` in a trace child: the prestarted one if it is free (it stays warm for
    the next request: the planner may ask for more traces), else a new one. A child in use is
    out of ``_WARM``, so threads tracing at once each get their own."""
    proc = _WARM.pop(python, None)
    if proc is None or proc.poll() is not None:
        proc = _spawn(python)
    try:
        answer = _ask(proc, request, timeout_s)
    except TimeoutError:
        recipe_file = request.get("recipe_file") or request["batch"][0]["recipe_file"]
        raise TraceTimeout(
            f"tracing {Path(recipe_file).name} took longer than {timeout_s:g} s",
            file=recipe_file, kind="timeout",
        ) from None
    if answer is None:
        _kill(proc)
        _, rest = proc.communicate()
        stderr = _STDERR.pop(proc.pid, b"").decode(errors="replace") + rest
        tail = "\n".join(stderr.strip().splitlines()[-5:])
        raise TraceError(
            f"the trace process exited with status {proc.returncode} without an answer"
            + (f": {tail}" if tail else ""),
            kind="crash", detail=stderr,
        )
    if python not in _WARM:
        _keep(python, proc)
    else:
        _kill(proc)
        proc.communicate()
    return answer


def _result(answer: dict[str, Any], request: dict[str, Any]) -> TraceResult:
    segments = {
        label: ([(int(p[0]), tuple(p[1:])) for p in seg["points"]], seg["ops"])
        for label, seg in answer["segments"].items()
    }
    boundary = {label: tuple(v) for label, v in answer["boundary"].items()}
    verify = sorted({b for b in request["verify_sizes"] if b not in request["micro_batch_sizes"]})
    answer = {**answer, **_fit(segments, boundary, answer["categories"],
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
        strategy=(request.get("strategy") or {}).get("name", "single"),
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


# ----------------------------------------------------------------------------------------------
# The fit: timelines -> lines in the micro-batch size. Pure numpy, no torch.


def _fit(
    segments: dict[str, tuple[list, list]],
    boundary: dict[str, tuple[int, ...]],
    categories: list[str],
    sizes: list[int],
    verify: list[int],
    b0: int,
) -> dict[str, Any]:
    """Turn the traced segments into lines ``bytes = intercept + slope * micro_batch``.

    Micro-batch part: sizes whose op sequences are identical form a group; in the largest group
    every op's point is fitted over the group's sizes (``alignment="op"``). Sizes outside it
    (usually 1) are kept as exact, directly traced points. Optimizer part: the points of ``b0``'s
    optimizer phase, each moved by the fitted boundary (bytes alive when the phase starts).
    Build and step 1 enter as constant lines (traced once; they do not grow with the batch).
    """
    import numpy as np  # here, not at import: the CLI imports this module

    ncat = len(categories)
    main = segments[f"b{b0}"][0]
    opt_points = np.array([v for p, v in main if p in _OPTIMIZER_PHASES],
                          dtype=np.float64).reshape(-1, ncat)
    fb = {b: [(p, v) for p, v in segments[f"b{b}"][0] if p in MICRO_PHASES]
          for b in sizes + verify}
    fb_ops = {
        b: [op for (p, _), op in zip(segments[f"b{b}"][0], segments[f"b{b}"][1], strict=True)
            if p in MICRO_PHASES]
        for b in sizes + verify
    }
    bound_at = {b: np.array(boundary[f"b{b}"], dtype=np.float64) for b in sizes + verify}
    const_lines = []
    for label in ("build", "step1"):
        timeline = segments[label][0]
        if timeline:
            i = int(np.argmax([sum(v) for _, v in timeline]))
            const_lines.append((np.array(timeline[i][1], dtype=np.float64), timeline[i][0], label))

    # --- exact values at every traced size (no fit) --------------------------------------
    def direct(b: int) -> tuple[tuple[np.ndarray, int, str], dict[int, list[float]]]:
        """The peak at a traced size, and the peak of each phase (for depth scaling)."""
        candidates: list[tuple[np.ndarray, int, str]] = [
            (np.array(v, dtype=np.float64), p, "step") for p, v in fb[b]
        ]
        shift = bound_at[b] - bound_at[b0]
        shift[-1] = 0.0  # scratch is per op, never carried
        candidates += [(v + shift, 3, "step") for v in opt_points]
        candidates += const_lines
        best = max(candidates, key=lambda c: c[0].sum())
        by_phase: dict[int, tuple[np.ndarray, int, str]] = {}
        for c in candidates:
            if c[1] not in by_phase or c[0].sum() > by_phase[c[1]][0].sum():
                by_phase[c[1]] = c
        return best, {ph: [float(x) for x in c[0]] for ph, c in by_phase.items()}

    per_size = {}
    for b in sizes + verify:
        (v, phase, seg), phases = direct(b)
        per_size[str(b)] = {"peak": float(v.sum()), "at_peak": [float(x) for x in v],
                            "phase": phase, "segment": seg, "ops": len(fb[b]),
                            "fit": False, "phases": phases}

    # --- the fit -------------------------------------------------------------------------
    groups: list[list[int]] = []
    for b in sizes:
        for g in groups:
            if fb_ops[g[0]] == fb_ops[b]:
                g.append(b)
                break
        else:
            groups.append([b])
    group = max(groups, key=lambda g: (len(g), max(g)))
    if len(group) >= 2:
        alignment = "op"
        xs = np.array(group, dtype=np.float64)
        values = np.array([[v for _, v in fb[b]] for b in group], dtype=np.float64)
        phases = [p for p, _ in fb[group[0]]]
    else:
        # No two sizes run exactly the same ops. Align them as sequences instead: runs of equal
        # ops pair point by point, each stretch that differs becomes one point (its maximum).
        alignment = "sequence"
        group = list(sizes)
        xs = np.array(group, dtype=np.float64)
        units, ranges = _align_sequences(fb_ops[group[-1]], [fb_ops[b] for b in group])
        values = np.array([
            [_range_max(fb[b], lo, hi) for lo, hi in ranges[k]] for k, b in enumerate(group)
        ], dtype=np.float64)
        ref = group[-1]
        phases = [fb[ref][min(lo, len(fb[ref]) - 1)][0] for lo, _ in ranges[-1]]
        del units
    for b in group:
        per_size[str(b)]["fit"] = True
    bounds = np.array([bound_at[b] for b in group])
    if len(xs) >= 2:
        slope, intercept = _linear_fit(xs, values)
        b_slope, b_intercept = _linear_fit(xs, bounds[:, None, :])
        b_slope, b_intercept = b_slope[0], b_intercept[0]
    else:
        slope, intercept = np.zeros_like(values[0]), values[0]
        b_slope, b_intercept = np.zeros(ncat), bounds[0]
    b_slope[-1] = 0.0
    fitted = intercept[None] + slope[None] * xs[:, None, None]
    resid = np.abs(fitted.sum(axis=2) - values.sum(axis=2))
    b_resid = np.abs((b_intercept[None] + b_slope[None] * xs[:, None]).sum(1) - bounds.sum(1))
    peak = max(info["peak"] for info in per_size.values())
    max_resid = float(max(resid.max() if resid.size else 0.0, b_resid.max()))

    all_c = [intercept[t] for t in range(intercept.shape[0])]
    all_s = [slope[t] for t in range(slope.shape[0])]
    all_phase = list(phases)
    all_seg = ["step"] * len(all_c)
    # optimizer-phase points: their value at b0, moved with the boundary's slope
    for v in opt_points:
        all_c.append(v - b_slope * b0)
        all_s.append(b_slope.copy())
        all_phase.append(3)
        all_seg.append("step")
    for v, phase, label in const_lines:
        all_c.append(v)
        all_s.append(np.zeros(ncat))
        all_phase.append(phase)
        all_seg.append(label)
    c_arr = np.array(all_c)
    s_arr = np.array(all_s)
    # Each phase's own upper envelope (their union holds the overall one): scaling a trace to
    # the model's real depth extrapolates every phase's peak, and the phase that is the peak at
    # two blocks need not be the one at thirty-two.
    phase_of = np.array(all_phase)
    keep = sorted(
        int(np.flatnonzero(phase_of == ph)[i])
        for ph in sorted(set(all_phase))
        for i in _upper_envelope(c_arr[phase_of == ph].sum(axis=1),
                                 s_arr[phase_of == ph].sum(axis=1), start=1.0)
    )
    lines = [{
        "intercept": [float(x) for x in c_arr[t]],
        "slope": [float(x) for x in s_arr[t]],
        "phase": int(all_phase[t]),
        "segment": all_seg[t],
    } for t in keep]
    verification = []
    for vb in verify:
        predicted = max(sum(ln["intercept"]) + vb * sum(ln["slope"]) for ln in lines)
        verification.append({"micro_batch": vb, "traced": per_size[str(vb)]["peak"],
                             "predicted": predicted})
    return {
        "categories": categories,
        "lines": lines,
        "alignment": alignment,
        "fit_sizes": group,
        "size_groups": groups,
        "fit_points": int(values.shape[1]),
        "max_residual_bytes": max_resid,
        "max_residual_fraction": max_resid / peak if peak else 0.0,
        "per_size": per_size,
        "verification": verification,
    }


def _range_max(timeline: list, lo: int, hi: int) -> list[int]:
    """The point of largest total in ``timeline[lo:hi]`` (the one before ``lo`` if empty)."""
    if hi <= lo:
        return list(timeline[max(lo - 1, 0)][1])
    return list(max((v for _, v in timeline[lo:hi]), key=sum))


def _align_sequences(ref: list, seqs: list[list]) -> tuple[int, list[list[tuple[int, int]]]]:
    """Split ``ref`` into units that every sequence in ``seqs`` matches, and give each sequence's
    index range for every unit.

    A unit is one op where all sequences agree (difflib "equal" runs), or one merged stretch
    where any of them differs from ``ref`` (a batch of 1 makes a view where a larger batch makes
    a copy). Returns (number of units, per sequence a list of (start, end) ranges).
    """
    from difflib import SequenceMatcher

    n = len(ref)
    bad: list[tuple[int, int]] = []
    opcodes = []
    for seq in seqs:
        codes = SequenceMatcher(None, ref, seq, autojunk=False).get_opcodes()
        opcodes.append(codes)
        for tag, i1, i2, _, _ in codes:
            if tag != "equal":
                bad.append((i1, i2) if i2 > i1 else (max(i1 - 1, 0), min(i1 + 1, n)))
    bad.sort()
    merged: list[list[int]] = []
    for a, b in bad:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    cuts: list[tuple[int, int]] = []
    i = 0
    for a, b in merged:
        cuts.extend((k, k + 1) for k in range(i, a))
        cuts.append((a, b))
        i = b
    cuts.extend((k, k + 1) for k in range(i, n))
    ranges = []
    for codes in opcodes:
        to_seq: dict[int, int] = {}
        for tag, i1, i2, j1, j2 in codes:
            if tag == "equal":
                for k in range(i1, i2 + 1):
                    to_seq[k] = j1 + (k - i1)
            else:
                to_seq.setdefault(i1, j1)
                to_seq[i2] = j2
        ranges.append([(to_seq[a], to_seq[b]) for a, b in cuts])
    return len(cuts), ranges


def _linear_fit(xs: Any, values: Any) -> tuple[Any, Any]:
    """Least-squares slope and intercept along axis 0 of ``values`` (sizes x points x cats)."""
    xm = xs.mean()
    dx = xs - xm
    slope = (dx[:, None, None] * (values - values.mean(axis=0))).sum(axis=0) / (dx**2).sum()
    return slope, values.mean(axis=0) - slope * xm


def _upper_envelope(c: Any, s: Any, start: float) -> list[int]:
    """Indices of the lines ``c + s*x`` that are the maximum for some ``x >= start``."""
    import numpy as np

    order = np.lexsort((c, s))  # by slope, then intercept
    hull: list[int] = []
    for i in order:
        i = int(i)
        while hull and s[hull[-1]] == s[i]:
            hull.pop()  # same slope, lower (or equal) intercept: never above
        while len(hull) >= 2:
            a, m = hull[-2], hull[-1]
            # m is never the maximum if i overtakes a no later than m does
            if (c[a] - c[i]) * (s[m] - s[a]) <= (c[a] - c[m]) * (s[i] - s[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    keep = []
    for k, i in enumerate(hull):
        if k + 1 < len(hull):
            j = hull[k + 1]
            if (c[i] - c[j]) / (s[j] - s[i]) < start:
                continue  # overtaken before ``start``
        keep.append(i)
    return keep
