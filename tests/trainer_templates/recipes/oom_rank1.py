"""``tiny`` whose rank 1 runs out of GPU memory in the forward pass of step 2 (micro-step 1).

The error is raised, not provoked: the CPU cannot run out of GPU memory, and what is under test
is the report, the same code whatever raised it. The message is CUDA's, so the report can parse
the size. Rank 0 is left waiting in a collective, as on a GPU, until torchrun stops it.
"""

import torch
import torch.distributed as dist
from tiny import Block, build_model, example_batch, wrap_modules
from tiny import training_step as tiny_training_step

__all__ = ["Block", "build_model", "example_batch", "training_step", "wrap_modules"]

MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.15 GiB "
    "of which 1.06 GiB is free."
)
_calls = 0


def training_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    global _calls
    _calls += 1
    if dist.get_rank() == 1 and _calls == 3:  # grad_accum_steps 2: step 2, micro-step 1
        raise torch.OutOfMemoryError(MESSAGE)
    return tiny_training_step(model, batch)
