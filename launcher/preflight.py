"""Preflight: from what the user asked to a plan, before anything runs or costs money.

It picks the estimate that the input allows (a recipe is traced; a plain script is described by
``--model-config`` or ``--params``), the machines of the provider, and asks the planner.
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from pathlib import Path

from launcher.estimate.analytic import ModelShape, load_config, shape_from_params
from launcher.estimate.calibration import model_key
from launcher.estimate.footprint import Footprint, from_shape
from launcher.estimate.states import model_states
from launcher.plan.plan import Memory
from launcher.plan.planner import PlanResult, plan
from launcher.plan.targets import calibrated, cloud_targets, local_target
from launcher.recipe import ScriptInfo
from launcher.spec import Spec
from launcher.status import UsageError

#: Seconds a trace may take before the plan falls back to model states (LAUNCH_TRACE_TIMEOUT).
DEFAULT_TRACE_TIMEOUT_S = 120.0


def describe(spec: Spec, info: ScriptInfo) -> tuple[ModelShape | None, str]:
    """The model's shape from a config file or --params, and the contract's ``source``."""
    if spec.model_config is not None:
        return load_config(spec.model_config, seq_len=spec.seq_len), "config"
    if spec.params is not None:
        return shape_from_params(spec.params, layers=spec.layers, hidden=spec.hidden_size,
                                 heads=spec.heads, vocab=spec.vocab_size,
                                 seq_len=spec.seq_len), "declared"
    return None, "traced"


def _counted(info: ScriptInfo, precision: str, optimizer: str, checkpointing: bool
             ) -> Footprint:
    """A recipe's model states from its parameter count (built on the meta device)."""
    assert info.parameters is not None
    states = model_states(info.parameters, precision, optimizer,
                          trainable=info.trainable_parameters)

    def memory_at(_micro: int) -> Memory:
        return Memory(parameters=states.parameters, gradients=states.gradients,
                      optimizer=states.optimizer)

    return Footprint(kind="traced", precision=precision, optimizer=optimizer,
                     activation_checkpointing=checkpointing, parameters=info.parameters,
                     memory_at=memory_at, unit_parameters=info.unit_parameters,
                     flops_per_sample=info.flops_per_sample,
                     note="activations are not estimated yet: the plan checks model states only")


def _traced(spec: Spec, info: ScriptInfo, precision: str, optimizer: str,
            checkpointing: bool, device: str, environ: dict[str, str]) -> Footprint:
    """The recipe's own training step traced on fake tensors (see estimate/traced.py).

    A trace that cannot finish in time falls back to the counted model states, with a note; an
    error in the user's code is theirs to fix and stops the launch with its file and line.
    """
    from launcher.estimate.traced import TraceError, TraceTimeout, trace_recipe

    # The templates use the recipe's build_optimizer unless the optimizer is pinned: so does
    # the trace.
    pinned = spec.optimizer is not None or "build_optimizer" not in info.hooks
    timeout = float(environ.get("LAUNCH_TRACE_TIMEOUT", DEFAULT_TRACE_TIMEOUT_S))
    try:
        trace = trace_recipe(
            spec.script, micro_batch_sizes=(1, 2, 4), precision=precision,
            optimizer=optimizer if pinned else None, activation_checkpointing=checkpointing,
            grad_accum_steps=2, device=device, timeout_s=timeout,  # type: ignore[arg-type]
            max_grad_norm=spec.max_grad_norm, lr=spec.lr, weight_decay=spec.weight_decay,
            seed=spec.seed)
    except TraceTimeout:
        counted = _counted(info, precision, optimizer, checkpointing)
        return replace(counted, note=f"the trace took longer than {timeout:.0f} s "
                       "(LAUNCH_TRACE_TIMEOUT): the plan checks model states only")
    except TraceError as exc:
        where = f"{Path(exc.file).name}:{exc.line}: " if exc.file and exc.line else ""
        raise UsageError(f"tracing the recipe failed: {where}{exc.message}",
                         "fix the script, or set LAUNCH_NO_TRACE=1 to plan on model states "
                         "only") from None
    note = "; ".join(trace.notes[:2]) if trace.is_bound else ""
    return Footprint(kind="upper_bound" if trace.is_bound else "traced", precision=precision,
                     optimizer=optimizer, activation_checkpointing=checkpointing,
                     parameters=trace.parameters, memory_at=trace.memory_at,
                     unit_parameters=info.unit_parameters,
                     flops_per_sample=info.flops_per_sample, note=note)


def preflight(spec: Spec, info: ScriptInfo, state_dir: Path | None = None,
              environ: dict[str, str] | None = None) -> PlanResult:
    shape, source = describe(spec, info)
    environ = dict(os.environ if environ is None else environ)
    if spec.provider == "local":
        targets = [local_target(spec, info.hardware)]
    else:
        targets = cloud_targets(spec.provider, spec)
    device = "cpu" if targets and all(t.cpu for t in targets) else "cuda"
    trace = info.mode == "recipe" and shape is None and environ.get("LAUNCH_NO_TRACE") != "1"

    @functools.cache
    def estimator(precision: str, optimizer: str, checkpointing: bool) -> Footprint:
        if shape is not None:
            return from_shape(shape, precision=precision, optimizer=optimizer,
                              checkpointing=checkpointing, kind=source)
        if trace:
            return _traced(spec, info, precision, optimizer, checkpointing, device, environ)
        return _counted(info, precision, optimizer, checkpointing)

    targets = calibrated(targets, state_dir, model_key(spec.script))
    parameters = shape.parameters if shape is not None else info.parameters
    can_checkpoint = shape is not None or "wrap_modules" in info.hooks
    return plan(spec, estimator, targets, spec.provider, parameters=parameters, source=source,
                can_checkpoint=can_checkpoint)
