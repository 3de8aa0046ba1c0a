"""Preflight: from what the user asked to a plan, before anything runs or costs money.

It picks the estimate that the input allows (a recipe is traced; a plain script is described by
``--model-config`` or ``--params``), the machines of the provider, and asks the planner.
"""

from __future__ import annotations

import functools
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


def preflight(spec: Spec, info: ScriptInfo, state_dir: Path | None = None) -> PlanResult:
    shape, source = describe(spec, info)

    @functools.cache
    def estimator(precision: str, optimizer: str, checkpointing: bool) -> Footprint:
        if shape is not None:
            return from_shape(shape, precision=precision, optimizer=optimizer,
                              checkpointing=checkpointing, kind=source)
        return _counted(info, precision, optimizer, checkpointing)

    if spec.provider == "local":
        targets = [local_target(spec, info.hardware)]
    else:
        targets = cloud_targets(spec.provider, spec)
    targets = calibrated(targets, state_dir, model_key(spec.script))
    parameters = shape.parameters if shape is not None else info.parameters
    can_checkpoint = shape is not None or "wrap_modules" in info.hooks
    return plan(spec, estimator, targets, spec.provider, parameters=parameters, source=source,
                can_checkpoint=can_checkpoint)
