"""A test recipe that names no blocks: no ``wrap_modules()``.

The model keeps its residual blocks in an ``nn.ModuleList``, as transformers keep their layers;
the sharded templates find the repeated ``Layer`` class themselves and shard each layer as one
unit. Synthetic data with dropout, like ``tiny``.
"""

import torch
from torch import nn

DIM = 16
TEACHER = torch.randn(DIM, DIM, generator=torch.Generator().manual_seed(4321)) / DIM**0.5


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.down(torch.tanh(self.up(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(3))
        self.head = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build_model() -> nn.Module:
    return Net()


def example_batch(batch_size: int) -> dict[str, torch.Tensor]:
    x = torch.randn(batch_size, DIM)
    return {"x": x, "y": x @ TEACHER}


def training_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch["x"]).float(), batch["y"].float())
