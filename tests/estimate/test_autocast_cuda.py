"""CUDA's autocast policies on the CPU's autocast key (launcher/estimate/child/_autocast_cuda.py).

The registrations are process-wide, so the policy checks run in a child interpreter; the trace
check goes through the estimator's own child, as in production.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from launcher.estimate.traced import trace_recipe

CHECK = textwrap.dedent('''
    import json, torch, torch.nn.functional as F
    from launcher.estimate.child import _autocast_cuda
    registered = _autocast_cuda.install()
    x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    m = torch.randn(3, 8)
    out = {}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cases = {
            "layer_norm": lambda: F.layer_norm(x, (8,)),
            "group_norm": lambda: F.group_norm(x.view(4, 8, 1), 2),
            "softmax": lambda: F.softmax(x, -1),
            "softmax_explicit_bf16": lambda: F.softmax(x, -1, dtype=torch.bfloat16),
            "log_softmax": lambda: F.log_softmax(x, -1),
            "sum": lambda: x.sum(),
            "exp": lambda: x.exp(),
            "pow": lambda: x.pow(2),
            "rsqrt": lambda: x.rsqrt(),
            "logsumexp": lambda: x.logsumexp(-1),
            "cross_entropy": lambda: F.cross_entropy(x, torch.zeros(4, dtype=torch.long)),
            "mv": lambda: torch.mv(m, x[0].float()),
            "linear": lambda: F.linear(x.float(), m),
            "silu": lambda: F.silu(x),
        }
        for name, fn in cases.items():
            out[name] = str(fn().dtype)
        F.layer_norm(x, (8,)).sum().backward()
    out["grad"] = str(x.grad.dtype)
    out["registered"] = registered
    print(json.dumps(out))
''')


def test_cpu_autocast_follows_cuda_lists() -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          check=True, timeout=120)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    fp32 = ("layer_norm", "group_norm", "softmax", "log_softmax", "sum", "exp", "pow", "rsqrt",
            "logsumexp", "cross_entropy")
    for name in fp32:
        assert got[name] == "torch.float32", name  # CUDA: fp32 / fp32_set_opt_dtype
    for name in ("mv", "linear", "silu", "softmax_explicit_bf16"):
        assert got[name] == "torch.bfloat16", name  # lower precision, or an explicit dtype kept
    assert got["grad"] == "torch.bfloat16"  # the cast is differentiable: grads come back down
    assert "layer_norm" in got["registered"] and "linear" not in got["registered"]


LN_STACK = '''
import torch, torch.nn as nn

def build_model():
    return nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(64, 64), nn.LayerNorm(64))))

def example_batch(batch_size):
    return torch.randn(batch_size, 256, 64)

def training_step(model, batch):
    return model(batch).float().pow(2).mean()
'''


def test_a_gpu_bf16_trace_keeps_the_fp32_copies_cuda_makes(tmp_path: Path) -> None:
    """CUDA autocast runs layer_norm in fp32: its bf16 input is copied up and the copy saved for
    backward. A CUDA estimate traced on this CPU must count those copies; the CPU's own autocast
    (device="cpu") makes none."""
    recipe = tmp_path / "ln.py"
    recipe.write_text(LN_STACK)
    common = dict(micro_batch_sizes=(8, 16), precision="bf16_mixed", optimizer="sgd",
                  timeout_s=300)
    gpu = trace_recipe(recipe, device="cuda", **common)
    cpu = trace_recipe(recipe, device="cpu", **common)
    if gpu.trace_device == "cpu":
        assert any("autocast casts as on CUDA" in note for note in gpu.notes)
    # Per Linear + LayerNorm pair, CUDA saves the fp32 copy of the LayerNorm's input (1 MiB
    # at 16 x 256 x 64) where CPU autocast saves the bf16 original (0.5 MiB); both save the
    # bf16 input of the next Linear. Four pairs: 2 MiB more, plus the 512-byte rounding of
    # the small tensors (mean, rstd, ...), a few tens of KiB.
    extra = 4 * 16 * 256 * 64 * (4 - 2)
    difference = gpu.memory_at(16).activations - cpu.memory_at(16).activations
    assert extra <= difference <= extra + 128 * 1024


CACHE_CHECK = textwrap.dedent('''
    import json, torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from launcher.estimate.child import _autocast_cuda
    _autocast_cuda.install()
    w = torch.nn.Parameter(torch.randn(8, 8))
    bf16 = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.bfloat16))

    class Casts(TorchDispatchMode):
        def __init__(self):
            super().__init__(); self.n = {"fp32": 0, "bf16": 0}
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default:
                name = "fp32" if args[0] is w else "bf16" if args[0] is bf16 else "other"
                self.n[name] = self.n.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    x = torch.randn(8, dtype=torch.bfloat16)
    with Casts() as casts:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.mv(w, torch.mv(w, x))  # one region: one cast of w, reused
            y = torch.mv(bf16, y)             # a bf16 weight (FSDP2's gathered one): no cast
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.mv(w, y)                # the next region casts again
    print(json.dumps({**casts.n, "left": len(_autocast_cuda._weight_cache)}))
''')


def test_weight_casts_go_through_autocasts_cache() -> None:
    """CUDA's kernels cast an fp32 parameter once per autocast region (``cached_cast``) and a
    bf16 one never: the Python kernels must too, or a weight used twice is counted twice."""
    proc = subprocess.run([sys.executable, "-c", CACHE_CHECK], capture_output=True, text=True,
                          check=True, timeout=120)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["fp32"] == 2 and got["bf16"] == 0 and got["left"] == 0
