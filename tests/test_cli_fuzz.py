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
import os
import random
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from launcher import recipe as recipe_module
from launcher.cli import _kind
from launcher.cli import cli as launch_group
from launcher.options import config_keys
from launcher.plan.plan import OPTIMIZERS, PRECISIONS
from launcher.spec import LAUNCH_KEYS
from launcher.strategies import NAMES as STRATEGIES

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
    "region": ["us-east-1", "us-central1"], "bucket": ["my-bucket"],
    "project": ["my-project-1"], "service_account": ["sa@my-project-1.iam.gserviceaccount.com"],
    "role": ["arn:aws:iam::123456789012:role/R"], "image": ["img:1"], "timeout": ["90m", "2d"],
    "int": ["1", "2", "4", "8", "16", "64"], "float": ["0.001", "1", "100", "1e-4"],
    "count": ["1M", "125M", "7B"], "size": ["2GiB", "512MiB", "64GB"],
}
PROVIDERS = {
    "sagemaker": ["--provider", "sagemaker", "--region", "us-east-1", "--bucket", "my-bucket",
                  "--role", "arn:aws:iam::123456789012:role/R"],
    "vertex": ["--provider", "vertex", "--region", "us-central1", "--project", "my-project-1",
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


# -- issue 30: the ways in that read without bound, nest without bound or name the wrong thing --


def usage_line(result: Any, *words: str) -> str:
    """The one stderr line of a usage error (exit 2), holding each of ``words``."""
    assert result.status == 2, (result.status, result.stderr)
    lines = result.stderr.split("\n")
    assert len(lines) == 2 and lines[1] == "" and lines[0].startswith("launch: error: "), (
        result.stderr)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)
    return result.stderr.strip()


def plain_plan(cli: Any, write_script: Any, *flags: str, provider: str = "sagemaker",
               environ: dict[str, str] | None = None) -> Any:
    """`launch plan train.py --json` of a plain script for a cloud: no child process."""
    script = write_script("print('training')\n", "train.py")
    size = [] if "--model-config" in flags else ["--params", "1M"]
    return cli("plan", str(script), "--json", *PROVIDERS[provider], *size, *flags,
               environ={**ENVIRON, **(environ or {})})


SECONDS_VARIABLES = ("LAUNCH_PROBE_TIMEOUT", "LAUNCH_TRACE_TIMEOUT", "LAUNCH_RANK_TRACE_BUDGET",
                     "LAUNCH_CAPTURE_TIMEOUT")


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "-5", "0", "1e400", "-inf", "1e300",
                                   "a\nb", "9" * 500])
@pytest.mark.parametrize("variable", SECONDS_VARIABLES)
def test_a_bad_number_of_seconds_names_its_variable(cli, write_script, variable, value):
    line = usage_line(plain_plan(cli, write_script, environ={variable: value}), variable)
    assert "seconds" in line or "30 days" in line
    assert "set it to e.g. 600, or unset it" in line


@pytest.mark.parametrize("variable", SECONDS_VARIABLES)
def test_good_numbers_of_seconds_plan(cli, write_script, variable):
    for value in ("600", "0.5", " 90 ", ""):
        result = plain_plan(cli, write_script, environ={variable: value})
        assert result.status == 0, (value, result.stderr)


@pytest.mark.parametrize("value", ["yes", "true", "ON", "1", " on "])
def test_launch_no_trace_takes_the_usual_spellings_of_on(cli, write_script, tmp_path, value):
    # An architecture only a trace can size is refused, with tracing off, in one line that
    # says so: "yes" must turn tracing off as "1" does (not be read as "trace").
    config = tmp_path / "opt.json"
    config.write_text(json.dumps({"model_type": "opt", "hidden_size": 64, "ffn_dim": 128,
                                  "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "vocab_size": 256, "max_position_embeddings": 128}))
    result = plain_plan(cli, write_script, "--model-config", str(config),
                        environ={"LAUNCH_NO_TRACE": value})
    usage_line(result, 'model_type "opt"', "unset LAUNCH_NO_TRACE")


@pytest.mark.parametrize("value", ["maybe", "2", "y", "enabled", "1 1", "ja\n"])
def test_launch_no_trace_refuses_other_values(cli, write_script, value):
    line = usage_line(plain_plan(cli, write_script, environ={"LAUNCH_NO_TRACE": value}),
                      "LAUNCH_NO_TRACE", "neither on nor off")
    assert "1, true, yes or on" in line


@pytest.mark.parametrize(("value", "status"), [("full", 0), ("FULL", 0), ("", 0), ("junk", 2),
                                                ("shallow", 2), ("full\n2", 2)])
def test_launch_trace_depth_takes_its_documented_value_only(cli, write_script, value, status):
    result = plain_plan(cli, write_script, environ={"LAUNCH_TRACE_DEPTH": value})
    if status == 2:
        usage_line(result, "LAUNCH_TRACE_DEPTH", "is not full", "LAUNCH_TRACE_DEPTH=full")
    else:
        assert result.status == 0, result.stderr


DEEP = 5000


@pytest.mark.parametrize(("name", "text"), [
    ("launch.toml", "a = " + "[" * DEEP + "]" * DEEP + "\n"),
    ("launch.toml", "a = " + "{b = " * DEEP + "1" + "}" * DEEP + "\n"),
    ("launch.toml", "steps" + ".a" * DEEP + " = 1\n"),
    ("launch.toml", "[" + ".".join(["steps"] * DEEP) + "]\n"),
    ("pyproject.toml", "[tool.launch]\nsteps = " + "[" * DEEP + "]" * DEEP + "\n"),
    ("pyproject.toml", "[tool.launch]\nsteps = " + "{a = " * DEEP + "1" + "}" * DEEP + "\n"),
])
def test_a_config_file_nested_deep_is_one_line(cli, write_script, tmp_path, name, text):
    (tmp_path / name).write_text(text)
    usage_line(plain_plan(cli, write_script), f"{tmp_path / name}: nested deeper than")


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_config_file_that_is_no_regular_file_is_one_line(cli, write_script, tmp_path, kind):
    path = tmp_path / "launch.toml"
    if kind == "fifo":
        os.mkfifo(path)  # read as before, it would block for a writer that never comes
    else:
        path.symlink_to("/dev/zero")  # read as before, it would never end
    usage_line(plain_plan(cli, write_script), f"{path} is not a regular file")


def bounded_plan(runs: list[list[str]], cwd: Path, timeout: float = 60.0
                 ) -> tuple[str, list[tuple[int, int]]]:
    """``launch ARGS`` for each ARGS of ``runs``, one after the other in one child whose address
    space is capped at 1 GiB (an unbounded read fails fast instead of taking the machine) and
    whose time is bounded (a read that blocks cannot hang the test): the child's stderr and,
    for each run, its exit status and the child's peak RSS (KiB) after it."""
    code = (
        "import json, resource, sys\n"
        "from launcher.cli import main\n"
        "peaks = []\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    status = main(args)\n"
        "    peaks.append([status, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss])\n"
        "sys.stderr.write('PEAKS ' + json.dumps(peaks) + '\\n')\n"
    )

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    environ = {**os.environ, **ENVIRON, "LAUNCH_STATE_DIR": str(cwd / "state"),
               "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(runs)], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=cap)
    stderr, _, peaks = done.stderr.rpartition("PEAKS ")
    assert done.returncode == 0 and peaks, (done.returncode, done.stderr[-2000:])
    return stderr, [(status, peak) for status, peak in json.loads(peaks)]


def model_config_args(tmp_path: Path, config: Path) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    return ["plan", str(script), "--json", *PROVIDERS["sagemaker"], "--model-config",
            str(config)]


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_model_config_of_no_regular_file_is_refused_at_once(tmp_path, kind):
    config = tmp_path / "config.json"
    if kind == "fifo":
        os.mkfifo(config)
    else:
        config = Path("/dev/zero")
    stderr, [(status, _peak)] = bounded_plan([model_config_args(tmp_path, config)], tmp_path,
                                             timeout=30)
    assert status == 2 and stderr == (f"launch: error: model config {config} is not a regular "
                                      "file (give a Hugging Face config.json file)\n"), stderr


def test_a_huge_model_config_is_refused_and_read_bounded(tmp_path):
    small = tmp_path / "small.json"
    small.write_text(json.dumps(TINY_CONFIG))
    huge = tmp_path / "config.json"
    pad = "x" * (20 << 20)  # 20 MiB: valid JSON, a valid config, yet beyond any real one
    huge.write_text(json.dumps({**TINY_CONFIG, "pad": pad}))
    stderr, [(small_status, small_peak), (status, peak)] = bounded_plan(
        [model_config_args(tmp_path, small), model_config_args(tmp_path, huge)], tmp_path)
    assert small_status == 0 and status == 2, stderr[-2000:]
    assert stderr == (f"launch: error: model config {huge} is larger than 16 MiB (give a "
                      "Hugging Face config.json file)\n"), stderr[-2000:]
    # At most the cap (16 MiB and a byte) is read; the old read took the file, its text and
    # its parse (three times its size at least).
    assert peak - small_peak < 24 << 10, (small_peak, peak)


@pytest.mark.parametrize(("variable", "value", "flag"), [
    ("LAUNCH_BUDGET", "abc", "--budget"), ("LAUNCH_MAX_ATTEMPTS", "many", "--max-attempts"),
    ("LAUNCH_SPOT", "maybe", "--spot"),
])
def test_a_value_from_the_environment_names_its_variable(cli, write_script, monkeypatch,
                                                         variable, value, flag):
    monkeypatch.setenv(variable, value)  # click reads its envvars from os.environ
    line = usage_line(plain_plan(cli, write_script, environ={variable: value}), variable)
    assert f"'{flag}' ({variable})" in line


def test_the_same_value_as_a_flag_names_the_flag_only(cli, write_script, monkeypatch):
    monkeypatch.delenv("LAUNCH_BUDGET", raising=False)
    line = usage_line(plain_plan(cli, write_script, "--budget", "abc"), "'--budget'")
    assert "LAUNCH_BUDGET" not in line


@pytest.mark.parametrize(("provider", "flag", "value", "words"), [
    ("sagemaker", "--bucket", "Bad_Bucket", "is not an S3 bucket name"),
    ("sagemaker", "--bucket", "ab", "is not an S3 bucket name"),
    ("sagemaker", "--bucket", "192.168.0.1", "is not an S3 bucket name"),
    ("sagemaker", "--bucket", "xn--bucket", "is not an S3 bucket name"),
    ("sagemaker", "--bucket", "s3://bucket/../x", "is not an S3 bucket name"),
    ("sagemaker", "--role", "notarole", "is not an IAM role ARN"),
    ("sagemaker", "--role", "arn:aws:iam::1:role/../x", "is not an IAM role ARN"),
    ("vertex", "--bucket", "Bad Bucket", "is not a Cloud Storage bucket name"),
    ("vertex", "--bucket", "google-bucket", "is not a Cloud Storage bucket name"),
    ("vertex", "--bucket", "a" * 64, "is not a Cloud Storage bucket name"),
    ("vertex", "--service-account", "not-an-email", "is not an email address"),
    ("vertex", "--service-account", "x@y", "is not an email address"),
    ("vertex", "--service-account", "a@b.com/../c", "is not an email address"),
    ("vertex", "--project", "p/../../x", "is not a Google Cloud project id"),
    ("vertex", "--project", "p-1", "is not a Google Cloud project id"),
    ("vertex", "--project", "My-Project", "is not a Google Cloud project id"),
    ("vertex", "--project", "1project", "is not a Google Cloud project id"),
    ("vertex", "--project", "my-project-", "is not a Google Cloud project id"),
    ("vertex", "--project", "a" * 31, "is not a Google Cloud project id"),
])
def test_a_malformed_cloud_setting_stops_a_dry_run(cli, write_script, provider, flag, value,
                                                   words):
    # Not a note on a plan that goes on without the request: a malformed value is the user's to
    # fix, as a malformed region is (exit 2), whichever setting it is.
    usage_line(plain_plan(cli, write_script, flag, value, provider=provider), words)


def test_a_malformed_project_from_the_environment_is_named(cli, write_script, monkeypatch):
    monkeypatch.setenv("LAUNCH_PROJECT", "p/../x")
    flags = [f for f in PROVIDERS["vertex"] if f not in ("--project", "my-project-1")]
    script = write_script("print('training')\n", "train.py")
    result = cli("plan", str(script), "--json", *flags, "--params", "1M",
                 environ={**ENVIRON, "LAUNCH_PROJECT": "p/../x"})
    usage_line(result, "project 'p/../x'", "LAUNCH_PROJECT", "not a Google Cloud project id")


@pytest.mark.parametrize(("provider", "flag", "value"), [
    ("sagemaker", "--bucket", "s3://my.bucket-1/"), ("sagemaker", "--role",
                                                     "arn:aws:iam::123456789012:role/a/b/R"),
    ("vertex", "--bucket", "gs://my_bucket.example/runs"),
    ("vertex", "--service-account", "123456789-compute@developer.gserviceaccount.com"),
    ("vertex", "--project", "abcdef"), ("vertex", "--project", "a" * 30),
])
def test_well_formed_cloud_settings_still_plan(cli, write_script, provider, flag, value):
    result = plain_plan(cli, write_script, flag, value, provider=provider)
    assert result.status == 0, result.stderr
