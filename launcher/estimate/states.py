"""Model-state bytes (weights, gradients, optimizer state) from a parameter count: exact arithmetic.

These need no tracing: they follow from the number of parameters, the precision and the
optimizer. Mixed-precision AdamW holds 16 bytes per parameter (ZeRO paper, Rajbhandari et al.
2020, section 3.1); with torch autocast that is fp32 weights (4) + fp32 gradients (4) + two fp32
Adam moments (8). Pure bf16 halves every term (8). Sharding divides all three by the shard degree.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bytes per parameter of (weights, gradients) by precision.
WEIGHT_GRAD_BYTES = {"fp32": (4, 4), "bf16_mixed": (4, 4), "bf16": (2, 2)}


def optimizer_bytes_per_param(optimizer: str, precision: str) -> float | None:
    """Optimizer state per parameter; None where it depends on shapes (Adafactor's factors)."""
    state = 2 if precision == "bf16" else 4
    return {
        "adamw": 2 * state,      # exp_avg + exp_avg_sq, in the parameters' dtype
        "sgd": state,            # momentum buffer
        "adam8bit": 2 + 0.0625,  # two uint8 moments + one fp32 absmax per 256-value block, x2 / 256
        "adafactor": None,       # row + column factors: O(rows + cols) per matrix, needs shapes
    }[optimizer]


@dataclass(frozen=True)
class ModelStates:
    parameters: int
    gradients: int
    optimizer: int | None

    @property
    def total(self) -> int | None:
        return None if self.optimizer is None else self.parameters + self.gradients + self.optimizer


def model_states(
    parameters: int, precision: str, optimizer: str, *, trainable: int | None = None,
    shard_degree: int = 1,
) -> ModelStates:
    """Per-GPU model states of ``parameters`` weights, ``trainable`` of them trained."""
    trainable = parameters if trainable is None else trainable
    weight, grad = WEIGHT_GRAD_BYTES[precision]
    per_param = optimizer_bytes_per_param(optimizer, precision)
    return ModelStates(
        parameters=-(-parameters * weight // shard_degree),
        gradients=-(-trainable * grad // shard_degree),
        optimizer=None if per_param is None else int(-(-trainable * per_param // shard_degree)),
    )
