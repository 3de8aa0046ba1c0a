"""The footprints the planner asks for: one per precision, optimizer and checkpointing.

``preflight`` decides what describes the script (a traced recipe, a Hugging Face config traced
or sized, a shape from ``--params``, the recipe's counted parameters) and hands the planner a
:class:`Footprints`. The planner calls it, and each footprint's ``rank_memory_at`` when it sizes
one rank of a sharded plan, without coming back into preflight: the plan path reads one way,
preflight -> planner -> footprints -> the trace children (``estimate/traced.py``).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher import strategies
from launcher.estimate.analytic import ModelShape
from launcher.estimate.footprint import Footprint, from_shape
from launcher.estimate.states import model_states
from launcher.options import env_seconds, env_word
from launcher.plan.plan import Memory, checkpointing_key
from launcher.remedies import CHECKPOINTING_ORDER
from launcher.script_info import ScriptInfo
from launcher.spec import Spec
from launcher.status import UsageError

#: Seconds a trace may take before the plan falls back to model states (LAUNCH_TRACE_TIMEOUT).
DEFAULT_TRACE_TIMEOUT_S = 120.0
#: All the rank traces of one preflight together (``LAUNCH_RANK_TRACE_BUDGET``, seconds). A rank
#: trace only sharpens a sharded plan near capacity (the scaled figure stands without it), and a
#: catalog search can ask for a dozen (strategies x world sizes x resharding x checkpointing),
#: each a child of its own: a 7B config spent over 15 minutes in them before this bound.
DEFAULT_RANK_TRACE_BUDGET_S = 90.0


def counted(info: ScriptInfo, precision: str, optimizer: str, checkpointing: bool
             ) -> Footprint:
    """A recipe's model states from its parameter count (built on the meta device)."""
    assert info.parameters is not None
    states = model_states(info.parameters, precision, optimizer,
                          trainable=info.trainable_parameters)

    def memory_at(_micro: int, _accum: int = 1) -> Memory:
        return Memory(parameters=states.parameters, gradients=states.gradients,
                      optimizer=states.optimizer)

    return Footprint(kind="traced", precision=precision, optimizer=optimizer,
                     activation_checkpointing=checkpointing, parameters=info.parameters,
                     memory_at=memory_at, unit_parameters=info.unit_parameters,
                     flops_per_sample=info.flops_per_sample,
                     note="activations are not estimated yet: the plan checks model states only")


def floor(info: ScriptInfo, precision: str, optimizer: str | None) -> Footprint | None:
    """What a recipe's model states take at least, without a trace: its weights as built
    (bf16 where the precision casts them), a gradient for every trained weight, and AdamW's two
    moments when the optimizer is known to be AdamW (``optimizer``: None, the recipe's own,
    counts none). Every byte of it is alive at a whole replica's optimizer step, so a rung that
    shards nothing and overflows on this alone overflows traced; the planner rejects it
    without tracing (``planner.plan_on``). None where the probe did not count the bytes."""
    if info.parameters is None or info.parameter_bytes is None or info.trainable_bytes is None:
        return None
    weights, trained = info.parameter_bytes, info.trainable_bytes
    if precision == "bf16":  # the templates cast floating weights to bf16: at most 2 B each
        weights = min(weights, 2 * info.parameters)
        trained = min(trained, 2 * (info.trainable_parameters or 0))
    moments = 2 * trained if optimizer == "adamw" else 0

    def memory_at(_micro: int, _accum: int = 1) -> Memory:
        return Memory(parameters=weights, gradients=trained, optimizer=moments)

    return Footprint(kind="traced", precision=precision, optimizer=optimizer or "adamw",
                     activation_checkpointing=False, parameters=info.parameters,
                     memory_at=memory_at, unit_parameters=info.unit_parameters,
                     flops_per_sample=info.flops_per_sample,
                     note="model states counted without a trace: a lower bound")


#: The micro-batches every trace fits its lines through.
FIT_SIZES = (1, 2, 4)


def trace_options(spec: Spec, environ: dict[str, str], captured: bool = False
                   ) -> dict[str, Any]:
    """What every trace of a preflight shares (a recipe's, a Hugging Face config's): the sizes
    fitted, the accumulation traced, the time limit, the spec's training settings.

    A captured script's own micro-batch is traced too (``verify_sizes``: a traced size answers
    from its own record, not the lines): the plan that keeps the script's batch, which is the
    one the planner tries first, is then the step as it runs, not an extrapolation from 1, 2
    and 4. The lines miss what does not grow with the batch: a CPU kernel's scratch (mnist's
    backward: 3.7 MB of oneDNN scratch at 64 that micro-batches 1 to 4 never reach, -3.65%;
    a ResNet's, which shrinks past 4: +19.6%), a kernel chosen by size."""
    own = (spec.micro_batch_size or spec.global_batch_size) if captured else None
    return dict(
        micro_batch_sizes=FIT_SIZES, grad_accum_steps=2,
        verify_sizes=(own,) if own is not None and own not in FIT_SIZES else (),
        timeout_s=env_seconds(environ, "LAUNCH_TRACE_TIMEOUT", DEFAULT_TRACE_TIMEOUT_S),
        max_grad_norm=spec.max_grad_norm, lr=spec.lr, weight_decay=spec.weight_decay,
        seed=spec.seed, scale_depth=env_word(environ, "LAUNCH_TRACE_DEPTH") != "full",
        foreach=None if spec.optimizer_impl is None else spec.optimizer_impl == "foreach")


class Budget:
    """Seconds left for the rank traces of one preflight, shared by all its footprints."""

    def __init__(self, seconds: float):
        self.left = seconds
        self.skipped = 0

    def note(self) -> str | None:
        if not self.skipped:
            return None
        return (f"{self.skipped} sharded plan(s) near capacity keep the scaled estimate: the "
                f"rank traces used their time (LAUNCH_RANK_TRACE_BUDGET)")


class Ahead:
    """The rank traces of one preflight asked for ahead of the plan that reads them.

    The planner asks for a rank trace one at a time, each once the answer before it is read
    (the 7B's ZeRO-2 rank without checkpointing, then with it: two rounds of the trace child,
    each with a core idle while the shallower depth waits for the deeper). So ``preflight``
    first runs the planner on the sharded estimates alone (``collecting``: every rank the
    planner asks for is noted and answered None, as a rank without a trace is), then traces
    what it noted, ``CHUNK`` ranks to a request (``flush``: two workers at a time, each next one
    started as one ends), and then plans for real. The real run finds those traces done; a rank the
    sharded estimates did not lead to (a rank's answer changed the path) is traced when asked,
    as before. What the first run noted and the real one never read is the price: a rank whose
    sharded estimate overflowed and whose trace fits."""

    def __init__(self) -> None:
        self.collecting = False
        #: noted while collecting: (recipe, options, rank key) -> what to trace
        self.wishes: dict[tuple[str, str, tuple[Any, ...]], dict[str, Any]] = {}
        #: traced by ``flush``: (recipe, options, rank key) -> the trace, or None
        self.done: dict[tuple[str, str, tuple[Any, ...]], Any] = {}

    #: Ranks traced per request: the 7B's two in one; a catalog search's dozen in several, so
    #: that the budget is checked between them and one that runs out keeps what finished.
    CHUNK = 2

    def flush(self, budget: Budget | None) -> None:
        """Trace every rank noted, ``CHUNK`` to a request of the trace child (whose workers run
        two at a time), in the order the planner asked for them."""
        from launcher.estimate.traced import TraceError, TraceTimeout, trace_recipe_configs

        wishes, self.wishes = self.wishes, {}
        by_recipe: dict[str, list[tuple[str, str, tuple[Any, ...]]]] = {}
        for k in wishes:
            by_recipe.setdefault(k[0], []).append(k)
        chunks = [keys[i:i + self.CHUNK] for keys in by_recipe.values()
                  for i in range(0, len(keys), self.CHUNK)]
        for chunk in chunks:
            configs = [dict(wishes[k]) for k in chunk]
            timeout = sum(c.pop("timeout_s") for c in configs)  # each trace's own limit
            if budget is not None:
                if budget.left < 5.0:  # not worth a child: the scaled figures stand
                    budget.skipped += len(chunk)
                    self.done.update(dict.fromkeys(chunk))
                    continue
                timeout = min(timeout, budget.left)
            started = time.monotonic()
            try:
                found: list[Any] = trace_recipe_configs(chunk[0][0], configs, timeout_s=timeout)
            except TraceError:  # a timeout or a crash of the child: all of the chunk
                found = [None] * len(chunk)
            self.done.update({k: None if isinstance(t, (TraceError, TraceTimeout)) else t
                              for k, t in zip(chunk, found, strict=True)})
            if budget is not None:
                budget.left -= time.monotonic() - started


def rank_traces(recipe: Path, options: dict[str, Any], budget: Budget | None = None,
                ahead: Ahead | None = None
                ) -> Callable[[str, int, int, int, int], Memory | None]:
    """``Footprint.rank_memory_at`` for a traceable recipe: one rank of a sharded strategy traced
    at its world size (a fake process group; the rendered script's own wrapping), once per
    strategy, world size, side of accumulation and the micro-batches traced. A trace that fails
    or runs out of time answers None: the planner keeps its scaled estimate.

    A rank is traced at the micro-batch the planner asks about and at half of it, not at the
    sizes a line is fitted through: the planner asks a rank about the plan it is about to take
    (or one near capacity), and when that rank does not fit, about the next smaller
    micro-batch of the same rung (a divisor of the batch: half of it, where the batch is a
    power of two). Each answer is its own size's record (at micro-batch 1, the last of a
    rung, the only one); the allocator is replayed at the larger size, whose ratio the smaller
    carries. The rank's two depths run in two processes (``traced._forking``)."""
    from launcher.estimate.trace_result import ScaledTrace
    from launcher.estimate.traced import TraceError, trace_recipe

    Key = tuple[str, int, int, bool, bool, tuple[int, ...]]
    traces: dict[Key, Any] = {}
    whole: set[Key] = set()  # traced whole, or tried
    # what ``ahead`` knows these traces by: the recipe and every option of the footprint
    mine = (str(recipe), json.dumps(options, sort_keys=True, default=str))

    def rank_memory_at(strategy: str, nodes: int, gpus: int, micro: int, accum: int,
                       reshard_after_forward: bool = True) -> Memory | None:
        world = nodes * gpus
        replicas = strategies.get(strategy).replicas(nodes)  # a shard group per node
        rank = (strategy, world, replicas, accum > 1, reshard_after_forward)
        sizes = (micro,) if micro == 1 else (micro // 2, micro)
        if ahead is not None:  # what a flush traced for this footprint, taken in
            for k in [k for k in ahead.done if k[:2] == mine]:
                traces.setdefault(k[2], ahead.done.pop(k))
        key = _covering(traces, rank, micro) or (*rank, sizes)

        def request(key: Key) -> dict[str, Any]:
            """``trace_recipe``'s arguments for the rank traced as ``key``."""
            return {**options, "grad_accum_steps": 2 if accum > 1 else 1,
                    "micro_batch_sizes": key[5], "verify_sizes": (),
                    "strategy": {"name": strategy, "world_size": world, "replicas": replicas,
                                 "reshard_after_forward": reshard_after_forward}}

        if ahead is not None and ahead.collecting:
            if key not in traces:
                noted = _covering({k[2]: None for k in ahead.wishes if k[:2] == mine}, rank,
                                 micro) or key
                ahead.wishes.setdefault((*mine, noted), request(noted))
                return None  # as a rank without a trace: the scaled figure stands

        def trace(**whole: bool) -> None:
            timeout = options["timeout_s"]
            if budget is not None:
                if budget.left < 5.0:  # not worth a child: the scaled figure stands
                    budget.skipped += 1
                    traces.setdefault(key, None)
                    return
                timeout = min(timeout, budget.left)
            started = time.monotonic()
            try:
                traces[key] = trace_recipe(recipe, **{**request(key), "timeout_s": timeout,
                                                      **whole})
            except TraceError:  # TraceTimeout included
                traces.setdefault(key, None)
            if budget is not None:
                budget.left -= time.monotonic() - started

        if key not in traces:
            trace()  # depth-scaled (4 and 6 blocks) where the model has a stack
        found = traces[key]
        if isinstance(found, ScaledTrace) and found.moment_moved(micro, accum):
            # the two depths disagree on the peak's moment: this rank, whole (seconds more)
            if key not in whole:
                whole.add(key)
                trace(scale_depth=False)
            found = traces[key]
            if isinstance(found, ScaledTrace):
                return None  # the whole trace failed or had no time: the scaled figure stands
        return None if found is None else found.memory_at(micro, accum)

    return rank_memory_at


def _covering(keys: Any, rank: tuple[Any, ...], micro: int) -> Any:
    """The first of ``keys`` (rank keys: the rank, then the micro-batches traced) for ``rank``
    whose sizes hold ``micro``, or None: a trace at 1 and 2 answers a question at 1."""
    return next((k for k in keys if k[:5] == rank and micro in k[5]), None)


def _stacked(options: dict[str, Any], trace: Any) -> bool:
    """Whether a rank of the model traced as ``trace`` is depth-scaled: where the single device
    was (its stack was found and cut). A rank trace that is depth-scaled runs its two depths in
    two processes (``traced._forking``); a model without a stack would be traced whole by
    both, so its rank is not asked to scale and its two halves are split as a single
    device's are."""
    from launcher.estimate.trace_result import ScaledTrace

    return bool(options["scale_depth"]) and isinstance(trace, ScaledTrace)


def optimizer_pinned(spec: Spec, info: ScriptInfo) -> bool:
    """Whether the step runs the plan's optimizer, not the recipe's own: the templates use the
    recipe's build_optimizer unless the optimizer is pinned, and so does the trace. A framework
    script's own optimizer (the spec names it) is not a pin: the recipe made from what it built
    rebuilds it with its settings (SGD's momentum)."""
    return (spec.optimizer is not None and (spec.framework is None or "optimizer" in spec.pinned)
            ) or "build_optimizer" not in info.hooks


def traced(spec: Spec, info: ScriptInfo, precision: str, optimizer: str,
            variants: tuple[bool, ...], device: str, environ: dict[str, str],
            budget: Budget | None = None, ahead: Ahead | None = None
            ) -> dict[bool, Footprint | UsageError]:
    """The recipe's own training step traced on fake tensors (see estimate/traced.py), with and
    without activation checkpointing (``variants``) in one child: torch is imported once, and
    the planner nearly always asks for both.

    A trace that cannot finish in time falls back to the counted model states, with a note; an
    error in the user's code is theirs to fix and stops the launch with its file and line (when
    the planner asks for that variant).
    """
    from launcher.estimate.traced import TraceError, TraceTimeout, trace_recipe_configs

    pinned = optimizer_pinned(spec, info)
    options = trace_options(spec, environ, captured=info.framework_recipe is not None)
    timeout = options["timeout_s"]
    try:
        traces = trace_recipe_configs(
            # FLOPs from the plain variant: cost.py adds checkpointing's recomputation itself.
            spec.script, [{"activation_checkpointing": v,
                           "count_flops": info.flops_per_sample is None and not v}
                          for v in variants],
            precision=precision, optimizer=optimizer if pinned else None, device=device,
            **options)
    except TraceTimeout:
        return {v: replace(counted(info, precision, optimizer, v),
                           note=f"the trace took longer than {timeout:.0f} s "
                           "(LAUNCH_TRACE_TIMEOUT): the plan checks model states only")
                for v in variants}
    except TraceError as exc:
        traces = [exc] * len(variants)
    flops = info.flops_per_sample or next(
        (t.flops_per_sample for v, t in zip(variants, traces, strict=True)
         if not v and not isinstance(t, TraceError)), None)
    out: dict[bool, Footprint | UsageError] = {}
    for checkpointing, trace in zip(variants, traces, strict=True):
        if isinstance(trace, TraceError):
            where = f"{Path(trace.file).name}:{trace.line}: " if trace.file and trace.line else ""
            out[checkpointing] = UsageError(
                f"tracing the recipe failed: {where}{trace.message}",
                "fix the script, or set LAUNCH_NO_TRACE=1 to plan on model states only")
            continue
        note = "; ".join(trace.notes[:2]) if trace.is_bound else ""
        out[checkpointing] = Footprint(
            kind="upper_bound" if trace.is_bound else "traced", precision=precision,
            optimizer=optimizer, activation_checkpointing=checkpointing,
            parameters=trace.parameters, memory_at=trace.memory_at,
            unit_parameters=info.unit_parameters,
            flops_per_sample=flops, note=note, phases_at=trace.phase_memories_at,
            optimizer_class=None if pinned else trace.optimizer_class,
            rank_memory_at=rank_traces(spec.script, {
                **options, "precision": precision, "optimizer": optimizer if pinned else None,
                "activation_checkpointing": checkpointing, "device": device,
                "scale_depth": _stacked(options, trace)}, budget, ahead))
    return out


def hf_traced(spec: Spec, shape: ModelShape, precision: str, optimizer: str,
               checkpointing: bool, device: str, environ: dict[str, str],
               state_dir: Path | None, failed: dict[str, str],
               budget: Budget | None = None, ahead: Ahead | None = None) -> Footprint:
    """A ``--model-config`` built by transformers and traced (see estimate/hf_recipe.py).

    The recipe is written under the state dir; the analytic shape keeps the FSDP unit and the
    FLOPs. Whatever stops the trace (an architecture transformers does not know, a timeout) falls
    back to the analytic estimate with a note, once for all the configurations planned.
    """
    from launcher.estimate.hf_recipe import write_recipe
    from launcher.estimate.traced import TraceError, TraceTimeout, trace_recipe

    analytic = from_shape(shape, precision=precision, optimizer=optimizer,
                          checkpointing=checkpointing, kind="config",
                          optimizer_implementation=spec.optimizer_impl or "foreach")
    options = trace_options(spec, environ)
    timeout = options["timeout_s"]
    if "note" not in failed:
        try:
            recipe = write_recipe(spec.model_config, shape.seq_len,  # type: ignore[arg-type]
                                  recipe_folder(state_dir), attention=spec.attention)
            trace = trace_recipe(
                recipe, precision=precision, optimizer=optimizer,
                activation_checkpointing=checkpointing, device=device,  # type: ignore[arg-type]
                **options)
        except TraceTimeout:
            failed["note"] = (f"tracing the config with transformers took longer than "
                              f"{timeout:.0f} s (LAUNCH_TRACE_TIMEOUT)")
        except (TraceError, OSError, ValueError) as exc:
            failed["note"] = ("transformers could not build and trace the config ("
                              f"{getattr(exc, 'message', exc)})")
        else:
            note = "; ".join(trace.notes[:2]) if trace.is_bound else ""
            return replace(analytic, kind="upper_bound" if trace.is_bound else "traced",
                           parameters=trace.parameters, memory_at=trace.memory_at, note=note,
                           phases_at=trace.phase_memories_at,
                           rank_memory_at=rank_traces(recipe, {
                               **options, "precision": precision, "optimizer": optimizer,
                               "activation_checkpointing": checkpointing, "device": device,
                               "scale_depth": _stacked(options, trace)}, budget, ahead))
    note = f"{failed['note']}: the estimate is analytic"
    return replace(analytic, note="; ".join(n for n in (note, analytic.note) if n))


def recipe_folder(state_dir: Path | None) -> Path:
    """Where the recipes made from Hugging Face configs are written: the state dir's
    ``hf_recipes/`` (one folder per config and length, reused), else a new temporary one."""
    return (state_dir / "hf_recipes" if state_dir is not None
            else Path(tempfile.mkdtemp(prefix="launch-hf-")))


class Footprints:
    """The planner's estimator for one preflight: ``footprints(precision, optimizer,
    checkpointing)`` is the script's footprint so, from what describes it best (``preflight``
    says which: ``shape`` and ``hf_trace`` for a config or ``--params``, ``trace`` for a recipe,
    else the counted parameters). Each answer is kept: the planner asks the same ones many
    times. The traces of a recipe run without and with selective checkpointing in one child
    (the next rung the ladder asks for after the plain step, on a replica or sharded), full
    checkpointing with them when asked first, else in a child of its own (its FLOPs are the
    plain variant's: cost.py adds the recomputation); a pinned mode is the only one the planner
    asks for, so nothing else is traced. ``floor`` is a recipe's model states without a trace,
    for the rungs they alone overflow."""

    def __init__(self, spec: Spec, info: ScriptInfo, *, traced_spec: Spec,
                 shape: ModelShape | None, source: str, hf_trace: bool, trace: bool,
                 can_checkpoint: bool, pinned: str | None, device: str,
                 environ: dict[str, str], state_dir: Path | None, budget: Budget) -> None:
        self.spec, self.info, self.traced_spec = spec, info, traced_spec
        self.shape, self.source, self.hf_trace, self.trace = shape, source, hf_trace, trace
        self.can_checkpoint, self.pinned, self.device = can_checkpoint, pinned, device
        self.environ, self.state_dir, self.budget = environ, state_dir, budget
        self.ahead = Ahead()
        self._traced: dict[tuple[str, str], dict[bool, Footprint | UsageError]] = {}
        self._hf_failed: dict[str, str] = {}
        self._answers: dict[tuple[str, str, bool], Footprint] = {}

    def __call__(self, precision: str, optimizer: str, checkpointing: Any) -> Footprint:
        key = (precision, optimizer, checkpointing)
        if key not in self._answers:  # an error is raised again each time, as it was asked
            self._answers[key] = self._footprint(precision, optimizer, checkpointing)
        return self._answers[key]

    def _footprint(self, precision: str, optimizer: str, checkpointing: Any) -> Footprint:
        spec, shape = self.spec, self.shape
        if shape is not None and self.hf_trace:
            return hf_traced(spec, shape, precision, optimizer, checkpointing, self.device,
                             self.environ, self.state_dir, self._hf_failed, self.budget,
                             self.ahead)
        if shape is not None:
            return from_shape(shape, precision=precision, optimizer=optimizer,
                              checkpointing=checkpointing, kind=self.source,
                              optimizer_implementation=spec.optimizer_impl or "foreach")
        if not self.trace:
            return counted(self.info, precision, optimizer, checkpointing)
        key = (precision, optimizer)
        if key not in self._traced or checkpointing not in self._traced[key]:
            both = self.can_checkpoint and self.pinned is None and key not in self._traced
            paired = (False, checkpointing_key(CHECKPOINTING_ORDER[1])) if both else ()
            variants = tuple(dict.fromkeys(paired + (checkpointing,)))
            done = self._traced.setdefault(key, {})
            for v, fp in traced(self.traced_spec, self.info, precision, optimizer, variants,
                                self.device, self.environ, self.budget, self.ahead).items():
                plain = done.get(False)
                if (isinstance(fp, Footprint) and fp.flops_per_sample is None
                        and isinstance(plain, Footprint)):
                    fp = replace(fp, flops_per_sample=plain.flops_per_sample)
                done[v] = fp
        footprint = self._traced[key][checkpointing]
        if isinstance(footprint, UsageError):
            raise footprint
        return footprint

    def floor(self, precision: str, optimizer: str) -> Footprint | None:
        """The model states a traced recipe needs at least (``floor``), known without a trace;
        None where the footprint costs no trace anyway (a shape, a config) or the probe did not
        count them."""
        if self.shape is not None or not self.trace:
            return None
        known = optimizer_pinned(self.traced_spec, self.info)
        return floor(self.info, precision, optimizer if known else None)
