"""The fast dispatch-cache key (``_fast_fake``) is PyTorch's own key, value for value.

Every key the fake tensor's cache builds during a training step (a GPT under bf16 autocast:
SDPA, views, in-place updates, a foreach AdamW step, gradient clipping) and on odd tensors
(conjugate, negative, channels-last, permuted, offset views, inference tensors, empty ones)
is built both ways and compared, and so is every refusal to cache (a real tensor mixed in).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch._subclasses import fake_tensor as ft
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import FakeTensorMode

from launcher.estimate.child import _fast_fake
from tests.estimate._recipes import GPT


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Build every cache key with PyTorch's function and with the fast one; fail on the first
    difference (of value or of type: 1 and 1.0 and True are different keys)."""
    original = ft.FakeTensorMode._prep_args_for_hash
    fast = _fast_fake.fast_prep(original)
    real_key = ft.FakeTensorMode._cache_key
    counts = {"keys": 0, "bypassed": 0}

    def key_with(prep: Any, mode: Any, func: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
        monkeypatch.setattr(ft.FakeTensorMode, "_prep_args_for_hash", prep)
        try:
            return real_key(mode, _CacheKeyState(mode.shape_env), func, args, kwargs).key, None
        except ft._BypassDispatchCache as exc:
            return None, exc.reason
        finally:
            monkeypatch.setattr(ft.FakeTensorMode, "_prep_args_for_hash", original)

    def both(mode: Any, state: Any, func: Any, args: Any, kwargs: Any) -> Any:
        theirs, their_reason = key_with(original, mode, func, args, kwargs)
        ours, our_reason = key_with(fast, mode, func, args, kwargs)
        assert our_reason == their_reason, func
        assert ours == theirs, func
        if theirs is not None:
            assert [type(v) for v in ours] == [type(v) for v in theirs], func
        counts["keys" if theirs is not None else "bypassed"] += 1
        return real_key(mode, state, func, args, kwargs)

    monkeypatch.setattr(ft.FakeTensorMode, "_cache_key", both)
    return counts


def test_every_key_of_a_training_step_is_pytorchs(compared: dict[str, int]) -> None:
    recipe: dict[str, Any] = {}
    exec(GPT, recipe)  # noqa: S102 - the test recipe's own source
    with FakeTensorMode():
        model = recipe["build_model"]()
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
        for _ in range(2):  # the second step finds its outputs in the cache
            idx = torch.randint(0, 256, (3, 32))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(idx)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                     idx.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    assert compared["keys"] > 300


def test_odd_tensors_and_refusals_get_pytorchs_keys(compared: dict[str, int]) -> None:
    real = torch.ones(3)
    with FakeTensorMode(allow_non_fake_inputs=True):
        z = torch.randn(4, 5, dtype=torch.cfloat)
        (z.conj() + 1).abs().sum()
        torch._neg_view(torch.randn(3, 2, dtype=torch.cfloat)).sum()
        images = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
        torch.nn.functional.conv2d(images, torch.randn(8, 3, 3, 3)).relu()
        torch.randn(2, 3, 4, 5, 6).permute(0, 2, 3, 4, 1) + 1
        window = torch.randn(6, 7)[1:, 2:].t()
        torch.cat([window * 2, window], dim=0)
        with torch.inference_mode():
            torch.randn(3) * 2
        torch.empty(0, 4).sum(dim=0)
        torch.zeros(3, dtype=torch.long).add_(2)
        torch.randn(3).clamp(min=None, max=1.0)
        torch.full((3,), 2.5, dtype=torch.float64).mul(True)
        torch.randn(2, 3).expand(4, 2, 3).contiguous()
        torch.randn(()) + torch.randn(5)
        torch.randn(3, requires_grad=True).sum()
        torch.randn(3) + real  # a real tensor: not cached
        torch.tensor([1.0, 2.0]) * 2  # a constant: not cached
    assert compared["keys"] > 20
    assert compared["bypassed"] >= 2


def test_a_torch_with_other_metadata_keeps_its_own_key(monkeypatch: pytest.MonkeyPatch) -> None:
    original = ft.FakeTensorMode._prep_args_for_hash
    monkeypatch.setattr(_fast_fake, "_FIELDS", _fast_fake._FIELDS + ("new_field",))
    assert not _fast_fake.install()
    assert ft.FakeTensorMode._prep_args_for_hash is original
    assert tuple(f.name for f in dataclasses.fields(ft.TensorMetadata)) == _fast_fake._FIELDS[:-1]
