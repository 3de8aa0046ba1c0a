"""A plain script's own parallelism bounds its plan (issue 28): launch starts a plain script as
it is, so a script without DDP of its own, started by torchrun on 8 GPUs, would train 8 copies;
one that does not shard cannot be planned as FSDP. The plan keeps to what the script does, and
says what it left out and what the script would have to change.

The scripts are written as their authors write them; ``--params`` sizes them without a capture
(these tests are about the plan, not the trace).
"""

from __future__ import annotations

from pathlib import Path

from launcher.script_info import script_parallelism
from launcher.status import ExitStatus

ONE_PROCESS = """
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
args = parser.parse_args()
model = torch.nn.Linear(16, 16).cuda()
optimizer = torch.optim.AdamW(model.parameters())
for step in range(10):
    loss = model(torch.randn(args.batch_size, 16, device="cuda")).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""

OWN_DDP = """
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    dist.init_process_group(backend="nccl")
model = torch.nn.Linear(16, 16)
if ddp:
    model = DDP(model)
"""

OWN_FSDP = """
import torch
from torch.distributed.fsdp import fully_shard

model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
for layer in model:
    fully_shard(layer)
fully_shard(model)
"""

LOOP = """
optimizer = torch.optim.AdamW(model.parameters())
for step in range(10):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""

BY_HAND = """
import torch.distributed as dist

dist.init_process_group("gloo")
for p in model.parameters():
    dist.all_reduce(p.grad)
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_what_a_script_does_across_processes_is_read_from_its_source(tmp_path):
    assert script_parallelism(_write(tmp_path, "a.py", ONE_PROCESS)) == ()
    assert script_parallelism(_write(tmp_path, "b.py", OWN_DDP)) == ("ddp",)
    assert script_parallelism(_write(tmp_path, "c.py", BY_HAND)) == ("ddp",)
    assert script_parallelism(_write(tmp_path, "d.py", OWN_FSDP)) == ("ddp", "fsdp")
    assert script_parallelism(_write(tmp_path, "e.py", "def broken(:\n")) == ()


def _capture_env() -> dict[str, str]:
    return {"LAUNCH_NO_TRACE": "0"}  # captured: run to its first optimizer step, traced


def test_a_captured_one_process_script_is_planned_on_one_gpu_and_says_so(cli, tmp_path):
    script = _write(tmp_path, "train.py", ONE_PROCESS)
    result = cli("plan", str(script), "--provider", "vertex", "--json", "--all",
                 environ=_capture_env())
    assert result.status == ExitStatus.SUCCESS, result.stderr
    data = result.json()
    assert data["model"]["source"] == "traced"
    assert data["plans"] and {p["nodes"] * p["gpus_per_node"] for p in data["plans"]} == {1}
    assert {p["strategy"] for p in data["plans"]} == {"single"}
    assert any("train.py runs one process (no DDP or FSDP of its own)" in n
               for n in data["notes"])


def test_a_captured_script_with_its_own_ddp_gets_several_gpus_never_sharding(cli, tmp_path):
    script = _write(tmp_path, "ddp.py", OWN_DDP + LOOP)
    data = cli("plan", str(script), "--provider", "vertex", "--json", "--all",
               environ=_capture_env()).json()
    assert data["model"]["source"] == "traced"
    assert any(p["strategy"] == "ddp" and p["gpus_per_node"] > 1 for p in data["plans"])
    assert not any(p["strategy"] in ("fsdp", "hybrid_shard") for p in data["plans"])


def test_a_model_one_process_cannot_hold_is_not_planned_as_sharded(cli, tmp_path):
    """The local CPU capped below the model's states: a script that does not shard has no
    plan, and the plan says what the script would have to change."""
    script = _write(tmp_path, "train.py", ONE_PROCESS)
    result = cli("plan", str(script), "--memory-limit", "1KiB", "--gpus-per-node", "2",
                 "--json", environ=_capture_env())
    assert result.status == ExitStatus.NO_PLAN_FITS, result.stderr
    data = result.json()
    assert not any(p["strategy"] in ("fsdp", "hybrid_shard") for p in data["plans"])
    assert any("train.py does not shard it" in n and "fully_shard" in n for n in data["notes"])


def test_a_described_script_is_planned_as_described_and_told_where_its_code_disagrees(
        cli, tmp_path):
    """--params sizes a script launch does not run (the seeds' 30B on SageMaker): the plan is
    as described, and a note says the source shows no sharding for the chosen FSDP plan."""
    script = _write(tmp_path, "train.py", ONE_PROCESS)
    data = cli("plan", str(script), "--params", "70B", "--provider", "vertex", "--json").json()
    assert data["chosen"]["strategy"] in ("fsdp", "hybrid_shard")
    assert any("train.py shows no code to shard its model (FSDP)" in n for n in data["notes"])
    fsdp = cli("plan", str(_write(tmp_path, "fsdp.py", OWN_FSDP)), "--params", "70B",
               "--provider", "vertex", "--json").json()
    assert not any("shows no code" in n for n in fsdp["notes"])


BLOCKS = """
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))

    def forward(self, x):
        return x + self.mlp(x)


model = nn.Sequential(*[Block() for _ in range(4)])
"""


def test_a_captured_script_that_reads_no_plan_is_never_checkpointed(cli, tmp_path):
    """Its blocks are found (the capture names them), but the script runs as it is: launch
    cannot checkpoint them, so no plan of it is checkpointed, and a pin is refused in one line
    (before, the plan said "full checkpointing" for a script that would run without it)."""
    script = _write(tmp_path, "train.py", BLOCKS + LOOP)
    result = cli("plan", str(script), "--provider", "vertex", "--json", "--all",
                 environ=_capture_env())
    assert result.status == ExitStatus.SUCCESS, result.stderr
    plans = result.json()["plans"]
    assert plans and {p["checkpointing"] for p in plans} == {"none"}
    pinned = cli("plan", str(script), "--checkpointing", "full", environ=_capture_env())
    assert pinned.status == ExitStatus.USAGE
    assert "train.py runs as it is and reads neither LAUNCH_CHECKPOINTING" in pinned.stderr
    assert "Traceback" not in pinned.stderr
