"""A plain script's settings the other ways people write them: click options, environment
variables, transformers' HfArgumentParser dataclasses (launcher/capture/child/script_options.py).

Each script is a loop as its style has it (none reads a ``LAUNCH_*`` variable): the capture must
learn which of its settings is the batch (its value is the traced batch's rows), the plan must
say which carries what, and the job must get the plan's value the way the script reads it: a
click option in its arguments, a variable in its environment.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.fakes.in_process import Runs

CLICK = '''
import click
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


@click.command()
@click.option("--batch-size", default=24, show_default=True, help="Batch size per step.")
@click.option("--epochs", default=3, type=int)
@click.option("--lr", default=1e-3, type=float)
@click.option("--verbose/--quiet", default=False)
def train(batch_size, epochs, lr, verbose):
    """Train a small regressor."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    dataset = TensorDataset(torch.randn(480, 32), torch.randn(480, 1))
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
    for epoch in range(epochs):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        click.echo(f"epoch {epoch} batch {batch_size} loss {loss.item():.4f}")


if __name__ == "__main__":
    train()
'''

ENV = '''
"""Settings from the environment, the way a container-first team writes it."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH_SIZE = int(os.environ.get("BATCH_SIZE", 48))
MAX_STEPS = int(os.getenv("MAX_STEPS", "200"))
LR = float(os.environ.get("LR", "3e-4"))
HOME = os.environ.get("HOME", "/")  # not a setting: never a flag

model = nn.Sequential(nn.Embedding(500, 64), nn.Flatten(), nn.Linear(64 * 16, 500))
optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
print(f"batch {BATCH_SIZE} steps {MAX_STEPS}", flush=True)
for step in range(MAX_STEPS):
    tokens = torch.randint(0, 500, (BATCH_SIZE, 16))
    labels = torch.randint(0, 500, (BATCH_SIZE,))
    loss = F.cross_entropy(model(tokens), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.3f}", flush=True)
'''

HF_ARGS = '''
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import HfArgumentParser


@dataclass
class TrainArguments:
    per_device_train_batch_size: int = field(default=12, metadata={"help": "rows per step"})
    max_steps: int = field(default=500)
    learning_rate: float = field(default=5e-4)
    hidden: int = field(default=128)


def main():
    (args,) = HfArgumentParser(TrainArguments).parse_args_into_dataclasses()
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.GELU(), nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate, momentum=0.9)
    for step in range(args.max_steps):
        x = torch.randn(args.per_device_train_batch_size, 64)
        y = torch.randint(0, 10, (args.per_device_train_batch_size,))
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
'''






@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    r = Runs(tmp_path_factory.mktemp("options"))
    r.plan("click", CLICK)
    r.plan("env", ENV)
    r.plan("hf_args", HF_ARGS)
    # a job: the plan's micro-batch and steps reach the script through its own variables
    r.run("env_run", ENV, "--micro-batch-size", "16", "--steps", "3")
    yield r
    r.pool.shutdown(wait=True, cancel_futures=True)


def test_a_click_scripts_options_are_its_flags(runs: Runs) -> None:
    data = runs.json("click")
    assert data["model"]["source"] == "traced"
    assert data["chosen"]["global_batch_size"] == 24
    assert data["origins"]["global_batch_size"] == "the script's own: --batch-size 24"
    assert "micro-batch -> --batch-size (the script's own flag)" in data["notes"]
    assert data["chosen"]["steps"] == 3 * 20  # --epochs 3 of 480 / 24 batches
    capture = json.loads(next((runs.dir / "click" / "state" / "framework_recipes")
                              .glob("*/capture.json")).read_text())
    assert capture["flags"] == {"micro_batch_size": "--batch-size", "epochs": "--epochs",
                                "lr": "--lr"}


def test_a_scripts_environment_variables_are_its_settings(runs: Runs) -> None:
    data = runs.json("env")
    assert data["chosen"]["global_batch_size"] == 48
    assert data["origins"]["global_batch_size"] == "the script's own: BATCH_SIZE=48"
    assert data["chosen"]["steps"] == 200
    assert data["origins"]["steps"] == "the script's own: MAX_STEPS=200"
    assert ("micro-batch -> $BATCH_SIZE (the script's own environment variable)"
            in data["notes"])
    assert data["script_args"] == []  # a variable is never an argument
    capture = json.loads(next((runs.dir / "env" / "state" / "framework_recipes")
                              .glob("*/capture.json")).read_text())
    assert capture["flags"] == {"micro_batch_size": "$BATCH_SIZE", "steps": "$MAX_STEPS",
                                "lr": "$LR"}  # HOME is read, and is no setting
    unseen = [n for n in data["notes"] if "reads none of" in n]  # only checkpointing
    assert len(unseen) == 1 and "the plan's checkpointing does not reach it" in unseen[0]


def test_the_job_gets_the_plans_values_in_the_scripts_own_variables(runs: Runs) -> None:
    data = runs.json("env_run")
    run = runs.dir / "env_run" / "state" / "runs" / data["run_id"]
    request = json.loads((run / "attempt-1" / "request.json").read_text())
    assert request["env"]["BATCH_SIZE"] == "16" and request["env"]["MAX_STEPS"] == "3"
    assert "LR" not in request["env"]  # not pinned: the script's own stays
    assert not any(a in ("--batch-size", "BATCH_SIZE") for a in request["argv"])
    log = (run / "attempt-1" / "output.log").read_text()
    assert "batch 16 steps 3" in log and "step 2 loss" in log and "step 3 loss" not in log


def test_an_hf_argument_parser_dataclass_is_argparse(runs: Runs) -> None:
    data = runs.json("hf_args")
    assert data["chosen"]["global_batch_size"] == 12
    assert data["origins"]["global_batch_size"] == (
        "the script's own: --per_device_train_batch_size 12")
    assert data["chosen"]["steps"] == 500
    assert ("micro-batch -> --per_device_train_batch_size (the script's own flag)"
            in data["notes"])
