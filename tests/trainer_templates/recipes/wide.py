"""``tiny_loader``'s fixed data through a model whose gradient is large next to everything else
a rank holds besides its model states: 8 residual blocks of 2048 x 2048 (33.6M parameters, a
134 MB fp32 gradient) on micro-batches of a few 16-wide samples.

Used to see gradient memory in a CPU run's peak RSS: the activations and the torch runtime stay
the same between plans, so what changes the peak is which gradient each rank holds.
"""

import torch
from tiny_loader import DIM, build_dataloader, example_batch
from torch import nn

__all__ = ["Block", "build_dataloader", "build_model", "example_batch", "training_step",
           "wrap_modules"]

WIDTH = 2048
BLOCKS = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, WIDTH), *(Block() for _ in range(BLOCKS)),
                         nn.Linear(WIDTH, DIM))


def training_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch["x"]).float(), batch["y"].float())


def wrap_modules() -> tuple[type, ...]:
    return (Block,)
