"""The child process of the traced estimator: runs the user's recipe on fake tensors.

``launcher.estimate.trace_process`` starts ``python -m launcher.estimate.child._trace_child``,
writes JSON requests to its stdin and reads JSON answers from its stdout. Everything that imports
torch or the user's code lives in this process and its workers, so the parent stays light and a
crash, a hang or an import-time side effect of the user's script cannot take the CLI down with it.

This module is the entry point: ``main`` serves the line protocol, or, with ``--worker``, is one
worker spawned as a fresh interpreter; ``_work`` is what a worker does with a request. The jobs
live in modules of their own (docs/estimator.md explains why each step is there):

- ``_trace_protocol``: the line protocol, the recipe probe, handing requests to workers
  (``_workers``: forked from this process while that is safe, else spawned).
- ``_trace_run``: the sequence traced for one request and its fallbacks: the model built, step 1
  (optimizer state created), the steady-state step at one size and the micro-batches alone at
  the others, under ``FakeTensorMode`` (every tensor a shape and a dtype: a 7B model costs
  nothing); on data-dependent shapes a rerun on real CPU tensors or an upper bound.
- ``_trace_step``: the step itself, the rendered training script's own functions (``_script``),
  so that what is traced is what runs; ``_blocks``: depth scaling of a stack of identical blocks.
- ``_tracker``: the live bytes of every category (parameters, buffers, gradients, activations,
  backward temporaries, optimizer state) after every ATen op, with PyTorch ``MemTracker``'s
  accounting. The parent fits every point linearly in the micro-batch size
  (``launcher.estimate._fit``).
- ``_measure``: a real step's peak from the CPU allocator's own events, the reference.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

from launcher.estimate.child import _measure, _trace_protocol, _trace_run, _workers


def _work(request: dict[str, Any]) -> dict[str, Any]:
    """What a worker process does with its request (it runs the user's code)."""
    if request.get("action") == "probe":
        return _trace_protocol.answer_probe(request)
    if request.get("action") == "measure":
        return _measure.measure(request)
    return _trace_run.run(request)


def _warm_up() -> None:
    """Import what the first fake op imports lazily (``torch._refs``, decompositions, the fake
    tensor machinery: about two seconds) by running a tiny step on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with contextlib.suppress(Exception), FakeTensorMode():
        model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.LayerNorm(4),
                                    torch.nn.Linear(4, 8))
        logits = model(torch.zeros(2, 3, dtype=torch.long))
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.zeros(6, dtype=torch.long)
                                          ).backward()
        torch.optim.AdamW(model.parameters()).step()


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:  # a worker spawned by ``_workers``: one request, one answer
        request = json.loads(sys.stdin.read())
        _workers.answer_with_cache(Path(sys.argv[2]), request, _work)
        return
    _workers.become_reaper()  # what the workers' user code starts comes back here to be ended
    _trace_protocol.serve(_work, warm_up=_warm_up)


if __name__ == "__main__":
    main()
