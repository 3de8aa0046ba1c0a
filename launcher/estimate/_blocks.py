"""Depth scaling: find a model's stack of identical blocks and cut it to the depths traced.

One home for "which blocks are a stack", used by the memory trace (``_trace_step.build`` cuts
the model; ``launcher.estimate.traced`` extrapolates the two depths) and by the recipe probe's
FLOP count (``launcher.recipe``), which scales the same way. Imports torch: only children
(the trace child, ``python -m launcher.recipe``) import it.
"""

from __future__ import annotations

from typing import Any

import torch

#: A stack needs at least this many identical blocks before tracing a few of them pays off.
MIN_SCALED_BLOCKS = 8
#: The depths traced when scaling a stack of identical blocks: two, so that every point is
#: linear in the depth; both even, so that a pattern alternating every other layer (sliding
#: window / global attention) is covered by whole periods; both above 1, so that the first and
#: the last block are distinct blocks at each.
SCALED_DEPTHS = (2, 4)
#: The depths traced for one rank of a sharded strategy (FSDP, hybrid sharding): FSDP2 gathers
#: the next block ahead of the current one (forward and backward prefetch), so at two blocks
#: the first block's prefetch is the last block and the backward's peak is not the interior
#: one's: 2 and 4 extrapolated to 8 blocks of a 7B at 8 ranks were +428..+676 MiB over the
#: whole trace (full resharding), while 3, 4, 5 and 8 blocks lie on one line to the byte.
#: Both even (as ``SCALED_DEPTHS``) and with an interior block at each.
SHARDED_DEPTHS = (4, 6)


def _signature(module: torch.nn.Module) -> tuple[Any, ...]:
    """What makes two blocks interchangeable for memory: their module types, and the names,
    shapes, dtypes and trainability of their parameters and buffers."""
    return (
        tuple(type(m).__qualname__ for m in module.modules()),
        tuple((n, tuple(t.shape), t.dtype, t.requires_grad) for n, t in module.named_parameters()),
        tuple((n, tuple(t.shape), t.dtype) for n, t in module.named_buffers()),
    )


def repeated_blocks(model: torch.nn.Module) -> tuple[str, torch.nn.Module, int] | None:
    """The model's largest stack of identical blocks: a ``ModuleList`` or ``Sequential`` of at
    least ``MIN_SCALED_BLOCKS`` children of one type and one parameter signature (a transformer's
    layers). Returns (its path, the container, how many blocks), or None.

    Memory at every moment of a training step grows by the same bytes with every block of such a
    stack (its weights, gradients, optimizer state, saved activations), so tracing two depths and
    extrapolating linearly gives the whole model's timeline at a fraction of the tracing time.
    """
    best: tuple[str, torch.nn.Module, int, int] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        children = list(module.children())
        if len(children) < MIN_SCALED_BLOCKS or len(children) != len(module):
            continue  # a module listed twice (shared weights) is not a stack
        first = children[0]
        signature = _signature(first)
        if any(type(c) is not type(first) or _signature(c) != signature for c in children[1:]):
            continue
        size = sum(p.numel() for p in module.parameters())
        if best is None or size > best[3]:
            best = (name, module, len(children), size)
    return None if best is None else best[:3]


def truncate_blocks(model: torch.nn.Module, depth: int) -> dict[str, Any] | None:
    """Keep the first ``depth`` blocks of the model's repeated stack; say what was cut."""
    found = repeated_blocks(model)
    if found is None:
        return None
    name, container, count = found
    if count <= depth:
        return None
    del container[depth:]
    return {"path": name or "<root>", "count": count, "depth": depth}
