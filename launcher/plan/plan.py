"""The plan: one concrete way to run a training job, with its memory and cost.

A plan is plain data. The planner produces candidates, the renderer turns the chosen one into a
training script plus ``plan.json``, and the training script reads its settings back from that JSON
file. Field names follow the JSON contract in the design brief, so ``to_dict()`` *is* the contract.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from dataclasses import dataclass, field
from typing import Any, Literal

from launcher import strategies

Precision = Literal["fp32", "bf16_mixed", "bf16"]
Optimizer = Literal["adamw", "sgd", "adafactor", "adam8bit"]
#: Where an unpinned optimizer comes from when the script builds its own (``Spec.origins``): a
#: captured script's, a recipe's ``build_optimizer``. A plan names it by the class its traced
#: step built (``Plan.optimizer_class``); untraced, by launch's default name, said to be that.
OWN_OPTIMIZERS = ("the script's own optimizer", "the recipe's build_optimizer")
#: Activation checkpointing of the ``wrap_modules()`` blocks: none; selective (op-level, as
#: torchtitan does it: each block keeps its matmul and attention outputs, and recomputes the
#: cheap rest: norms, activations, casts); full (each block keeps its input only and recomputes
#: its whole forward in the backward pass).
Checkpointing = Literal["none", "selective", "full"]

PRECISIONS: tuple[str, ...] = ("fp32", "bf16_mixed", "bf16")
OPTIMIZERS: tuple[str, ...] = ("adamw", "sgd", "adafactor", "adam8bit")
CHECKPOINTING: tuple[str, ...] = ("none", "selective", "full")


_KIND_WORDS: dict[Any, str] = {type(None): "null", bool: "true or false", int: "a whole number",
                               float: "a finite number", str: "text"}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s field types, resolved once (every record read asks)."""
    import typing

    return typing.get_type_hints(cls)


def _typed(cls: type, data: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``data``'s values for ``cls``'s fields (others dropped), each checked against the field's
    type as JSON gives it: an int is no bool, a float may be an int but is finite, a ``Literal``
    is one of its words, ``X | None`` may be null. ``TypeError`` names the first that is not."""
    import math
    import typing

    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        allowed = typing.get_args(hints[f.name]) if typing.get_origin(hints[f.name]) in (
            typing.Union, types.UnionType) else (hints[f.name],)
        ok = False
        for kind in allowed:
            if kind is type(None):
                ok = value is None
            elif typing.get_origin(kind) is Literal:
                ok = isinstance(value, str) and value in typing.get_args(kind)
            elif kind is bool:
                ok = isinstance(value, bool)
            elif kind is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif kind is float:
                ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                      and math.isfinite(value))
            elif kind is str:
                ok = isinstance(value, str)
            if ok:
                break
        if not ok:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            words = " or ".join(_KIND_WORDS.get(kind) or "one of " + ", ".join(
                typing.get_args(kind)) for kind in allowed)
            raise TypeError(f"{prefix}{f.name} is {shown}, not {words}")
        values[f.name] = value
    return values


def checkpointing_mode(value: bool | str | None) -> str:
    """The checkpointing mode of a value from anywhere: a mode itself, or the older boolean
    (``activation_checkpointing``: True was, and still means, full checkpointing).

    The estimator and the trace pass the choice on as ``False | True | "selective"`` so that
    every ``if checkpointing:`` written for the boolean keeps meaning "some checkpointing"; this
    is where either spelling becomes a mode."""
    if value is None or value is False or value == "none":
        return "none"
    if value is True or value == "full":
        return "full"
    if value == "selective":
        return "selective"
    raise ValueError(f"unknown activation checkpointing {value!r} (none, selective, full)")


def checkpointing_key(mode: str) -> bool | str:
    """The estimator's key for a mode: False, True (full) or "selective" (see
    ``checkpointing_mode``)."""
    mode = checkpointing_mode(mode)
    return mode == "full" if mode != "selective" else "selective"


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
    #: One rank of the sharded plan traced at its world size (exact, ``plan/memory.py``), not
    #: the single-device footprint sharded by arithmetic (on the safe side by tens of percent).
    rank_traced: bool = False

    @property
    def usable(self) -> int | None:
        """What the plan may use of ``capacity``: all but the safety margin."""
        from launcher.estimate.overheads import SAFETY_MARGIN

        return None if self.capacity is None else int(self.capacity * (1 - SAFETY_MARGIN))

    @property
    def headroom(self) -> int | None:
        """Usable bytes left above the plan's total (negative: over); None where unknown."""
        usable = self.usable
        return None if usable is None or self.total is None else usable - self.total

    def to_dict(self) -> dict[str, Any]:
        """The fields, and ``usable`` and ``headroom`` for a reader of ``--json``."""
        return {**dataclasses.asdict(self), "usable": self.usable, "headroom": self.headroom}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Memory:
        """From ``to_dict`` (derived and unknown keys ignored: a state file of another
        version); a field of the wrong type is a ``TypeError`` naming it."""
        return cls(**_typed(cls, data, "memory."))

    @property
    def model_states(self) -> int | None:
        parts = (self.parameters, self.gradients, self.optimizer)
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Plan:
    """One candidate: where and how the job runs, whether it fits, and what it costs."""

    strategy: str  # a name in launcher.strategies.STRATEGIES
    machine: str
    nodes: int
    gpus_per_node: int
    micro_batch_size: int
    grad_accum_steps: int
    global_batch_size: int
    precision: Precision
    optimizer: Optimizer
    activation_checkpointing: bool  # some checkpointing: selective or full (``checkpointing``)
    steps: int | None  # None: a framework script's own length, not known before it runs
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
    # The class of the optimizer the traced step built where it is the script's own (a
    # captured script's Adadelta, a recipe's build_optimizer): what the job runs, where
    # ``optimizer`` is only launch's name for the plan's default. None: launch's optimizer.
    optimizer_class: str | None = None
    # none | selective | full. Added after ``activation_checkpointing``, which stays (the JSON
    # contract) and says whether there is any: a plan.json without this field is the boolean's
    # none or full; one with both must agree (``__post_init__``).
    checkpointing: Checkpointing | None = None

    def __post_init__(self) -> None:
        some = bool(self.activation_checkpointing)
        if self.checkpointing is None:
            object.__setattr__(self, "checkpointing", "full" if some else "none")
            return
        mode = checkpointing_mode(self.checkpointing)
        if (mode != "none") != some:
            raise ValueError(f"activation_checkpointing={self.activation_checkpointing} "
                             f"contradicts checkpointing={mode!r}")
        object.__setattr__(self, "checkpointing", mode)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def zero2(self) -> bool:
        """A sharded plan that keeps each unit's gathered parameters from its forward to its
        backward (FSDP2 ``reshard_after_forward=False``): gradients and optimizer state sharded,
        parameters whole while they compute, as ZeRO stage 2 does; one all-gather per unit
        and step fewer than full sharding."""
        return strategies.get(self.strategy).zero2 and not self.reshard_after_forward

    @property
    def strategy_label(self) -> str:
        """The strategy as a table and a reason show it: ``fsdp``, or ``fsdp zero2`` and
        ``hybrid zero2`` (no wider than ``hybrid_shard``: the plan table's width is fixed)."""
        if not self.zero2:
            return self.strategy
        return strategies.get(self.strategy).label + " zero2"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "memory": self.memory.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """From ``to_dict`` (unknown keys ignored: a state file of another version). Each field
        is checked against its type (``"nodes": "two"``, ``"precision": "fp9"``, a count below
        one, a strategy this version does not have: a ``TypeError`` naming it), so a record
        launch did not write is refused where it is read, not acted on."""
        memory = data.get("memory") or {}
        if not isinstance(memory, dict):
            raise TypeError("memory is not a table")
        values = _typed(cls, {k: v for k, v in data.items() if k != "memory"}, "")
        if values.get("strategy") not in strategies.STRATEGIES:
            raise TypeError(f"strategy {values.get('strategy')!r} is not one of "
                            f"{', '.join(strategies.STRATEGIES)}")
        for name in ("nodes", "gpus_per_node", "micro_batch_size", "grad_accum_steps",
                     "global_batch_size", "tensor_parallel_degree"):
            if name in values and values[name] < 1:
                raise TypeError(f"{name} is {values[name]}, not a count")
        return cls(**values, memory=Memory.from_dict(memory))

    def replace(self, **changes: Any) -> Plan:
        """A copy with ``changes``; changing only one of ``activation_checkpointing`` and
        ``checkpointing`` changes the other with it (True is full checkpointing)."""
        if "checkpointing" in changes and "activation_checkpointing" not in changes:
            changes["activation_checkpointing"] = (
                checkpointing_mode(changes["checkpointing"]) != "none")
        elif "activation_checkpointing" in changes and "checkpointing" not in changes:
            changes["checkpointing"] = checkpointing_mode(bool(changes["activation_checkpointing"]))
        return dataclasses.replace(self, **changes)
