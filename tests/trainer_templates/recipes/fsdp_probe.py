"""``tiny_loader`` plus a probe of FSDP's gradient reduce-scatter.

At import it wraps torch.distributed's reduce-scatter functions (FSDP2 looks them up at call
time) so that they count their calls; every ``training_step`` reports on stderr how many had run
before it. With gradient accumulation the count must only grow across the last micro-step of
each step: the earlier ones keep their gradients unsharded (``set_requires_gradient_sync``).
"""

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from tiny_loader import Block, build_dataloader, build_model, example_batch, wrap_modules
from tiny_loader import training_step as loader_training_step

__all__ = [
    "Block", "build_dataloader", "build_model", "example_batch", "training_step", "wrap_modules",
]

_state = {"reduce_scatters": 0}


def _counting(collective: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(collective)
    def counted(*args: Any, **kwargs: Any) -> Any:
        _state["reduce_scatters"] += 1
        return collective(*args, **kwargs)

    return counted


for _name in ("reduce_scatter_single", "reduce_scatter_tensor"):
    if hasattr(dist, _name):
        setattr(dist, _name, _counting(getattr(dist, _name)))


def training_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    probe = {"rank": dist.get_rank(), "reduce_scatters_before": _state["reduce_scatters"]}
    sys.stderr.write(json.dumps(probe) + "\n")  # one write: ranks share stderr, lines stay whole
    sys.stderr.flush()
    return loader_training_step(model, batch)
