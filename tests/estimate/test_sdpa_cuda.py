"""CUDA's attention kernels and dropout for a GPU estimate traced on a CPU
(launcher/estimate/child/_sdpa_cuda.py).

The kernel registrations are process-wide, so what runs under them runs in a child
interpreter; the selection rules are plain functions and are checked here. Every expected byte
count is computed from the shapes and the CUDA sources (``derivatives.yaml``, ``attention.cpp``,
``flash_api.cpp``, ``attention_backward.cu``), not read back from the module.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _recipes import GPT  # noqa: E402

from launcher.estimate.child import _sdpa_cuda as sdpa  # noqa: E402
from launcher.estimate.traced import trace_recipe, trace_recipe_configs  # noqa: E402


def _params(b: int = 2, h: int = 4, s: int = 128, d: int = 64, dtype: torch.dtype = torch.bfloat16,
            mask: torch.Tensor | None = None, dropout: float = 0.1, causal: bool = True,
            kv_heads: int | None = None, gqa: bool = False) -> sdpa.SdpParams:
    q = torch.empty(b, h, s, d, dtype=dtype, device="meta", requires_grad=True)
    kv = torch.empty(b, kv_heads or h, s, d, dtype=dtype, device="meta", requires_grad=True)
    return sdpa.SdpParams(q, kv, kv, mask, dropout, causal, gqa)


@pytest.mark.parametrize(("case", "cap", "expected"), [
    (dict(), (8, 0), "flash"),                                    # bf16 on an A100
    (dict(dtype=torch.float32), (9, 0), "efficient"),             # flash is 16-bit only
    (dict(), (7, 0), "math"),                                     # V100: no bf16 fused kernel
    (dict(dtype=torch.float16), (7, 0), "efficient"),             # ... but fp16 efficient
    (dict(dtype=torch.float16), (7, 5), "efficient"),             # flash needs sm80
    (dict(mask=torch.empty(128, 128, device="meta"), causal=False), (8, 0), "efficient"),
    (dict(d=72), (8, 0), "flash"),                                # padded to 80 by attention.cpp
    (dict(d=264), (9, 0), "efficient"),                           # flash: head dim <= 256
    (dict(d=200), (8, 9), "efficient"),                           # sm86-89 flash bwd: d <= 192
    (dict(d=62, dtype=torch.float32), (8, 0), "math"),            # efficient: d % 4
    (dict(kv_heads=2, gqa=True), (8, 0), "flash"),                # GQA: flash handles it
    (dict(kv_heads=2, gqa=True, dtype=torch.float32), (8, 0), "math"),
])
def test_backend_selection_follows_sdp_utils(case: dict, cap: tuple[int, int],
                                             expected: str) -> None:
    assert sdpa.select_backend(_params(**case), cap) == expected


def test_cudnn_rules_when_it_goes_first() -> None:
    order = (sdpa.CUDNN, *sdpa.PRIORITY[:-1])
    assert sdpa.select_backend(_params(dropout=0.125), (9, 0), order) == "cudnn"
    assert sdpa.select_backend(_params(dropout=0.1), (9, 0), order) == "flash"  # 1/16 steps
    assert sdpa.select_backend(_params(d=256, dropout=0.0), (8, 0), order) == "flash"  # d <= 128
    assert sdpa.select_backend(_params(d=256, dropout=0.0), (9, 0), order) == "cudnn"


def test_generations_map_to_capabilities() -> None:
    assert sdpa.capability_of("hopper") == (9, 0) and sdpa.capability_of("volta") == (7, 0)
    assert sdpa.capability_of(None) == sdpa.DEFAULT_CAPABILITY
    # every generation of the catalog is known
    gpus = json.loads((Path(sdpa.__file__).parents[2] / "plan/catalogs/gpus.json").read_text())
    assert {g["generation"] for g in gpus["gpus"].values()} <= set(sdpa.CAPABILITY)


# One attention call, fake tensors, saved bytes (distinct storages that autograd keeps) and the
# bytes each backward op allocates, per backend, in a child interpreter.
ONE_CALL = textwrap.dedent('''
    import json, sys, torch, torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from launcher.estimate.child import _sdpa_cuda as S
    case = json.loads(sys.argv[1])
    S.install(tuple(case["cap"]))

    class Allocs(TorchDispatchMode):
        def __init__(self):
            super().__init__(); self.sizes = []; self.seen = set()
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    if id(st) not in self.seen and st.nbytes():
                        self.seen.add(id(st)); self.sizes.append(st.nbytes())
            return out

    with FakeTensorMode():
        dt = getattr(torch, case["dtype"])
        b, h, s, d, kv = case["b"], case["h"], case["s"], case["d"], case.get("kv", case["h"])
        q = torch.empty(b, h, s, d, dtype=dt, requires_grad=True)
        k = torch.empty(b, kv, s, d, dtype=dt, requires_grad=True)
        v = torch.empty(b, kv, s, d, dtype=dt, requires_grad=True)
        mask = None
        if case.get("mask"):
            mask = torch.empty(b, h, s, s, dtype=dt, requires_grad=True)
        storages = {}
        def pack(t):
            storages[id(t.untyped_storage())] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                dropout_p=case["dropout"], is_causal=case["causal"],
                enable_gqa=kv != h)
        chosen = S.chosen()
        for t in (q, k, v) + ((mask,) if mask is not None else ()):
            storages.pop(id(t.untyped_storage()), None)  # the inputs are the caller's
        grad = torch.empty_like(out)
        with Allocs() as allocs:
            out.backward(grad)
        print(json.dumps({"chosen": chosen, "saved": sorted(storages.values()),
                          "backward": sorted(allocs.sizes),
                          "grad_mask": None if mask is None else mask.grad.shape[-1]}))
''')


def _one_call(**case: object) -> dict:
    proc = subprocess.run([sys.executable, "-c", ONE_CALL, json.dumps(case)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_flash_keeps_output_and_logsumexp_not_scores() -> None:
    b, h, s, d = 2, 4, 200, 64
    got = _one_call(cap=[8, 0], dtype="bfloat16", b=b, h=h, s=s, d=d, dropout=0.1, causal=True)
    assert got["chosen"] == {"flash": 1}
    # _scaled_dot_product_flash_attention's node: output (bf16), logsumexp [b, h, s] fp32, and
    # the philox state (two uint64 + one uint64): no s x s tensor, no dropout mask
    assert got["saved"] == sorted([b * h * s * d * 2, b * h * s * 4, 16, 8])
    # mha_bwd: grads of q, k, v, softmax_d [b, h, round128(s)] and dq_accum [b, round128(s), h,
    # round32(d)], both fp32
    s_r = 256
    for size in (b * h * s * d * 2, b * h * s_r * 4, b * s_r * h * d * 4):
        assert size in got["backward"], size
    assert max(got["backward"]) < b * h * s * s * 2  # nothing quadratic


def test_efficient_pads_logsumexp_and_its_mask_gradient() -> None:
    b, h, s, d = 2, 4, 100, 64
    got = _one_call(cap=[8, 0], dtype="float32", b=b, h=h, s=s, d=d, dropout=0.1, causal=False,
                    mask=True)
    assert got["chosen"] == {"efficient": 1}
    # output fp32, logsumexp padded to 32 rows, seed and offset (int64), and the mask as
    # preprocess_mask hands it over: padded to a multiple of 16 columns (a copy)
    lse = b * h * math.ceil(s / 32) * 32 * 4
    mask_copy = b * h * s * (s + 16 - s % 16) * 4
    assert got["saved"] == sorted([b * h * s * d * 4, lse, 8, 8, mask_copy])
    # backward: the bias gradient aligned to 16 columns and delta [b, h, s] fp32
    assert mask_copy in got["backward"] and b * h * s * 4 in got["backward"]
    assert got["grad_mask"] == s


def test_math_fallback_keeps_the_quadratic_tensors() -> None:
    b, h, s, d = 1, 2, 64, 64
    got = _one_call(cap=[7, 0], dtype="bfloat16", b=b, h=h, s=s, d=d, dropout=0.1, causal=True)
    assert got["chosen"] == {"math": 1}
    # CUDA's math path: probabilities, the dropout's bool mask (native_dropout on CUDA)...
    assert sum(got["saved"]) >= b * h * s * s * (2 + 1)
    assert b * h * s * s in got["saved"]  # the bool mask: 1 byte an element


def test_gqa_flash_expands_key_value_gradients_in_backward() -> None:
    b, h, kv, s, d = 2, 8, 2, 128, 64
    got = _one_call(cap=[9, 0], dtype="bfloat16", b=b, h=h, kv=kv, s=s, d=d, dropout=0.0,
                    causal=True)
    assert got["chosen"] == {"flash": 1}
    assert got["saved"] == sorted([b * h * s * d * 2, b * h * s * 4, 16, 8])
    # dk_expanded and dv_expanded [b, s, h, d] beside the kv-head gradients
    assert got["backward"].count(b * s * h * d * 2) >= 3  # grad_q and the two expansions
    assert b * kv * s * d * 2 in got["backward"]


# A GPT-2-shaped block as Korthikanti et al. count it (pure 16-bit, GeLU, dropout 0.1 after
# attention and after each projection), traced by the estimator at two depths and two sizes.
BLOCKS = '''
import torch, torch.nn as nn, torch.nn.functional as F

H, A, S, LAYERS = 1600, 25, 1024, {layers}

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv, self.proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.fc, self.out = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, A, H // A).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), dropout_p=0.1, is_causal=True)
        x = x + F.dropout(self.proj(y.transpose(1, 2).reshape(b, s, H)), 0.1, self.training)
        h = self.out(F.gelu(self.fc(self.ln2(x))))
        return x + F.dropout(h, 0.1, self.training)

def build_model():
    return nn.Sequential(*(Block() for _ in range(LAYERS)))

def example_batch(batch_size):
    return torch.randn(batch_size, S, H)

def training_step(model, batch):
    return model(batch).float().square().mean()
'''


def test_gpt2_xl_block_keeps_korthikanti_34_sbh(tmp_path: Path) -> None:
    """Per layer and sample, a CUDA trace of GPT-2 XL's block keeps 34 s h bytes (16-bit, 1-byte
    dropout masks, flash attention's O(s) statistics), where the CPU's math path kept the
    5 a s^2 of scores, probabilities and masks on top (25x more at s = 1024)."""
    acts = {}
    for layers in (2, 4):
        recipe = tmp_path / f"blocks{layers}.py"
        recipe.write_text(BLOCKS.format(layers=layers))
        # (at micro-batch 1 the step peaks elsewhere: the optimizer's phase)
        trace = trace_recipe(recipe, micro_batch_sizes=(2, 4), precision="bf16",
                             optimizer="sgd", device="cuda", scale_depth=False, timeout_s=300)
        if trace.trace_device != "cpu":
            pytest.skip("a GPU traced this: the emulation is not in use")
        acts[layers] = {b: trace.memory_at(b).activations for b in (2, 4)}
    per_layer_sample = ((acts[4][4] - acts[4][2]) - (acts[2][4] - acts[2][2])) / 4
    s, h, a = 1024, 1600, 25
    korthikanti = 34 * s * h
    # 34 s h and the logsumexp (4 a s): within 1%; the math path kept 5 a s^2 more (26x)
    assert per_layer_sample == pytest.approx(korthikanti + 4 * a * s, rel=0.01)


def test_the_gpu_generation_reaches_the_trace(tmp_path: Path) -> None:
    """A V100 has no bf16 fused kernel: the same bf16 step traced for it runs the math path and
    keeps the scores; for an Ampere-or-newer GPU (the default) it runs flash attention."""
    recipe = tmp_path / "gpt.py"
    recipe.write_text(GPT)
    default, volta = trace_recipe_configs(
        recipe, [{}, {"gpu_generation": "volta"}], micro_batch_sizes=(2, 4), precision="bf16",
        optimizer="sgd", device="cuda", timeout_s=300)
    assert not isinstance(default, Exception) and not isinstance(volta, Exception)
    if default.trace_device != "cpu":
        pytest.skip("a GPU traced this: the emulation is not in use")
    assert any("(sm80)" in n for n in default.notes) and any("(sm70)" in n for n in volta.notes)
    # two layers of 4 heads at s = 32 keep bf16 probabilities of [b, 4, 32, 32] on the math path
    extra = volta.memory_at(4).activations - default.memory_at(4).activations
    assert extra >= 2 * 4 * 4 * 32 * 32 * 2
