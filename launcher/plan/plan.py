"""The plan: one concrete way to run a training job, with its memory and cost.

A plan is plain data. The planner produces candidates, the renderer turns the chosen one into a
training script plus ``plan.json``, and the training script reads its settings back from that JSON
file. Field names follow the JSON contract in the design brief, so ``to_dict()`` *is* the contract.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

Strategy = Literal["single", "ddp", "fsdp", "hybrid_shard", "smp_v2"]
Precision = Literal["fp32", "bf16_mixed", "bf16"]
Optimizer = Literal["adamw", "sgd", "adafactor", "adam8bit"]

STRATEGIES: tuple[str, ...] = ("single", "ddp", "fsdp", "hybrid_shard", "smp_v2")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16_mixed", "bf16")
OPTIMIZERS: tuple[str, ...] = ("adamw", "sgd", "adafactor", "adam8bit")


@dataclass(frozen=True)
class Memory:
    """Per-GPU (or per-process on the CPU) memory of a plan, in bytes.

    ``None`` means "cannot be known from the input" (the design brief forbids guesses dressed as
    facts): for example activations of a script described only by ``--params``.
    """

    parameters: int | None = None
    gradients: int | None = None
    optimizer: int | None = None
    activations: int | None = None
    temporary: int | None = None
    framework_overhead: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    total: int | None = None
    capacity: int | None = None

    @property
    def model_states(self) -> int | None:
        parts = (self.parameters, self.gradients, self.optimizer)
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Plan:
    """One candidate: where and how the job runs, whether it fits, and what it costs."""

    strategy: Strategy
    machine: str
    nodes: int
    gpus_per_node: int
    micro_batch_size: int
    grad_accum_steps: int
    global_batch_size: int
    precision: Precision
    optimizer: Optimizer
    activation_checkpointing: bool
    steps: int
    lr: float
    seq_len: int | None = None
    fits: bool | None = None
    cost_per_hour_usd: float | None = None
    step_time_s: float | None = None
    total_cost_usd: float | None = None
    memory: Memory = field(default_factory=Memory)
    # Sharded strategies (fsdp, hybrid_shard, smp_v2): FSDP's reshard after forward, the size of
    # a shard group (None: the GPUs of a node), and SMP v2's tensor parallelism and offloading.
    reshard_after_forward: bool = True
    hybrid_shard_degree: int | None = None
    tensor_parallel_degree: int = 1
    activation_offloading: bool = False
    # fsdp / hybrid_shard with grad_accum_steps > 1: reduce-scatter the gradient on every
    # micro-step instead of only the last, so each GPU holds its shard of the gradient, not the
    # whole unsharded one, for grad_accum_steps x the gradient communication.
    reduce_every_micro_step: bool = False
    # PyTorch's caching allocator grows segments instead of splitting them
    # (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): the fix for a fragmented allocator.
    expandable_segments: bool = False
    # Why this candidate exists, in words ("as asked", "micro-batch 8 -> 4, 2 accumulation steps").
    note: str = ""

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["memory"] = Memory(**(data.get("memory") or {}))
        return cls(**values)

    def replace(self, **changes: Any) -> Plan:
        return dataclasses.replace(self, **changes)
