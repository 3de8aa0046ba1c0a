"""A script written for the GPU it will get, run on a CPU: the capture's view of ``cuda``.

A plain script hard-codes its device as often as not (``device = "cuda"``, ``.cuda()``,
``.to("cuda:0")``, ``pin_memory()``, ``torch.cuda.synchronize()``). On a machine without a GPU
(every machine ``launch plan`` runs on in CI, most laptops) the capture runs it on the CPU
instead, and remembers the first place it asked for a GPU: the job runs the script as it is, so a
plan for a machine without one must say it would fail there (``runner._no_gpu_here``). The
estimate itself is the CUDA one either way: the trace emulates the target's GPU.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from launcher.capture.child.answer import ANSWER, STATE


def patch_cuda() -> None:
    """A script written for a GPU runs here on the CPU when there is none: ``.cuda()``,
    ``.to("cuda")``, ``device="cuda"`` (a string, ``torch.device``, ``cuda:N`` or an index) and
    ``pin_memory()`` stay on the CPU, and ``torch.cuda.synchronize()`` waits for nothing. What a
    CPU-only torch already tolerates (``torch.cuda.manual_seed``, a ``GradScaler("cuda")`` or an
    ``autocast("cuda")``, which it disables with a warning; the memory counters, which read 0)
    is left to it."""
    if torch.cuda.is_available():
        return

    def module_cuda(self: torch.nn.Module, device: Any = None) -> torch.nn.Module:
        _on_a_gpu(".cuda()")
        return self

    def tensor_cuda(self: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
        _on_a_gpu(".cuda()")
        return self

    torch.nn.Module.cuda = module_cuda  # type: ignore[method-assign]
    torch.Tensor.cuda = tensor_cuda  # type: ignore[method-assign]
    torch.cuda.synchronize = lambda device=None: None
    OnTheCpu().__enter__()  # for the rest of the script: the capture ends the process


def _gpu(value: Any) -> bool:
    """Whether a device argument names a GPU (``"cuda"``, ``"cuda:1"``, a CUDA ``torch.device``);
    an int is a device index only where the argument is a device."""
    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, str) and value.split(":", 1)[0] == "cuda"


def _on_a_gpu(what: str) -> None:
    """Remember the first place the script put a tensor on a GPU itself (``device="cuda"``,
    ``.to("cuda")``, ``.cuda()``), as ``train.py:42: .to('cuda')``: the capture runs it on the
    CPU, but the job runs the script as it is, so a plan for a machine without a GPU (the local
    provider here) must say it will fail there. A script that asks ``torch.cuda.is_available()``
    first never gets here."""
    if "needs_gpu" in ANSWER:
        return
    script = STATE.get("script")
    frame = sys._getframe(1)
    while frame is not None and (script is None or frame.f_code.co_filename != str(script)):
        frame = frame.f_back
    where = f"{script.name}:{frame.f_lineno}: " if frame is not None and script else ""
    ANSWER["needs_gpu"] = where + what


class OnTheCpu(torch.overrides.TorchFunctionMode):
    """Every torch function (factories, ``Tensor.to``, ``Module.to``'s per-tensor moves) sees
    the CPU where the script named a GPU."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and (_gpu(device) or type(device) is int):
            _on_a_gpu(f"device={str(device)!r}")
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.to:
            moved = tuple("cpu" if _gpu(a) or (i == 1 and type(a) is int) else a
                          for i, a in enumerate(args))
            changed = [str(a) for a, m in zip(args, moved, strict=True) if a is not m]
            if changed:
                _on_a_gpu(f".to({changed[0]!r})")
            args = moved
        elif func is torch.Tensor.pin_memory:
            return args[0]
        return func(*args, **kwargs)
