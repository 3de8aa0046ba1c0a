"""The test recipe: a two-block MLP that learns a fixed linear map.

Small enough that a run costs little beyond torch's import, learnable so that the loss falls, with
dropout so that a resumed run only matches an uninterrupted one if the random state is restored.
Data is the default stream: ``example_batch`` under the seed the training script sets.
"""

import torch
from torch import nn

DIM = 16
# A fixed "teacher" map: the same in every process, whatever the training script seeds.
TEACHER = torch.randn(DIM, DIM, generator=torch.Generator().manual_seed(1234)) / DIM**0.5


class Block(nn.Module):
    """A residual MLP block: the unit ``wrap_modules`` names for activation checkpointing."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.linear = nn.Linear(DIM, DIM)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(torch.tanh(self.linear(x)))


def make_model(dropout: float) -> nn.Module:
    return nn.Sequential(Block(dropout), Block(dropout), nn.Linear(DIM, DIM))


def build_model() -> nn.Module:
    return make_model(dropout=0.1)


def example_batch(batch_size: int) -> dict[str, torch.Tensor]:
    x = torch.randn(batch_size, DIM)
    return {"x": x, "y": x @ TEACHER}


def training_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch["x"]).float(), batch["y"].float())


def wrap_modules() -> tuple[type, ...]:
    return (Block,)
