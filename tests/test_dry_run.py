"""`launch plan --out DIR` (issue 26): the chosen plan's first attempt written out as it would
run, and the request beside it; a folder that holds anything is refused before any work."""

from __future__ import annotations

import json

from launcher.status import ExitStatus

SAGEMAKER = ("--provider", "sagemaker", "--machine", "ml.g5.xlarge", "--region", "us-east-1",
             "--bucket", "my-bucket", "--role", "arn:aws:iam::123456789012:role/R")
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_EC2_METADATA_DISABLED": "true"}


def test_the_local_job_folder_is_the_script_its_plan_and_the_command(cli, tiny_recipe,
                                                                     tmp_path):
    out = tmp_path / "job"
    result = cli("plan", str(tiny_recipe), "--micro-batch-size", "2", "--out", str(out),
                 "--json")
    assert result.status == 0, result.stderr
    chosen = result.json()["chosen"]
    assert sorted(p.name for p in out.iterdir()) == ["launch_runtime.py", "launch_train.py",
                                                      "plan.json", "request.json"]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["micro_batch_size"] == chosen["micro_batch_size"] == 2
    request = json.loads((out / "request.json").read_text())
    # the command runs the script written in DIR, from the user's script folder
    assert request["argv"][-1] == str(out / "launch_train.py")
    assert request["cwd"] == str(tiny_recipe.parent)
    assert request["env"]["LAUNCH_MICRO_BATCH_SIZE"] == "2"
    compile((out / "launch_train.py").read_text(), "launch_train.py", "exec")
    compile((out / "launch_runtime.py").read_text(), "launch_runtime.py", "exec")
    assert any(f"job folder written to {out}" in n for n in result.json()["notes"])


def test_a_cloud_job_folder_holds_the_exact_request_and_no_credentials(cli, tiny_recipe,
                                                                       tmp_path):
    out = tmp_path / "job"
    result = cli("plan", str(tiny_recipe), *SAGEMAKER, "--out", str(out), "--json",
                 environ=AWS)
    assert result.status == 0, result.stderr
    written = json.loads((out / "request.json").read_text())
    assert written == result.json()["request"]  # the request the dry run shows, to the byte
    assert written["create_training_job"]["ResourceConfig"]["InstanceType"] == "ml.g5.xlarge"
    assert not any("testing" in p.read_text() for p in out.iterdir())


def test_a_folder_that_holds_anything_is_refused_and_left_as_it_is(cli, tiny_recipe, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    result = cli("plan", str(tiny_recipe), "--out", str(out))
    assert result.status == ExitStatus.USAGE
    assert result.stderr.count("\n") == 1 and "is not empty" in result.stderr
    assert "Traceback" not in result.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "my notes"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    refused = cli("plan", str(tiny_recipe), "--out", str(a_file))
    assert refused.status == ExitStatus.USAGE and "is not a folder" in refused.stderr
    assert a_file.read_text() == "x"


def test_nothing_is_written_when_no_plan_fits(cli, write_script, tmp_path):
    script = write_script("print('training')\n")
    out = tmp_path / "job"
    result = cli("plan", str(script), "--params", "1T", *SAGEMAKER, "--out", str(out), "--json",
                 environ=AWS)
    assert result.status == ExitStatus.NO_PLAN_FITS, result.stderr
    data = result.json()
    assert data["chosen"] is None and not out.exists()
    assert f"nothing written to {out}: no plan fits" in data["notes"]
