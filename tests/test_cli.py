"""The CLI in-process: exit codes, one-line errors, JSON output, and a cheap `--help`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launcher.status import ExitStatus


def test_help_does_not_import_torch_or_cloud_sdks():
    # (An installed google-cloud package's namespace .pth creates an empty `google.cloud` at
    # interpreter start; that costs nothing, so the check names the SDK modules themselves.)
    code = (
        "import sys, io, contextlib\n"
        "from launcher.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['--help']) == 0\n"
        "heavy = [m for m in ('torch', 'boto3', 'botocore', 'sagemaker', 'grpc',"
        " 'google.cloud.aiplatform', 'google.cloud.storage', 'google.cloud.logging',"
        " 'google.api_core', 'rich', 'jinja2') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_version(capsys, cli):
    assert cli("--version").status == 0
    assert "launch, version" in capsys.readouterr().out


def test_missing_script_is_one_line_usage_error(cli):
    result = cli("plan", "nope.py")
    assert result.status == ExitStatus.USAGE
    assert result.stderr.count("\n") == 1
    assert "script not found" in result.stderr and "Traceback" not in result.stderr


def test_syntax_error_names_file_and_line(cli, write_script):
    script = write_script("import torch\n\ndef build_model(:\n    pass\n")
    result = cli("plan", str(script))
    assert result.status == ExitStatus.USAGE
    assert "train.py:3: syntax error" in result.stderr


def test_hook_that_raises_names_hook_and_line(cli, write_script):
    script = write_script("""
        import torch
        def build_model():
            raise ValueError("no weights here")
        def example_batch(b):
            return torch.zeros(b)
        def training_step(model, batch):
            return batch.sum()
        """)
    result = cli("plan", str(script))
    assert result.status == ExitStatus.USAGE
    assert "build_model() raised ValueError: no weights here (train.py:4)" in result.stderr
    assert "Traceback" not in result.stderr


def test_half_a_recipe_is_refused(cli, write_script):
    script = write_script("def build_model():\n    pass\n")
    result = cli("plan", str(script))
    assert result.status == ExitStatus.USAGE
    assert "not example_batch, training_step" in result.stderr


def test_plain_script_needs_a_size(cli, write_script):
    script = write_script("print('hello')\n")
    result = cli("plan", str(script))
    assert result.status == ExitStatus.USAGE
    assert "--params" in result.stderr


def test_unknown_provider(cli, tiny_recipe):
    result = cli("plan", str(tiny_recipe), "--provider", "azure")
    assert result.status == ExitStatus.USAGE
    assert "unknown provider 'azure'" in result.stderr


def test_cloud_provider_without_its_settings_is_one_line(cli, tiny_recipe):
    environ = {"GOOGLE_CLOUD_PROJECT": "", "CLOUDSDK_AI_REGION": "", "LAUNCH_REGION": ""}
    result = cli("--provider", "vertex", str(tiny_recipe), environ=environ)
    assert result.status == ExitStatus.USAGE
    assert result.stderr.count("\n") == 1 and "--region" in result.stderr


def test_plan_shows_the_exact_sagemaker_request(cli, tiny_recipe):
    result = cli("plan", str(tiny_recipe), "--provider", "sagemaker", "--json",
                 "--machine", "ml.g5.xlarge", "--region", "us-east-1", "--bucket", "my-bucket",
                 "--role", "arn:aws:iam::123456789012:role/R",
                 environ={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                          "AWS_EC2_METADATA_DISABLED": "true"})
    assert result.status == 0, result.stderr
    request = result.json()["request"]["create_training_job"]
    assert request["ResourceConfig"]["InstanceType"] == "ml.g5.xlarge"
    assert request["RoleArn"] == "arn:aws:iam::123456789012:role/R"
    assert "testing" not in result.stdout  # no credentials in the request


def test_global_batch_not_a_multiple_says_what_to_use(cli, tiny_recipe):
    result = cli("plan", str(tiny_recipe), "--global-batch-size", "10",
                 "--micro-batch-size", "4")
    assert result.status == ExitStatus.USAGE
    assert "use --global-batch-size 8 or 12" in result.stderr


def test_bad_size_flag(cli, tiny_recipe):
    result = cli("plan", str(tiny_recipe), "--memory-limit", "lots")
    assert result.status == ExitStatus.USAGE
    assert "not a size" in result.stderr


def test_plan_json_contract(cli, tiny_recipe):
    result = cli("plan", str(tiny_recipe), "--json", "--micro-batch-size", "2",
                 environ={"LAUNCH_NO_TRACE": "1"})
    assert result.status == 0, result.stderr
    data = result.json()
    assert set(data) >= {"model", "plans", "chosen", "rejected", "request"}
    # Two Blocks of 16x16+16 and a 16->1 head.
    assert data["model"] == {"parameters": 2 * (16 * 16 + 16) + 17, "source": "traced"}
    chosen = data["chosen"]
    for key in ("strategy", "machine", "nodes", "gpus_per_node", "micro_batch_size",
                "grad_accum_steps", "global_batch_size", "precision", "optimizer",
                "activation_checkpointing", "fits", "cost_per_hour_usd", "step_time_s",
                "total_cost_usd", "memory"):
        assert key in chosen
    assert (chosen["micro_batch_size"], chosen["grad_accum_steps"]) == (2, 2)
    assert chosen["global_batch_size"] == 4  # from LAUNCH
    # issue 25 added rank_traced (one rank traced at its world size), usable and headroom
    assert set(chosen["memory"]) == {"parameters", "gradients", "optimizer", "activations",
                                     "temporary", "framework_overhead", "peak_allocated",
                                     "peak_reserved", "total", "capacity", "rank_traced",
                                     "usable", "headroom"}
    params = data["model"]["parameters"]
    assert chosen["memory"]["parameters"] == 4 * params
    assert chosen["memory"]["optimizer"] == 8 * params
    assert chosen["memory"]["activations"] is None  # not known: never a guess


def test_plan_traces_the_recipe(cli, tiny_recipe):
    data = cli("plan", str(tiny_recipe), "--json", "--micro-batch-size", "2",
               environ={"LAUNCH_NO_TRACE": "0"}).json()
    memory = data["chosen"]["memory"]
    params = data["model"]["parameters"]
    assert memory["parameters"] == 4 * params
    # Two fp32 moments per parameter, and AdamW's fp32 step counter per parameter tensor (6).
    assert memory["optimizer"] == 8 * params + 6 * 4
    assert memory["activations"] > 0
    assert memory["peak_allocated"] >= 16 * params  # states and more
    assert data["chosen"]["fits"] is True  # tiny, on this machine's RAM


def test_config_file_and_flags_precedence(cli, tiny_recipe, tmp_path):
    (tmp_path / "launch.toml").write_text('global-batch-size = 8\nsteps = 7\n')
    data = cli("plan", str(tiny_recipe), "--json").json()
    assert data["chosen"]["global_batch_size"] == 8 and data["chosen"]["steps"] == 7
    data = cli("plan", str(tiny_recipe), "--json", "--steps", "9").json()
    assert data["chosen"]["steps"] == 9


def test_model_states_over_capacity_exits_3(cli, tiny_recipe):
    result = cli("plan", str(tiny_recipe), "--json", "--memory-limit", "1KiB")
    assert result.status == ExitStatus.NO_PLAN_FITS
    data = result.json()
    assert data["chosen"] is None
    assert "no micro-batch changes that" in data["rejected"][0]["reason"]


def test_json_error_object(cli):
    result = cli("plan", "missing.py", "--json")
    assert result.status == ExitStatus.USAGE
    assert json.loads(result.stdout)["exit_status"] == 2


def test_unwritable_state_folder(cli, tiny_recipe, tmp_path):
    # A path under a regular file cannot be created, even by root (permission bits would not do).
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    result = cli(str(tiny_recipe), environ={"LAUNCH_STATE_DIR": str(blocker / "state")})
    assert result.status == ExitStatus.USAGE
    assert "cannot write the state folder" in result.stderr
    assert result.stderr.count("\n") == 1


def test_unknown_run_id(cli):
    result = cli("status", "nope")
    assert result.status == ExitStatus.USAGE
    assert "no runs" in result.stderr


def test_machines_lists_the_catalog(cli):
    result = cli("machines", "--provider", "sagemaker", "--gpu", "A100-80GB", "--json")
    assert result.status == 0, result.stderr
    names = [m["name"] for m in result.json()["machines"]]
    assert "ml.p4de.24xlarge" in names and "ml.p4d.24xlarge" not in names
    text = cli("machines", "--provider", "vertex").stdout
    assert "a2-ultragpu-8g" in text and "8 x A100-80GB" in text


def test_machines_unknown_gpu_suggests(cli):
    result = cli("machines", "--provider", "sagemaker", "--gpu", "A200")
    assert result.status == ExitStatus.USAGE
    assert "did you mean" in result.stderr


def test_recipe_probe_counts_units_and_flops(tiny_recipe):
    from launcher.recipe import inspect_script

    info = inspect_script(tiny_recipe)
    assert info.unit_parameters == 16 * 16 + 16  # one Block
    # Forward + backward of one sample: three linear layers, 2 x (2 x in x out) each (matmul
    # flops for the input and weight gradients); the head has no input gradient to compute.
    assert info.flops_per_sample is not None and info.flops_per_sample > 2 * 2 * 16 * 16


# -- regions: checked before they can become part of a host name ----------------------------------

HOSTILE_REGIONS = ["evil.example.com:443#", "us-central1.evil.example.com", "evil.example.com/",
                   "us-central1@evil.example.com", "US-CENTRAL1", "us-central1\nx", "../x"]


def _one_usage_line(result, bad: str, cloud: str) -> None:
    assert result.status == ExitStatus.USAGE == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("launch: error: ")
    assert "Traceback" not in result.stderr
    words = "is not an AWS region" if cloud == "aws" else "is not a Google Cloud region"
    assert repr(bad) in result.stderr and words in result.stderr
    assert "like us-" in result.stderr  # the expected shape
    assert json.loads(result.stdout)["exit_status"] == 2


def _region_env(monkeypatch, variable: str | None = None, value: str = "") -> dict[str, str]:
    """No region anywhere but ``variable``; set in os.environ too, where click reads
    LAUNCH_REGION for --region."""
    environ = {"LAUNCH_REGION": "", "CLOUDSDK_AI_REGION": "", "AWS_REGION": "",
               "AWS_DEFAULT_REGION": "", "LAUNCH_PROJECT": "launch-test"}
    if variable:
        environ[variable] = value
    for key, item in environ.items():
        if item:
            monkeypatch.setenv(key, item)
        else:
            monkeypatch.delenv(key, raising=False)
    return environ


@pytest.mark.parametrize("bad", HOSTILE_REGIONS)
def test_a_hostile_vertex_region_is_refused_in_one_line(cli, tiny_recipe, monkeypatch, bad):
    result = cli("plan", str(tiny_recipe), "--provider", "vertex", "--region", bad, "--json",
                 environ=_region_env(monkeypatch))
    _one_usage_line(result, bad, "gcp")


@pytest.mark.parametrize("variable", ["LAUNCH_REGION", "CLOUDSDK_AI_REGION"])
def test_a_vertex_region_from_the_environment_is_checked_too(cli, tiny_recipe, monkeypatch,
                                                            variable):
    bad = "evil.example.com:443#"
    result = cli("plan", str(tiny_recipe), "--provider", "vertex", "--json",
                 environ=_region_env(monkeypatch, variable, bad))
    _one_usage_line(result, bad, "gcp")


@pytest.mark.parametrize(("flag", "variable"), [
    ("evil.example.com:443#", None), ("us-east-1.evil.example.com", None),
    (None, "LAUNCH_REGION"), (None, "AWS_REGION"), (None, "AWS_DEFAULT_REGION")])
def test_a_hostile_aws_region_is_refused_in_one_line(cli, tiny_recipe, monkeypatch, flag,
                                                     variable):
    bad = flag or "evil.example.com:443#"
    environ = _region_env(monkeypatch, variable, bad)
    args = ["--region", flag] if flag else []
    result = cli("plan", str(tiny_recipe), "--provider", "sagemaker", *args, "--json",
                 environ=environ)
    _one_usage_line(result, bad, "aws")


def test_plan_sizes_a_described_model_without_a_script(cli, tmp_path):
    result = cli("plan", "--params", "7B", "--provider", "vertex", "--region", "us-central1",
                 "--json")
    assert result.status == 0, result.stderr
    data = result.json()
    assert data["chosen"] is not None and data["request"] is None
    assert any("no script to render" in note for note in data["notes"])
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, '
                      '"num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 32000}')
    described = cli("plan", "--model-config", str(config), "--provider", "sagemaker", "--json")
    assert described.status == 0, described.stderr
    assert described.json()["model"]["parameters"] > 0
    nothing = cli("plan")
    assert nothing.status == ExitStatus.USAGE
    assert nothing.stderr.count("\n") == 1 and "--params" in nothing.stderr
    assert cli("run", "--params", "7B").status == ExitStatus.USAGE  # a run needs its script


# -- the script's own arguments: `launch [plan] SCRIPT -- ARGS` (issue 28) -------------------------

#: A plain script on SageMaker plans without a probe child or a trace: fast.
SAGEMAKER_PLAIN = ["--params", "1M", "--provider", "sagemaker", "--region", "us-east-1",
                   "--bucket", "my-bucket", "--role", "arn:aws:iam::123456789012:role/R",
                   "--machine", "ml.g5.xlarge"]
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.mark.parametrize("command", [("plan",), ()])
def test_a_script_option_without_dashdash_says_to_put_it_after_dashdash(cli, write_script,
                                                                         command):
    script = write_script("print('hi')\n", name="run_clm.py")
    result = cli(*command, str(script), "--params", "1M", "--train_file", "data.txt")
    assert result.status == ExitStatus.USAGE
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    prog = "launch plan" if command else "launch"
    assert "No such option '--train_file'" in result.stderr
    assert (f"put the script's arguments after --: {prog} {script} --params 1M -- "
            "--train_file data.txt)") in result.stderr
    extra = cli(*command, str(script), "--json", "data.txt")
    assert extra.status == ExitStatus.USAGE and extra.stderr.count("\n") == 1
    assert f"after --: {prog} {script} --json -- data.txt" in json.loads(extra.stdout)["hint"]


def test_everything_after_dashdash_is_the_script_s_and_the_plan_shows_it(cli, write_script):
    script = write_script("print('hi')\n")
    args = ["--help", "--json", "--debug", "data with spaces.txt", "-x"]
    result = cli("plan", str(script), *SAGEMAKER_PLAIN, "--json", "--", *args, environ=AWS_ENV)
    assert result.status == 0, result.stderr
    assert result.json()["script_args"] == args  # not launch's --help, --json, --debug
    text = cli("plan", str(script), *SAGEMAKER_PLAIN, "--", "--lr=3e-4", "it's",
               environ=AWS_ENV)
    assert text.status == 0, text.stderr
    assert "script arguments: --lr=3e-4 'it'\"'\"'s'" in text.stdout
    assert "script_args" in cli("plan", str(script), *SAGEMAKER_PLAIN, "--json",
                                environ=AWS_ENV).json()


def test_a_recipe_takes_no_arguments(cli, tiny_recipe):
    result = cli("plan", str(tiny_recipe), "--", "--lr", "3")
    assert result.status == ExitStatus.USAGE and result.stderr.count("\n") == 1
    assert "train.py is a recipe, which takes no arguments (the script's arguments after --)" \
        in result.stderr
    assert "give its settings through LAUNCH" in result.stderr
    assert cli("plan", str(tiny_recipe), "--json", "--").status == 0  # none: nothing to refuse
    nothing = cli("plan", "--params", "7B", "--", "--x")
    assert nothing.status == ExitStatus.USAGE and "none is given" in nothing.stderr


def test_a_cloud_plan_without_a_request_is_no_gate_in_ci(cli, tiny_recipe):
    """Issue 29: with the region unset, `launch plan --provider sagemaker --json` planned,
    built no request and exited 0, so a CI gate passed having checked nothing. Where CI is set
    (or with --strict) it exits 2 with the plan and the reason in one JSON object."""
    args = ("plan", str(tiny_recipe), "--provider", "sagemaker", "--json",
            "--role", "arn:aws:iam::123456789012:role/launch", "--bucket", "launch-bucket")
    environ = {"LAUNCH_REGION": "", "AWS_REGION": "", "AWS_DEFAULT_REGION": "",
               "AWS_CONFIG_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"}
    gate = cli(*args, environ={**environ, "CI": "true"})
    assert gate.status == ExitStatus.USAGE, gate.stderr
    data = gate.json()
    assert data["request"] is None and data["chosen"] is not None
    assert "no sagemaker request to check" in data["error"]["message"]
    assert gate.stderr.startswith("launch: error: the plan has no sagemaker request")
    assert len(gate.stderr.strip().splitlines()) == 1
    assert cli(*args, "--strict", environ=environ).status == ExitStatus.USAGE
    # a person planning at a terminal, or CI asking for it, plans without the request
    for relaxed in (cli(*args, environ=environ),
                    cli(*args, "--no-strict", environ={**environ, "CI": "true"})):
        assert relaxed.status == ExitStatus.SUCCESS, relaxed.stderr
        assert relaxed.json()["request"] is None and "error" not in relaxed.json()
    # with the region the request is built, and the strict gate passes
    full = cli(*args, "--region", "us-east-1", environ={**environ, "CI": "true",
                                                       "AWS_ACCESS_KEY_ID": "testing",
                                                       "AWS_SECRET_ACCESS_KEY": "testing"})
    assert full.status == ExitStatus.SUCCESS, full.stderr
    assert full.json()["request"]["api"] == "sagemaker:CreateTrainingJob"


def test_a_providers_own_flag_for_another_provider_is_one_usage_line(cli, tmp_path):
    """``--role`` is SageMaker's setting (its settings class declares the flag): given on the
    command line with Vertex, the local provider or `launch doctor --provider vertex` it is
    refused with what the provider does take, not dropped; from the environment or a config
    file, which may serve every cloud, it is let be."""
    role = "arn:aws:iam::123456789012:role/X"
    refused = cli("plan", "--params", "1B", "--provider", "vertex", "--role", role)
    assert refused.status == ExitStatus.USAGE, refused.stderr
    assert refused.stderr.count("\n") == 1 and "--role is a SageMaker setting" in refused.stderr
    assert "vertex takes --project or --service-account" in refused.stderr
    local = cli("plan", "--params", "1B", "--project", "my-project-1")
    assert local.status == ExitStatus.USAGE and "--project is a Vertex AI setting" in local.stderr
    assert "--provider vertex" in local.stderr
    doctor = cli("doctor", "--provider", "vertex", "--role", role)
    assert doctor.status == ExitStatus.USAGE and "--role is a SageMaker" in doctor.stderr
    from_env = cli("plan", "--params", "1B", environ={"LAUNCH_ROLE": role})
    assert from_env.status == ExitStatus.SUCCESS, from_env.stderr
    (tmp_path / "launch.toml").write_text(f'role = "{role}"\nproject = "my-project-1"\n')
    from_config = cli("plan", "--params", "1B")
    assert from_config.status == ExitStatus.SUCCESS, from_config.stderr
    own = cli("plan", "--params", "1B", "--provider", "sagemaker", "--role", role,
              "--region", "us-east-1")
    assert own.status == ExitStatus.SUCCESS, own.stderr
