"""The traced estimator against reality: real CPU steps, exact model-state bytes, user errors.

Every trace and every real measurement runs in its own child process, as in production. They
are started together (a few at a time) by one module-scoped fixture, and the tests read the
results: the whole file costs about as much as its slowest children.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from _recipes import GPT  # tests/estimate is on sys.path under pytest

from launcher.estimate.traced import (
    ScaledTrace,
    TraceError,
    TraceResult,
    TraceTimeout,
    measure_recipe,
    trace_recipe,
    trace_recipe_configs,
)
from launcher.plan.plan import Memory

CNN = '''
import torch, torch.nn as nn, torch.nn.functional as F

def build_model():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )

def example_batch(batch_size):
    return torch.randn(batch_size, 3, 32, 32), torch.randint(0, 10, (batch_size,))

def training_step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
'''

# Bias-free linear layers of known sizes: P = 4 * (256*256) weights in 4 tensors.
STATES = '''
import torch, torch.nn as nn

def build_model():
    return nn.Sequential(*(nn.Linear(256, 256, bias=False) for _ in range(4)))

def example_batch(batch_size):
    return torch.randn(batch_size, 256)

def training_step(model, batch):
    return model(batch).pow(2).mean()
'''
P, TENSORS = 4 * 256 * 256, 4

MOE = '''
import torch, torch.nn as nn, torch.nn.functional as F

class MoE(nn.Module):
    def __init__(self, d=32, experts=4):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(experts))

    def forward(self, x):
        choice = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            idx = (choice == e).nonzero().squeeze(-1)        # data-dependent size
            out = out.index_add(0, idx, expert(x[idx]))
        return out

def build_model():
    return MoE()

def example_batch(batch_size):
    return torch.randn(batch_size * 16, 32)

def training_step(model, batch):
    return model(batch).pow(2).mean()
'''

SYNTAX = '''
import torch

def build_model():
    return torch.nn.Linear(4, 4
'''

HOOK = '''
import torch

def _refuse(module, inputs):
    raise ValueError("this hook refuses")

def build_model():
    model = torch.nn.Linear(4, 4)
    model.register_forward_pre_hook(_refuse)
    return model

def example_batch(batch_size):
    return torch.randn(batch_size, 4)

def training_step(model, batch):
    return model(batch).sum()
'''

SLOW = '''
import time, torch

def build_model():
    time.sleep(120)
    return torch.nn.Linear(4, 4)

def example_batch(batch_size):
    return torch.randn(batch_size, 4)

def training_step(model, batch):
    return model(batch).sum()
'''

# A frozen table (requires_grad=False), as Whisper's encoder positions or a frozen backbone.
FROZEN = '''
import torch, torch.nn as nn

class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(64, 128)
        self.table.requires_grad_(False)
        self.head = nn.Linear(128, 64)

    def forward(self, idx):
        return self.head(self.table(idx))

def build_model():
    return Frozen()

def example_batch(batch_size):
    return torch.randint(0, 64, (batch_size, 16))

def training_step(model, batch):
    return nn.functional.cross_entropy(model(batch).flatten(0, 1), batch.flatten())
'''

# Eight identical blocks: the estimator traces two and four of them and extrapolates.
DEEP_GPT = GPT.replace("V, D, H, L, S = 256, 64, 4, 2, 32", "V, D, H, L, S = 256, 64, 4, 8, 32")
# The same, with a forward that indexes all eight blocks: it cannot run on fewer.
INDEXED_GPT = DEEP_GPT.replace("for block in self.blocks:\n            x = block(x)",
                               "for i in range(L):\n            x = self.blocks[i](x)")

STATE_CONFIGS: list[dict[str, Any]] = [
    {"precision": "fp32", "optimizer": "adamw"},
    {"precision": "bf16_mixed", "optimizer": "adamw"},
    {"precision": "bf16", "optimizer": "adamw"},
    {"precision": "fp32", "optimizer": "sgd"},
    {"precision": "fp32", "optimizer": "adam8bit"},
    {"precision": "fp32", "optimizer": "adafactor"},
    {"precision": "fp32", "optimizer": "adamw", "activation_checkpointing": False,
     "micro_batch_sizes": (1, 2), "grad_accum_steps": 4},
]


class Runs:
    """Futures of every child process the tests need, started at once."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.pool = ThreadPoolExecutor(3)
        self.futures: dict[str, Future] = {}

    def recipe(self, name: str, source: str) -> Path:
        path = self.dir / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        return path

    def submit(self, key: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.futures[key] = self.pool.submit(fn, *args, **kwargs)

    def get(self, key: str) -> Any:
        return self.futures[key].result()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    r = Runs(tmp_path_factory.mktemp("recipes"))
    gpt, cnn = r.recipe("gpt", GPT), r.recipe("cnn", CNN)
    states, moe = r.recipe("states", STATES), r.recipe("moe", MOE)
    # slowest first
    r.submit("gpt", trace_recipe, gpt, device="cpu", micro_batch_sizes=(1, 2, 4),
             verify_sizes=(6,))
    r.submit("gpt_real4", measure_recipe, gpt, micro_batch=4)
    r.submit("gpt_real6", measure_recipe, gpt, micro_batch=6)
    r.submit("states", trace_recipe_configs, states, STATE_CONFIGS, device="cpu",
             micro_batch_sizes=(2, 4))
    r.submit("cnn", trace_recipe, cnn, device="cpu", micro_batch_sizes=(2, 4))
    r.submit("cnn_real", measure_recipe, cnn, micro_batch=4)
    r.submit("moe", trace_recipe_configs, moe, [{}, {"data_dependent": "bound"}],
             device="cpu", micro_batch_sizes=(1, 2))
    r.submit("moe_real", measure_recipe, moe, micro_batch=2)
    r.submit("cuda", trace_recipe, states, device="cuda", micro_batch_sizes=(2, 4),
             optimizer="adamw")
    deep = r.recipe("deep", DEEP_GPT)
    r.submit("deep", trace_recipe, deep, device="cpu", micro_batch_sizes=(1, 2, 4))
    r.submit("deep_full", trace_recipe, deep, device="cpu", micro_batch_sizes=(1, 2, 4),
             scale_depth=False)
    r.submit("deep_real", measure_recipe, deep, micro_batch=4)
    r.submit("indexed", trace_recipe, r.recipe("indexed", INDEXED_GPT), device="cpu",
             micro_batch_sizes=(1, 2))
    frozen = r.recipe("frozen", FROZEN)
    r.submit("frozen", trace_recipe, frozen, device="cpu", micro_batch_sizes=(1, 2, 4))
    r.submit("frozen_real", measure_recipe, frozen, micro_batch=4)
    r.submit("syntax", _error, r.recipe("syntax", SYNTAX))
    r.submit("hook", _error, r.recipe("hook", HOOK))
    r.submit("timeout", _error, r.recipe("slow", SLOW), timeout_s=5)
    yield r
    r.pool.shutdown(wait=True)


def _error(path: Path, **kwargs: Any) -> TraceError:
    with pytest.raises(TraceError) as info:
        trace_recipe(path, device="cpu", micro_batch_sizes=(1,), **kwargs)
    return info.value


def _within(estimate: int, real: int, tolerance: float = 0.01) -> bool:
    return abs(estimate - real) <= tolerance * real


# ----------------------------------------------------------------------------------------------
# Against a real step


def test_traced_peak_matches_a_real_cpu_step(runs: Runs) -> None:
    trace: TraceResult = runs.get("gpt")
    real = runs.get("gpt_real4").peak_allocated
    assert trace.kind == "traced"
    assert _within(trace.peak_at(4), real), (trace.peak_at(4), real)


def test_a_frozen_weight_is_traced_without_a_gradient(runs: Runs) -> None:
    trace: TraceResult = runs.get("frozen")
    assert trace.gradient_bytes == (128 * 64 + 64) * 4  # the head's only
    assert trace.parameter_bytes == trace.gradient_bytes + 64 * 128 * 4
    assert _within(trace.peak_at(4), runs.get("frozen_real").peak_allocated)


def test_fit_predicts_an_untraced_size(runs: Runs) -> None:
    trace: TraceResult = runs.get("gpt")
    assert 6 not in trace.fit_sizes and not trace.per_size[6].in_fit
    # against the direct trace at 6 ...
    assert _within(trace.predicted_at(6), trace.per_size[6].peak, 0.001)
    # ... and against a real step at 6
    assert _within(trace.predicted_at(6), runs.get("gpt_real6").peak_allocated)
    assert trace.max_residual_fraction < 0.01
    # and the fit keeps growing with the batch: activations scale, model states do not
    m8, m16 = trace.memory_at(8), trace.memory_at(16)
    assert m16.peak_allocated > m8.peak_allocated
    assert m16.parameters == m8.parameters


def test_depth_scaling_matches_the_whole_trace_and_a_real_step(runs: Runs) -> None:
    """Two and four of eight identical blocks, extrapolated: the same bytes, every category and
    every size, as tracing all eight; and within 1% of a real CPU step."""
    scaled, whole = runs.get("deep"), runs.get("deep_full")
    assert isinstance(scaled, ScaledTrace) and not isinstance(whole, ScaledTrace)
    assert scaled.blocks["count"] == 8 and scaled.blocks["traced_depths"] == [2, 4]
    assert scaled.blocks["path"] == "blocks"
    assert scaled.parameters == whole.parameters
    assert scaled.optimizer_state_bytes == whole.optimizer_state_bytes
    for b in (1, 2, 4, 8, 32):
        assert scaled.memory_at(b) == whole.memory_at(b), b
    assert _within(scaled.peak_at(4), runs.get("deep_real").peak_allocated)
    assert any("extrapolated to 8" in note for note in scaled.notes)


def test_depth_scaling_falls_back_to_the_whole_model(runs: Runs) -> None:
    """A forward that indexes blocks by number fails on a truncated stack: the whole model is
    traced instead, and the note says so."""
    trace = runs.get("indexed")
    assert not isinstance(trace, ScaledTrace)
    assert any("traced the whole model" in note for note in trace.notes)
    assert trace.parameters == runs.get("deep_full").parameters


def test_kernel_scratch_is_counted(runs: Runs) -> None:
    """oneDNN convolution and batch-norm kernels allocate scratch the dispatcher never sees; the
    probes put it back, or the estimate would be several percent low."""
    trace: TraceResult = runs.get("cnn")
    assert trace.probes.get("probed", 0) > 0
    assert _within(trace.peak_at(4), runs.get("cnn_real").peak_allocated)


def test_memory_fields(runs: Runs) -> None:
    trace: TraceResult = runs.get("gpt")
    memory = trace.memory_at(4)
    assert isinstance(memory, Memory)
    parts = (memory.parameters, memory.gradients, memory.optimizer, memory.activations,
             memory.temporary)
    assert all(p is not None and p >= 0 for p in parts)
    assert sum(parts) == memory.peak_allocated  # type: ignore[arg-type]
    # GPU-side overheads are not the tracer's to guess
    assert memory.framework_overhead is None and memory.peak_reserved is None
    assert memory.capacity is None and memory.total is None


# ----------------------------------------------------------------------------------------------
# Exact model states, precisions, optimizers


def _states(runs: Runs) -> list[TraceResult]:
    results = runs.get("states")
    for r in results:
        assert isinstance(r, TraceResult), r
    return results


def test_adamw_fp32_is_16_bytes_per_parameter(runs: Runs) -> None:
    r = _states(runs)[0]
    assert r.parameters == P
    steps = TENSORS * 4  # AdamW keeps one fp32 step counter per parameter tensor
    assert r.parameter_bytes == 4 * P and r.gradient_bytes == 4 * P
    assert r.optimizer_state_bytes == 8 * P + steps
    assert r.model_state_bytes - steps == 16 * P


def test_precisions_in_the_expected_direction(runs: Runs) -> None:
    fp32, mixed, bf16 = _states(runs)[:3]
    steps = TENSORS * 4
    # bf16 autocast keeps fp32 master weights, gradients and states: 16 B/param, like fp32 ...
    assert mixed.model_state_bytes == fp32.model_state_bytes
    # ... pure bf16 halves them all: 8 B/param
    assert bf16.model_state_bytes - steps == 8 * P
    # activations: autocast adds bf16 copies of the weights and activations, pure bf16 halves
    assert bf16.peak_at(4) < fp32.peak_at(4)


def test_optimizers_in_the_expected_direction(runs: Runs) -> None:
    adamw, _, _, sgd, adam8, adafactor = _states(runs)[:6]
    assert sgd.optimizer_state_bytes == 4 * P  # one momentum buffer
    blocks = 2 * TENSORS * math.ceil(256 * 256 / 256) * 4  # fp32 absmax per 256 values, x2
    assert adam8.optimizer_state_bytes == 2 * P + blocks + TENSORS * 4
    assert adafactor.optimizer_state_bytes < 0.05 * P * 4  # factored second moment: rows + cols
    # its step's .item() (step size, update clipping) is answered on fake tensors: no real rerun
    assert adafactor.kind == "traced", adafactor.notes
    assert adafactor.optimizer_state_bytes < adam8.optimizer_state_bytes
    assert adam8.optimizer_state_bytes < sgd.optimizer_state_bytes < adamw.optimizer_state_bytes


def test_accumulation_keeps_gradients_through_the_micro_batches(runs: Runs) -> None:
    one, four = _states(runs)[0], _states(runs)[6]
    # with accumulation, gradients are alive while the next micro-batch runs forward
    assert four.peak_at(2) >= one.peak_at(2)


def test_cuda_semantics_on_a_cpu_machine(runs: Runs) -> None:
    r: TraceResult = runs.get("cuda")
    assert r.device == "cuda"
    if r.trace_device == "cpu":  # no GPU here: emulated, and said so
        assert any("emulating CUDA" in n for n in r.notes)
        assert r.foreach is True  # torch's CUDA default
    # the caching allocator's 512-byte blocks: AdamW's scalar step counters cost 512 each
    assert r.gradient_bytes % 512 == 0
    assert r.optimizer_state_bytes == 8 * P + TENSORS * 512


# ----------------------------------------------------------------------------------------------
# Data-dependent shapes, errors, time limit


def test_data_dependent_shapes_get_an_estimate_or_a_labelled_bound(runs: Runs) -> None:
    auto, bound = runs.get("moe")
    assert isinstance(auto, TraceResult) and isinstance(bound, TraceResult)
    assert auto.kind == "real_run" and not auto.is_bound
    assert any("data-dependent" in n for n in auto.notes)
    # The rerun is exact for the batches it ran; the measured step routes other batches
    # through other weights (after a real first step), so the two agree only closely.
    assert _within(auto.peak_at(2), runs.get("moe_real").peak_allocated, 0.05)
    assert bound.kind == "upper_bound" and bound.is_bound
    assert bound.substituted_ops and any("upper bound" in n for n in bound.notes)
    assert bound.peak_at(2) >= auto.peak_at(2)


def test_syntax_error_names_file_and_line(runs: Runs) -> None:
    err: TraceError = runs.get("syntax")
    assert err.kind == "syntax"
    assert err.file and err.file.endswith("syntax.py") and err.line == 5
    assert "syntax.py:5:" in str(err) and "Traceback" not in str(err)


def test_raising_hook_names_the_users_line(runs: Runs) -> None:
    err: TraceError = runs.get("hook")
    assert err.kind == "user_code"
    assert err.file and err.file.endswith("hook.py") and err.line == 5
    assert str(err).endswith("in _refuse(): ValueError: this hook refuses")


def test_time_limit_kills_the_child(runs: Runs) -> None:
    err = runs.get("timeout")
    assert isinstance(err, TraceTimeout) and err.kind == "timeout"


def test_arguments_are_checked_before_any_process() -> None:
    with pytest.raises(ValueError):
        trace_recipe("x.py", micro_batch_sizes=(0,))
    with pytest.raises(ValueError):
        trace_recipe("x.py", precision="fp16")


def test_parent_does_not_import_torch() -> None:
    code = "import sys, launcher.estimate.traced; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
