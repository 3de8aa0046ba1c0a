"""The test recipe with its own data: 40 fixed samples, reshuffled every epoch.

Used to check gradient accumulation: a step consumes the next ``micro_batch_size * world_size``
samples of one order per micro-step, so one micro-batch of 8 holds exactly the samples of two
micro-batches of 4, or of 2 ranks x 2 micro-steps x 2. No dropout, so that those runs compute the
same function. Imports its model from its sibling ``tiny.py`` (the recipe's directory is on
sys.path).
"""

from collections.abc import Iterator

import torch
from tiny import DIM, TEACHER, Block, make_model, training_step

__all__ = ["Block", "build_dataloader", "build_model", "example_batch", "training_step"]

SAMPLES = 40
_generator = torch.Generator().manual_seed(99)
X = torch.randn(SAMPLES, DIM, generator=_generator)
Y = X @ TEACHER


def build_model() -> torch.nn.Module:
    return make_model(dropout=0.0)


def example_batch(batch_size: int) -> dict[str, torch.Tensor]:
    return {"x": X[:batch_size], "y": Y[:batch_size]}


def wrap_modules() -> tuple[type, ...]:
    return (Block,)


class FixedData:
    """One epoch = the samples in an order drawn from the global RNG (seeded per epoch by the
    training script), cut into chunks of ``batch_size * world_size``; rank r gets the r-th slice."""

    def __init__(self, batch_size: int, rank: int, world_size: int) -> None:
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        order = torch.randperm(SAMPLES)
        chunk = self.batch_size * self.world_size
        for start in range(0, SAMPLES - chunk + 1, chunk):
            first = start + self.rank * self.batch_size
            index = order[first : first + self.batch_size]
            yield {"x": X[index], "y": Y[index]}


def build_dataloader(batch_size: int, rank: int, world_size: int) -> FixedData:
    return FixedData(batch_size, rank, world_size)
