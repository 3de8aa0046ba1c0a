"""The fake tensor's dispatch-cache key, built faster: the same key, without the detour.

Every op a trace runs on fake tensors looks its output up in ``FakeTensorMode``'s cache, by a
key that holds each tensor argument's metadata (``fake_tensor.extract_tensor_metadata``: a
``TensorMetadata`` dataclass, then flattened field by field through ``dataclasses.fields``).
On the 7B preflight that key was over a third of each trace's time (2.1 of 5.7 s for a
4-block step at three sizes, cProfile), most of it the dataclass round trip and the
sparse-layout checks of dense tensors.

``install`` replaces ``FakeTensorMode._prep_args_for_hash`` with a version that appends the
same values in the same order for the common argument, a dense, strided fake tensor of this
mode with concrete sizes, and hands everything else (sparse and symbolic tensors, constants,
another mode's tensors, graph modules, dicts...) to PyTorch's own function unchanged. So the
cache stores and finds exactly the entries it did: ``tests/estimate/test_fast_fake.py`` builds
both keys for every op of a transformer's training step and for odd tensors (views, channels
last, conjugates, inference tensors) and compares them. It is installed only where
``TensorMetadata`` has the fields this was written against (torch 2.6 to 2.13); a torch that
changes them keeps its own function.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

#: ``fake_tensor.TensorMetadata``'s fields, in the order the key flattens them.
_FIELDS = ("dtype", "shape", "stride", "device", "layout", "memory_format", "storage_offset",
           "storage_bytes", "requires_grad", "is_quantized", "is_conj", "is_neg",
           "is_inference", "is_sparse", "is_coalesced", "dense_dim", "sparse_dim")


def install() -> bool:
    """Use the fast key from now on in this process; False where this torch's metadata differs
    from the one it reproduces (PyTorch's own key stays)."""
    from torch._subclasses import fake_tensor as ft

    if getattr(ft.FakeTensorMode._prep_args_for_hash, "_launch_fast", False):
        return True
    if tuple(f.name for f in dataclasses.fields(ft.TensorMetadata)) != _FIELDS:
        return False
    ft.FakeTensorMode._prep_args_for_hash = fast_prep(  # type: ignore[method-assign]
        ft.FakeTensorMode._prep_args_for_hash)
    return True


def fast_prep(original: Any) -> Any:
    """``FakeTensorMode._prep_args_for_hash`` over ``original`` (PyTorch's), which it calls for
    every argument it does not build itself."""
    from torch._subclasses.fake_tensor import FakeTensor, suggest_memory_format

    strided, contiguous = torch.strided, torch.contiguous_format
    size_type = torch.Size
    lengths = [f"length_{n}" for n in range(64)]

    def length(n: int) -> str:
        return lengths[n] if n < 64 else f"length_{n}"

    def prep(self: Any, result: list[object], args: Any, state: Any,
             id_hashed_objects: list[object]) -> None:
        if isinstance(args, dict):
            original(self, result, args, state, id_hashed_objects)  # keys, values: back here
            return
        if isinstance(args, (list, tuple)):
            result.append(type(args))
            result.append(length(len(args)))
        append = result.append
        for arg in args:
            kind = type(arg)
            if kind in (int, float, bool, str) or arg is None:
                append(kind)
                append(arg)
            elif (isinstance(arg, FakeTensor) and arg.fake_mode is self and arg.constant is None
                  and arg.layout is strided and not arg._has_symbolic_sizes_strides):
                shape, stride = arg.shape, arg.stride()
                fmt = suggest_memory_format(arg) if len(shape) in (4, 5) else contiguous
                if not arg.is_contiguous(memory_format=fmt):
                    fmt = None
                append(arg.dtype)
                append(size_type)
                append(length(len(shape)))
                for n in shape:
                    append(int)
                    append(n)
                append(tuple)
                append(length(len(stride)))
                for n in stride:
                    append(int)
                    append(n)
                result += (arg.device, strided, fmt, arg.storage_offset(),
                           arg.untyped_storage().nbytes(), arg.requires_grad, arg.is_quantized,
                           arg.is_conj(), arg.is_neg(), arg.is_inference(), False, None, None,
                           None)
            elif kind is list or kind is tuple:
                prep(self, result, arg, state, id_hashed_objects)
            else:  # PyTorch's own handling of one argument (an iterator adds no prefix)
                original(self, result, iter((arg,)), state, id_hashed_objects)

    prep._launch_fast = True  # type: ignore[attr-defined]
    prep.__wrapped__ = original  # type: ignore[attr-defined]
    return prep
