"""Preflight: from what the user asked to a plan, before anything runs or costs money.

It picks the estimate that the input allows (a recipe is traced; a plain script is described by
``--model-config`` or ``--params``), the machines of the provider, and asks the planner.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, replace
from pathlib import Path

from launcher import remedies
from launcher.estimate.analytic import ModelShape
from launcher.estimate.calibration import model_key
from launcher.estimate.model_config import (
    ASSUMED_FROM,
    UnsupportedModelType,
    assumed_shape,
    load_config,
    max_positions,
    shape_from_params,
)
from launcher.footprints import DEFAULT_RANK_TRACE_BUDGET_S, Budget, Footprints, recipe_folder
from launcher.options import check_environment, env_flag, env_seconds
from launcher.plan.memory import Target
from launcher.plan.plan import Plan
from launcher.plan.planner import PlanResult, plan, reevaluate
from launcher.plan.targets import calibrated, cloud_targets, local_target
from launcher.providers import LOCAL
from launcher.script_info import ScriptInfo, plain_reads
from launcher.spec import Spec
from launcher.status import UsageError


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


@dataclass(frozen=True)
class _Planning:
    """What the planner is asked with: the spec as planned (a framework's own settings, an
    assumed length), the footprint of each precision, optimizer and checkpointing
    (``footprints``), the machines, and what the plan's notes say of them."""

    spec: Spec
    info: ScriptInfo
    footprints: Footprints
    targets: list[Target]
    parameters: int | None
    source: str
    can_checkpoint: bool
    assumed: str


def preflight(spec: Spec, info: ScriptInfo, state_dir: Path | None = None,
              environ: dict[str, str] | None = None) -> PlanResult:
    """The plan for ``spec``: every candidate the planner searched, the chosen one, and why
    each other was rejected."""
    p = _planning(spec, info, state_dir, environ)

    def search() -> PlanResult:
        return plan(p.spec, p.footprints, p.targets, p.spec.provider, parameters=p.parameters,
                    source=p.source, can_checkpoint=p.can_checkpoint, floor=p.footprints.floor)

    # First on the sharded estimates alone, noting the ranks it would trace; those are traced
    # together, and the plan that stands is searched with them (footprints.Ahead). A search
    # that asked for no rank is already that plan.
    ahead = p.footprints.ahead
    ahead.collecting = True
    try:
        result = search()
    finally:
        ahead.collecting = False
    if ahead.wishes:
        ahead.flush(p.footprints.budget)
        result = search()
    result.notes.extend(n for n in p.info.notes if n not in result.notes)
    if p.assumed:
        result.notes.insert(0, p.assumed)
    if p.footprints.budget.note() is not None:
        result.notes.append(p.footprints.budget.note())  # type: ignore[arg-type]
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
    return reevaluate(p.spec, p.footprints, target, fixed)


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
    if spec.provider == LOCAL:
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
    footprints = Footprints(
        spec, info, traced_spec=traced_spec, shape=shape, source=source, hf_trace=hf_trace,
        trace=trace, can_checkpoint=can_checkpoint, pinned=pinned, device=device,
        environ=environ, state_dir=state_dir,
        budget=Budget(env_seconds(environ, "LAUNCH_RANK_TRACE_BUDGET",
                                  DEFAULT_RANK_TRACE_BUDGET_S)))
    return _Planning(
        spec=spec, info=info, footprints=footprints,
        targets=calibrated(targets, state_dir, model_key(spec.script)),
        parameters=shape.parameters if shape is not None else info.parameters, source=source,
        can_checkpoint=can_checkpoint, assumed=assumed)


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
                              recipe_folder(state_dir), attention=spec.attention)
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
