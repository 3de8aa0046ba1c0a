"""The conventions every command keeps (issue 29 item 8): one name for one thing (--provider,
explain's too), a misspelt command named back, a GPU family where a GPU is asked for, and one
default provider that means the same thing everywhere."""

from __future__ import annotations

import pytest

from launcher.cli import cli as launch_group
from launcher.status import ExitStatus


def one_line(result) -> str:
    assert result.status == ExitStatus.USAGE, (result.status, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("launch: error: "), \
        result.stderr
    return result.stderr.strip()


@pytest.fixture
def killed_log(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("step 1 loss 2.0\nKilled\n")
    return path


def test_explain_takes_provider_as_every_command_does(cli, killed_log):
    cloud = cli("explain", str(killed_log), "--provider", "vertex", "--json")
    assert cloud.status == 0, cloud.stderr
    nowhere = cli("explain", str(killed_log), "--json").json()
    assert cloud.json()["failure"] == "host_oom" and cloud.json() != nowhere
    shown = {p.opts[0] for p in launch_group.commands["explain"].params
             if not getattr(p, "hidden", False)}
    assert "--provider" in shown and "--platform" not in shown


def test_explain_platform_is_a_hidden_deprecated_alias(cli, killed_log):
    old = cli("explain", str(killed_log), "--platform", "vertex", "--json")
    assert old.status == 0, old.stderr
    assert old.json() == cli("explain", str(killed_log), "--provider", "vertex", "--json").json()
    assert "deprecated" in old.stderr and "--provider" in old.stderr
    both = cli("explain", str(killed_log), "--platform", "vertex", "--provider", "local")
    assert "disagree" in one_line(both)


@pytest.mark.parametrize(("typed", "meant"), [("plna", "plan"), ("explian", "explain"),
                                              ("stauts", "status"), ("machine", "machines")])
def test_a_misspelt_command_is_named_back(cli, typed, meant):
    line = one_line(cli(typed, "train.py"))
    assert f"did you mean `{meant}`?" in line and "unexpected extra argument" not in line


def test_a_misspelt_command_is_named_back_in_json_too(cli):
    result = cli("plna", "train.py", "--json")
    assert result.status == ExitStatus.USAGE and "`plan`" in result.json()["error"]


@pytest.mark.parametrize("script", ["plna", "plna.py"])
def test_a_script_of_that_name_still_runs(cli, tmp_path, script):
    """A file, or a name ending in .py, is `run`'s script, as `launch SCRIPT` always is."""
    (tmp_path / script).write_text("print('training')\n")
    result = cli(script, "--provider", "sagemaker", "--params", "1M", "--json")
    assert "did you mean" not in result.stderr, result.stderr
    missing = cli("plna.py" if script == "plna" else "plna2.py", "--json")
    assert "did you mean" not in missing.stderr


@pytest.mark.parametrize("family", ["H100", "h100", "A100"])
def test_machines_takes_a_gpu_family(cli, family):
    result = cli("machines", "--provider", "vertex", "--gpu", family, "--json")
    assert result.status == 0, result.stderr
    gpus = {m["gpu"] for m in result.json()["machines"]}
    assert gpus and all(g.lower().startswith(family.lower()) for g in gpus)
    assert result.json()["gpus"] == sorted(gpus)
    if family == "A100":
        assert gpus == {"A100-40GB", "A100-80GB"}


def test_machines_gpu_family_is_no_loose_prefix(cli):
    a10 = cli("machines", "--provider", "sagemaker", "--gpu", "A10", "--json").json()
    assert {m["gpu"] for m in a10["machines"]} == {"A10G"}  # not the A100s
    assert "did you mean" in one_line(cli("machines", "--provider", "vertex", "--gpu", "H"))


def test_machines_without_provider_lists_every_cloud(cli):
    result = cli("machines", "--gpu", "H100", "--json")
    assert result.status == 0, result.stderr
    data = result.json()
    assert data["provider"] is None and data["providers"] == ["vertex", "sagemaker"]
    assert {m["provider"] for m in data["machines"]} == {"vertex", "sagemaker"}
    text = cli("machines", "--gpu", "H100").stdout
    assert "vertex (" in text and "sagemaker (" in text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 100
    local = cli("machines", "--json", environ={"LAUNCH_PROVIDER": "local"})  # the default
    assert local.status == 0 and local.json()["providers"] == ["vertex", "sagemaker"]
    assert "--provider vertex" in one_line(cli("machines", "--provider", "local"))
    one = cli("machines", "--provider", "sagemaker", "--json").json()
    assert one["provider"] == "sagemaker" and one["providers"] == ["sagemaker"]


def test_every_machine_is_one_whole_line_at_100_columns(cli):
    """Issue 29: at 100 columns every row of `machines` wrapped ("1000 / Gbps") and the
    columns were cut ("netwo...", "2026-0..."): now one line a machine, nothing cut."""
    for provider in ("vertex", "sagemaker"):
        result = cli("machines", "--provider", provider, environ={"COLUMNS": "100"})
        assert result.status == 0, result.stderr
        lines = result.stdout.splitlines()
        assert max(len(line) for line in lines) <= 100
        assert not any("…" in line for line in lines), result.stdout
        rows = [line for line in lines[2:-1] if line.strip()]
        assert all(len(row.split()) >= 9 for row in rows), rows  # every field on its line
