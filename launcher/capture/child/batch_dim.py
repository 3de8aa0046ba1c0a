"""Which dimension of a plain script's batch is the batch: dimension 0, unless the model says not.

A plain loop's batch is what it called its model with, and most loops put the samples first
(``[batch, ...]``): the capture took the most common first dimension of the inputs as the
batch's rows. Sequence-first loops do not: PyTorch's nn.Transformer tutorial and pytorch/examples'
word_language_model ``batchify`` their token stream into ``[seq_len, batch]`` columns, ``get_batch``
slices ``bptt`` rows of it (``data [35, 20]``) and flattens the target (``[35 * 20]``), and the
LSTM's hidden state is ``[layers, batch, hidden]``. Taking dimension 0 there made the plan's
micro-batch the sequence length (35), the hidden state's layers (2) a batch of 2, and learned
``--bptt`` or ``--nlayers`` as the batch flag.

The sizes alone cannot tell a batch of 20 sequences of 35 from 35 of 20. What can is the model:
torch's sequence-first modules say so themselves (``batch_first=False`` on ``nn.LSTM``/``GRU``/
``RNN``, ``nn.MultiheadAttention`` and the ``nn.Transformer*`` layers built on it), and a
batched call of one of them takes ``[seq, batch, features]``. So the capture watches those calls
(a global forward pre-hook, while the script runs to its first step) and takes their dimension-1
size as the batch's rows; the batch dimension of the model's input is the dimension of that size
(the first one: a loop that transposes a batch-first input itself keeps dimension 0).

Every tensor of the traced batch then gets its own layout (``capture.json``'s
``batch_layout``, one entry per tensor in ``capture.leaves`` order): resized along the batch
dimension where it has the batch's rows there (the input, the hidden state), resized as the
input's leading dimensions where its first dimension is their product (a flattened target,
``[bptt * batch]``: ``view(bptt, batch)``, resized, flattened again), else copied as it is. A
flattened target is also what the loop's loss is matched against (``flattened``), in
batch-first loops too (``targets.view(-1)`` of ``[batch * seq]``).

The script's own settings named for its batch (``--batch_size``, a ``batch_size`` global) are
the second witness: they overrule a sequence-first layer that was handed a ``[batch, seq]``
input (``batch_first`` forgotten), with a note, and where the inputs disagree on their first
dimension and no module says which is the batch, the dimension such a setting holds is the
batch. Failing both, the most common first dimension is still taken, with a note that says the
plan's micro-batch may not be the script's batch: never a silently wrong number.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from launcher.capture.child.answer import ANSWER, STATE, note
from launcher.capture.child.capture import leaves

#: The batch sizes seen by batched calls of sequence-first modules, most recent last.
_SEEN = "sequence_first_rows"


def watch_sequence_first() -> None:
    """Record the batch size of each batched call of a ``batch_first=False`` module (an RNN,
    LSTM or GRU, a multi-head attention, a transformer layer) made with gradients before the
    capture: its input is ``[seq, batch, features]``. Not while measuring: the measurement
    records allocations, and this adds a hook to every module call."""
    if STATE.get("measure"):
        return
    from torch.nn.modules.module import register_module_forward_pre_hook

    seen: list[int] = STATE.setdefault(_SEEN, [])

    def sequence_first(module: torch.nn.Module, args: tuple) -> None:
        if getattr(module, "batch_first", None) is not False or ANSWER["reached"] or (
                not torch.is_grad_enabled()):
            return
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is not None and first.dim() == 3:
            seen.append(int(first.shape[1]))
            del seen[:-64]

    register_module_forward_pre_hook(sequence_first)


@dataclass(frozen=True)
class BatchDim:
    """The batch's rows and the dimension of the model's first input they are in.

    ``main`` is that input's shape (a flattened target's first dimension is the product of its
    leading dimensions); ``how`` says how the dimension was found, for the plan's notes."""

    dim: int
    rows: int | None
    main: tuple[int, ...] = ()
    how: str = ""

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is one of the batch's: its rows along the batch dimension, or
        its first dimension the input's leading ones flattened (a flattened target)."""
        return layout_of(tensor, self) is not None


def find_batch_dim(batch: Any) -> BatchDim:
    """The batch dimension of ``batch`` (the model's inputs): dimension ``d`` of the first input
    where a sequence-first module inside the model saw that many rows, else dimension 0 with its
    most common size.

    The script's own settings named for the batch (``--batch_size``, a ``batch_size`` global:
    ``batch_named``) check the model's word: a sequence-first layer given a ``[batch, seq]``
    input (``nn.TransformerEncoderLayer`` without ``batch_first=True``, a common slip) says the
    sequence is the batch, and the setting that holds the input's first dimension wins, with a
    note. Where the inputs disagree on their first dimension and the model says nothing, the
    dimension of the first input that such a setting holds is taken; else the most common first
    dimension, with a note that it may not be the batch."""
    tensors = [t for t in leaves(batch) if t.dim() > 0]
    if not tensors:
        return BatchDim(0, None)
    main = tuple(int(s) for s in tensors[0].shape)
    named = batch_named()
    seen = STATE.get(_SEEN) or []
    if seen:
        rows = Counter(seen).most_common(1)[0][0]
        dims = [d for d, size in enumerate(main) if size == rows]
        if dims and dims[0] and main[0] in named and rows not in named:
            note(f"the model's sequence-first layers take dimension {dims[0]} of its input "
                 f"{list(main)} as the batch, but the script's batch size is {main[0]}, its "
                 "dimension 0: planned so (do those layers want batch_first=True?)")
            return BatchDim(0, main[0], main)
        if dims:
            dim = dims[0]
            how = ("" if dim == 0 else
                   f"the batch is dimension {dim} of the model's input {list(main)} (its "
                   f"sequence-first layers take [seq, batch, ...]): {rows} rows")
            return BatchDim(dim, rows, main, how)
    firsts = [int(t.shape[0]) for t in tensors]
    if len(set(firsts)) > 1:
        dims = [d for d, size in enumerate(main) if size in named]
        if len(dims) == 1:
            return BatchDim(dims[0], main[dims[0]], main, "" if not dims[0] else (
                f"the batch is dimension {dims[0]} of the model's input {list(main)} (the "
                f"script's batch size, {main[dims[0]]}): {main[dims[0]]} rows"))
    rows = max(set(firsts), key=lambda size: (firsts.count(size), size == main[0]))
    if len(set(firsts)) > 1:
        note(f"the model's inputs differ in their first dimension ({', '.join(map(str, firsts))}) "
             f"and nothing in the model says which is the batch: the plan takes {rows} rows as "
             "the script's batch, which may not be its batch size")
    return BatchDim(0, rows, main)


#: Settings named for another batch than the training step's.
_OTHER_BATCHES = ("eval", "test", "val", "valid", "infer", "predict")


def batch_named() -> set[int]:
    """The values of the script's own int settings named for its (training) batch: its argparse
    options (``--batch_size``, ``--batch-size``, ``-b``'s ``batch_size`` dest) and its
    module-level globals (the tutorial's ``batch_size = 20``, nanoGPT's), not an evaluation's."""
    import sys

    found: dict[str, Any] = {}
    for parser in STATE.get("plain_parsers") or ():
        for option in parser["options"]:
            found[option["dest"]] = option["value"]
    main = sys.modules.get("__main__")
    for name, value in (vars(main).items() if main is not None else ()):
        found.setdefault(name, value)
    return {value for name, value in found.items()
            if isinstance(value, int) and not isinstance(value, bool) and value > 0
            and "batch" in name.lower().replace("-", "_")
            and not any(other in name.lower() for other in _OTHER_BATCHES)}


def flattened(tensor: torch.Tensor, found: BatchDim) -> list[int] | None:
    """The input's leading dimensions (through the batch's) whose product is ``tensor``'s first
    dimension: a target the loop flattened (``[bptt * batch]``, ``[batch * seq]``); None else."""
    if tensor.dim() == 0 or found.rows is None:
        return None
    product = 1
    for k, size in enumerate(found.main):
        product *= size
        if k > 0 and k >= found.dim and product == tensor.shape[0]:
            return list(found.main[:k + 1])
        if product > tensor.shape[0]:
            return None
    return None


def layout_of(tensor: torch.Tensor, found: BatchDim) -> dict[str, Any] | None:
    """How the recipe resizes ``tensor`` with the batch (``recipe_template._resized``):
    ``{"dim": d}`` along its batch dimension, ``{"dim": d, "flat": [...]}`` as the input's
    leading dimensions flattened, None when it is not the batch's (copied as it is)."""
    if found.rows is None or tensor.dim() == 0:
        return None
    if tensor.dim() > found.dim and tensor.shape[found.dim] == found.rows:
        return {"dim": found.dim}
    flat = flattened(tensor, found)
    return {"dim": found.dim, "flat": flat} if flat is not None else None


def record_batch_dim(batch: Any, found: BatchDim) -> None:
    """The batch's rows, its dimension and each tensor's layout in ``capture.json`` (after
    ``capture.finish``, which took the most common first dimension), and the note where the
    batch is not dimension 0."""
    ANSWER["batch_size"] = found.rows
    ANSWER["batch_dim"] = found.dim
    ANSWER["batch_layout"] = [layout_of(t, found) for t in leaves(batch)]
    if found.how:
        note(found.how)
