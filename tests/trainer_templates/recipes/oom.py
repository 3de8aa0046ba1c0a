"""The test recipe that runs out of memory for real, partway through training.

Each forward pass allocates scratch memory that grows with the micro-batch and with every call
(like activations of ever longer sequences): ``micro_batch_size * call * OOM_SCRATCH_MIB`` MiB.
Under a cap on the address space (RLIMIT_AS) the CPU allocator eventually fails with
"DefaultCPUAllocator: can't allocate memory". Each call also reports the process's peak virtual
size on stderr, so a test can measure the baseline and set the cap above it.
"""

import json
import os
import sys

import torch
from tiny import Block, build_model, example_batch, wrap_modules
from tiny import training_step as tiny_training_step

__all__ = ["Block", "build_model", "example_batch", "training_step", "wrap_modules"]

SCRATCH_MIB = int(os.environ.get("OOM_SCRATCH_MIB", "0"))
_calls = 0


def vm_peak_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmPeak in /proc/self/status")


def training_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    global _calls
    _calls += 1
    sys.stderr.write(json.dumps({"vm_peak_bytes": vm_peak_bytes()}) + "\n")  # one write per line
    sys.stderr.flush()
    if SCRATCH_MIB:
        size = batch["x"].shape[0] * _calls * SCRATCH_MIB * 2**20
        scratch = torch.empty(size, dtype=torch.uint8)  # untouched: costs address space only
        del scratch
    return tiny_training_step(model, batch)
