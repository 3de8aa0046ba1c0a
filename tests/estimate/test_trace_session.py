"""One prestarted child for a whole preflight: it loads the recipe for the CLI, then traces it.

(A file of its own: the module fixture of test_traced.py traces from several threads at once,
and any of them would take the prestarted child.)
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from launcher.estimate import trace_process, traced
from launcher.recipe import inspect_script
from launcher.status import UsageError

TINY = '''
import torch, torch.nn as nn

LAUNCH = {"global_batch_size": 4}

def build_model():
    return nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64))

def example_batch(batch_size):
    return torch.randint(0, 64, (batch_size, 16))

def training_step(model, batch):
    return nn.functional.cross_entropy(model(batch).flatten(0, 1), batch.flatten())
'''

SLOW_IMPORT = '''
import time
time.sleep(60)

def build_model(): ...
def example_batch(batch_size): ...
def training_step(model, batch): ...
'''


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.py"
    path.write_text(textwrap.dedent(TINY))
    return path


def test_the_prestarted_child_probes_then_traces(recipe: Path) -> None:
    usual = inspect_script(recipe)  # its own child, FLOPs counted there
    trace_process.prestart()
    child = trace_process._WARM[sys.executable]
    info = inspect_script(recipe, count_flops=False, probe=trace_process.probe)
    assert info.mode == "recipe" and info.launch == {"global_batch_size": 4}
    assert info.parameters == usual.parameters == 64 * 32 + 32 * 64 + 64
    assert info.flops_per_sample is None  # left to the trace
    assert trace_process._WARM.get(sys.executable) is child  # kept for the trace
    # with accumulation, as a preflight traces: every micro-step's FLOPs, per sample
    result = traced.trace_recipe(recipe, device="cpu", micro_batch_sizes=(1, 2),
                                 count_flops=True, grad_accum_steps=2)
    assert child.poll() is None and trace_process._WARM[sys.executable] is child  # still warm
    assert result.parameters == usual.parameters
    again = traced.trace_recipe(recipe, device="cpu", micro_batch_sizes=(1, 2),
                                grad_accum_steps=2)
    assert trace_process._WARM[sys.executable] is child  # the planner's next trace: the same child
    assert again.peak_at(2) == result.peak_at(2)
    trace_process._reap()
    assert child.wait(timeout=10) is not None and not trace_process._WARM
    # The trace counts the same FLOPs the probe would have.
    assert result.flops_per_sample == usual.flops_per_sample and usual.flops_per_sample > 0


def test_no_prestarted_child_means_the_usual_probe(recipe: Path) -> None:
    trace_process._reap()
    assert trace_process.probe(recipe, count_flops=True, timeout_s=30) is None
    info = inspect_script(recipe, probe=trace_process.probe)  # falls back to its own child
    assert info.parameters == 64 * 32 + 32 * 64 + 64


def test_a_recipe_that_hangs_on_import_is_stopped(tmp_path: Path) -> None:
    path = tmp_path / "slow.py"
    path.write_text(textwrap.dedent(SLOW_IMPORT))
    trace_process.prestart()
    child = trace_process._WARM[sys.executable]
    started = time.monotonic()
    with pytest.raises(UsageError, match="took longer than 5 s"):
        inspect_script(path, count_flops=False, probe=trace_process.probe, timeout_s=5)
    assert time.monotonic() - started < 30
    child.wait(timeout=10)  # killed, with its process group
    assert not trace_process._WARM
