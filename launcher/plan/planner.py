"""Choosing the plan: candidates, whether each fits, and why the others were not chosen.

This first planner covers the local provider: one machine (this one), single-process or DDP, the
micro-batch and gradient accumulation that give the asked global batch. It already keeps the
contract of the design brief (every candidate, the chosen one or None, the rejected options with
reasons); the cloud catalogs and the traced estimate plug into the same shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.estimate.states import model_states
from launcher.plan.plan import Memory, Plan
from launcher.recipe import ScriptInfo
from launcher.spec import Spec
from launcher.status import UsageError
from launcher.units import format_bytes

#: Strategies the training templates can run today.
RUNNABLE_STRATEGIES = ("single", "ddp")


@dataclass(frozen=True)
class Rejection:
    option: str
    reason: str


@dataclass(frozen=True)
class PlanResult:
    """The planner's answer; ``to_dict`` is the `launch plan --json` contract, less ``request``."""

    parameters: int | None
    source: str  # traced | config | declared
    plans: list[Plan]
    chosen: Plan | None
    rejected: list[Rejection] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

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
    if micro is None:
        if global_batch % world:
            lower = global_batch - global_batch % world
            options = " or ".join(str(n) for n in (lower, lower + world) if n > 0)
            raise UsageError(
                f"global batch {global_batch} cannot be split evenly over {world} processes",
                f"use --global-batch-size {options}",
            )
        return global_batch // world, 1
    step = micro * world
    if global_batch % step:
        lower = global_batch - global_batch % step
        options = " or ".join(str(n) for n in (lower, lower + step) if n > 0)
        divisors = [d for d in range(1, global_batch + 1)
                    if global_batch % (d * world) == 0][:8]
        raise UsageError(
            f"global batch {global_batch} is not a multiple of micro-batch {micro} x "
            f"{world} process{'es' if world > 1 else ''} (= {step})",
            f"use --global-batch-size {options}, or a micro-batch that divides it "
            f"({', '.join(map(str, divisors))})",
        )
    return micro, global_batch // step


def plan_local(spec: Spec, info: ScriptInfo) -> PlanResult:
    """Plan a run on this machine: the GPUs torch sees, else the CPU with gloo."""
    hw = info.hardware
    on_gpu = hw.cuda_devices > 0
    if spec.nodes not in (None, 1):
        raise UsageError("the local provider runs on one node", "drop --nodes, or use a cloud")
    if spec.machine is not None:
        raise UsageError("--machine names a cloud machine type",
                         "drop it for the local provider, or pass --provider vertex|sagemaker")
    procs = spec.gpus_per_node or (hw.cuda_devices if on_gpu else 1)
    if on_gpu and procs > hw.cuda_devices:
        raise UsageError(f"--gpus-per-node {procs}, but this machine has {hw.cuda_devices} GPUs")
    strategy = spec.strategy or ("single" if procs == 1 else "ddp")
    if strategy not in RUNNABLE_STRATEGIES:
        raise UsageError(f"strategy {strategy!r} has no training template yet",
                         f"use {' or '.join(RUNNABLE_STRATEGIES)}")
    if strategy == "single" and procs > 1:
        raise UsageError(f"strategy 'single' runs one process, not {procs}",
                         "use --strategy ddp, or --gpus-per-node 1")
    micro, accum = batch_split(spec.global_batch_size, procs, spec.micro_batch_size)
    precision = spec.precision or "fp32"
    optimizer = spec.optimizer or "adamw"

    if on_gpu:
        machine, capacity = f"local-{hw.cuda_name or 'cuda'}", hw.cuda_memory_bytes
    else:
        # Each CPU worker is one process; the cap is --memory-limit, else the host's RAM shared.
        machine = "local-cpu"
        host = hw.host_memory_bytes
        capacity = spec.memory_limit or (host // procs if host else None)

    memory = Memory(capacity=capacity)
    fits: bool | None = None
    notes: list[str] = []
    rejected: list[Rejection] = []
    parameters = info.parameters if info.mode == "recipe" else spec.params
    if parameters is not None:
        states = model_states(parameters, precision, optimizer,
                              trainable=info.trainable_parameters)
        memory = Memory(parameters=states.parameters, gradients=states.gradients,
                        optimizer=states.optimizer, capacity=capacity)
        if states.total is not None and capacity is not None and states.total > capacity:
            fits = False
            rejected.append(Rejection(
                option=f"{strategy} on {machine}",
                reason=(f"weights, gradients and optimizer state alone need "
                        f"{format_bytes(states.total)} per process, more than the "
                        f"{format_bytes(capacity)} available; no batch size changes that"),
            ))
    notes.append("activations are not estimated yet: the plan checks model states only")
    plan = Plan(
        strategy=strategy,  # type: ignore[arg-type]
        machine=machine, nodes=1, gpus_per_node=procs, micro_batch_size=micro,
        grad_accum_steps=accum, global_batch_size=spec.global_batch_size,
        precision=precision,  # type: ignore[arg-type]
        optimizer=optimizer,  # type: ignore[arg-type]
        activation_checkpointing=bool(spec.activation_checkpointing), steps=spec.steps,
        lr=spec.lr, seq_len=spec.seq_len, fits=fits, cost_per_hour_usd=0.0,
        step_time_s=None, total_cost_usd=0.0, memory=memory,
        note="as asked" if spec.micro_batch_size else "whole global batch per step",
    )
    chosen = None if fits is False else plan
    source = "traced" if info.mode == "recipe" else "declared"
    return PlanResult(parameters=parameters, source=source, plans=[plan], chosen=chosen,
                      rejected=rejected, notes=notes)
