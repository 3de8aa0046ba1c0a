"""The fake tensor's cache, shipped from one process to another (``_shared_cache``).

A fresh interpreter (its own string hashes, its own op objects) runs a training step on fake
tensors and exports what it added to the cache; this process takes it in and runs the same
step with PyTorch's cross-check on, which recomputes every output it finds in the cache and
compares: every shipped entry that is used must be what the op computes here. What is not
plain data is never shipped, and a file that names anything else is refused unread.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from launcher.estimate.child import _shared_cache
from tests.estimate._recipes import GPT

REPO = Path(__file__).resolve().parents[2]

STEP = """
import sys
from pathlib import Path
from torch._subclasses.fake_tensor import FakeTensorMode
from launcher.estimate.child import _shared_cache
from tests.estimate.test_shared_cache import _step

recipe = {}
exec(sys.stdin.read(), recipe)
with FakeTensorMode():
    before = _shared_cache.keys()
    _step(recipe)
print(_shared_cache.export(before, Path(sys.argv[1])))
"""


def _step(recipe: dict[str, Any]) -> None:
    model = recipe["build_model"]()
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    idx = torch.randint(0, 256, (3, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
    torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx.flatten()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


@pytest.fixture
def empty_cache(monkeypatch: pytest.MonkeyPatch) -> dict[Any, Any]:
    """This process's fake-tensor cache, empty for the test and restored after it."""
    monkeypatch.setattr(FakeTensorMode, "cache", {})
    return FakeTensorMode.cache


def test_entries_from_another_interpreter_are_the_ops_own_outputs(
        tmp_path: Path, empty_cache: dict[Any, Any]) -> None:
    shipped = tmp_path / "answer.json.fakecache"
    done = subprocess.run(
        [sys.executable, "-c", STEP, str(shipped)], input=GPT, capture_output=True, text=True,
        cwd=REPO, env={**os.environ, "PYTHONHASHSEED": "random"}, timeout=300, check=True)
    exported = int(done.stdout.split()[-1])
    assert exported > 100

    assert _shared_cache.absorb(shipped) == exported  # every op is known here
    assert _shared_cache.absorb(shipped) == 0  # and nothing is added twice

    import torch._dynamo.config

    recipe: dict[str, Any] = {}
    exec(GPT, recipe)  # noqa: S102 - the test recipe's own source
    hits, misses = FakeTensorMode.cache_hits, FakeTensorMode.cache_misses
    with torch._dynamo.config.patch(fake_tensor_cache_crosscheck_enabled=True), \
            FakeTensorMode():  # every hit is recomputed and compared (PyTorch's cross-check)
        _step(recipe)
    assert FakeTensorMode.cache_hits - hits > 100
    assert FakeTensorMode.cache_misses - misses == 0


def test_an_op_this_process_does_not_know_is_left_out(tmp_path: Path,
                                                      empty_cache: dict[Any, Any]) -> None:
    with FakeTensorMode():
        before = _shared_cache.keys()
        torch.ones(4, 4) @ torch.ones(4, 4)
    shipped = tmp_path / "cache"
    count = _shared_cache.export(before, shipped)
    assert count >= 1
    entries = pickle.loads(shipped.read_bytes())
    key, entry = entries[0]
    unknown = tuple(("op", "nosuchlib::op", "default") if type(e) is tuple else e for e in key)
    shipped.write_bytes(pickle.dumps([(unknown, entry), *entries]))
    empty_cache.clear()
    assert _shared_cache.absorb(shipped) == count


class _Anything:
    pass


def test_what_is_not_plain_data_is_neither_shipped_nor_read(
        tmp_path: Path, empty_cache: dict[Any, Any]) -> None:
    from torch._subclasses.fake_tensor import _DispatchCacheBypassEntry, _DispatchCacheKey

    # a key holding an object (a process group, a graph module) stays in its process
    before = _shared_cache.keys()
    empty_cache[_DispatchCacheKey((torch.ops.aten.add.Tensor, _Anything, _Anything()))] = (
        _DispatchCacheBypassEntry("test"))
    assert _shared_cache.export(before, tmp_path / "none") == 0
    assert not (tmp_path / "none").exists()

    # a file naming anything else is refused before it builds it
    hostile = tmp_path / "hostile"
    hostile.write_bytes(pickle.dumps([((1,), os.system)]))
    assert _shared_cache.absorb(hostile) == 0
    hostile.write_bytes(pickle.dumps(_Anything()))
    assert _shared_cache.absorb(hostile) == 0

    # torn, empty or missing: nothing, and no error
    torn = tmp_path / "torn"
    torn.write_bytes(pickle.dumps([((1,), _DispatchCacheBypassEntry("x"))])[:-3])
    assert _shared_cache.absorb(torn) == 0
    (tmp_path / "empty").write_bytes(b"")
    assert _shared_cache.absorb(tmp_path / "empty") == 0
    assert _shared_cache.absorb(tmp_path / "missing") == 0
    assert not empty_cache or all(
        isinstance(k, _DispatchCacheKey) and k.key[1] is _Anything for k in empty_cache)
