"""Framework scripts run by `launch SCRIPT`, unmodified: the plan reaches the Hugging Face Trainer,
accelerate and Lightning through their own settings, and the out-of-memory loop fixes them.

Each job is a real torchrun job on the CPU under an address-space cap (the local provider's
``--memory-limit``), so the framework's own out-of-memory error is PyTorch's, for real. The
fixtures (tests/fixtures/frameworks/oom_*.py) need 384 MiB a sample in their step: under a 3 GiB
cap their own batch of 8 cannot run and a batch of 4 can. They print what the framework trains
with (``{"fixture": "settings"}``) and the rows each step gets (``{"fixture": "forward"}``).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.plan.plan import Plan
from launcher.render import (
    FRAMEWORK_SCRIPT,
    PLAN_NAME,
    RUNTIME_NAME,
    TrainSettings,
    available_strategies,
    render,
    runtime_source,
)
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "frameworks"
KINDS = ("hf_trainer", "lightning", "accelerate")


def _fixture(tmp_path: Path, kind: str) -> Path:
    """The fixture as a user's train.py in a folder of its own (the job runs from it)."""
    code = tmp_path / "code"
    code.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(FIXTURES / f"oom_{kind}.py", code / "train.py"))


def _lines(log: Path, key: str, value: str) -> list[dict]:
    """The JSON objects of one kind a job printed (after torchrun's ``[rank0]:`` prefix)."""
    found = []
    for line in log.read_text().splitlines():
        start = line.find("{")
        if start < 0 or f'"{key}": "{value}"' not in line:
            continue
        try:
            found.append(json.loads(line[start:]))
        except json.JSONDecodeError:
            continue
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_an_overflowing_micro_batch_is_fixed_by_one_resubmission(cli, tmp_path, kind):
    """No --steps: the Trainer and Lightning scripts train for their own 3 epochs of 8 rows (3
    steps of 8), which the plan counts and the shim leaves to them (no max_steps written); the
    accelerate loop counts its own 6 micro-batches, a length the plan cannot know."""
    script = _fixture(tmp_path, kind)
    result = cli(str(script), "--json", "--memory-limit", "3GiB", "--micro-batch-size", "8",
                 "--global-batch-size", "8",
                 environ={"FIXTURE_EPOCHS": "3", "FIXTURE_ROWS": "8"})
    assert result.status == 0, result.stderr + result.stdout
    data = result.json()
    first, second = data["attempts"]
    assert first["outcome"] == "oom" and second["outcome"] == "success"
    assert first["diagnosis"]["phase"] == "forward"
    assert "can't allocate memory" in first["diagnosis"]["message"]
    assert (first["plan"]["micro_batch_size"], first["plan"]["grad_accum_steps"]) == (8, 1)
    assert (second["plan"]["micro_batch_size"], second["plan"]["grad_accum_steps"]) == (4, 2)
    assert second["plan"]["global_batch_size"] == first["plan"]["global_batch_size"] == 8
    assert "global batch 8 unchanged" in second["change"]
    assert data["summary"]["steps"] == 3
    assert first["plan"]["steps"] == second["plan"]["steps"] == (
        None if kind == "accelerate" else 3)
    # the plan names the optimizer the script builds (Lightning's and accelerate's are SGD)
    assert first["plan"]["optimizer"] == {"hf_trainer": "adamw", "lightning": "sgd",
                                          "accelerate": "sgd"}[kind]

    run = tmp_path / "state" / "runs" / data["run_id"]
    # The job is the rendered shim; the user's script is run as it is, from its own folder.
    job = run / "attempt-2" / "job"
    assert sorted(p.name for p in job.iterdir()) == [FRAMEWORK_SCRIPT, RUNTIME_NAME, PLAN_NAME]
    assert script.read_text() == (FIXTURES / f"oom_{kind}.py").read_text()
    # What the framework itself trained with, each attempt: the plan's, not the script's 8 x 1.
    for number, (micro, accum) in ((1, (8, 1)), (2, (4, 2))):
        log = run / f"attempt-{number}" / "output.log"
        settings = _lines(log, "fixture", "settings")[0]
        assert settings["accum"] == accum
        if kind == "hf_trainer":  # its own epochs: the shim wrote no max_steps
            assert settings["micro"] == micro and settings["max_steps"] == -1
        if kind == "lightning":
            assert settings["max_steps"] == -1
        if number == 2:
            rows = [line["rows"] for line in _lines(log, "fixture", "forward")]
            assert rows == [4] * 6  # 3 optimizer steps x 2 micro-batches of 4
    if kind == "accelerate":  # a loop without accumulate(): the accumulation is the shim's
        steps = _lines(run / "attempt-2" / "output.log", "fixture", "optimizer_steps")
        assert steps == [{"fixture": "optimizer_steps", "steps": 3}]
    # The loss reported is the last step's as the script computes it, the mean of its two
    # micro-batches' losses: not divided by the accumulation the replan added.
    losses = [line["value"] for line in _lines(run / "attempt-2" / "output.log", "fixture",
                                               "loss")]
    assert len(losses) == 6
    assert data["summary"]["loss"] == pytest.approx(sum(losses[-2:]) / 2, rel=1e-4)


@pytest.mark.parametrize("kind", ("hf_trainer", "lightning"))
def test_out_of_memory_partway_resumes_from_the_framework_s_checkpoint(cli, tmp_path, kind):
    """The step needs its scratch once 400 samples are trained on (50 steps of 8): the first
    attempt fails in step 51, after the framework's checkpoint of step 50 (launch's default
    ``checkpoint_every``); the second resumes from it at micro-batch 4 and finishes."""
    script = _fixture(tmp_path, kind)
    result = cli(str(script), "--json", "--memory-limit", "3GiB", "--micro-batch-size", "8",
                 "--global-batch-size", "8", "--steps", "54",
                 environ={"FIXTURE_OOM_AFTER_SAMPLES": "400"})
    assert result.status == 0, result.stderr + result.stdout
    data = result.json()
    first, second = data["attempts"]
    assert first["outcome"] == "oom" and first["diagnosis"]["step"] == 50
    assert (second["plan"]["micro_batch_size"], second["plan"]["grad_accum_steps"]) == (4, 2)
    assert second["summary"]["resumed_from_step"] == 50
    assert data["summary"]["steps"] == 54
    log = tmp_path / "state" / "runs" / data["run_id"] / "attempt-2" / "output.log"
    assert len(_lines(log, "fixture", "forward")) == 2 * 4  # steps 51..54 only


def _plan(**overrides: object) -> Plan:
    values: dict = {
        "strategy": "ddp", "machine": "local-cpu", "nodes": 1, "gpus_per_node": 2,
        "micro_batch_size": 4, "grad_accum_steps": 2, "global_batch_size": 16,
        "precision": "bf16_mixed", "optimizer": "adamw", "activation_checkpointing": True,
        "steps": 100, "lr": 3e-4,
    }
    values.update(overrides)
    return Plan(**values)


@pytest.mark.parametrize("kind", KINDS)
def test_the_shim_carries_the_plan_as_data(kind):
    settings = TrainSettings(recipe_file="/code/train.py", mode="script", run_id="r",
                             attempt=1, framework=kind)
    one = render(_plan(), settings)
    other = render(_plan(micro_batch_size=2, grad_accum_steps=4, precision="fp32", steps=7,
                         lr=1e-3, strategy="fsdp"), settings)
    assert one.entrypoint == FRAMEWORK_SCRIPT
    assert set(one.files) == {FRAMEWORK_SCRIPT, RUNTIME_NAME, PLAN_NAME}
    assert one.files[RUNTIME_NAME] == runtime_source()  # the training scripts' machinery
    # The same code for every plan and every framework: the values are in plan.json only.
    assert one.files[FRAMEWORK_SCRIPT] == other.files[FRAMEWORK_SCRIPT]
    source = one.files[FRAMEWORK_SCRIPT]
    ast.parse(source)
    assert not re.search(r"\{\{|\{%|/code/train\.py|3e-04|0\.0003", source)
    plan = json.loads(one.files[PLAN_NAME])
    assert (plan["framework"], plan["micro_batch_size"], plan["grad_accum_steps"]) == (kind, 4, 2)
    assert json.loads(other.files[PLAN_NAME])["micro_batch_size"] == 2
    assert "framework" not in available_strategies()


def test_the_shim_is_lint_clean_and_needs_no_launcher(tmp_path):
    """It runs in cloud containers without the launcher package: the standard library, torch
    and the framework the script uses, imported where that framework is patched, and
    launch_runtime.py beside it."""
    source = render(_plan(), TrainSettings(recipe_file="train.py", mode="script", run_id="r",
                                           attempt=1, framework="lightning")
                    ).files[FRAMEWORK_SCRIPT]
    path = tmp_path / FRAMEWORK_SCRIPT
    path.write_text(source)
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config",
                           str(REPO / "pyproject.toml"), str(path)],
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module.split(".")[0])
    assert modules - sys.stdlib_module_names == {"torch", "transformers", "accelerate",
                                                 "launch_runtime"}


def test_a_plain_script_has_no_shim_and_a_recipe_no_framework():
    plain = render(_plan(), TrainSettings(recipe_file="train.py", mode="script", run_id="r",
                                          attempt=1))
    assert plain.entrypoint == "train.py" and set(plain.files) == {PLAN_NAME}
    with pytest.raises(ValueError, match="framework"):
        TrainSettings(recipe_file="train.py", mode="recipe", run_id="r", attempt=1,
                      framework="hf_trainer")
    with pytest.raises(ValueError, match="framework"):
        TrainSettings(recipe_file="train.py", mode="script", run_id="r", attempt=1,
                      framework="keras")


def test_an_accelerate_loop_that_saves_its_state_resumes_from_it(cli, tmp_path):
    """The loop calls ``accelerator.save_state`` every 8 micro-batches: the shim keeps the state
    in the run's checkpoint folder and loads the newest after ``prepare`` in the next attempt
    (the weights, with the fixture's sample count, the optimizer and the random states)."""
    script = _fixture(tmp_path, "accelerate")
    result = cli(str(script), "--json", "--memory-limit", "3GiB", "--micro-batch-size", "8",
                 "--global-batch-size", "8",
                 environ={"FIXTURE_OOM_AFTER_SAMPLES": "400", "FIXTURE_LOOP": "60"})
    assert result.status == 0, result.stderr + result.stdout
    data = result.json()
    first, second = data["attempts"]
    assert first["outcome"] == "oom" and first["diagnosis"]["step"] == 50
    assert second["summary"]["resumed_from_step"] == 48
    run = tmp_path / "state" / "runs" / data["run_id"]
    assert not (script.parent / "state").exists()  # the script's folder: the run's instead
    states = sorted(p.name for p in (run / "checkpoints").glob("state-*"))
    assert len(states) == 2  # keep_checkpoints
    log = run / "attempt-2" / "output.log"
    assert _lines(log, "fixture", "optimizer_steps")[0]["steps"] == 30  # 60 micro-batches / 2


@pytest.mark.parametrize("kind", KINDS)
def test_processes_train_together_at_the_plan_s_micro_batch(cli, tmp_path, kind):
    """Two processes (gloo on the CPU): the framework sees a world of 2 (one DDP job, not two
    unconnected ones), each process gets micro-batches of 2, 8 samples a step in all. The
    script's own arguments (after --) reach it as its sys.argv[1:], exactly, in the capture
    that runs it to where training starts and through the shim in each process of the job."""
    script = _fixture(tmp_path, kind)
    args = ["--train_file", "data with spaces.txt", "--lr=3e-4", "$HOME", "it's"]
    result = cli(str(script), "--json", "--gpus-per-node", "2", "--micro-batch-size", "2",
                 "--global-batch-size", "8", "--steps", "2", "--", *args,
                 environ={"FIXTURE_LOOP": "4"})
    assert result.status == 0, result.stderr + result.stdout
    data = result.json()
    assert len(data["attempts"]) == 1 and data["summary"]["steps"] == 2
    (capture,) = (tmp_path / "state" / "framework_recipes").glob("*/capture.json")
    assert json.loads(capture.read_text())["argv"] == args
    log = tmp_path / "state" / "runs" / data["run_id"] / "attempt-1" / "output.log"
    settings = _lines(log, "fixture", "settings")
    assert [(s["world"], s["accum"]) for s in settings] == [(2, 2), (2, 2)]
    assert [s["argv"] for s in settings] == [args, args]
    assert {line["rows"] for line in _lines(log, "fixture", "forward")} == {2}


def test_the_replan_re_traces_the_recipe_generated_from_the_script(tmp_path):
    """What `launch` does with tracing on (cli.py hands ``retrace`` the capture's recipe): the
    failure's batch shapes are re-traced through the recipe generated from the script (its
    classes rebuilt with the script's computed constants, ``SCRATCH`` and ``AFTER`` here)."""
    from launcher.capture.frameworks import capture, detect
    from launcher.remedies import replan, retrace

    script = _fixture(tmp_path, "accelerate")
    found = capture(script, detect(script), folder=tmp_path / "captures", hardware=False)
    assert found.recipe is not None, found.notes
    assert {"SCRATCH", "AFTER"} <= set(json.loads(
        (found.folder / "capture.json").read_text())["constants"])
    plan = _plan(strategy="single", gpus_per_node=1, micro_batch_size=8, grad_accum_steps=1,
                 global_batch_size=8, precision="fp32", activation_checkpointing=False)
    shapes = {"list": [{"shape": [8, 16], "dtype": "float32"},
                       {"shape": [8, 1], "dtype": "float32"}]}
    failure = {"phase": "forward", "cause": "activations", "batch_shapes": shapes}
    fixed, why = replan(plan, failure, measure=retrace(str(found.recipe)))
    assert (fixed.micro_batch_size, fixed.grad_accum_steps) == (4, 2)
    assert "re-traced at the batch shapes it failed at" in why
