"""The fake tensor's dispatch cache, handed from each round of workers to the next.

Every op a trace runs on fake tensors looks its output up in ``FakeTensorMode``'s cache (a
class-level dict keyed by the op and its arguments' metadata); a miss runs the op's meta kernel
or decomposition, a third to a half of a worker's time. The workers are forked from the trace
child, so they inherit its cache, but what each of them learns dies with it: every worker of
every round computed the same outputs again (the 7B preflight's four rounds trace one model;
the selective rank at six blocks missed 973 times, 455 with the round before's entries).

So a worker writes the entries it added (``export``, beside its answer) and the child takes
them in before it forks the next workers (``absorb``). An entry is a pure function of its key,
which holds everything that decides the output (the op, the arguments' dtypes, shapes, strides
and devices, the default dtype and device, inference mode); the registrations the workers make
(``_sdpa_cuda``, ``_autocast_cuda``) sit above the fake mode and change which ops run, not what
an op returns. What is not data is never shipped: an entry whose key holds a process group, a
script object, a graph module or any other object outside a fixed list of plain types is left
out, and an op is named by its schema, resolved in the child (an op the child does not know,
a user's custom op, is left out too). The file is read with an unpickler that builds nothing
but those types. A file that cannot be read is ignored: the cache is an optimisation, and
the next worker computes what it lacks.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch._ops import OpOverload

#: Types a key element (or a key's type marker) may have to be shipped.
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format, OpOverload)
_MARKERS = frozenset({int, float, bool, str, type(None), tuple, list, dict, torch.Size,
                      torch.dtype, torch.device, torch.layout, torch.memory_format})
#: The classes and functions an entry file may name (``_Reader``).
_ALLOWED = frozenset({
    ("torch", "device"), ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("torch", "dtype"), ("torch", "layout"), ("torch", "memory_format"),
    ("torch._subclasses.fake_tensor", "TensorMetadata"),
    ("torch._subclasses.fake_tensor", "_DispatchCacheValidEntry"),
    ("torch._subclasses.fake_tensor", "_DispatchCacheEntryOutputInfo"),
    ("torch._subclasses.fake_tensor", "_DispatchCacheBypassEntry"),
    ("torch._subclasses.fake_tensor", "SingletonConstant"),
    ("torch._subclasses._fake_tensor_utils", "TensorMetadata"),
    ("builtins", "tuple"), ("builtins", "list"), ("builtins", "dict"),
    ("builtins", "int"), ("builtins", "float"), ("builtins", "bool"), ("builtins", "str"),
})


def _cache() -> dict[Any, Any] | None:
    """The fake mode's shared cache, if this process has imported it (a probe has not)."""
    import sys

    module = sys.modules.get("torch._subclasses.fake_tensor")
    return None if module is None else module.FakeTensorMode.cache


def keys() -> set[Any]:
    """The keys in the cache now: what ``export`` leaves out later."""
    cache = _cache()
    return set() if cache is None else set(cache)


def _op(name: str, overload: str) -> OpOverload:
    """An op by its schema name and overload; raises if this process does not know it."""
    namespace, op = name.split("::", 1)
    found = getattr(getattr(getattr(torch.ops, namespace), op), overload)
    if not isinstance(found, OpOverload):
        raise LookupError(f"{name}.{overload} is not an op overload")
    return found


def _named(op: OpOverload) -> tuple[str, str, str]:
    """An op as data: its schema's name and overload (``_op`` finds it again)."""
    return "op", op._schema.name, op._schema.overload_name or "default"


def _type_of(value: Any) -> type:
    """``type`` with one argument only: a file may name ``NoneType``, never make a class."""
    return type(value)


class _Reader(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "type"):  # ``type(None)``: the NoneType marker
            return _type_of
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module == "torch._utils" and name.startswith("torch.") and isinstance(
                getattr(torch, name.removeprefix("torch."), None), torch.memory_format):
            return getattr(torch, name.removeprefix("torch."))
        raise pickle.UnpicklingError(f"{module}.{name} is not a cache entry's type")


def _shippable(key: tuple[Any, ...]) -> bool:
    return all(element in _MARKERS if isinstance(element, type) else type(element) in _PLAIN
               for element in key)


def export(before: set[Any], path: Path) -> int:
    """Write the entries added to the cache since ``before`` (``keys()``) to ``path``; returns
    how many. Nothing is written when there are none."""
    cache = _cache()
    if cache is None:
        return 0
    entries = [(tuple(_named(e) if type(e) is OpOverload else e for e in key.key), entry)
               for key, entry in list(cache.items()) if key not in before and _shippable(key.key)]
    if not entries:
        return 0
    data = pickle.dumps(entries, protocol=pickle.HIGHEST_PROTOCOL)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)
    return len(entries)


def absorb(path: Path) -> int:
    """Add the entries in ``path`` (``export``'s) that the cache lacks; returns how many. A
    missing or unreadable file adds nothing."""
    cache = _cache()
    if cache is None:
        return 0
    from torch._subclasses.fake_tensor import (
        _DispatchCacheBypassEntry,
        _DispatchCacheKey,
        _DispatchCacheValidEntry,
    )

    try:
        entries = _Reader(io.BytesIO(path.read_bytes())).load()
    except Exception:  # noqa: BLE001 - missing or torn: nothing to add
        return 0
    added = 0
    for item in entries if isinstance(entries, list) else ():
        try:
            named, entry = item
            key = tuple(_op(e[1], e[2]) if type(e) is tuple and len(e) == 3 and e[0] == "op"
                        else e for e in named)
        except Exception:  # noqa: BLE001 - an op this process does not know: left out
            continue
        if (not isinstance(key, tuple) or not _shippable(key) or not isinstance(
                entry, (_DispatchCacheValidEntry, _DispatchCacheBypassEntry))):
            continue
        cache_key = _DispatchCacheKey(key)  # hashed here: str hashes differ by interpreter
        if cache_key not in cache:
            cache[cache_key] = entry
            added += 1
    return added
