"""Rendering a plan into a job: the script is code chosen by strategy, every value is data."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.plan.plan import Plan
from launcher.render import (
    PLAN_NAME,
    RUNTIME_NAME,
    SCRIPT_NAME,
    RenderedJob,
    TrainSettings,
    available_strategies,
    render,
    render_script,
    runtime_source,
)

REPO = Path(__file__).resolve().parents[1]


def make_plan(**overrides: object) -> Plan:
    values: dict = {
        "strategy": "ddp", "machine": "cpu", "nodes": 1, "gpus_per_node": 2,
        "micro_batch_size": 4, "grad_accum_steps": 2, "global_batch_size": 16,
        "precision": "bf16_mixed", "optimizer": "adamw", "activation_checkpointing": True,
        "steps": 100, "lr": 3e-4, "seq_len": 128,
    }
    values.update(overrides)
    return Plan(**values)


def make_settings(**overrides: object) -> TrainSettings:
    values: dict = {"recipe_file": "train.py", "mode": "recipe", "run_id": "run-1", "attempt": 1}
    values.update(overrides)
    return TrainSettings(**values)


def test_templates_exist_for_single_and_ddp() -> None:
    assert {"single", "ddp"} <= set(available_strategies())
    assert not any(name.startswith("_") for name in available_strategies())


@pytest.mark.parametrize("strategy", available_strategies())
def test_rendered_scripts_compile_and_pass_the_linter(strategy: str, tmp_path: Path) -> None:
    """The rendered script is code a person reads: it compiles and is lint-clean under the
    project's own rules (unused imports would show a partial pulled in for nothing)."""
    script = render_script(strategy)
    compile(script, SCRIPT_NAME, "exec")
    path = tmp_path / SCRIPT_NAME
    path.write_text(script)
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--config",
         str(REPO / "pyproject.toml"), str(path)],
        capture_output=True, text=True,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("strategy", available_strategies())
def test_rendered_scripts_import_only_the_standard_library_and_torch(strategy: str) -> None:
    """The script runs in cloud containers where launcher is not installed."""
    tree = ast.parse(render_script(strategy))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module.split(".")[0])
    third_party = modules - set(sys.stdlib_module_names) - {"__future__"}
    # bitsandbytes is imported only inside the function that builds the adam8bit optimizer;
    # launch_runtime.py is written beside the script (and imports only torch: test_layout.py).
    assert third_party <= {"torch", "bitsandbytes", "launch_runtime"}, third_party
    assert "launch_runtime" in modules


def test_plan_values_reach_the_script_as_data_only() -> None:
    """Distinctive values are in plan.json and nowhere in the script, and two plans of one
    strategy render the very same script."""
    plan = make_plan(lr=0.000123, micro_batch_size=7, grad_accum_steps=3, global_batch_size=42,
                     steps=4321)
    settings = make_settings(recipe_file="my_recipe_xyz.py", checkpoint_dir="ckpt_qwerty",
                             checkpoint_every=777)
    job = render(plan, settings)
    script, document = job.files[SCRIPT_NAME], json.loads(job.files[PLAN_NAME])
    for text in ("0.000123", "1.23e-04", "4321", "777", "my_recipe_xyz", "ckpt_qwerty", "42"):
        assert text not in script
    assert (document["lr"], document["micro_batch_size"], document["steps"]) == (0.000123, 7, 4321)
    assert document["recipe_file"] == "my_recipe_xyz.py"
    assert script == render(make_plan(), make_settings()).files[SCRIPT_NAME]
    # The machinery beside it is the one file every plan and strategy gets, as shipped.
    assert job.files[RUNTIME_NAME] == runtime_source()
    assert job.files[RUNTIME_NAME] == render(make_plan(strategy="ddp", gpus_per_node=2),
                                             make_settings()).files[RUNTIME_NAME]


def test_plan_json_is_the_plan_and_the_settings_in_one_object() -> None:
    plan, settings = make_plan(), make_settings(max_grad_norm=None, seed=7)
    document = json.loads(render(plan, settings).files[PLAN_NAME])
    assert document == {**plan.to_dict(), **dataclasses.asdict(settings)}
    assert document["max_grad_norm"] is None and document["memory"]["total"] is None


def test_env_carries_the_plan_for_plain_scripts() -> None:
    job = render(make_plan(lr=0.000123), make_settings(checkpoint_dir="/ckpt"))
    assert job.entrypoint == SCRIPT_NAME
    assert {k: job.env[k] for k in (
        "LAUNCH_MICRO_BATCH_SIZE", "LAUNCH_GRAD_ACCUM_STEPS", "LAUNCH_GLOBAL_BATCH_SIZE",
        "LAUNCH_STRATEGY", "LAUNCH_PRECISION", "LAUNCH_ACTIVATION_CHECKPOINTING",
        "LAUNCH_CHECKPOINT_DIR", "LAUNCH_STEPS", "LAUNCH_LR", "LAUNCH_OPTIMIZER", "LAUNCH_PLAN",
        "LAUNCH_SEQ_LEN",
    )} == {
        "LAUNCH_MICRO_BATCH_SIZE": "4", "LAUNCH_GRAD_ACCUM_STEPS": "2",
        "LAUNCH_GLOBAL_BATCH_SIZE": "16", "LAUNCH_STRATEGY": "ddp",
        "LAUNCH_PRECISION": "bf16_mixed", "LAUNCH_ACTIVATION_CHECKPOINTING": "1",
        "LAUNCH_CHECKPOINT_DIR": "/ckpt", "LAUNCH_STEPS": "100", "LAUNCH_LR": "0.000123",
        "LAUNCH_OPTIMIZER": "adamw", "LAUNCH_PLAN": "plan.json", "LAUNCH_SEQ_LEN": "128",
    }
    assert all(isinstance(v, str) for v in job.env.values())
    no_seq_len = render(make_plan(seq_len=None, activation_checkpointing=False), make_settings())
    assert "LAUNCH_SEQ_LEN" not in no_seq_len.env
    assert no_seq_len.env["LAUNCH_ACTIVATION_CHECKPOINTING"] == "0"


def test_script_mode_renders_no_script() -> None:
    job = render(make_plan(strategy="fsdp"), make_settings(mode="script", recipe_file="mine.py"))
    assert job.files.keys() == {PLAN_NAME}
    assert job.entrypoint == "mine.py"
    assert job.env["LAUNCH_STRATEGY"] == "fsdp"


def test_a_script_s_own_arguments_are_data_beside_its_entrypoint() -> None:
    """The arguments go on the command line each provider builds, never into code or plan.json;
    the same for a framework script's shim, which hands them on; a recipe takes none."""
    args = ("--train_file", "data with spaces.txt", "$HOME", "it's")
    plain = render(make_plan(), make_settings(mode="script", recipe_file="mine.py"), args)
    shim = render(make_plan(), make_settings(mode="script", recipe_file="mine.py",
                                             framework="hf_trainer"), args)
    assert plain.args == shim.args == args
    assert all("data with spaces" not in text for text in {**plain.files, **shim.files}.values())
    assert render(make_plan(), make_settings()).args == ()
    with pytest.raises(ValueError, match="a recipe takes no arguments"):
        render(make_plan(), make_settings(), args)


def test_a_framework_script_s_own_length_and_its_pins_are_data() -> None:
    """A framework script whose length is its own (steps None: not known before it runs) is
    rendered, with no LAUNCH_STEPS; a recipe's plan needs its steps. plan.json names the
    settings the user pinned: the shim writes only those over the script's own."""
    shim = make_settings(mode="script", recipe_file="mine.py", framework="lightning",
                         pinned=["lr", "steps"])
    job = render(make_plan(steps=None), shim)
    document = json.loads(job.files[PLAN_NAME])
    assert document["steps"] is None and document["pinned"] == ["lr", "steps"]
    assert "LAUNCH_STEPS" not in job.env
    assert render(make_plan(), make_settings()).env["LAUNCH_STEPS"] == "100"
    with pytest.raises(ValueError, match="steps"):
        render(make_plan(steps=None), make_settings())


def test_strategies_without_a_template_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="pipeline") as raised:
        render(make_plan(strategy="pipeline"), make_settings())
    assert "ddp" in str(raised.value) and "single" in str(raised.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"global_batch_size": 12}, "global_batch_size 12"),
        ({"micro_batch_size": 0, "global_batch_size": 0}, "micro_batch_size"),
        ({"steps": 0}, "steps"),
        ({"lr": 0.0}, "lr"),
    ],
)
def test_inconsistent_plans_are_refused(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render(make_plan(**overrides), make_settings())


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        make_settings(mode="notebook")
    with pytest.raises(ValueError, match="keep_checkpoints"):
        make_settings(keep_checkpoints=0)
    with pytest.raises(ValueError, match=SCRIPT_NAME):
        render(make_plan(), make_settings(recipe_file=f"code/{SCRIPT_NAME}"))
    with pytest.raises(ValueError, match=RUNTIME_NAME):
        render(make_plan(), make_settings(recipe_file=RUNTIME_NAME))


def test_write_puts_every_file_in_place(tmp_path: Path) -> None:
    job = render(make_plan(), make_settings())
    (tmp_path / PLAN_NAME).write_text("stale")
    job.write(tmp_path)
    nested = RenderedJob(files={"configs/extra.json": "{}"}, entrypoint=SCRIPT_NAME)
    nested.write(tmp_path)
    assert (tmp_path / PLAN_NAME).read_text() == job.files[PLAN_NAME]
    assert (tmp_path / SCRIPT_NAME).read_text() == job.files[SCRIPT_NAME]
    assert (tmp_path / "configs" / "extra.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [PLAN_NAME, RUNTIME_NAME, SCRIPT_NAME, "configs"])  # no temporary file left behind
    with pytest.raises(ValueError, match="relative"):
        RenderedJob(files={"../escape.py": ""}, entrypoint="x").write(tmp_path)


def test_a_plain_script_receives_the_plan_under_torchrun(tmp_path: Path) -> None:
    """Script mode end to end: examples/plain/train.py under torchrun with 2 processes gets
    exactly the LAUNCH_* variables of the rendered job, and trains with them. (Seconds: it runs
    torch; the "slow" marker is registered for tests/trainer_templates only.)"""
    script = REPO / "examples" / "plain" / "train.py"
    plan = make_plan(strategy="ddp", precision="fp32", activation_checkpointing=False,
                     micro_batch_size=3, grad_accum_steps=2, global_batch_size=12, steps=4,
                     lr=0.05)
    job = render(plan, make_settings(mode="script", recipe_file=str(script),
                                     checkpoint_dir=str(tmp_path / "checkpoints")))
    job.write(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCH_")}
    env.update(job.env, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         job.entrypoint],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"plain"')]
    received = {line["rank"]: line["env"] for line in lines if line["plain"] == "received"}
    assert received == {0: job.env, 1: job.env}
    steps = [(line["rank"], line["step"]) for line in lines if line["plain"] == "step"]
    assert sorted(steps) == [(rank, step) for rank in (0, 1) for step in range(1, 5)]


@pytest.mark.parametrize("strategy, moves_first", [("fsdp", False), ("hybrid_shard", False),
                                                   ("ddp", True), ("single", True)])
def test_sharded_scripts_leave_the_move_to_the_gpu_to_fully_shard(strategy, moves_first):
    """A sharded plan is for a model that does not fit on one GPU: its script must not move the
    whole model there before sharding (fully_shard moves each block as it shards it)."""
    from launcher.render import render_script

    source = render_script(strategy)
    build = source[source.index("def build_model(recipe"):source.index("def build_optimizer(")]
    assert ("model.to(device=runtime.device" in build) is moves_first
    if not moves_first:
        assert "model.to(dtype=launch.param_dtype(" in build
