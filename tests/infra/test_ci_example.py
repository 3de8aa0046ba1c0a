"""examples/ci/launch.yml: the pull-request gate runs `launch plan --json` and its exit status
decides; merges launch with OIDC credentials only; the plan and the memory report are kept.

The gate's own shell step is run here, as GitHub would run it (bash, GITHUB_OUTPUT), with the real
`launch` of this checkout: a plan that fits passes, one that does not fit fails with status 3,
and both leave plan.json and plan.html behind for the artifact step.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / "examples" / "ci" / "launch.yml"
PLAIN = REPO / "examples" / "plain" / "train.py"
GPT2 = "--params 125M --layers 12 --hidden-size 768 --heads 12 --vocab-size 50257 --seq-len 1024"


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    data = yaml.safe_load(WORKFLOW.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def step(job: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in job["steps"] if s.get("name") == name or s.get("id") == name)


def test_triggers_and_least_privilege(workflow: dict[str, Any]) -> None:
    assert set(workflow["on"]) == {"pull_request", "push"}
    assert workflow["on"]["push"]["branches"] == ["main"]
    assert workflow["permissions"] == {"contents": "read"}
    plan, launch = workflow["jobs"]["plan"], workflow["jobs"]["launch"]
    assert "permissions" not in plan  # no OIDC token for pull requests
    assert launch["permissions"] == {"contents": "read", "id-token": "write"}
    assert launch["needs"] == "plan"
    assert launch["if"] == "github.event_name == 'push' && github.ref == 'refs/heads/main'"


def test_no_long_lived_credentials(workflow: dict[str, Any]) -> None:
    text = WORKFLOW.read_text()
    assert "secrets." not in text
    for forbidden in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "credentials_json"):
        assert forbidden not in text
    launch = workflow["jobs"]["launch"]
    aws = step(launch, "AWS credentials (OIDC, no keys)")
    assert aws["uses"].startswith("aws-actions/configure-aws-credentials@")
    assert aws["with"]["role-to-assume"] == "${{ vars.AWS_ROLE_ARN }}"
    gcp = step(launch, "Google Cloud credentials (Workload Identity Federation, no key file)")
    assert gcp["uses"].startswith("google-github-actions/auth@")
    assert set(gcp["with"]) == {"workload_identity_provider", "service_account"}
    for job in workflow["jobs"].values():
        checkout = next(s for s in job["steps"] if s.get("uses", "").startswith(
            "actions/checkout@"))
        assert checkout["with"]["persist-credentials"] is False


def test_plans_and_reports_are_kept_as_artifacts(workflow: dict[str, Any]) -> None:
    for job, name in (("plan", "Keep the plan"), ("launch", "Keep the plan, the run and its "
                                                             "attempts")):
        upload = step(workflow["jobs"][job], name)
        assert upload["uses"].startswith("actions/upload-artifact@")
        assert upload["if"] == "always()"  # a failed gate keeps its plan too
        paths = upload["with"]["path"].split()
        assert {"plan.json", "plan.html"} <= set(paths)
        assert not any("*" in p or p in (".", "./") for p in paths)  # named paths only
    run = step(workflow["jobs"]["launch"], "Launch")["run"]
    assert "launch run" in run and "--json" in run


def test_the_ci_variables_are_terraform_outputs(workflow: dict[str, Any]) -> None:
    """Every repository variable the workflow reads is named in its header, and each
    LAUNCH_* one is a setting of the launcher (a flag's environment variable)."""
    from launcher.cli import cli

    text = WORKFLOW.read_text()
    header = text.split("\nname:", 1)[0]
    used = set(re.findall(r"vars\.([A-Z_]+)", text))
    assert used and all(name in header for name in used)

    plan = cli.commands["plan"]  # the command the workflow runs, as click built it
    envvars = {p.envvar for p in plan.params if isinstance(p.envvar, str)}
    settings = {n for n in used if n.startswith("LAUNCH_") and n != "LAUNCH_PLAN_ARGS"}
    assert settings <= envvars, settings - envvars


def _run_gate(workflow: dict[str, Any], tmp_path: Path, plan_args: str,
              **variables: str) -> tuple[int, str]:
    script = step(workflow["jobs"]["plan"], "plan")["run"]
    output = tmp_path / "github_output"
    output.touch()
    environ = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GITHUB_OUTPUT": str(output), "LAUNCH_STATE_DIR": str(tmp_path / "state"),
        "SCRIPT": str(PLAIN), "LAUNCH_PROVIDER": "sagemaker", "LAUNCH_REGION": "us-east-1",
        "LAUNCH_BUCKET": "launch-123456789012-us-east-1",
        "LAUNCH_ROLE": "arn:aws:iam::123456789012:role/launch-sagemaker-execution",
        "LAUNCH_PLAN_ARGS": plan_args, "CI": "true", **variables,
    }
    done = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=120)
    assert output.read_text().strip() == f"status={done.returncode}"
    return done.returncode, done.stdout + done.stderr


def test_the_gate_passes_a_plan_that_fits(workflow: dict[str, Any], tmp_path: Path) -> None:
    status, printed = _run_gate(workflow, tmp_path, GPT2)
    assert status == 0, printed
    assert "::notice title=launch plan::" in printed
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["chosen"]["fits"] is True
    assert plan["request"]["api"] == "sagemaker:CreateTrainingJob"
    assert (tmp_path / "plan.html").read_text().lstrip().lower().startswith("<!doctype html")


def test_the_gate_fails_when_nothing_fits(workflow: dict[str, Any], tmp_path: Path) -> None:
    too_big = ("--params 70B --layers 80 --hidden-size 8192 --heads 64 --vocab-size 32000 "
               "--seq-len 4096 --machine ml.g4dn.xlarge --nodes 1")
    status, printed = _run_gate(workflow, tmp_path, too_big)
    assert status == 3, printed
    assert "::error title=launch plan::no plan fits" in printed
    assert json.loads((tmp_path / "plan.json").read_text())["chosen"] is None
    assert (tmp_path / "plan.html").exists()  # the artifact step has the report to keep


def test_the_install_line_names_this_repositorys_distribution(workflow: dict[str, Any]) -> None:
    """`launcher` on the package index is someone else's project: the workflow installs this
    repository's distribution by its own name, at this version, with extras it defines."""
    import tomllib

    from launcher import __version__

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "launch-fit" and project["version"] == __version__
    spec = workflow["env"]["LAUNCH_PIP"]
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)\[([a-z,]+)\]==([0-9.]+)", spec)
    assert match, spec
    name, extras, version = match.groups()
    assert name == project["name"] and version == project["version"]
    assert set(extras.split(",")) <= set(project["optional-dependencies"])
    for job in workflow["jobs"].values():
        installs = [s["run"] for s in job["steps"] if "pip install" in s.get("run", "")]
        assert all('"$LAUNCH_PIP"' in run and "launcher[" not in run for run in installs)


def test_the_gate_fails_without_a_region(workflow: dict[str, Any], tmp_path: Path) -> None:
    """The repository variables unset: the plan builds no request, so it checked nothing a
    submission needs. A gate that passed here would gate nothing."""
    status, printed = _run_gate(workflow, tmp_path, GPT2, LAUNCH_REGION="")
    assert status == 2, printed
    assert "::error title=launch plan::usage error: the plan has no sagemaker request" in printed
    plan = json.loads((tmp_path / "plan.json").read_text())  # one object, the plan and why
    assert plan["request"] is None and plan["chosen"]["fits"] is True
    assert "region" in plan["error"]["message"]


def test_the_launch_step_runs_as_a_runner_runs_it_on_the_local_provider(
        workflow: dict[str, Any], tmp_path: Path) -> None:
    """The merge job's Launch step, as GitHub runs it (bash -e, CI set, no terminal), against
    the local provider: it plans, then runs with --yes --json (no question asked: there is no
    terminal), run.json is the one result object, and the log shows the run's progress as JSON
    lines on stderr."""
    from tests.conftest import TINY_RECIPE

    script = tmp_path / "train.py"
    script.write_text(TINY_RECIPE)
    launch = step(workflow["jobs"]["launch"], "Launch")["run"]
    environ = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "LAUNCH_STATE_DIR": str(tmp_path / "state"), "LAUNCH_HOME": str(tmp_path / "home"),
        "SCRIPT": str(script), "LAUNCH_PROVIDER": "local", "LAUNCH_PLAN_ARGS": "--steps 2",
        "LAUNCH_NO_TRACE": "1", "CI": "true",
    }
    done = subprocess.run(["bash", "-e", "-c", launch], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["status"] == "success" and run["summary"]["steps"] == 2
    assert json.loads((tmp_path / "plan.json").read_text())["chosen"]["fits"] in (True, None)
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert [e["step"] for e in events if e["event"] == "metrics"] == [1, 2]
    assert "Proceed?" not in done.stderr
