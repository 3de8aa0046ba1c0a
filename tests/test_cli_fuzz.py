"""Hostile values through every way in, to `launch plan`: never an internal error (issue 16).

Random (seeded: the same cases every run) and hostile values (nan, inf, -1, 0, huge numbers,
empty strings, unicode, lists, tables, booleans, newlines, quotes, path traversal) go through the
flags, the environment variables, ``launch.toml`` / ``[tool.launch]`` and the recipe's ``LAUNCH``
dict. Every run must exit 0 or 2, or 3/4 (no plan fits, over budget) with a plan for valid values;
never 1. A usage error is exactly one stderr line, ``launch: error: ...``, no traceback; a plan's
JSON has no NaN or Infinity in it.

Fast: plain scripts planned for the clouds need no child process; the local provider's hardware
probe and the recipe's probe (the child that imports the recipe with torch) are answered in
process, the ``LAUNCH`` dict passing through JSON as the real child's answer does. Tracing is off.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

import click
import pytest

from launcher import recipe as recipe_module
from launcher.cli import _kind
from launcher.cli import cli as launch_group
from launcher.options import config_keys
from launcher.plan.plan import OPTIMIZERS, PRECISIONS, STRATEGIES
from launcher.spec import LAUNCH_KEYS

SEED = 16
CASES = 400

TINY_CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
               "max_position_embeddings": 128}

#: Text no option should take as it is.
HOSTILE_TEXT = [
    "nan", "NaN", "inf", "-inf", "Infinity", "-1", "0", "-0", "0.0", "1e400", "1e-400",
    str(2**64), "9" * 40, "", " ", "ünïcødé", "日本語", "🙂", "a\nb", "\n", "\r\n", "\t", '"',
    "'", '"quoted"', "it's", "../../etc/passwd", "..", "/", "~", "$HOME", "%s%n", "{}",
    "[1, 2]", "true", "false", "None", "null", "0x10", "1_000", "١٢٣", "1,5", "  8  ", "-",
    "--", "a" * 3000, "s3://bucket/../x", "arn:aws:iam::1:role/../x", "C:\\Windows",
]
#: Values a config file or LAUNCH may hold (TOML or JSON types), valid ones among them.
HOSTILE_VALUES: list[Any] = [
    math.nan, math.inf, -math.inf, -1, 0, 1, 2, 8, 2**31, 2**63 - 1, -(2**63), 10**30, 1.5,
    -0.0, 1e-300, 1e300, True, False, "", " ", "x\ny", "../..", "日本", "🙂", '"', "'", [],
    [1, 2], ["a"], {}, {"a": 1}, "nan", "7B", "2GiB", "90m", "fp32", "adamw", "a" * 3000,
]
#: Valid values by option (or by kind), so that many cases get as far as the planner.
VALID: dict[str, list[str]] = {
    "provider": ["local", "sagemaker", "vertex"], "strategy": list(STRATEGIES),
    "precision": list(PRECISIONS), "optimizer": list(OPTIMIZERS),
    "machine": ["ml.g5.xlarge", "ml.p4d.24xlarge", "a2-highgpu-1g", "local-cpu"],
    "region": ["us-east-1", "us-central1"], "bucket": ["my-bucket"], "project": ["p-1"],
    "service_account": ["sa@p-1.iam.gserviceaccount.com"],
    "role": ["arn:aws:iam::123456789012:role/R"], "image": ["img:1"], "timeout": ["90m", "2d"],
    "int": ["1", "2", "4", "8", "16", "64"], "float": ["0.001", "1", "100", "1e-4"],
    "count": ["1M", "125M", "7B"], "size": ["2GiB", "512MiB", "64GB"],
}
PROVIDERS = {
    "sagemaker": ["--provider", "sagemaker", "--region", "us-east-1", "--bucket", "my-bucket",
                  "--role", "arn:aws:iam::123456789012:role/R"],
    "vertex": ["--provider", "vertex", "--region", "us-central1", "--project", "p-1",
               "--bucket", "my-bucket"],
    "local": ["--provider", "local"],
}
ENVIRON = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent",
           "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "LAUNCH_NO_TRACE": "1"}


def plan_options() -> list[click.Option]:
    """The options of `launch plan` that a case may set (not --report: it writes a file where
    its value says; not --json and --debug: every case is --json)."""
    return [p for p in launch_group.commands["plan"].params if isinstance(p, click.Option)
            and p.name not in ("report_path", "as_json", "debug")]


def toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(
            value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


class Case:
    def __init__(self, rng: random.Random, number: int):
        self.number = number
        self.provider = rng.choices(list(PROVIDERS), weights=(5, 2, 3))[0]
        self.recipe = rng.random() < 0.3
        self.flags: list[str] = []
        self.config: dict[str, Any] = {}
        self.config_file = rng.choice(("launch.toml", "pyproject.toml"))
        self.launch: dict[str, Any] = {}
        self.env: dict[str, str] = {}
        for _ in range(rng.randint(1, 3)):
            getattr(self, "_" + rng.choice(("flag", "flag", "config", "launch", "env")))(rng)

    def _text(self, rng: random.Random, option: click.Option, kind: str) -> str:
        valid = VALID.get(option.name or "") or VALID.get(kind)
        if kind == "path":
            valid = ["config.json"]
        return rng.choice(valid) if valid and rng.random() < 0.5 else rng.choice(HOSTILE_TEXT)

    def _flag(self, rng: random.Random) -> None:
        option = rng.choice(plan_options())
        kind = _kind(option)
        if kind == "bool":
            self.flags.append(rng.choice(option.opts + option.secondary_opts))
        else:
            self.flags += [option.opts[0], self._text(rng, option, kind)]

    def _config(self, rng: random.Random) -> None:
        keys = sorted(set(config_keys()) - {"report"})
        if rng.random() < 0.1:
            key = rng.choice(["global-bach-size", "stpes", "日本", "lr ", "tool", "s3prefix"])
        else:
            key = rng.choice(keys)
            key = key.replace("_", "-") if rng.random() < 0.5 else key
        if rng.random() < 0.3:
            kind = config_keys().get(key.replace("-", "_"))
            valid = VALID.get(key.replace("-", "_")) or VALID.get(kind.kind if kind else "")
            if valid:
                value: Any = rng.choice(valid)
                if kind is not None and kind.kind == "int":
                    value = int(value)
                elif kind is not None and kind.kind == "float":
                    value = float(value)
                self.config[key] = value
                return
        self.config[key] = rng.choice(HOSTILE_VALUES)

    def _launch(self, rng: random.Random) -> None:
        self.recipe = True
        key = rng.choice([*LAUNCH_KEYS, "stpes", "", "lr "] if rng.random() < 0.1
                         else list(LAUNCH_KEYS))
        self.launch[key] = rng.choice(HOSTILE_VALUES)

    def _env(self, rng: random.Random) -> None:
        options = [p for p in plan_options() if p.envvar]
        option = rng.choice(options)
        text = self._text(rng, option, _kind(option))
        if "\x00" not in text:
            self.env[str(option.envvar)] = text

    def args(self, folder: Path) -> list[str]:
        script = folder / ("recipe.py" if self.recipe else "train.py")
        size = [] if self.recipe else ["--params", "1M"]
        return ["plan", str(script), "--json", *PROVIDERS[self.provider], *size, *self.flags]

    def config_text(self) -> str:
        body = "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in self.config.items())
        return "[tool.launch]\n" + body if self.config_file == "pyproject.toml" else body

    def __repr__(self) -> str:
        return (f"case {self.number}: {self.provider} {'recipe' if self.recipe else 'plain'} "
                f"flags={self.flags!r} {self.config_file}={self.config!r} "
                f"LAUNCH={self.launch!r} env={self.env!r}")


def reject_constant(name: str) -> Any:
    raise ValueError(f"{name} in the JSON output")


def check(case: Case, result: Any) -> str | None:
    """What is wrong with this run, or None."""
    if result.status not in (0, 2, 3, 4):
        return f"exit {result.status}: {result.stderr.strip()[:300]}"
    if "Traceback" in result.stderr or "internal error" in result.stderr:
        return f"a traceback or an internal error: {result.stderr[:300]}"
    if result.status == 2:
        lines = result.stderr.split("\n")
        if len(lines) != 2 or lines[1] != "" or not lines[0].startswith("launch: error: "):
            return f"a usage error that is not one line: {result.stderr[:300]!r}"
        return None
    if result.stderr.strip():
        return f"exit {result.status} with something on stderr: {result.stderr[:300]!r}"
    try:
        data = json.loads(result.stdout, parse_constant=reject_constant)
    except ValueError as exc:
        return f"exit {result.status}, and its JSON does not parse: {exc}"
    if re.search(r"\$-?(nan|inf)", result.stdout, re.IGNORECASE):
        return f"exit {result.status} for a budget that is not a number"
    if result.status == 4 and "budget" not in json.dumps(data):
        return "over budget (exit 4) with no budget in the plan"
    if result.status == 3 and data.get("chosen") is not None:
        return "no plan fits (exit 3), yet one was chosen"
    return None


@pytest.fixture
def probe_in_process(monkeypatch):
    """Answer the probe child in process: this machine's hardware (a CPU host), and for a recipe
    its LAUNCH dict through JSON (as the child's answer travels) and a small model's size."""
    launch: dict[str, Any] = {}

    def fake_child(args: list[str], **_kwargs: Any) -> dict[str, Any]:
        answer: dict[str, Any] = {"hardware": {"cpus": 4, "host_memory_bytes": 16 * 2**30}}
        if "--script" in args:
            answer.update(launch=json.loads(json.dumps(launch)), parameters=10_000,
                          trainable_parameters=10_000, parameter_bytes=40_000, buffer_bytes=0,
                          wrap_modules=["Block"], unit_parameters=272,
                          flops_per_sample=1e5)
        return answer

    monkeypatch.setattr(recipe_module, "_run_child", fake_child)
    return launch


def test_hostile_values_never_become_internal_errors(cli, write_script, tmp_path, monkeypatch,
                                                      probe_in_process):
    from tests.conftest import TINY_RECIPE

    write_script("print('training')\n", "train.py")
    write_script(TINY_RECIPE, "recipe.py")
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    for variable in {str(p.envvar) for p in plan_options() if p.envvar}:
        monkeypatch.delenv(variable, raising=False)
    rng = random.Random(SEED)
    problems: list[str] = []
    statuses: dict[int, int] = {}
    for number in range(CASES):
        case = Case(rng, number)
        for name in ("launch.toml", "pyproject.toml"):
            (tmp_path / name).unlink(missing_ok=True)
        if case.config:
            (tmp_path / case.config_file).write_text(case.config_text(), encoding="utf-8")
        probe_in_process.clear()
        probe_in_process.update(case.launch)
        with monkeypatch.context() as env:
            for variable, value in case.env.items():
                env.setenv(variable, value)  # click reads its envvars from os.environ
            result = cli(*case.args(tmp_path / "code"), environ={**ENVIRON, **case.env})
        statuses[result.status] = statuses.get(result.status, 0) + 1
        problem = check(case, result)
        if problem:
            problems.append(f"{case!r}\n    -> {problem}")
    assert not problems, f"{len(problems)} of {CASES} cases:\n" + "\n".join(problems[:15])
    # The cases reach the planner as well as the checks (a fuzz that only ever failed would
    # prove little).
    assert statuses.get(0, 0) > CASES // 10 and statuses.get(2, 0) > CASES // 4, statuses
