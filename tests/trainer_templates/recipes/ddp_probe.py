"""``tiny_loader`` plus a probe of DDP's gradient all-reduce.

On its first call ``training_step`` registers a communication hook on the DDP model (it is handed
the wrapped model) that counts all-reduces and then does the default one; every call reports on
stderr how many all-reduces had run before it. With gradient accumulation the count must only
grow across the last micro-step of each step, which is what ``no_sync`` is for.
"""

import json
import sys

import torch
from tiny_loader import Block, build_dataloader, build_model, example_batch, wrap_modules
from tiny_loader import training_step as loader_training_step
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

__all__ = [
    "Block", "build_dataloader", "build_model", "example_batch", "training_step", "wrap_modules",
]

_state = {"calls": 0, "allreduces": 0}


def _counting_allreduce(
    state: dict, bucket: torch.distributed.GradBucket
) -> torch.futures.Future[torch.Tensor]:  # DDP checks this annotation
    state["allreduces"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def training_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    if _state["calls"] == 0:
        model.register_comm_hook(_state, _counting_allreduce)
    _state["calls"] += 1
    rank = torch.distributed.get_rank()
    probe = {"rank": rank, "call": _state["calls"], "allreduces_before": _state["allreduces"]}
    # One write call per line: ranks share stderr and run unbuffered (PYTHONUNBUFFERED), where
    # print() would issue the text and its newline as two writes that interleave across ranks.
    sys.stderr.write(json.dumps(probe) + "\n")
    sys.stderr.flush()
    return loader_training_step(model, batch)
