"""Shared fixtures: an in-process CLI with an isolated environment, and tiny scripts."""

from __future__ import annotations

import io
import json
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.cli import main
from launcher.context import Environment
from launcher.plan.plan import Plan

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


@dataclass
class Result:
    status: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture(autouse=True, scope="session")
def _launch_home(tmp_path_factory: pytest.TempPathFactory):
    """No test writes the user's real index of runs (~/.local/state/launch): every `launch`
    started by a test, in-process or as a child, keeps it in a temporary LAUNCH_HOME (the
    ``cli`` fixture gives each test its own)."""
    previous = os.environ.get("LAUNCH_HOME")
    os.environ["LAUNCH_HOME"] = str(tmp_path_factory.mktemp("launch-home"))
    yield
    if previous is None:
        os.environ.pop("LAUNCH_HOME", None)
    else:
        os.environ["LAUNCH_HOME"] = previous


@pytest.fixture
def cli(tmp_path: Path):
    """Run `launch ARGS` in-process with its state (and its index of runs, ``LAUNCH_HOME``)
    under tmp_path; returns a Result.

    Tracing is off unless a test turns it on (``environ={"LAUNCH_NO_TRACE": "0"}``): these tests
    are about the CLI and the runs, and each trace costs seconds; tests/estimate covers it.
    ``CI`` (which makes ``launch plan`` strict) is the test's to set, not the machine's: the
    same test passes on a laptop and in CI.
    """

    def run(*args: str, cwd: Path | None = None, environ: dict[str, str] | None = None) -> Result:
        out, err = io.StringIO(), io.StringIO()
        outside = {k: v for k, v in os.environ.items() if k != "CI"}
        env = Environment(
            stdout=out, stderr=err, cwd=cwd or tmp_path,
            environ={**outside, "LAUNCH_STATE_DIR": str(tmp_path / "state"),
                     "LAUNCH_HOME": str(tmp_path / "home"), "LAUNCH_NO_TRACE": "1",
                     **(environ or {})},
            python=sys.executable,
        )
        status = main(list(args), env)
        return Result(int(status), out.getvalue(), err.getvalue())

    return run


TINY_RECIPE = '''
import torch

LAUNCH = {"global_batch_size": 4, "steps": 4, "lr": 0.01}


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.lin(x)) + x


def build_model():
    return torch.nn.Sequential(Block(), Block(), torch.nn.Linear(16, 1))


def example_batch(batch_size):
    x = torch.randn(batch_size, 16)
    return {"x": x, "y": x.sum(dim=1, keepdim=True)}


def training_step(model, batch):
    return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])


def wrap_modules():
    return (Block,)
'''


@pytest.fixture
def write_script(tmp_path: Path):
    """Write a script into tmp_path/code/NAME and return its path."""

    def write(text: str, name: str = "train.py") -> Path:
        path = tmp_path / "code" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def tiny_recipe(write_script) -> Path:
    return write_script(TINY_RECIPE)


def a_plan(**changes: object) -> Plan:
    """A whole plan, as the planner makes one: what an attempt records (the run records are
    typed, so a test's attempt holds a real plan, not a fragment of one)."""
    values: dict = {"strategy": "single", "machine": "local-cpu", "nodes": 1, "gpus_per_node": 1,
                    "micro_batch_size": 4, "grad_accum_steps": 1, "global_batch_size": 4,
                    "precision": "fp32", "optimizer": "adamw", "activation_checkpointing": False,
                    "steps": 10, "lr": 1e-3}
    values.update(changes)
    return Plan(**values)

