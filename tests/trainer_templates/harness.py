"""Running rendered training scripts for real, as subprocesses on the CPU (the test harness).

A run renders a plan into a job folder (``launch_train.py`` + ``plan.json``), copies the test
recipes next to it (``recipe/``, so the recipe path is relative and its sibling imports are
exercised), and runs it with plain ``python`` or under ``torchrun`` with gloo. Each run costs a
few seconds, almost all of it importing torch, so the tests share runs through module fixtures
and ``start`` them concurrently, waiting only when they need the result.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from launcher.plan.plan import Plan
from launcher.render import (
    RUNTIME_NAME,
    SCRIPT_NAME,
    RenderedJob,
    TrainSettings,
    render,
    render_script,
    runtime_source,
)

REPO = Path(__file__).resolve().parents[2]
RECIPES = Path(__file__).parent / "recipes"
PLAN_FIELDS = {f.name for f in dataclasses.fields(Plan)}
SETTINGS_FIELDS = {f.name for f in dataclasses.fields(TrainSettings)}
RUN_TIMEOUT_S = 300  # generous: many runs share two cores
#: Another interpreter (another torch) to run the scripts under; the tests themselves still run
#: here. E.g. LAUNCH_TEST_PYTHON=/venvs/torch-2.8.0/bin/python pytest tests/trainer_templates:
#: the images' torch versions are in launcher/providers/images.py.
TRAIN_PYTHON = os.environ.get("LAUNCH_TEST_PYTHON")


def make_plan(**overrides: Any) -> Plan:
    """A small CPU plan; the global batch follows from the other batch numbers."""
    values: dict[str, Any] = {
        "strategy": "single", "machine": "cpu", "nodes": 1, "gpus_per_node": 1,
        "micro_batch_size": 4, "grad_accum_steps": 2, "precision": "fp32", "optimizer": "adamw",
        "activation_checkpointing": False, "steps": 6, "lr": 1e-2,
    }
    values.update(overrides)
    values.setdefault(
        "global_batch_size",
        values["micro_batch_size"] * values["grad_accum_steps"] * values["gpus_per_node"],
    )
    return Plan(**values)


@dataclasses.dataclass
class Run:
    """A finished run: its exit status, output, and the ``{"launch": ...}`` lines it printed."""

    job_dir: Path
    checkpoint_dir: Path
    job: RenderedJob
    returncode: int
    stdout: str
    stderr: str

    @property
    def events(self) -> list[dict[str, Any]]:
        lines = (line.strip() for line in self.stdout.splitlines())
        return [json.loads(line) for line in lines if line.startswith('{"launch"')]

    def of(self, event: str, rank: int | None = None) -> list[dict[str, Any]]:
        return [
            e for e in self.events
            if e["launch"] == event and (rank is None or e["rank"] == rank)
        ]

    def losses(self, rank: int = 0) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.of("metrics", rank)}

    def check(self) -> Run:
        """Fail with the run's output when it did not succeed."""
        assert self.returncode == 0, f"exit {self.returncode}\n{self.stdout}\n{self.stderr}"
        return self


class Pending:
    """A started run; ``wait()`` gives its ``Run``."""

    def __init__(self, process: subprocess.Popen, make: Callable[[str, str], Run]) -> None:
        self.process, self.make = process, make

    def wait(self) -> Run:
        try:
            stdout, stderr = self.process.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            stdout, stderr = self.process.communicate()
        return self.make(stdout, stderr)


def start(
    job_dir: Path,
    *,
    recipe: str = "tiny.py",
    nproc: int | None = None,
    checkpoint_dir: Path | None = None,
    address_space_limit: int | None = None,
    env: dict[str, str] | None = None,
    **overrides: Any,
) -> Pending:
    """Render and start a run. ``recipe`` names a file in ``recipes/`` or is an absolute path;
    ``nproc`` None runs plain ``python``, a number runs torchrun with that many processes;
    ``overrides`` are Plan or TrainSettings fields."""
    unknown = overrides.keys() - PLAN_FIELDS - SETTINGS_FIELDS
    assert not unknown, f"neither plan nor settings fields: {unknown}"
    checkpoint_dir = checkpoint_dir or job_dir / "checkpoints"
    plan_values = {k: v for k, v in overrides.items() if k in PLAN_FIELDS}
    plan_values.setdefault("gpus_per_node", nproc or 1)
    if plan_values["gpus_per_node"] > 1:
        plan_values.setdefault("strategy", "ddp")
    settings_values = {"checkpoint_every": 3, "keep_checkpoints": 3}
    settings_values.update({k: v for k, v in overrides.items() if k in SETTINGS_FIELDS})
    settings = TrainSettings(
        recipe_file=recipe if Path(recipe).is_absolute() else f"recipe/{recipe}",
        mode="recipe", run_id="test", attempt=1, checkpoint_dir=str(checkpoint_dir),
        **settings_values,
    )
    job = render(make_plan(**plan_values), settings)
    job.write(job_dir)
    shutil.copytree(RECIPES, job_dir / "recipe", dirs_exist_ok=True)

    python = TRAIN_PYTHON or sys.executable
    if nproc is None:
        argv = [python, job.entrypoint]
    else:
        argv = [python, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", str(nproc), job.entrypoint]
    process_env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCH_")}
    process_env.update(job.env, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))

    def cap_address_space() -> None:  # runs in the child, before exec
        resource.setrlimit(resource.RLIMIT_AS, (address_space_limit, address_space_limit))

    process = subprocess.Popen(
        argv, cwd=job_dir, env=process_env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=cap_address_space if address_space_limit else None,
    )
    return Pending(
        process,
        lambda out, err: Run(job_dir, checkpoint_dir, job, process.returncode, out, err),
    )


def copy_checkpoint(run: Run, step: int, directory: Path) -> Path:
    """A fresh checkpoint directory holding only ``run``'s checkpoint of ``step``: the state a run
    interrupted right after that step leaves behind."""
    directory.mkdir(parents=True)
    name = f"step_{step:08d}.pt"
    shutil.copy(run.checkpoint_dir / name, directory / name)
    return directory


def import_script(strategy: str, directory: Path) -> ModuleType:
    """The rendered script as a module, launch_runtime.py beside it: importing them defines
    their functions without training. The runtime is imported once per test process, as
    ``launch_runtime`` (the name the script imports it by); the scripts' ``launch.`` names are
    its functions."""
    runtime = directory / RUNTIME_NAME
    runtime.write_text(runtime_source())
    if "launch_runtime" not in sys.modules:
        _exec("launch_runtime", runtime)
    path = directory / SCRIPT_NAME
    path.write_text(render_script(strategy))
    return _exec(f"rendered_{strategy}_{directory.name}", path)


def _exec(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
