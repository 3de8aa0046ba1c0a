"""Preflight: from what the user asked to a plan, before anything runs or costs money.

It picks the estimate that the input allows (a recipe is traced; a plain script is described by
``--model-config`` or ``--params``), the machines of the provider, and asks the planner.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launcher import remedies, strategies
from launcher.estimate.analytic import ModelShape
from launcher.estimate.calibration import model_key
from launcher.estimate.footprint import Footprint, from_shape
from launcher.estimate.model_config import (
    ASSUMED_FROM,
    UnsupportedModelType,
    assumed_shape,
    load_config,
    max_positions,
    shape_from_params,
)
from launcher.estimate.states import model_states
from launcher.options import check_environment, env_flag, env_seconds, env_word
from launcher.plan.memory import Target
from launcher.plan.plan import Memory, Plan
from launcher.plan.planner import PlanResult, plan, reevaluate
from launcher.plan.targets import calibrated, cloud_targets, local_target
from launcher.script_info import ScriptInfo, plain_reads
from launcher.spec import Spec
from launcher.status import UsageError

#: Seconds a trace may take before the plan falls back to model states (LAUNCH_TRACE_TIMEOUT).
DEFAULT_TRACE_TIMEOUT_S = 120.0
#: All the rank traces of one preflight together (``LAUNCH_RANK_TRACE_BUDGET``, seconds). A rank
#: trace only sharpens a sharded plan near capacity (the scaled figure stands without it), and a
#: catalog search can ask for a dozen (strategies x world sizes x resharding x checkpointing),
#: each a child of its own: a 7B config spent over 15 minutes in them before this bound.
DEFAULT_RANK_TRACE_BUDGET_S = 90.0


def describe(spec: Spec, info: ScriptInfo) -> tuple[ModelShape | None, str, str]:
    """The model's shape from a config file or --params, the contract's ``source``, and a note
    when the shape is assumed (``--params`` alone: ``model_config.assumed_shape``, a published
    Llama shape of that size, so that the plan can say whether it fits)."""
    if spec.model_config is not None:
        return load_config(spec.model_config, seq_len=spec.seq_len,
                           attention=spec.attention), "config", ""
    if spec.params is not None:
        if spec.params >= ASSUMED_FROM and all(
                v is None for v in (spec.layers, spec.hidden_size, spec.heads, spec.vocab_size)):
            assumed = assumed_shape(spec.params, seq_len=spec.seq_len, attention=spec.attention)
            return assumed.shape, "declared", assumed.note
        return shape_from_params(spec.params, layers=spec.layers, hidden=spec.hidden_size,
                                 heads=spec.heads, vocab=spec.vocab_size,
                                 seq_len=spec.seq_len, attention=spec.attention), "declared", ""
    return None, "traced", ""


def _counted(info: ScriptInfo, precision: str, optimizer: str, checkpointing: bool
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


#: The micro-batches every trace fits its lines through.
FIT_SIZES = (1, 2, 4)


def _trace_options(spec: Spec, environ: dict[str, str], captured: bool = False
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


class _Budget:
    """Seconds left for the rank traces of one preflight, shared by all its footprints."""

    def __init__(self, seconds: float):
        self.left = seconds
        self.skipped = 0

    def note(self) -> str | None:
        if not self.skipped:
            return None
        return (f"{self.skipped} sharded plan(s) near capacity keep the scaled estimate: the "
                f"rank traces used their time (LAUNCH_RANK_TRACE_BUDGET)")


def _rank_traces(recipe: Path, trace_options: dict[str, Any], budget: _Budget | None = None
                 ) -> Callable[[str, int, int, int, int], Memory | None]:
    """``Footprint.rank_memory_at`` for a traceable recipe: one rank of a sharded strategy traced
    at its world size (a fake process group; the rendered script's own wrapping), once per
    strategy, world size and side of accumulation (a trace answers every micro-batch). A trace
    that fails or runs out of time answers None: the planner keeps its scaled estimate."""
    from launcher.estimate.trace_result import ScaledTrace
    from launcher.estimate.traced import TraceError, trace_recipe

    traces: dict[tuple[str, int, int, bool, bool], Any] = {}
    whole: set[tuple[str, int, int, bool, bool]] = set()  # traced whole, or tried

    def rank_memory_at(strategy: str, nodes: int, gpus: int, micro: int, accum: int,
                       reshard_after_forward: bool = True) -> Memory | None:
        world = nodes * gpus
        replicas = strategies.get(strategy).replicas(nodes)  # a shard group per node
        key = (strategy, world, replicas, accum > 1, reshard_after_forward)

        def trace(**whole: bool) -> None:
            timeout = trace_options["timeout_s"]
            if budget is not None:
                if budget.left < 5.0:  # not worth a child: the scaled figure stands
                    budget.skipped += 1
                    traces.setdefault(key, None)
                    return
                timeout = min(timeout, budget.left)
            started = time.monotonic()
            try:
                traces[key] = trace_recipe(
                    recipe, **{**trace_options, "grad_accum_steps": 2 if accum > 1 else 1,
                               "timeout_s": timeout, **whole},
                    strategy={"name": strategy, "world_size": world, "replicas": replicas,
                              "reshard_after_forward": reshard_after_forward})
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


def _traced(spec: Spec, info: ScriptInfo, precision: str, optimizer: str,
            variants: tuple[bool, ...], device: str, environ: dict[str, str],
            budget: _Budget | None = None) -> dict[bool, Footprint | UsageError]:
    """The recipe's own training step traced on fake tensors (see estimate/traced.py), with and
    without activation checkpointing (``variants``) in one child: torch is imported once, and
    the planner nearly always asks for both.

    A trace that cannot finish in time falls back to the counted model states, with a note; an
    error in the user's code is theirs to fix and stops the launch with its file and line (when
    the planner asks for that variant).
    """
    from launcher.estimate.traced import TraceError, TraceTimeout, trace_recipe_configs

    # The templates use the recipe's build_optimizer unless the optimizer is pinned: so does
    # the trace. A framework script's own optimizer (the spec names it) is not a pin: the
    # recipe made from what it built rebuilds it with its settings (SGD's momentum).
    pinned = (spec.optimizer is not None and (spec.framework is None or "optimizer" in spec.pinned)
              ) or "build_optimizer" not in info.hooks
    options = _trace_options(spec, environ, captured=info.framework_recipe is not None)
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
        return {v: replace(_counted(info, precision, optimizer, v),
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
            rank_memory_at=_rank_traces(spec.script, {
                **options, "precision": precision, "optimizer": optimizer if pinned else None,
                "activation_checkpointing": checkpointing, "device": device}, budget))
    return out


def _hf_traced(spec: Spec, shape: ModelShape, precision: str, optimizer: str,
               checkpointing: bool, device: str, environ: dict[str, str],
               state_dir: Path | None, failed: dict[str, str],
               budget: _Budget | None = None) -> Footprint:
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
    options = _trace_options(spec, environ)
    timeout = options["timeout_s"]
    if "note" not in failed:
        try:
            recipe = write_recipe(spec.model_config, shape.seq_len,  # type: ignore[arg-type]
                                  _recipe_folder(state_dir), attention=spec.attention)
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
                           rank_memory_at=_rank_traces(recipe, {
                               **options, "precision": precision, "optimizer": optimizer,
                               "activation_checkpointing": checkpointing, "device": device},
                               budget))
    note = f"{failed['note']}: the estimate is analytic"
    return replace(analytic, note="; ".join(n for n in (note, analytic.note) if n))


@dataclass(frozen=True)
class _Planning:
    """What the planner is asked with: the spec as planned (a framework's own settings, an
    assumed length), the footprint of each precision, optimizer and checkpointing
    (``estimator``), the machines, and what the plan's notes say of them."""

    spec: Spec
    info: ScriptInfo
    estimator: Callable[[str, str, Any], Footprint]
    targets: list[Target]
    parameters: int | None
    source: str
    can_checkpoint: bool
    assumed: str
    budget: _Budget


def preflight(spec: Spec, info: ScriptInfo, state_dir: Path | None = None,
              environ: dict[str, str] | None = None) -> PlanResult:
    """The plan for ``spec``: every candidate the planner searched, the chosen one, and why
    each other was rejected."""
    p = _planning(spec, info, state_dir, environ)
    result = plan(p.spec, p.estimator, p.targets, p.spec.provider, parameters=p.parameters,
                  source=p.source, can_checkpoint=p.can_checkpoint)
    result.notes.extend(n for n in p.info.notes if n not in result.notes)
    if p.assumed:
        result.notes.insert(0, p.assumed)
    if p.budget.note() is not None:
        result.notes.append(p.budget.note())  # type: ignore[arg-type]
    return result


def reprice(spec: Spec, info: ScriptInfo, fixed: Plan, state_dir: Path | None = None,
            environ: dict[str, str] | None = None) -> Plan:
    """``fixed`` (a remedy's change of a failed plan) with its memory, fit, step time and cost
    worked out by the planner for the plan that will run, not kept from the plan it replaces
    (a checkpointed plan recomputes, a smaller micro-batch takes more steps of the optimizer's
    accumulation: the budget is checked against what the fixed plan costs). Its machine no
    longer offered (a catalog changed under a long run) leaves ``fixed`` as it is."""
    p = _planning(spec, info, state_dir, environ)
    target = next((t for t in p.targets if t.name == fixed.machine), None)
    if target is None:
        return fixed
    return reevaluate(p.spec, p.estimator, target, fixed)


def _planning(spec: Spec, info: ScriptInfo, state_dir: Path | None,
              environ: dict[str, str] | None) -> _Planning:
    if info.framework is not None:
        spec = _framework_spec(spec, info)
    environ = dict(os.environ if environ is None else environ)
    check_environment(environ)  # whichever path below would read a bad value
    described = False
    assumed = ""
    try:
        shape, source, assumed = describe(spec, info)
        described = shape is not None
    except UnsupportedModelType as exc:
        info = _config_recipe(spec, info, environ, state_dir, exc)
        shape, source, described = None, "config", True
    if assumed and shape is not None and spec.seq_len is None:
        # the plan runs at the length its shape was sized at, and says where it came from
        spec = replace(spec, seq_len=shape.seq_len, origins={
            **spec.origins, "seq_len": "assumed with the shape; --seq-len changes it"})
    if spec.provider == "local":
        targets = [local_target(spec, info.hardware)]
    else:
        targets = cloud_targets(spec.provider, spec)
    device = "cpu" if targets and all(t.cpu for t in targets) else "cuda"
    trace = ((info.mode == "recipe" or info.framework_recipe is not None) and shape is None
             and not env_flag(environ, "LAUNCH_NO_TRACE"))
    # A framework script is traced through the recipe made from what it built.
    traced_spec = spec if info.framework_recipe is None else replace(
        spec, script=info.framework_recipe)
    # A config transformers can build is traced like a recipe (importlib: no import here).
    hf_trace = (shape is not None and spec.model_config is not None and shape.seq_len is not None
                and not env_flag(environ, "LAUNCH_NO_TRACE")
                and importlib.util.find_spec("transformers") is not None)
    hf_failed: dict[str, str] = {}

    traced: dict[tuple[str, str], dict[bool, Footprint | UsageError]] = {}
    # A described plain script checkpoints by the contract's LAUNCH_CHECKPOINTING; a recipe is
    # checkpointed by the template, which needs its wrap_modules() whatever describes it.
    can_checkpoint = remedies.can_checkpoint(
        info.hooks, described=described and info.mode == "script")
    reads = plain_reads(spec) if info.captured else None
    if reads is not None and not {*remedies.REACHED_BY[remedies.CHECKPOINTING.name],
                                  "LAUNCH_PLAN"} & reads:
        # A captured plain script runs as it is: its blocks are checkpointed only where it reads
        # the plan's checkpointing itself, so no plan of it is checkpointed (nor traced so: one
        # trace, not two, of its step)
        can_checkpoint = False
    pinned = _pinned_checkpointing(spec)
    if pinned not in (None, "none") and not can_checkpoint and reads is not None:
        raise UsageError(
            f"{spec.script.name} runs as it is and reads neither LAUNCH_CHECKPOINTING nor "
            f"LAUNCH_PLAN, so launch cannot checkpoint its blocks ({pinned} checkpointing was "
            "asked for)", "checkpoint them in the script (torch.utils.checkpoint), or drop the pin")
    if pinned not in (None, "none") and not can_checkpoint:
        raise UsageError(
            f"{spec.script.name} defines no wrap_modules(), so its blocks cannot be "
            f"checkpointed ({pinned} checkpointing was asked for)",
            "add wrap_modules() returning the block classes, or drop the checkpointing pin")
    budget = _Budget(env_seconds(environ, "LAUNCH_RANK_TRACE_BUDGET",
                                 DEFAULT_RANK_TRACE_BUDGET_S))

    @functools.cache
    def estimator(precision: str, optimizer: str, checkpointing: bool) -> Footprint:
        if shape is not None and hf_trace:
            return _hf_traced(spec, shape, precision, optimizer, checkpointing, device, environ,
                              state_dir, hf_failed, budget)
        if shape is not None:
            return from_shape(shape, precision=precision, optimizer=optimizer,
                              checkpointing=checkpointing, kind=source,
                              optimizer_implementation=spec.optimizer_impl or "foreach")
        if trace:
            key = (precision, optimizer)
            if key not in traced or checkpointing not in traced[key]:
                # without and with full checkpointing in one child (the planner nearly always
                # asks for both), selective with them when asked first, else in a child of its
                # own (its FLOPs are the plain variant's: cost.py adds the recomputation)
                # (a pinned mode is the only one the planner asks for: nothing else is traced)
                variants = tuple(dict.fromkeys(
                    ((False, True) if can_checkpoint and pinned is None and key not in traced
                     else ()) + (checkpointing,)))
                done = traced.setdefault(key, {})
                for v, fp in _traced(traced_spec, info, precision, optimizer, variants, device,
                                     environ, budget).items():
                    plain = done.get(False)
                    if (isinstance(fp, Footprint) and fp.flops_per_sample is None
                            and isinstance(plain, Footprint)):
                        fp = replace(fp, flops_per_sample=plain.flops_per_sample)
                    done[v] = fp
            footprint = traced[key][checkpointing]
            if isinstance(footprint, UsageError):
                raise footprint
            return footprint
        return _counted(info, precision, optimizer, checkpointing)

    return _Planning(
        spec=spec, info=info, estimator=estimator,
        targets=calibrated(targets, state_dir, model_key(spec.script)),
        parameters=shape.parameters if shape is not None else info.parameters, source=source,
        can_checkpoint=can_checkpoint, assumed=assumed, budget=budget)


def _recipe_folder(state_dir: Path | None) -> Path:
    """Where the recipes made from Hugging Face configs are written: the state dir's
    ``hf_recipes/`` (one folder per config and length, reused), else a new temporary one."""
    return (state_dir / "hf_recipes" if state_dir is not None
            else Path(tempfile.mkdtemp(prefix="launch-hf-")))


def _config_recipe(spec: Spec, info: ScriptInfo, environ: dict[str, str],
                   state_dir: Path | None, error: UnsupportedModelType) -> ScriptInfo:
    """A ``--model-config`` of an architecture the analytic sizer does not know (Gemma 2, OPT,
    Falcon, OLMo, DeepSeek, Mamba...), as the recipe transformers builds from it
    (estimate/hf_recipe.py): ``info`` with that recipe to trace in place of the script, as a
    framework script's generated recipe is, and its size as the recipe probe counts it on the
    meta device (exact parameters, the largest block as FSDP's unit). The script that runs is
    still the user's. ``error`` is raised, with what would lift it, where this cannot be done:
    tracing off, transformers not installed, no sequence length, or an architecture
    transformers does not know either."""
    from launcher.estimate.hf_recipe import write_recipe
    from launcher.recipe import inspect_script
    from launcher.status import LaunchError

    def refuse(hint: str) -> UsageError:
        return UsageError(error.message, hint)

    if error.model_type is None or error.config is None:
        raise error
    if env_flag(environ, "LAUNCH_NO_TRACE"):
        raise refuse("unset LAUNCH_NO_TRACE to have it traced as transformers builds it, or "
                     "give --params")
    if importlib.util.find_spec("transformers") is None:
        raise refuse("install transformers to have it traced as transformers builds it, or "
                     "give --params")
    try:
        seq_len = spec.seq_len or max_positions(error.config)  # the file load_config read
    except UsageError as exc:  # a malformed size: the file and the field, as the sizer says
        raise UsageError(f"{spec.model_config}: {exc.message}", exc.hint) from None
    if seq_len is None:
        raise refuse("its config names no sequence length: give --seq-len")
    try:
        recipe = write_recipe(spec.model_config, seq_len,  # type: ignore[arg-type]
                              _recipe_folder(state_dir), attention=spec.attention)
    except OSError as exc:
        raise refuse(f"the recipe to trace it could not be written: {exc}") from None
    try:
        built = inspect_script(recipe, env=environ, local=False, count_flops=False)
    except LaunchError as exc:
        raise refuse(f"transformers could not build it either ({exc.message}); give "
                     "--params") from None
    note = (f"model_type {error.model_type!r} has no analytic shape here: sized by tracing "
            f"the model transformers builds from the config (sequence {seq_len})")
    return replace(info, framework_recipe=recipe, parameters=built.parameters,
                   trainable_parameters=built.trainable_parameters,
                   parameter_bytes=built.parameter_bytes, buffer_bytes=built.buffer_bytes,
                   unit_parameters=built.unit_parameters, notes=(*info.notes, note))


def _pinned_checkpointing(spec: Spec) -> str | None:
    """The checkpointing mode the user pinned (``--checkpointing`` or the older on/off flag),
    None when the planner chooses."""
    from launcher.plan.plan import checkpointing_mode

    if spec.checkpointing is not None:
        return checkpointing_mode(spec.checkpointing)
    if spec.activation_checkpointing is not None:
        return checkpointing_mode(spec.activation_checkpointing)
    return None


def _framework_spec(spec: Spec, info: ScriptInfo) -> Spec:
    """A framework script that never reached training (launcher/capture/frameworks.py) is described
    by the Hugging Face config of the model it built on the way, if any; with neither that nor
    --params / --model-config there is nothing to plan, and the capture's notes say why."""
    if (info.framework_recipe is not None or spec.model_config is not None
            or spec.params is not None):
        return spec
    if info.framework_config is not None:
        return replace(spec, model_config=info.framework_config)
    why = "; ".join(info.notes) or "it did not reach the start of training"
    raise UsageError(f"launch could not trace {spec.script.name}: {why}",
                     "describe the model with --model-config config.json or --params 7B")
