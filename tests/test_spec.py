"""Bad input is a one-line usage error that says where it came from (issue 16).

The config file (``launch.toml``, ``[tool.launch]``) is checked against the options it gives
defaults to and the providers' settings; numbers from flags, the environment, the config file and
the recipe's ``LAUNCH`` must be finite and in range; a ``--model-config`` must be a JSON object of
whole-number sizes. None of it may become an internal error (exit 1) or pass silently.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import click
import pytest

from launcher.cli import cli as launch_group
from launcher.options import config_keys
from launcher.providers.sagemaker import SageMakerSettings
from launcher.script_info import ScriptInfo
from launcher.spec import (
    DEFAULTS,
    INT_RANGES,
    LAUNCH_KEYS,
    MAX_BATCH,
    ConfigKey,
    Spec,
    build_spec,
    load_config,
)
from launcher.status import ExitStatus, UsageError

PLAIN = ["--params", "1M"]
SAGEMAKER = ["--provider", "sagemaker", "--region", "us-east-1", "--bucket", "my-bucket",
             "--role", "arn:aws:iam::123456789012:role/R"]
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_EC2_METADATA_DISABLED": "true"}


def one_usage_line(result) -> str:
    """The single stderr line of a usage error (exit 2), no traceback."""
    assert result.status == ExitStatus.USAGE, (result.status, result.stderr)
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("launch: error: ") and "Traceback" not in result.stderr
    assert "internal error" not in result.stderr
    return result.stderr.strip()


@pytest.fixture
def plain(write_script) -> Path:
    return write_script("print('training')\n")


def plan(cli, script: Path, *args: str, **kwargs):
    """`launch plan` of a plain script on SageMaker: no probe child, no tracing (fast)."""
    return cli("plan", str(script), *PLAIN, *SAGEMAKER, *args,
               environ={**AWS_ENV, **kwargs.pop("environ", {})}, **kwargs)


# -- the config file: keys --------------------------------------------------------------------


#: Options that are never config keys: a file cannot say yes to spending for the person who
#: runs `launch` (`--yes` is given on the command line, as CI does).
NOT_CONFIG = ("as_json", "debug", "yes")


def test_config_keys_are_the_options_and_the_provider_settings():
    keys = config_keys()
    assert "yes" not in keys
    for name in ("run", "plan", "doctor"):
        for param in launch_group.commands[name].params:
            if isinstance(param, click.Option) and param.name not in NOT_CONFIG:
                flag = next(o for o in param.opts if o.startswith("--"))
                assert flag[2:].replace("-", "_") in keys, flag
    for field in dataclasses.fields(SageMakerSettings):
        assert field.name in keys, field.name
    assert {"s3_prefix", "job_prefix", "aws_max_attempts", "image", "report",
            "cancel_on_interrupt"} <= set(keys)
    assert "json" not in keys and "debug" not in keys and "as_json" not in keys
    assert keys["report"].param == "report_path"  # named as the flag, given to the option
    assert keys["s3_prefix"] == ConfigKey("s3_prefix", "str", None)
    assert keys["aws_max_attempts"].kind == "int" and keys["budget"].kind == "float"
    assert keys["params"].kind == "count" and keys["memory_limit"].kind == "size"
    assert keys["spot"].kind == "bool" and keys["model_config"].kind == "path"


def test_the_click_options_are_the_tables_options():
    """cli.py builds run's, plan's and doctor's options from launcher.options: each config key
    is the option's flag, of the option's kind, given to the option's parameter."""
    from launcher.cli import _kind

    keys = config_keys()
    for name in ("run", "plan", "doctor"):
        for param in launch_group.commands[name].params:
            if isinstance(param, click.Option) and param.name not in NOT_CONFIG:
                key = keys[next(o for o in param.opts if o.startswith("--"))[2:].replace("-", "_")]
                assert (key.kind, key.param) == (_kind(param), param.name), key


def test_a_typo_names_the_key_and_suggests_the_right_one(cli, plain, tmp_path):
    (tmp_path / "launch.toml").write_text("global-bach-size = 16\n")
    line = one_usage_line(plan(cli, plain))
    assert f"{tmp_path / 'launch.toml'}: unknown key 'global-bach-size'" in line
    assert "did you mean 'global-batch-size'?" in line
    # never the 50 keys (tuning ones among them): where they are, in one short line
    assert "known keys" not in line and "aws" not in line and "log-page" not in line
    assert "`launch plan --help`" in line and len(line) < 250, line


def test_an_unknown_key_with_nothing_close_lists_no_keys(cli, plain, tmp_path):
    (tmp_path / "launch.toml").write_text("zzz = 1\n")
    line = one_usage_line(plan(cli, plain))
    assert "unknown key 'zzz'" in line and "did you mean" not in line
    assert "log_page_size" not in line and "api_interval_s" not in line and len(line) < 200


def test_a_launch_toml_pasted_from_pyproject_reads_its_table(cli, plain, tmp_path):
    (tmp_path / "launch.toml").write_text('[tool.launch]\nparams = "7B"\nsteps = 7\n')
    result = cli("plan", str(plain), "--json", "--provider", "sagemaker", environ=AWS_ENV)
    assert result.status == 0, result.stderr
    assert result.json()["model"]["parameters"] == 7_000_000_000
    assert load_config(tmp_path) == ({"params": "7B", "steps": 7}, tmp_path / "launch.toml")
    (tmp_path / "launch.toml").write_text('[tool.launch]\nstep = 7\n')  # a typo: the table named
    assert "launch.toml [tool.launch]: unknown key 'step'" in one_usage_line(plan(cli, plain))
    (tmp_path / "launch.toml").write_text('[tool.launch]\nsteps = 7\n[tool.ruff]\nx = 1\n')
    line = one_usage_line(plan(cli, plain))  # not [tool.launch] alone: no table is guessed
    assert "unknown key 'tool'" in line and len(line) < 250


def test_a_typo_in_pyproject_names_the_table(cli, plain, tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.launch]\nstep = 5\n")
    line = one_usage_line(plan(cli, plain))
    assert "pyproject.toml [tool.launch]: unknown key 'step'" in line
    assert "did you mean 'steps'?" in line


def test_a_pyproject_without_a_launch_table_is_not_a_config(cli, plain, tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.other]\nsteps = 'x'\n")
    assert plan(cli, plain, "--json").status == 0


@pytest.mark.parametrize("text", ["[tool]\nlaunch = 3\n", "tool = 'x'\n"])
def test_a_tool_launch_that_is_no_table(cli, plain, tmp_path, text):
    (tmp_path / "pyproject.toml").write_text(text)
    result = plan(cli, plain)
    if "launch = 3" in text:
        assert "[tool.launch] must be a table" in one_usage_line(result)
    else:
        assert result.status == 0, result.stderr


def test_the_same_key_twice(cli, plain, tmp_path):
    (tmp_path / "launch.toml").write_text("global-batch-size = 8\nglobal_batch_size = 16\n")
    assert "are the same key" in one_usage_line(plan(cli, plain))


# -- the config file: values ------------------------------------------------------------------


def test_a_list_value_is_a_usage_error_not_a_type_error(cli, plain, tmp_path):
    (tmp_path / "launch.toml").write_text("steps = [1, 2]\n")
    line = one_usage_line(plan(cli, plain))
    assert f"steps in {tmp_path / 'launch.toml'} must be a whole number, not [1, 2]" in line


def test_a_boolean_is_no_step_count(cli, plain, tmp_path):
    (tmp_path / "launch.toml").write_text("steps = true\n")
    assert "steps in" in one_usage_line(plan(cli, plain))
    assert "must be a whole number, not true" in plan(cli, plain).stderr


#: A value of the wrong type for each kind of key, and what the message says it must be.
WRONG = {"int": ("1.5", "a whole number"), "float": ('"fast"', "a number"),
         "bool": ('"yes"', "true or false"), "str": ("7", "text"), "path": ("[]", "a path"),
         "count": ("true", "a count"), "size": ("{}", "a size"),
         "args": ('"--train_file data.txt"', "a list of strings")}


@pytest.mark.parametrize("key", sorted(config_keys()))
def test_every_key_refuses_a_wrong_type_naming_file_and_key(cli, plain, tmp_path, key):
    kind = config_keys()[key].kind
    value, words = WRONG[kind]
    (tmp_path / "launch.toml").write_text(f"{key.replace('_', '-')} = {value}\n")
    line = one_usage_line(plan(cli, plain))
    assert f"{key.replace('_', '-')} in {tmp_path / 'launch.toml'} must be {words}" in line


@pytest.mark.parametrize("key", sorted(config_keys()))
def test_every_key_refuses_a_table(cli, plain, tmp_path, key):
    (tmp_path / "launch.toml").write_text(f"[{key}]\na = 1\n")
    line = one_usage_line(plan(cli, plain))
    assert f"{key} in {tmp_path / 'launch.toml'} must be" in line


@pytest.mark.parametrize(("text", "words"), [
    ("lr = nan", "lr in {toml} must be a finite number, not nan"),
    ("budget = inf", "budget in {toml} must be a finite number, not inf"),
    ("aws_connect_timeout_s = -inf", "aws_connect_timeout_s in {toml} must be a finite number"),
    ("aws_max_attempts = 0", "aws_max_attempts in {toml} must be at least 1, not 0"),
    ("api_interval_s = -1.0", "api_interval_s in {toml} must not be negative"),
    ('image = "a\\nb"', "image in {toml} must be one line of text"),
    ('params = "lots"', "params in {toml}: not a count: 'lots'"),
    ('memory-limit = "1e999GiB"', "memory-limit in {toml}: not a size: '1e999GiB' is too large"),
    ("steps = -3", "steps in {toml} must be at least 1, not -3"),
    ("max-attempts = 0", "max-attempts in {toml} must be at least 1, not 0"),
    ("memory_limit = 0", "memory_limit in {toml} must be at least 1, not 0"),
    ("global-batch-size = 99999999999", "global-batch-size in {toml} must be at most"),
    ('precision = "fp64"', "unknown precision 'fp64' from precision in {toml}"),
    ("steps = 1" + "0" * 5000, "{toml}: not valid TOML"),
])
def test_bad_config_values_name_the_file_and_key(cli, plain, tmp_path, text, words):
    toml = tmp_path / "launch.toml"
    toml.write_text(text + "\n")
    assert words.format(toml=toml) in one_usage_line(plan(cli, plain))


def test_script_args_from_the_config_and_after_dashdash(cli, plain, tmp_path):
    """A list of strings in the config is the script's arguments; those after `--` replace it
    (`--` alone: none); each reaches the request as one element, as written."""
    toml = tmp_path / "launch.toml"
    toml.write_text('script_args = ["--train_file", "data with spaces.txt", "$HOME"]\n')

    def container_args(*args: str) -> tuple[list[str], list[str]]:
        result = plan(cli, plain, "--json", *args)
        assert result.status == 0, result.stderr
        request = result.json()["request"]["create_training_job"]
        arguments = request["AlgorithmSpecification"]["ContainerArguments"]
        return result.json()["script_args"], arguments[arguments.index("train.py") + 1:]

    assert container_args() == (["--train_file", "data with spaces.txt", "$HOME"],) * 2
    assert container_args("--", "--lr=3e-4", "it's") == (["--lr=3e-4", "it's"],) * 2
    assert container_args("--") == ([], [])
    assert load_config(tmp_path)[0] == {"script_args": ["--train_file", "data with spaces.txt",
                                                        "$HOME"]}
    toml.write_text('script_args = ["--epochs", 3]\n')
    assert (f"script_args in {toml} must be a list of strings like "
            '["--train_file", "data.txt"], not ["--epochs", 3]') in one_usage_line(
                plan(cli, plain))
    toml.write_text('script-args = ["a\\u0000b"]\n')
    assert f"script-args in {toml}: 'a\\x00b' holds a NUL character" in one_usage_line(
        plan(cli, plain))


def test_an_unknown_provider_in_the_config_names_it(cli, plain, tmp_path):
    (tmp_path / "launch.toml").write_text('provider = "azure"\n')
    line = one_usage_line(cli("plan", str(plain), *PLAIN))
    assert f"unknown provider 'azure' from provider in {tmp_path / 'launch.toml'}" in line


def test_numbers_and_text_for_counts_and_sizes(cli, plain, tmp_path):
    (tmp_path / "launch.toml").write_text('params = 7000000000\nmemory-limit = "2GiB"\n')
    result = cli("plan", str(plain), "--json", "--provider", "sagemaker", environ=AWS_ENV)
    assert result.status == 0, result.stderr
    assert result.json()["model"]["parameters"] == 7_000_000_000
    config, _ = load_config(tmp_path)
    assert config == {"params": 7_000_000_000, "memory_limit": "2GiB"}


def test_provider_settings_from_the_config_reach_the_request(cli, plain, tmp_path):
    (tmp_path / "launch.toml").write_text(
        'job_prefix = "team-a"\ns3_prefix = "exp/1"\naws_max_attempts = 2\n')
    result = plan(cli, plain, "--json")
    assert result.status == 0, result.stderr
    request = result.json()["request"]["create_training_job"]
    assert request["TrainingJobName"].startswith("team-a-")
    assert request["CheckpointConfig"]["S3Uri"].startswith("s3://my-bucket/exp/1/")


def test_a_bad_provider_setting_in_the_config_is_not_silently_dropped(cli, plain, tmp_path):
    (tmp_path / "launch.toml").write_text('job_prefix = "no spaces allowed"\n')
    result = plan(cli, plain, "--json")
    # Formats are the provider's to check; a dry run notes a provider it could not configure.
    assert result.status in (0, 2), result.stderr
    shown = result.stderr if result.status else json.dumps(result.json()["notes"])
    assert "job_prefix 'no spaces allowed'" in shown


# -- the config file is read only by the commands that use it ---------------------------------


@pytest.fixture
def broken_config(tmp_path: Path) -> Path:
    path = tmp_path / "launch.toml"
    path.write_text("steps = [1]\nglobal-bach-size = true\n")
    return path


def test_explain_ignores_the_config(cli, broken_config, tmp_path):
    (tmp_path / "train.log").write_text("step 1 loss 2.0\n")
    result = cli("explain", "train.log")
    assert result.status == 0, result.stderr
    assert "no failure found" in result.stdout


def test_machines_ignores_the_config(cli, broken_config):
    result = cli("machines", "--provider", "vertex", "--json")
    assert result.status == 0, result.stderr


@pytest.mark.parametrize(("command", "status"), [("status", 0), ("cancel", 0), ("logs", 2),
                                                  ("attach", 2)])
def test_run_commands_ignore_the_config(cli, broken_config, tmp_path, command, status):
    from launcher.runs import Run

    run = Run.create(tmp_path / "state", "train", {"script": "train.py", "provider": "local",
                                                    "spec": {}, "plan": {}})
    result = cli(command, run.id)
    assert result.status == status, result.stderr
    if status:  # no submitted attempt: their own usage error, not the config's
        assert "no submitted attempt" in one_usage_line(result)
    assert "launch.toml" not in result.stderr


@pytest.mark.parametrize("args", [["--help"], ["plan", "--help"], ["--version"]])
def test_help_ignores_the_config(cli, broken_config, args):
    assert cli(*args).status == 0


@pytest.mark.parametrize("command", [["plan"], ["run"], []])
def test_plan_and_run_read_it(cli, broken_config, plain, command):
    line = one_usage_line(cli(*command, str(plain), *PLAIN))
    assert f"steps in {broken_config} must be a whole number" in line


def test_doctor_reads_it(cli, broken_config):
    line = one_usage_line(cli("doctor", "--provider", "sagemaker"))
    assert f"steps in {broken_config} must be a whole number" in line


# -- numbers from flags, the environment and LAUNCH ---------------------------------------------


@pytest.mark.parametrize(("args", "words"), [
    (["--lr", "nan"], "--lr must be a finite number, not nan"),
    (["--lr", "inf"], "--lr must be a finite number, not inf"),
    (["--lr", "-0.1"], "--lr must be positive, not -0.1"),
    (["--lr", "0"], "--lr must be positive, not 0.0"),
    (["--budget", "nan"], "--budget must be a finite number, not nan"),
    (["--budget", "inf"], "--budget must be a finite number, not inf"),
    (["--budget", "-5"], "--budget must be a positive amount of USD, not -5.0"),
    (["--memory-limit", "0"], "--memory-limit must be at least 1, not 0"),
    (["--memory-limit", "0.5"], "--memory-limit must be at least 1, not 0"),
    (["--memory-limit", "1e999"], "not a size: '1e999' is too large"),
    (["--params", "1e400"], "not a count: '1e400' is too large"),
    (["--params", "2000T"], f"--params must be at most {10**15}"),
    (["--steps", "99999999999999999999"], "--steps must be at most 2147483647"),
    (["--global-batch-size", str(MAX_BATCH + 1)],
     f"--global-batch-size must be at most {MAX_BATCH}"),
    (["--nodes", "0"], "--nodes must be at least 1, not 0"),
    (["--heads", "-1"], "--heads must be at least 1, not -1"),
    (["--image", "a\nb"], "--image must be one line of text without control characters"),
])
def test_bad_numbers_on_the_command_line(cli, plain, args, words):
    assert words in one_usage_line(plan(cli, plain, *args))


def numeric_options() -> list[tuple[str, str]]:
    """Every numeric option of `launch plan` with each value it must refuse."""
    from launcher.cli import _kind

    cases = []
    for param in launch_group.commands["plan"].params:
        if isinstance(param, click.Option) and _kind(param) in ("int", "float", "count", "size"):
            bad = ["-1", "0"] + (["nan", "inf", "-inf", "1e400"] if _kind(param) != "int" else
                                 ["nan", str(2**64)])
            cases += [(param.opts[0], value) for value in bad]
    return cases


@pytest.mark.parametrize(("flag", "value"), numeric_options())
def test_every_numeric_flag_refuses_non_positive_and_non_finite(cli, plain, flag, value):
    line = one_usage_line(plan(cli, plain, f"{flag}={value}"))
    assert flag in line


#: Each numeric config key with values it must refuse (a provider setting may be 0 if a float).
NUMERIC_KEYS = [(key, value) for key, spec in sorted(config_keys().items())
                if spec.kind in ("int", "float", "count", "size")
                for value in ("-1", "nan", "inf", "-inf")
                + (("0",) if spec.kind != "float" or spec.param else ())]


@pytest.mark.parametrize(("key", "value"), NUMERIC_KEYS)
def test_every_numeric_config_key_refuses_non_positive_and_non_finite(cli, plain, tmp_path,
                                                                      key, value):
    toml = tmp_path / "launch.toml"
    toml.write_text(f"{key} = {value}\n")
    result = cli("plan", str(plain), *SAGEMAKER, environ=AWS_ENV)  # no --params over params
    assert f"{key} in {toml}" in one_usage_line(result)


def test_budget_nan_is_not_over_budget(cli, plain):
    result = plan(cli, plain, "--budget", "nan")
    assert result.status == ExitStatus.USAGE and "$nan" not in result.stdout + result.stderr


@pytest.mark.parametrize(("variable", "value", "words"), [
    ("LAUNCH_BUDGET", "nan", "--budget (LAUNCH_BUDGET) must be a finite number, not nan"),
    ("LAUNCH_MAX_ATTEMPTS", "0", "--max-attempts (LAUNCH_MAX_ATTEMPTS) must be at least 1, not 0"),
])
def test_bad_numbers_from_the_environment_name_the_variable(cli, plain, monkeypatch, variable,
                                                            value, words):
    monkeypatch.setenv(variable, value)  # click reads its envvars from os.environ
    assert words in one_usage_line(plan(cli, plain))


def test_lr_nan_leaves_no_run_folder(cli, plain, tmp_path):
    result = cli("run", str(plain), "--params", "1M", "--lr", "nan")
    assert "--lr must be a finite number" in one_usage_line(result)
    runs = tmp_path / "state" / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_launch_steps_are_blamed_on_launch_not_on_the_flag(cli, write_script):
    from tests.conftest import TINY_RECIPE

    script = write_script(TINY_RECIPE.replace('"steps": 4', '"steps": -3'))
    line = one_usage_line(cli("plan", str(script)))
    assert "LAUNCH['steps'] in train.py must be at least 1, not -3" in line
    assert "--steps" not in line


def test_where_a_value_came_from(cli, plain, tmp_path):
    """The flag beats the config file, and each is named when its value is bad."""
    toml = tmp_path / "launch.toml"
    toml.write_text("steps = -3\n")
    assert f"steps in {toml} must be at least 1" in one_usage_line(plan(cli, plain))
    assert plan(cli, plain, "--steps", "5").status == 0
    assert "--steps must be at least 1, not 0" in one_usage_line(plan(cli, plain, "--steps", "0"))


# -- build_spec: every number of LAUNCH ---------------------------------------------------------


def info(launch: dict, tmp_path: Path) -> ScriptInfo:
    return ScriptInfo(path=tmp_path / "train.py", mode="recipe", launch=launch)


#: Each numeric LAUNCH key with values it must refuse.
BAD_LAUNCH = [(key, value) for key, kind in LAUNCH_KEYS.items() if kind not in (str, bool)
              for value in (math.nan, math.inf, -math.inf, -1, 0, 10**400, True, "1", [1], {})
              if not (key == "seed" and value == 0)
              and not (key == "weight_decay" and value == 0)]


@pytest.mark.parametrize(("key", "value"), BAD_LAUNCH, ids=[f"{k}={v!r}" for k, v in BAD_LAUNCH])
def test_every_numeric_launch_value_is_checked(tmp_path, key, value):
    with pytest.raises(UsageError) as caught:
        build_spec({}, info({key: value}, tmp_path))
    assert f"LAUNCH[{key!r}] in train.py" in caught.value.message
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("key", "value"), [("max_grad_norm", None), ("weight_decay", 0),
                                             ("seed", 0), ("lr", 1), ("max_grad_norm", 0.5)])
def test_good_launch_values(tmp_path, key, value):
    assert getattr(build_spec({}, info({key: value}, tmp_path)), key) == value


def test_unknown_launch_key_suggests(tmp_path):
    with pytest.raises(UsageError) as caught:
        build_spec({}, info({"stpes": 3}, tmp_path))
    assert "unknown LAUNCH key 'stpes'" in caught.value.message
    assert "did you mean 'steps'?" in caught.value.hint


def test_options_over_launch_and_their_origin(tmp_path):
    spec = build_spec({"steps": 7}, info({"steps": 3, "lr": 0.1}, tmp_path))
    assert (spec.steps, spec.lr) == (7, 0.1)
    with pytest.raises(UsageError, match=r"^steps in /x/launch.toml must be at least 1"):
        build_spec({"steps": -1}, info({"steps": 3}, tmp_path),
                   {"steps": "steps in /x/launch.toml"})


def test_the_plan_says_where_each_setting_came_from(tmp_path):
    spec = build_spec({"steps": 7, "precision": "fp32"}, info({"steps": 3, "lr": 0.1}, tmp_path),
                      {"steps": "steps in /x/launch.toml"})
    assert spec.origins == {
        "global_batch_size": "launch's default", "steps": "steps in /x/launch.toml",
        "lr": "LAUNCH['lr'] in train.py", "precision": "--precision",
        "optimizer": "launch's default"}
    assert spec.pinned == ("steps", "lr", "precision")  # a recipe's LAUNCH pins too


def framework(kind: str, tmp_path: Path, length: dict) -> ScriptInfo:
    """A framework script as its capture describes it: its own settings, and its length."""
    return ScriptInfo(
        path=tmp_path / "train.py", mode="script", framework=kind,
        launch={"global_batch_size": 8, "lr": 0.01, "optimizer": "sgd", "max_grad_norm": None},
        own={"global_batch_size": "batch_size 8 x accumulation 1", "lr": "SGD's lr",
             "optimizer": "torch.optim.SGD"}, length=length)


def test_a_framework_script_keeps_its_own_length_and_settings_unless_pinned(tmp_path):
    """Launch's default 100 steps is never a framework script's: its own length (1 epoch of 2
    batches: 2 steps), or None where it cannot be known before it runs; its own optimizer and
    learning rate are not pins (the job keeps the script's)."""
    epoch = {"epochs": 1, "batches": 2, "accumulation": 1, "batch_size": 8, "samples": 16}
    spec = build_spec({}, framework("hf_trainer", tmp_path, epoch))
    assert (spec.steps, spec.lr, spec.optimizer, spec.global_batch_size) == (2, 0.01, "sgd", 8)
    assert spec.origins["steps"] == "the script's own: 1 epoch of 2 batches"
    assert spec.origins["optimizer"] == "the script's own: torch.optim.SGD"
    assert spec.pinned == ()
    # pinned: the pin, and only the pins reach the framework
    spec = build_spec({"steps": 5, "lr": 0.5, "global_batch_size": 16},
                      framework("hf_trainer", tmp_path, epoch))
    assert (spec.steps, spec.lr) == (5, 0.5) and spec.pinned == ("global_batch_size", "steps",
                                                                 "lr")
    assert spec.origins["steps"] == "--steps"
    # an unbounded loop: unknown, not 100
    spec = build_spec({}, framework("accelerate", tmp_path, {"unknown": "its loop stops itself"}))
    assert spec.steps is None
    assert spec.origins["steps"] == (
        "the script's own, not known before it runs: its loop stops itself")


def test_a_pin_the_framework_has_no_place_for_keeps_the_scripts_value_and_says_so(tmp_path):
    epoch = {"epochs": 2, "batches": 2, "accumulation": 1, "batch_size": 8, "samples": 16}
    spec = build_spec({"steps": 5, "optimizer": "adamw", "lr": 0.5},
                      framework("accelerate", tmp_path, epoch))
    assert (spec.steps, spec.optimizer, spec.lr) == (4, "sgd", 0.01) and spec.pinned == ()
    assert spec.origins["steps"] == (
        "the script's own: 2 epochs of 2 batches (the loop counts its own batches, which the "
        "pin --steps does not reach)")
    assert "which the pin --optimizer does not reach" in spec.origins["optimizer"]
    spec = build_spec({"lr": 0.5}, framework("lightning", tmp_path, epoch))
    assert spec.lr == 0.01 and "configure_optimizers" in spec.origins["lr"]
    assert spec.steps == 4  # Lightning's own epochs: no pin


def test_ranges_cover_every_whole_number_field():
    numbers = {f.name for f in dataclasses.fields(Spec)
               if f.type in ("int", "int | None")}
    assert numbers <= set(INT_RANGES), numbers - set(INT_RANGES)
    assert set(DEFAULTS) <= set(LAUNCH_KEYS)


# -- --model-config ----------------------------------------------------------------------------

TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
              "max_position_embeddings": 128}


def with_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.json"
    path.write_text(text)
    return path


def model_plan(cli, plain, path):
    return cli("plan", str(plain), "--model-config", str(path), *SAGEMAKER, environ=AWS_ENV)


def test_model_config_folder(cli, plain, tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    line = one_usage_line(model_plan(cli, plain, folder))
    assert f"--model-config {folder} is a folder" in line
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    line = one_usage_line(model_plan(cli, plain, folder))
    assert f"give the file: --model-config {folder / 'config.json'}" in line


@pytest.mark.parametrize(("change", "words"), [
    ({"hidden_size": "4096"}, 'hidden_size must be a whole number, not "4096"'),
    ({"num_attention_heads": 0}, "num_attention_heads must be at least 1, not 0"),
    ({"num_hidden_layers": -2}, "num_hidden_layers must be at least 1, not -2"),
    ({"vocab_size": 256.0}, "vocab_size must be a whole number, not 256.0"),
    ({"vocab_size": 10**40}, "vocab_size must be at most 2147483647"),
    ({"intermediate_size": True}, "intermediate_size must be a whole number, not true"),
    ({"num_key_value_heads": [2]}, "num_key_value_heads must be a whole number, not [2]"),
    ({"tie_word_embeddings": "false"}, 'tie_word_embeddings must be true or false, not "false"'),
    ({"model_type": ["llama"]}, 'model_type ["llama"] is not one launch can size'),
])
def test_model_config_fields(cli, plain, tmp_path, change, words):
    path = with_config(tmp_path, json.dumps({**TINY_LLAMA, **change}))
    assert f"{path}: {words}" in one_usage_line(model_plan(cli, plain, path))


@pytest.mark.parametrize(("text", "words"), [
    ('{"model_type": "llama", "hidden_size": NaN}', "hidden_size must be a whole number, not NaN"),
    ("[" * 100_000 + "]" * 100_000, "not a JSON config"),
    ("[1, 2]", "not a Hugging Face config (expected a JSON object)"),
    ("\xff\xfe", "not a JSON config"),
])
def test_model_config_files(cli, plain, tmp_path, text, words):
    path = with_config(tmp_path, text)
    assert f"{path}: {words}" in one_usage_line(model_plan(cli, plain, path))


def test_encoder_decoder_fields_are_checked_too(cli, plain, tmp_path):
    t5 = {"model_type": "t5", "d_model": 64, "d_kv": "16", "d_ff": 128, "num_layers": 2,
          "num_heads": 4, "vocab_size": 256}
    path = with_config(tmp_path, json.dumps(t5))
    assert 'd_kv must be a whole number, not "16"' in one_usage_line(model_plan(cli, plain, path))


def test_the_hf_recipe_reads_the_config_as_the_estimate_does(tmp_path):
    from launcher.estimate.hf_recipe import write_recipe

    with pytest.raises(UsageError, match="is a folder"):
        write_recipe(tmp_path, 16, tmp_path / "recipes")
    with pytest.raises(UsageError, match="expected a JSON object"):
        write_recipe(with_config(tmp_path, "[]"), 16, tmp_path / "recipes")
    with pytest.raises(ValueError, match="seq_len"):
        write_recipe(with_config(tmp_path, json.dumps(TINY_LLAMA)), 0, tmp_path / "recipes")
