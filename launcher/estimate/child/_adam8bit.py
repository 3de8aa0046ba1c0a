"""A stand-in for bitsandbytes' ``AdamW8bit`` in the trace: the same state, no CUDA kernels.

Its own module because the rendered script (``_script.bitsandbytes_stand_in``) hands it to the
script's ``build_optimizer`` as ``bitsandbytes.optim.AdamW8bit``, and ``_script`` is imported by
the step (``_trace_step``): here it depends on torch alone, so neither imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch


class Adam8bitStandIn(torch.optim.Optimizer):
    """The memory of bitsandbytes' ``AdamW8bit`` without its CUDA kernels.

    bitsandbytes cannot run on fake (or CPU) tensors, so the trace holds the same state it would:
    per parameter of 4096 elements or more, two uint8 moments and one fp32 absmax per 256-element
    block for each; smaller parameters keep two fp32 moments (bitsandbytes' ``min_8bit_size``). Its
    update is one fused kernel with no temporaries, so the stand-in's update allocates nothing.
    The arithmetic is not Adam's: only the bytes matter here.
    """

    BLOCK = 256
    MIN_8BIT_SIZE = 4096

    def __init__(self, params: Any, lr: float = 1e-3, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    if p.numel() >= self.MIN_8BIT_SIZE:
                        blocks = math.ceil(p.numel() / self.BLOCK)
                        for i in (1, 2):
                            state[f"state{i}"] = torch.zeros_like(p, dtype=torch.uint8)
                            state[f"absmax{i}"] = torch.zeros(
                                blocks, dtype=torch.float32, device=p.device
                            )
                    else:
                        state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                        state["state2"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"].add_(1)
                p.add_(p.grad, alpha=-group["lr"])
