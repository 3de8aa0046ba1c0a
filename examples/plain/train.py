"""A plain training script, launched as is ("bring your own script").

It defines none of the recipe functions, so `launch` does not render a script around it: it runs
this file under torchrun and passes the plan in environment variables, which the script reads:

    LAUNCH_MICRO_BATCH_SIZE, LAUNCH_GRAD_ACCUM_STEPS, LAUNCH_GLOBAL_BATCH_SIZE, LAUNCH_STEPS,
    LAUNCH_LR, LAUNCH_OPTIMIZER, LAUNCH_PRECISION, LAUNCH_ACTIVATION_CHECKPOINTING,
    LAUNCH_STRATEGY, LAUNCH_CHECKPOINT_DIR, LAUNCH_PLAN (plan.json, the same values as JSON)

Honouring them is the script's job; launch cannot estimate this script's activations by tracing
it, so its preflight needs a model description (`--model-config` or `--params`).

Try it: `launch examples/plain/train.py --params 1M` or `torchrun --nproc_per_node 2 train.py`.
It prints the LAUNCH_* values it received as one JSON line per rank, then trains a linear
regression with DDP (gloo on the CPU) and gradient accumulation.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def report(fields: dict) -> None:
    """One JSON line, written in one call so lines from two ranks sharing stdout never mix."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main() -> None:
    micro_batch_size = int(os.environ.get("LAUNCH_MICRO_BATCH_SIZE", "8"))
    accum_steps = int(os.environ.get("LAUNCH_GRAD_ACCUM_STEPS", "1"))
    steps = int(os.environ.get("LAUNCH_STEPS", "10"))
    lr = float(os.environ.get("LAUNCH_LR", "0.01"))

    distributed = "WORLD_SIZE" in os.environ  # started by torchrun
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if distributed else 0
    received = {k: v for k, v in sorted(os.environ.items()) if k.startswith("LAUNCH_")}
    report({"plain": "received", "rank": rank, "env": received})

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    true_weights = torch.arange(8.0)
    generator = torch.Generator().manual_seed(rank)
    for step in range(1, steps + 1):
        for micro in range(accum_steps):
            x = torch.randn(micro_batch_size, 8, generator=generator)
            y = x @ true_weights
            # Synchronize gradients across ranks only on the last micro-batch of the step.
            last = micro == accum_steps - 1
            sync = contextlib.nullcontext() if last or not distributed else model.no_sync()
            with sync:
                loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
                (loss / accum_steps).backward()
        optimizer.step()
        optimizer.zero_grad()
        report({"plain": "step", "rank": rank, "step": step, "loss": loss.item()})

    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: with torch 2.13 on the CPU its C++ static
    # destructors sometimes abort a finished gloo job ("terminate called without an active
    # exception", exit status -6), which torchrun reports as a failure.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
