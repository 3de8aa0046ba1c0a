"""launcher.recipe's view of this machine on a GPU box, where no CI machine is one.

The first GPU run of bench/gpu_validate.py (an H200, 2026-12-04) found every ``launch plan``
failing: the probe, served in a worker forked from the trace child, asked torch for the GPU's
properties, and torch refuses CUDA in a process forked after its parent asked CUDA anything
("Cannot re-initialize CUDA in forked subprocess"). These tests put that machine's answers in
front of the real code: torch's CUDA calls answer as they do there (monkeypatched on torch, not
on our functions) and ``nvidia-smi`` is a script on PATH printing what the H200's printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launcher import recipe

ROOT = Path(__file__).resolve().parents[1]


def _gpu_box(monkeypatch: pytest.MonkeyPatch, forked: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)

    def properties(device: int) -> object:
        if forked:
            raise RuntimeError("Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
                               "multiprocessing, you must use the 'spawn' start method")
        return type("Props", (), {"name": "NVIDIA H200", "total_memory": 150109880320})()

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)


def _nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return smi


def test_the_gpu_is_read_from_nvidia_smi_in_a_forked_worker(tmp_path, monkeypatch):
    _gpu_box(monkeypatch, forked=True)
    # what the H200's nvidia-smi printed for --query-gpu=name,memory.total
    args = tmp_path / "args"
    _nvidia_smi(tmp_path, monkeypatch, f'echo "$@" > {args}\necho "NVIDIA H200, 143771"\n')
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    info = recipe.hardware()
    assert info["cuda_devices"] == 1
    assert info["cuda_name"] == "NVIDIA H200"
    assert info["cuda_memory_bytes"] == 143771 * 2**20
    # torch's device 0 is the first visible one, which nvidia-smi numbers by itself
    assert "--id=3" in args.read_text()


def test_no_nvidia_smi_and_a_forked_worker_leaves_the_gpu_unnamed_not_an_error(
        tmp_path, monkeypatch):
    _gpu_box(monkeypatch, forked=True)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    info = recipe.hardware()
    assert info["cuda_devices"] == 1
    assert "cuda_name" not in info and "cuda_memory_bytes" not in info


def test_torch_answers_where_nvidia_smi_is_broken(tmp_path, monkeypatch):
    _gpu_box(monkeypatch, forked=False)
    _nvidia_smi(tmp_path, monkeypatch, 'echo "NVIDIA-SMI has failed" >&2\nexit 9\n')
    info = recipe.hardware()
    assert (info["cuda_name"], info["cuda_memory_bytes"]) == ("NVIDIA H200", 150109880320)


def test_a_cuda_plan_is_traced_on_the_cpu_emulating_cuda_even_on_a_gpu_box():
    """The trace never touches the local GPU: the plan is for the target's GPU generation, is the
    same wherever it is computed, and a forked worker cannot use CUDA anyway."""
    code = (
        "import json, torch\n"
        "torch.cuda.is_available = lambda: True\n"
        "from launcher.estimate.child._trace_run import configure_device\n"
        "request = {'device': 'cuda', 'gpu_generation': 'hopper'}\n"
        "notes = configure_device(request)\n"
        "print(json.dumps({'trace_device': request['trace_device'], 'notes': notes}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=True)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["trace_device"] == "cpu"
    assert any("emulating CUDA" in note and "sm90" in note for note in answer["notes"])
