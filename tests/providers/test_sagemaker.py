"""The SageMaker provider against real servers on 127.0.0.1, driven by the real boto3.

moto's server (started once for this module on a free loopback port) serves S3, CloudWatch Logs
and IAM; ``tests/fakes/sagemaker_server.py`` serves the training-job API at the wire level and
plays each job's scenario. One test has the fake run the submitted job for real (torchrun on the
CPU, code from moto's S3, output into moto's CloudWatch Logs).
"""

from __future__ import annotations

import io
import itertools
import json
import socket
import tarfile
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import botocore.session
import botocore.validate
import pytest

from launcher.events import parse_event
from launcher.plan.plan import Memory, Plan
from launcher.providers.base import Job
from launcher.providers.sagemaker import (
    BOOTSTRAP_NAME,
    JOB_NAME,
    SageMakerProvider,
    SageMakerRequest,
    job_name,
    status_of,
)
from launcher.render import RenderedJob, TrainSettings, render
from launcher.status import ExitStatus, ProviderError, UsageError
from tests.fakes.record import record
from tests.fakes.sagemaker_server import (
    ACCOUNT,
    HOST_OOM_REASON,
    CloudWatchProxy,
    FakeSageMaker,
    FlakyProxy,
    chatty,
    cuda_oom,
    execute,
    flood,
    host_oom,
    isolated_aws_env,
    moto_client,
    no_aws_credentials,
    oom_event,
    oom_only_in_failure_reason,
    start_moto,
    success,
)
from tests.test_packaging import AWS_KEY_ID, PEM, PLANTED_KEPT, PLANTED_SKIPPED, plant_secrets

ROLE = f"arn:aws:iam::{ACCOUNT}:role/SageMakerRole"
BUCKET = "launch-test-bucket"
RECIPE = '''
import os

import torch

LAUNCH = {"global_batch_size": 4, "steps": 4, "lr": 0.01}


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.lin(x)) + x


def build_model():
    return torch.nn.Sequential(Block(), Block(), torch.nn.Linear(16, 1))


def example_batch(batch_size):
    x = torch.randn(batch_size, 16)
    return {"x": x, "y": x.sum(dim=1, keepdim=True)}


_calls = 0


def training_step(model, batch):
    # Rank 1 "runs out of GPU memory" in its third forward pass at micro-batch 2 or more.
    global _calls
    _calls += 1
    if batch["x"].shape[0] >= 2 and _calls >= 3 and os.environ.get("RANK") == "1":
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
            "22.07 GiB of which 1.10 GiB is free.")
    return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])


def wrap_modules():
    return (Block,)
'''


# -- servers and environment ------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto() -> Any:
    server, endpoint = start_moto()
    s3 = moto_client("s3", endpoint)
    s3.create_bucket(Bucket=BUCKET)
    iam = moto_client("iam", endpoint)
    # moto's backends live as long as the process: another module's server (test_sagemaker_sdk
    # uses this fixture too) may have made the role already.
    if "SageMakerRole" not in {r["RoleName"] for r in iam.list_roles()["Roles"]}:
        iam.create_role(RoleName="SageMakerRole", AssumeRolePolicyDocument="{}")
    yield endpoint
    server.stop()


@pytest.fixture
def fake(moto: str, tmp_path: Path) -> Any:
    service = FakeSageMaker(moto, tmp_path / "fake")
    (tmp_path / "fake").mkdir()
    service.start()
    yield service
    service.close()


@pytest.fixture
def cloudwatch(moto: str) -> Any:
    """CloudWatch Logs as boto3 reaches it: moto behind the quota-keeping proxy (no limits
    unless a test sets ``cloudwatch.limits``)."""
    proxy = CloudWatchProxy(moto)
    yield proxy
    proxy.close()


@pytest.fixture
def aws_env(moto: str, fake: FakeSageMaker, cloudwatch: CloudWatchProxy, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Dummy credentials, endpoints on loopback, no config files from the home folder."""
    return isolated_aws_env(
        monkeypatch, tmp_path, AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing-secret-value", AWS_ENDPOINT_URL=moto,
        AWS_ENDPOINT_URL_SAGEMAKER=fake.url, AWS_ENDPOINT_URL_LOGS=cloudwatch.url)


def provider(environ: dict[str, str] | None = None, **settings: Any) -> SageMakerProvider:
    values = {"bucket": BUCKET, "role": ROLE, "region": "us-east-1", "api_interval_s": 0,
              "log_settle_s": 0.05, "aws_max_attempts": 4, **settings}
    return SageMakerProvider.from_settings(values, environ)


def make_plan(**changes: Any) -> Plan:
    values: dict[str, Any] = {
        "strategy": "ddp", "machine": "ml.p4d.24xlarge", "nodes": 2, "gpus_per_node": 8,
        "micro_batch_size": 4, "grad_accum_steps": 1, "global_batch_size": 64,
        "precision": "bf16_mixed", "optimizer": "adamw", "activation_checkpointing": False,
        "steps": 10, "lr": 3e-4, "cost_per_hour_usd": 2 * 21.96,
    }
    values.update(changes)
    return Plan(**values)


def stub_rendered(strategy: str) -> RenderedJob:
    """A rendered job for a strategy whose template is not written yet (the request does not
    depend on the script's text)."""
    return RenderedJob(files={"plan.json": "{}\n", "launch_train.py": "print()\n"},
                       entrypoint="launch_train.py", env={"LAUNCH_STRATEGY": strategy})


_RUNS = itertools.count(1)


def make_job(tmp_path: Path, plan: Plan | None = None, *, attempt: int = 1,
             run_id: str | None = None, recipe: str = RECIPE,
             rendered: RenderedJob | None = None) -> Job:
    """A rendered attempt of a run. Run ids are unique unless given: moto's log group outlives
    a test, as a real account's does, and job names (so log streams) follow run ids."""
    plan = plan or make_plan()
    run_id = run_id or f"train-20260421-101500-{next(_RUNS):04x}"
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(textwrap.dedent(recipe))
    run = tmp_path / "state" / "runs" / run_id
    settings = TrainSettings(recipe_file=str(code / "train.py"), mode="recipe", run_id=run_id,
                             attempt=attempt, checkpoint_dir=str(run / "checkpoints"))
    rendered = rendered or render(plan, settings)
    job_dir = run / f"attempt-{attempt}" / "job"
    rendered.write(job_dir)
    return Job(run_id=run_id, attempt=attempt, plan=plan, rendered=rendered, job_dir=job_dir,
               attempt_dir=job_dir.parent, checkpoint_dir=run / "checkpoints", code_dir=code)


def follow(p: SageMakerProvider, job_id: str, *, stop_on_oom: bool = False,
           timeout: float = 60.0) -> tuple[list[str], Any]:
    """The supervisor's loop, reduced: poll, read, stop on the first oom event."""
    lines: list[str] = []
    cursor = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = p.poll(job_id)
        new, cursor = p.logs(job_id, cursor)
        lines += new
        if stop_on_oom and any((parse_event(x) or {}).get("launch") == "oom" for x in new):
            p.stop(job_id)
        if status.terminal and not new:
            return lines, status
        if not new:
            time.sleep(0.02)
    raise AssertionError(f"{job_id} did not end in {timeout}s; read:\n" + "\n".join(lines[-20:]))


def archive(s3_uri: str, moto: str) -> dict[str, bytes]:
    bucket, _, key = s3_uri.removeprefix("s3://").partition("/")
    body = moto_client("s3", moto).get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def create_shape() -> Any:
    model = botocore.session.get_session().get_service_model("sagemaker")
    return model.operation_model("CreateTrainingJob").input_shape


# -- the request --------------------------------------------------------------------------------


def test_request_is_the_exact_create_call_built_without_side_effects(tmp_path, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    job = make_job(tmp_path, run_id="train-20260421-101500-ab12")
    (job.code_dir / ".env").write_text("AWS_SECRET_ACCESS_KEY=do-not-ship\n")
    (job.code_dir / "__pycache__").mkdir()
    (job.code_dir / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (job.code_dir / "model.py").write_text("WIDTH = 16\n")
    p = provider({})  # no credentials at all: a dry run needs none
    request = p.dryrun(job)
    assert isinstance(request, SageMakerRequest)
    assert not (job.attempt_dir / "request.json").exists()
    again = p.dryrun(job)
    assert again.to_dict() == request.to_dict()  # deterministic, down to the archive hash

    kwargs = request.kwargs
    botocore.validate.validate_parameters(kwargs, create_shape())  # the API's own shape
    data = request.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["create_training_job"] == kwargs
    assert kwargs["TrainingJobName"] == "launch-train-20260421-101500-ab12-a1"
    assert kwargs["RoleArn"] == ROLE
    spec = kwargs["AlgorithmSpecification"]
    assert spec["TrainingImage"] == (
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312")
    assert spec["TrainingInputMode"] == "File"
    assert spec["ContainerEntrypoint"][:2] == ["/bin/sh", "-c"]
    assert spec["ContainerArguments"] == [
        "/opt/ml/input/data/code/sourcedir.tar.gz", "/opt/ml/code", request.package.sha256,
        "python3", BOOTSTRAP_NAME,
        "--nproc-per-node", "8", "--resource-config", "/opt/ml/input/config/resourceconfig.json",
        "--master-port", "29500", "launch_train.py"]
    assert all(len(a) <= 256 for a in spec["ContainerEntrypoint"] + spec["ContainerArguments"])
    assert {m["Name"] for m in spec["MetricDefinitions"]} >= {"train:loss"}
    assert kwargs["ResourceConfig"] == {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2,
                                        "VolumeSizeInGB": 30}
    run_root = f"s3://{BUCKET}/launch/train-20260421-101500-ab12"
    assert kwargs["CheckpointConfig"] == {"S3Uri": f"{run_root}/checkpoints",
                                          "LocalPath": "/opt/ml/checkpoints"}
    assert kwargs["OutputDataConfig"] == {"S3OutputPath": f"{run_root}/output"}
    assert kwargs["StoppingCondition"] == {"MaxRuntimeInSeconds": 86400}
    assert kwargs["EnableManagedSpotTraining"] is False
    environment = kwargs["Environment"]
    assert environment["LAUNCH_CHECKPOINT_DIR"] == "/opt/ml/checkpoints"
    # the one provider with a failure file names it; the scripts write nowhere else
    assert environment["LAUNCH_FAILURE_FILE"] == "/opt/ml/output/failure"
    assert environment["LAUNCH_MICRO_BATCH_SIZE"] == "4"
    assert environment["LAUNCH_RUN_ID"] == job.run_id and environment["LAUNCH_ATTEMPT"] == "1"
    assert kwargs["HyperParameters"]["micro_batch_size"] == "4"
    assert kwargs["HyperParameters"]["strategy"] == "ddp"
    tags = {t["Key"]: t["Value"] for t in kwargs["Tags"]}
    assert tags["launch:run-id"] == job.run_id and tags["launch:attempt"] == "1"
    text = json.dumps(data)
    assert "AWS_" not in text and "testing" not in text and "do-not-ship" not in text

    package = request.package
    channel = kwargs["InputDataConfig"][0]
    assert channel["ChannelName"] == "code"
    assert channel["DataSource"]["S3DataSource"]["S3Uri"] == package.channel_uri
    assert package.s3_uri == package.channel_uri + "sourcedir.tar.gz"
    assert package.files == ("launch_runtime.py", "launch_sagemaker.py", "launch_train.py",
                             "model.py", "plan.json", "train.py")
    with tarfile.open(fileobj=io.BytesIO(package.data), mode="r:gz") as tar:
        plan_json = json.loads(tar.extractfile("plan.json").read())
    assert plan_json["recipe_file"] == "train.py"
    assert plan_json["checkpoint_dir"] == "/opt/ml/checkpoints"
    assert plan_json["micro_batch_size"] == 4


def test_spot_budget_volume_and_settings(tmp_path):
    memory = Memory(parameters=8 * 2**30, gradients=8 * 2**30, optimizer=16 * 2**30)
    job = make_job(tmp_path, make_plan(strategy="fsdp", memory=memory),
                   rendered=stub_rendered("fsdp"))
    request = provider({}, spot=True, budget=22.0, s3_prefix="team/ml",
                       job_prefix="nightly").dryrun(job)
    kwargs = request.kwargs
    # $22 at $43.92 an hour: half an hour, SageMaker stops it there.
    assert kwargs["StoppingCondition"] == {"MaxRuntimeInSeconds": 1803,
                                           "MaxWaitTimeInSeconds": 3606}
    assert kwargs["EnableManagedSpotTraining"] is True
    assert kwargs["TrainingJobName"].startswith("nightly-train-")
    assert kwargs["CheckpointConfig"]["S3Uri"].startswith(f"s3://{BUCKET}/team/ml/train-")
    # 16 shards of 24 GiB of model and optimizer states, three copies, plus 30 GB.
    assert kwargs["ResourceConfig"]["VolumeSizeInGB"] == 3 * 16 * 24 + 30
    botocore.validate.validate_parameters(kwargs, create_shape())
    assert provider({}, max_run_s=600, spot=True).dryrun(job).kwargs["StoppingCondition"] == {
        "MaxRuntimeInSeconds": 600, "MaxWaitTimeInSeconds": 1200}


def test_smp_v2_plans_get_the_smp_image(tmp_path):
    plan = make_plan(strategy="smp_v2")
    request = provider({}, region="eu-west-1").dryrun(
        make_job(tmp_path, plan, rendered=stub_rendered("smp_v2")))
    assert request.kwargs["AlgorithmSpecification"]["TrainingImage"] == (
        "658645717510.dkr.ecr.eu-west-1.amazonaws.com/smdistributed-modelparallel:"
        "2.5.1-gpu-py311-cu124")
    assert request.region == "eu-west-1"
    custom = provider({}, image="123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:1")
    assert custom.dryrun(make_job(tmp_path)).kwargs["AlgorithmSpecification"][
        "TrainingImage"].endswith("/mine:1")


def test_job_names_are_deterministic_valid_and_short_enough():
    assert job_name("train-20260421-101500-ab12", 2) == "launch-train-20260421-101500-ab12-a2"
    long_id = "a-very-long-recipe-name-for-test-x-20260421-101500-ab12"
    names = {job_name(long_id, n) for n in (1, 10, 100)}
    assert len(names) == 3
    for name in names:
        assert len(name) <= 63 and JOB_NAME.match(name)
    assert job_name(long_id, 10) == job_name(long_id, 10)
    other = job_name(long_id.replace("ab12", "cd34"), 10)
    assert other != job_name(long_id, 10)  # the hash tells apart ids that share a start
    assert JOB_NAME.match(job_name("résumé_run--x", 1))


def test_content_hash_changes_with_the_content_only(tmp_path):
    run_id = "train-20260421-101500-ab12"
    first = provider({}).dryrun(make_job(tmp_path, run_id=run_id)).package
    same = provider({}).dryrun(make_job(tmp_path, run_id=run_id)).package
    assert (same.sha256, same.key) == (first.sha256, first.key)
    (tmp_path / "code" / "helper.py").write_text("X = 1\n")
    changed = provider({}).dryrun(make_job(tmp_path, run_id=run_id)).package
    assert changed.sha256 != first.sha256 and changed.key != first.key
    # The launcher's state folder inside the code folder is never packed.
    job = make_job(tmp_path / "code", run_id="inside-20260421-101500-ab12")
    inside = provider({}).dryrun(replace(job, code_dir=tmp_path / "code"))
    assert "code/train.py" in inside.package.files
    assert not any(name.startswith("state/") for name in inside.package.files)


# -- what is uploaded (launcher/packaging.py) -----------------------------------------------------


def test_the_code_package_holds_no_secrets_and_honours_ignore_files(tmp_path):
    job = make_job(tmp_path)
    gac = plant_secrets(job.code_dir, tmp_path / "home")
    (job.code_dir / "conf").mkdir()
    (job.code_dir / "conf" / "aws-shared").write_text(f"aws_access_key_id = {AWS_KEY_ID}\n")
    environ = {"GOOGLE_APPLICATION_CREDENTIALS": str(gac),
               "AWS_SHARED_CREDENTIALS_FILE": str(job.code_dir / "conf" / "aws-shared")}
    request = provider(environ).dryrun(job)

    # The very bytes `schedule` uploads.
    with tarfile.open(fileobj=io.BytesIO(request.package.data), mode="r:gz") as tar:
        members = tar.getmembers()
        contents = b"".join(tar.extractfile(m).read() for m in members)
    code = sorted(("train.py", *PLANTED_KEPT))
    assert [m.name for m in members] == sorted(
        (*code, BOOTSTRAP_NAME, "launch_runtime.py", "launch_train.py", "plan.json"))
    assert all(m.isfile() for m in members)  # no links in the archive
    assert b"aws_access_key_id" not in contents and b"private_key" not in contents

    # `launch plan --json` shows the code folder's part of it, and what was left out and why.
    upload = request.to_dict()["upload"]
    assert upload["root"] == str(job.code_dir.resolve())
    assert [f["name"] for f in upload["files"]] == code
    skipped = {s["path"]: s["reason"] for s in upload["skipped"]}
    assert {path: skipped.get(path) for path in PLANTED_SKIPPED} == PLANTED_SKIPPED
    assert skipped["conf/aws-shared"] == "named by AWS_SHARED_CREDENTIALS_FILE"
    assert skipped["aws-link"].startswith("symlink to outside the folder")


def test_plan_refuses_a_private_key_beside_the_script(cli, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent(RECIPE))
    (code / "deploy").mkdir()
    (code / "deploy" / "notes.md").write_text("# Deploying\n\nThe key:\n\n" + PEM)
    result = cli("plan", str(code / "train.py"), "--provider", "sagemaker", "--json",
                 "--machine", "ml.g5.xlarge", "--region", "us-east-1", "--bucket", BUCKET,
                 "--role", ROLE, environ={"AWS_ACCESS_KEY_ID": "testing",
                                          "AWS_SECRET_ACCESS_KEY": "testing",
                                          "AWS_EC2_METADATA_DISABLED": "true"})
    assert result.status == ExitStatus.USAGE, result.stdout
    assert result.stderr.startswith(
        "launch: error: refusing to upload deploy/notes.md: line 5 looks like a private key")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize(("settings", "plan", "words"), [
    ({"role": None}, {}, "needs an execution role"),
    ({"bucket": None}, {}, "needs an S3 bucket"),
    ({"role": "SageMakerRole"}, {}, "is not an IAM role ARN"),
    ({"bucket": "s3://Bad_Bucket/x"}, {}, "is not an S3 bucket name"),
    ({"job_prefix": "a-much-too-long-prefix-for-job-names"}, {}, "at most 20"),
    ({}, {"machine": "ml.p9.48xlarge"}, "unknown SageMaker machine 'ml.p9.48xlarge'"),
    ({}, {"machine": "ml.p4.24xlarge"}, "did you mean ml.p4d.24xlarge"),
    ({}, {"machine": "ml.m5.xlarge"}, "ml.m5.xlarge has no GPU"),
    ({}, {"machine": "ml.g5.2xlarge"}, "has 1 GPU(s), not 8"),
    ({"region": "mars-1"}, {}, "is not an AWS region"),
])
def test_bad_input_is_one_clear_line(tmp_path, settings, plan, words):
    with pytest.raises(UsageError) as caught:
        provider({}, **settings).dryrun(make_job(tmp_path, make_plan(**plan)))
    error = caught.value
    assert words in str(error)
    assert "\n" not in str(error) and error.status == ExitStatus.USAGE


def test_no_region_anywhere(tmp_path, monkeypatch):
    for key in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(UsageError, match="no AWS region"):
        provider({"AWS_CONFIG_FILE": str(tmp_path / "none")}, region=None).dryrun(
            make_job(tmp_path))


def test_no_credentials_fails_within_two_seconds_without_waiting_on_metadata(
        tmp_path, monkeypatch):
    # An instance metadata address that accepts connections and never answers: the worst case.
    blackhole = socket.create_server(("127.0.0.1", 0))
    port = blackhole.getsockname()[1]
    environ = no_aws_credentials(monkeypatch, tmp_path, port)
    p = provider(environ)
    request = p.dryrun(make_job(tmp_path))
    start = time.monotonic()
    try:
        with pytest.raises(ProviderError) as caught:
            p.schedule(request)
    finally:
        blackhole.close()
    assert time.monotonic() - start < 2.0
    error = caught.value
    assert error.status == ExitStatus.PROVIDER_ERROR == 6
    assert error.message == "no AWS credentials found"
    assert "AWS_PROFILE" in error.hint and "AWS_ACCESS_KEY_ID" in error.hint


def test_status_mapping():
    def described(status: str, secondary: str, **extra: Any) -> dict[str, Any]:
        return {"TrainingJobStatus": status, "SecondaryStatus": secondary,
                "SecondaryStatusTransitions": [{"Status": secondary, "StatusMessage": "msg"}],
                **extra}

    assert status_of(described("InProgress", "Starting")).state == "pending"
    running = status_of(described("InProgress", "Training"))
    assert (running.state, running.message) == ("running", "Training: msg")
    assert not status_of(described("Stopping", "Stopping")).terminal
    assert status_of(described("Completed", "Completed")).state == "succeeded"
    failed = status_of(described("Failed", "Failed", FailureReason="AlgorithmError: x, exit "
                                                                  "code: 137"))
    assert (failed.state, failed.exit_code) == ("failed", 137)
    assert status_of(described("Stopped", "Stopped")).state == "cancelled"
    assert status_of(described("Stopped", "MaxRuntimeExceeded")).state == "failed"


# -- submitting and following ---------------------------------------------------------------------


def test_success_uploads_once_creates_and_follows_every_line(tmp_path, aws_env, fake, moto):
    fake.push(success(steps=3, gpus=8), success(steps=1, gpus=8))
    p = provider(aws_env)
    job = make_job(tmp_path)
    request = p.dryrun(job)
    job_id = p.schedule(request)
    assert job_id == request.job_name
    assert json.loads((job.attempt_dir / "request.json").read_text()) == request.to_dict()
    created = fake.jobs[job_id].request
    assert created == json.loads(json.dumps(request.kwargs))  # what boto3 put on the wire
    files = archive(request.package.s3_uri, moto)
    assert set(files) == set(request.package.files)
    assert json.loads(files["plan.json"])["checkpoint_dir"] == "/opt/ml/checkpoints"

    lines, status = follow(p, job_id)
    assert (status.state, status.exit_code) == ("succeeded", 0)
    assert lines[0] == "[sagemaker] Starting: Starting the training job"
    assert "[sagemaker] Training: Training image download completed. Training in progress." \
        in lines
    assert lines[-1] == "[sagemaker] Completed: Training job completed"
    output = [x for x in lines if not x.startswith("[sagemaker]")]
    written = {h: [f"[{h}] {x}" for x in v] for h, v in fake.jobs[job_id].written.items()}
    assert sorted(output) == sorted(written["algo-1"] + written["algo-2"])
    for host in ("algo-1", "algo-2"):  # each host's lines in its order
        assert [x for x in output if x.startswith(f"[{host}]")] == written[host]
    done = {parse_event(x)["rank"] for x in output if (parse_event(x) or {}).get("launch")
            == "done"}
    assert done == set(range(16))

    # Scheduling the same request again uploads nothing and creates nothing.
    key = request.package.key
    s3 = moto_client("s3", moto)
    before = s3.head_object(Bucket=BUCKET, Key=key)["LastModified"]
    p.schedule(request)  # idempotent: the job exists and is this attempt's
    assert s3.head_object(Bucket=BUCKET, Key=key)["LastModified"] == before
    assert len(fake.jobs) == 1


@pytest.mark.parametrize("checksum", [None, "SHA256"])
def test_an_object_planted_at_the_package_key_is_neither_used_nor_overwritten(
        tmp_path, aws_env, fake, moto, checksum):
    """Jobs can write the bucket, so something else may sit at the package's key: the same
    size and the same x-amz-meta-sha256, other bytes (with S3's SHA-256 checksum of them, or
    none). It is not reused nor overwritten: the package goes to a key of its own, which the
    job's code channel reads, request.json records and the job's first log lines say."""
    fake.push(success(steps=1, gpus=8))
    p = provider(aws_env)
    job = make_job(tmp_path)
    request = p.dryrun(job)
    package = request.package
    planted = bytes(b ^ 0xFF for b in package.data)
    s3 = moto_client("s3", moto)
    s3.put_object(Bucket=BUCKET, Key=package.key, Body=planted, ContentType="application/gzip",
                  Metadata={"sha256": package.sha256},
                  **({"ChecksumAlgorithm": checksum} if checksum else {}))

    job_id = p.schedule(request)
    channel = fake.jobs[job_id].request["InputDataConfig"][0]["DataSource"]["S3DataSource"]
    uri = channel["S3Uri"]
    assert uri != package.channel_uri and uri.startswith(package.channel_uri.rstrip("/") + "-")
    files = archive(uri + "sourcedir.tar.gz", moto)
    assert set(files) == set(package.files)
    assert files["launch_train.py"] == job.rendered.files["launch_train.py"].encode()
    assert s3.get_object(Bucket=BUCKET, Key=package.key)["Body"].read() == planted

    recorded = json.loads((job.attempt_dir / "request.json").read_text())
    assert recorded["code_package"]["s3_uri"] == uri + "sourcedir.tar.gz"
    assert recorded["code_package"]["instead_of"] == package.s3_uri
    lines, _cursor = p.logs(job_id)
    assert lines[0].startswith(f"[sagemaker] {package.s3_uri} holds other bytes"), lines
    assert uri in lines[0]


def test_an_older_launch_s_upload_without_a_sha256_checksum_is_reused_by_its_bytes(
        tmp_path, aws_env, fake, moto):
    """An upload of the package before launch sent SHA-256 checksums: S3 vouches for no hash
    of it, so its bytes (the package's size, so bounded) are compared; they are the package's,
    so it is reused as it is."""
    fake.push(success(steps=1, gpus=8))
    p = provider(aws_env)
    request = p.dryrun(make_job(tmp_path))
    package = request.package
    s3 = moto_client("s3", moto)
    s3.put_object(Bucket=BUCKET, Key=package.key, Body=package.data,
                  ContentType="application/gzip", Metadata={"sha256": package.sha256})
    before = s3.head_object(Bucket=BUCKET, Key=package.key)["LastModified"]
    job_id = p.schedule(request)
    assert fake.jobs[job_id].request == json.loads(json.dumps(request.kwargs))
    assert s3.head_object(Bucket=BUCKET, Key=package.key)["LastModified"] == before
    folder = package.key.rsplit("/", 1)[0]
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=folder + "-")["KeyCount"] == 0  # no other


def test_cuda_oom_on_one_of_16_ranks_stops_the_hanging_job_and_resubmits(
        tmp_path, aws_env, fake, moto):
    from launcher.remedies import replan
    from launcher.runs import Run
    from launcher.spec import Spec
    from launcher.supervisor import Supervisor

    fake.push(cuda_oom(gpus=8, oom_rank=11, at_step=3, hang_s=60), success(steps=2, gpus=8))
    code = tmp_path / "code"
    code.mkdir()
    script = code / "train.py"
    script.write_text(textwrap.dedent(RECIPE))
    run = Run.create(tmp_path / "state", "train", {"provider": "sagemaker"})
    spec = Spec(script=script, mode="recipe", provider="sagemaker", max_attempts=3)
    lines: list[str] = []
    notes: list[str] = []
    supervisor = Supervisor(provider(aws_env), run, on_line=lines.append,
                            on_note=notes.append,
                            replan=lambda plan, failure: replan(plan, failure),
                            poll_interval_s=0.02)
    start = time.monotonic()
    outcome = supervisor.launch(spec, make_plan())
    assert time.monotonic() - start < 30  # not the 60 s the hanging ranks would take

    assert outcome.status == ExitStatus.SUCCESS
    first, second = outcome.attempts
    job1 = fake.jobs[first.job_id]
    assert job1.stop_calls == 1 and job1.status == "Stopped"
    assert (first.outcome, first.state) == ("oom", "cancelled")
    assert first.diagnosis.diagnosis.rank == 11 and first.diagnosis.diagnosis.phase == "forward"
    assert any("out of memory" in n and "stopping the job" in n for n in notes), notes
    assert second.job_id == first.job_id.removesuffix("-a1") + "-a2"
    request1, request2 = (fake.jobs[a.job_id].request for a in outcome.attempts)
    assert request1["CheckpointConfig"] == request2["CheckpointConfig"]
    assert request2["Environment"]["LAUNCH_MICRO_BATCH_SIZE"] == "2"
    code_uri = request2["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"]
    plan2 = json.loads(archive(code_uri + "sourcedir.tar.gz", moto)["plan.json"])
    assert (plan2["micro_batch_size"], plan2["grad_accum_steps"]) == (2, 2)


def test_host_oom_is_reported_through_the_failure_reason(tmp_path, aws_env, fake):
    from launcher.failures import explain_lines

    fake.push(host_oom(), host_oom(exit_137=True))
    p = provider(aws_env)
    job_id = p.schedule(p.dryrun(make_job(tmp_path)))
    lines, status = follow(p, job_id)
    assert status.state == "failed" and "OutOfMemoryError" in status.message
    assert lines[-1] == f"[sagemaker] FailureReason: {HOST_OOM_REASON}"
    assert explain_lines(lines, platform="sagemaker").failure == "host_oom"

    job_id = p.schedule(p.dryrun(make_job(tmp_path, attempt=2)))
    lines, status = follow(p, job_id)
    assert (status.state, status.exit_code) == ("failed", 137)
    assert explain_lines(lines, platform="sagemaker").failure == "host_oom"


def test_oom_report_only_in_failure_reason_is_still_an_oom(tmp_path, aws_env, fake):
    fake.push(oom_only_in_failure_reason(rank=0))
    p = provider(aws_env)
    job_id = p.schedule(p.dryrun(make_job(tmp_path)))
    lines, status = follow(p, job_id)
    assert status.state == "failed"
    events = [parse_event(x) for x in lines if parse_event(x)]
    oom = [e for e in events if e["launch"] == "oom"]
    assert len(oom) == 1 and oom[0]["phase"] == "forward"
    assert lines[-1].startswith("[sagemaker] FailureReason: AlgorithmError: {\"launch\": \"oom\"")


def test_throttled_create_is_retried_and_makes_one_job(tmp_path, aws_env, fake):
    fake.throttle("CreateTrainingJob", 2)
    fake.throttle("DescribeTrainingJob", 1)
    p = provider(aws_env)
    job_id = p.schedule(p.dryrun(make_job(tmp_path)))
    assert fake.count("CreateTrainingJob") == 3
    assert [j.name for j in fake.jobs.values()] == [job_id]
    assert p.poll(job_id).state in ("pending", "running", "succeeded")


def test_a_create_whose_answer_was_lost_is_adopted_not_duplicated(tmp_path, aws_env, fake):
    fake.lose_response("CreateTrainingJob", 1)
    p = provider(aws_env)
    job_id = p.schedule(p.dryrun(make_job(tmp_path)))
    # botocore retried the create after the dropped connection; SageMaker said ResourceInUse;
    # the describe showed it is this attempt's job.
    assert fake.count("CreateTrainingJob") == 2
    assert fake.count("DescribeTrainingJob") >= 1
    assert list(fake.jobs) == [job_id]


def test_a_foreign_job_with_the_name_is_not_adopted(tmp_path, aws_env, fake):
    p = provider(aws_env)
    request = p.dryrun(make_job(tmp_path))
    foreign = json.loads(json.dumps(request.kwargs))
    foreign["Environment"]["LAUNCH_RUN_ID"] = "someone-else"
    sagemaker = p._aws().client("sagemaker")
    sagemaker.create_training_job(**foreign)
    with pytest.raises(ProviderError, match="already exists and is not attempt 1"):
        p.schedule(request)


def test_stop_is_idempotent_and_finished_jobs_are_left_alone(tmp_path, aws_env, fake):
    fake.push(cuda_oom(gpus=1, oom_rank=0, hang_s=30), success(steps=1))
    p = provider(aws_env)
    job_id = p.schedule(p.dryrun(make_job(tmp_path)))
    p.stop(job_id)
    p.stop(job_id)
    lines, status = follow(p, job_id)
    assert status.state == "cancelled"
    assert "[sagemaker] Stopped: Training job stopped" in lines
    p.stop(job_id)  # stopped already
    done = p.schedule(p.dryrun(make_job(tmp_path, attempt=2)))
    fake.wait_ended(done)
    p.stop(done)  # completed already
    assert fake.jobs[done].status == "Completed"


def test_missing_bucket_and_role_are_one_line_each(tmp_path, aws_env, fake):
    p = provider(aws_env, bucket="no-such-bucket-here")
    with pytest.raises(ProviderError, match="the S3 bucket no-such-bucket-here does not exist"):
        p.schedule(p.dryrun(make_job(tmp_path)))
    role = f"arn:aws:iam::{ACCOUNT}:role/NoSuchRole"
    p = provider(aws_env, role=role)
    with pytest.raises(ProviderError, match=f"the IAM role {role} does not exist") as caught:
        p.schedule(p.dryrun(make_job(tmp_path)))
    assert caught.value.status == ExitStatus.PROVIDER_ERROR
    assert not fake.jobs


def test_unknown_job_is_a_provider_error(aws_env, fake):
    with pytest.raises(ProviderError, match="no SageMaker training job named launch-nope-a1"):
        provider(aws_env).poll("launch-nope-a1")


def test_logs_survive_paging_dropped_connections_and_reconnects(tmp_path, aws_env, fake, moto,
                                                                 monkeypatch):
    """Two hosts writing while being read, seven events a page, the connection to CloudWatch
    dropped mid-read (past botocore's retries) and the reader replaced by a new process-like
    reader from a JSON copy of the cursor: every line exactly once, in each host's order."""
    proxy = FlakyProxy(moto)
    monkeypatch.setenv("AWS_ENDPOINT_URL_LOGS", proxy.url)
    environ = {**aws_env, "AWS_ENDPOINT_URL_LOGS": proxy.url}
    release = threading.Event()
    fake.push(chatty(lines_per_host=300, pause_every=40, release=release))
    p = provider(environ, log_page_size=7, aws_max_attempts=2, log_read_tps=40)
    job_id = p.schedule(p.dryrun(make_job(tmp_path)))
    lines: list[str] = []
    cursor: Any = None
    rounds = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rounds += 1
        if rounds == 3:
            proxy.drop_next(3)       # more than the 2 attempts: this read fails part way
            proxy.cut()
        if rounds == 5:
            proxy.cut()              # pooled connections die under the reader
            release.set()
        if rounds == 7:              # a new reader, from what the old one saved
            cursor = json.loads(json.dumps(cursor))
            p = provider(environ, log_page_size=7, aws_max_attempts=2, log_read_tps=40)
        status = p.poll(job_id)
        new, cursor = p.logs(job_id, cursor)
        lines += new
        if status.terminal and not new:
            break
        time.sleep(0.01)
    proxy.close()
    assert proxy.dropped >= 3
    assert status.state == "succeeded"
    output = [x for x in lines if not x.startswith("[sagemaker]")]
    for host in ("algo-1", "algo-2"):
        assert [x for x in output if x.startswith(f"[{host}]")] == [
            f"[{host}] {host} line {i}" for i in range(300)]
    assert len(output) == 600


# -- a job that floods its log: the event channel, pacing, how far behind -------------------------

#: Read quotas of a busy account, per second (AWS's defaults are 25 for GetLogEvents and
#: DescribeLogStreams and 5 for FilterLogEvents, shared by everything that reads the account).
BUSY_ACCOUNT = {"GetLogEvents": 10, "DescribeLogStreams": 10, "FilterLogEvents": 5}


def test_the_event_filter_is_the_classifiers_needles_within_cloudwatchs_limit():
    from launcher.failures._rules import RULES
    from launcher.providers.sagemaker import FILTER_PATTERN_MAX, event_filter
    from tests.fakes.sagemaker_server import parse_filter_pattern

    pattern, left_out = event_filter()
    assert len(pattern) <= FILTER_PATTERN_MAX
    any_of, all_of = parse_filter_pattern(pattern)  # the fake's reading of CloudWatch's syntax
    assert not all_of and any_of[0] == "launch" and len(any_of) == len(set(any_of))
    needles = {n if isinstance(n, str) else n[0] for rule in RULES for n in rule.needles}
    assert set(any_of[1:]) <= needles  # no list of its own
    for line in (json.dumps(oom_event(3)), "torch.OutOfMemoryError: CUDA out of memory.",
                 "[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout",
                 "RuntimeError: NCCL communicator was aborted on rank 3"):
        assert any(term in line for term in any_of), line
    assert not any(term in "[rank3]:train 12/1000 |####| 3.20 tok/s" for term in any_of)
    assert left_out  # what did not fit is named (docs/providers/sagemaker.md lists it)


def test_pacer_spends_its_rate_and_backs_off_after_a_throttle():
    from launcher.providers.sagemaker._aws import Pacer

    now = [0.0]
    pacer = Pacer(4.0, burst=2, clock=lambda: now[0])
    assert [pacer.take(), pacer.take()] == [0.0, 0.0]
    assert pacer.take() == pytest.approx(0.25)  # the bucket is empty: one call per 1/rate
    now[0] += 0.25
    assert pacer.take() == 0.0
    pacer.throttled()
    first = pacer.take()
    assert 0.125 <= first <= 0.25
    now[0] += 0.25
    pacer.throttled()  # again: the backoff doubles
    assert 0.25 <= pacer.take() <= 0.5
    now[0] += 1.0
    pacer.succeeded()
    assert pacer.take() == 0.0 and pacer.throttles == 2


@pytest.mark.timing
def test_a_flooding_16_rank_job_is_stopped_within_a_poll_of_its_oom_and_logged_whole(
        tmp_path, aws_env, fake, cloudwatch):
    """16 hosts write 5,000 lines a second through a busy account's read quota (the follower
    pages faster than the quota, so CloudWatch throttles it); rank 11 runs out of memory after
    3 s and the other ranks hang. The supervisor stops the job within one event-channel
    interval + 2 s of the OOM line's write, and the lines it followed are every line each
    host wrote, once, in order."""
    from launcher.runs import Run
    from launcher.spec import Spec
    from launcher.supervisor import Supervisor

    cloudwatch.limits.update(BUSY_ACCOUNT)
    fake.push(flood(lines_per_s=5000, oom_at_s=3.0, oom_rank=11, gpus=1))
    code = tmp_path / "code"
    code.mkdir()
    script = code / "train.py"
    script.write_text(textwrap.dedent(RECIPE))
    run = Run.create(tmp_path / "state", "train", {"provider": "sagemaker"})
    spec = Spec(script=script, mode="recipe", provider="sagemaker", max_attempts=1)
    p = provider(aws_env, api_interval_s=0.5, log_page_size=200, log_read_tps=20)
    lines: list[str] = []
    notes: list[str] = []
    supervisor = Supervisor(p, run, on_line=lines.append, on_note=notes.append,
                            poll_interval_s=0.2)
    start = time.monotonic()
    outcome = supervisor.launch(spec, make_plan(nodes=16, gpus_per_node=1))
    assert time.monotonic() - start < 60

    attempt = outcome.last
    job = fake.jobs[attempt.job_id]
    assert job.oom_logged_at is not None and job.first_stop_at is not None
    latency = job.first_stop_at - job.oom_logged_at
    assert latency > 0  # how soon: bench/bench_cloud_stop.py (the note below says through what)
    record("sagemaker_16_ranks_5000_lines_per_s", stop_after_oom_s=round(latency, 3),
           events_interval_s=p.settings.events_interval_s, flood_lines_per_s=round(job.flood_rate))
    assert job.stop_calls == 1 and job.status == "Stopped"
    assert outcome.status == ExitStatus.OUT_OF_MEMORY
    assert (attempt.outcome, attempt.diagnosis.diagnosis.rank) == ("oom", 11)
    assert cloudwatch.throttled.get("GetLogEvents", 0) > 0  # the quota did bite
    assert cloudwatch.throttled.get("FilterLogEvents", 0) == 0
    # The stop came from the event channel, not from the log, which trailed: the supervisor's
    # note for an OOM found in the log names its cause; the event channel's notes do not.
    oom_notes = [n for n in notes if n.startswith("out of memory")]
    assert len(oom_notes) == 1 and "cause" not in oom_notes[0], notes

    output = [x for x in lines if not x.startswith("[sagemaker]")]
    written = sum(len(v) for v in job.written.values())
    assert len(output) == written == 15_000 + 5  # + the OOM lines
    # The flood shares this interpreter with the follower it floods, so on a busy CI host its
    # last batch lands late (4,480 lines/s once, 3.35 s for 15,000): the check is that it was a
    # flood, more than the busy account lets one reader page (10 GetLogEvents a second of 200
    # lines), not that the host was idle.
    assert job.flood_rate > 3_000, job.flood_rate
    for host, host_lines in job.written.items():
        assert [x for x in output if x.startswith(f"[{host}] ")] == [
            f"[{host}] {x}" for x in host_lines]
    # `launch logs` afterwards (a new reader, same busy account): the same lines, once each.
    again: list[str] = []
    cursor: Any = None
    while True:
        new, cursor = provider(aws_env, log_read_tps=20).logs(attempt.job_id, cursor)
        if not new:
            break
        again += new
    assert sorted(again) == sorted(lines)  # (interleaved across hosts in other places)
    for host in job.written:
        mine = [x for x in again if x.startswith(f"[{host}] ")]
        assert mine == [x for x in lines if x.startswith(f"[{host}] ")]
    print(f"\nstop {latency:.2f} s after the OOM line; {written} lines at "
          f"{job.flood_rate:,.0f}/s read whole; "
          f"CloudWatch calls {cloudwatch.calls}, throttled {cloudwatch.throttled}")


@pytest.mark.timing
def test_behind_reports_how_far_the_full_log_trails_a_flood(tmp_path, aws_env, fake,
                                                            cloudwatch):
    """Reading 500 lines a second of a job writing 5,000: ``behind`` says how far the log read
    trails the job, as the fake's own record of what it wrote when says; the event channel
    meanwhile hands over the OOM event (once) and none of the flood."""
    cloudwatch.limits.update(BUSY_ACCOUNT)
    fake.push(flood(lines_per_s=5000, oom_at_s=4.0, oom_rank=3, gpus=1))
    p = provider(aws_env, log_page_size=100, log_read_tps=5, events_interval_s=0.5)
    job_id = p.schedule(p.dryrun(make_job(tmp_path, make_plan(nodes=4, gpus_per_node=1,
                                                         global_batch_size=16))))
    job = fake.jobs[job_id]
    cursor: Any = None
    event_cursor: Any = None
    events: list[str] = []
    read: dict[str, int] = {}
    samples: list[tuple[float, float]] = []
    deadline = time.monotonic() + 30
    while job.oom_logged_at is None and time.monotonic() < deadline:
        new, cursor = p.logs(job_id, cursor)
        for line in new:
            host = line[1:line.index("]")]
            if host != "sagemaker":
                read[host] = read.get(host, 0) + 1
        lag = p.behind(job_id, cursor)
        now = time.time() * 1000
        truth = [now - (job.stamps[h][read[h] - 1] if read.get(h) else job.stamps[h][0] - 1)
                 for h in list(job.stamps) if len(job.stamps[h]) > read.get(h, 0)]
        if lag is not None and truth:
            samples.append((lag, max(truth) / 1000))
        more, event_cursor = p.events(job_id, event_cursor)
        events += more
    for _ in range(4):  # the OOM event is in by now; ask until it has come
        more, event_cursor = p.events(job_id, event_cursor)
        events += more
        if any((parse_event(x) or {}).get("launch") == "oom" for x in events):
            break
        time.sleep(0.5)
    p.stop(job_id)
    assert len(samples) >= 3
    lag, truth = samples[-1]
    assert truth > 2.0 and abs(lag - truth) < 1.0, samples[-3:]
    assert all(abs(a - b) < 1.0 for a, b in samples[-3:]), samples[-3:]
    assert sum(1 for x in events if (parse_event(x) or {}).get("launch") == "oom") == 1
    assert not any("tok/s" in x for x in events)
    print(f"\nbehind {lag:.1f} s (truth {truth:.1f} s) after {len(samples)} reads")


# -- the job, run for real -------------------------------------------------------------------------


def test_end_to_end_the_fake_runs_the_submitted_job_oom_stop_resubmit_resume(
        tmp_path, aws_env, fake, moto):
    """The request, the package and the template fit together: the fake takes the code from S3
    and runs the job's own command under torchrun on the CPU. Attempt 1 runs out of memory on
    rank 1 for real; the supervisor stops it, halves the micro-batch and resubmits; attempt 2
    downloads attempt 1's checkpoints from S3 and resumes from step 2."""
    from launcher.remedies import replan
    from launcher.runs import Run
    from launcher.spec import Spec
    from launcher.supervisor import Supervisor

    fake.push(execute(), execute())
    code = tmp_path / "code"
    code.mkdir()
    script = code / "train.py"
    script.write_text(textwrap.dedent(RECIPE))
    run = Run.create(tmp_path / "state", "train", {"provider": "sagemaker"})
    spec = Spec(script=script, mode="recipe", provider="sagemaker", max_attempts=2,
                checkpoint_every=1, steps=4, global_batch_size=4)
    plan = Plan(strategy="ddp", machine="ml.g5.12xlarge", nodes=1, gpus_per_node=2,
                micro_batch_size=2, grad_accum_steps=1, global_batch_size=4, precision="fp32",
                optimizer="adamw", activation_checkpointing=False, steps=4, lr=0.01)
    lines: list[str] = []
    supervisor = Supervisor(provider(aws_env), run, on_line=lines.append,
                            on_note=lambda text: None,
                            replan=lambda p, failure: replan(p, failure), poll_interval_s=0.05)
    outcome = supervisor.launch(spec, plan)
    log = "\n".join(lines)
    assert outcome.status == ExitStatus.SUCCESS, log
    first, second = outcome.attempts
    assert first.outcome == "oom" and first.diagnosis.diagnosis.rank == 1, log
    assert first.diagnosis.diagnosis.phase == "forward"
    events = [parse_event(x) for x in lines if parse_event(x)]
    resumed = [e for e in events if e["launch"] == "resume"]
    assert resumed and {e["step"] for e in resumed} == {2}, log
    done = [e for e in events if e["launch"] == "done"]
    assert {e["rank"] for e in done} == {0, 1} and {e["step"] for e in done} == {4}
    assert all(x.startswith(("[sagemaker]", "[algo-1]")) for x in lines)
    assert any("[algo-1] [rank1]:" in x for x in lines)  # torchrun's per-rank prefix, per host
    s3 = moto_client("s3", moto)
    checkpoints = fake.jobs[second.job_id].request["CheckpointConfig"]["S3Uri"]
    prefix = checkpoints.removeprefix(f"s3://{BUCKET}/")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]]
    assert any(k.endswith("step_00000004.pt") for k in keys)


# -- the command line -----------------------------------------------------------------------------


def test_status_logs_and_cancel_of_a_sagemaker_run(tmp_path, aws_env, fake, cli, monkeypatch):
    from launcher.runs import Attempt, Run

    fake.push(cuda_oom(gpus=1, oom_rank=0, hang_s=30))
    p = provider(aws_env)
    job_id = p.schedule(p.dryrun(make_job(tmp_path)))
    settings = {"bucket": BUCKET, "role": ROLE, "region": "us-east-1", "api_interval_s": 0,
                "log_settle_s": 0}
    run = Run.create(tmp_path / "state", "train", {"provider": "sagemaker",
                                                   "script": "train.py", "spec": settings})
    run.save_attempt(Attempt(number=1, plan=make_plan(), job_id=job_id,
                             state="running"))
    deadline = time.monotonic() + 10
    while '"launch": "oom"' not in "".join(fake.jobs[job_id].written.get("algo-1", [])):
        assert time.monotonic() < deadline
        time.sleep(0.02)

    status = cli("status", run.id, "--json")
    assert status.status == 0, status.stderr
    assert status.json()["attempts"][0]["live_state"] == "running"
    logs = cli("logs", run.id, "--raw")
    assert logs.status == 0, logs.stderr
    assert "[sagemaker] Training: Training image download completed." in logs.stdout
    assert '[algo-1] [local_rank0]:{"launch": "oom"' in logs.stdout
    cancel = cli("cancel", run.id, "--json")
    assert cancel.status == 0, cancel.stderr
    assert cancel.json()["cancelled"] == [1]
    assert fake.jobs[job_id].status == "Stopped"
    assert run.attempts()[0].state == "cancelled"


def test_a_launcher_killed_between_create_and_record_is_adopted_by_status(
        tmp_path, aws_env, fake, cli, monkeypatch):
    """The state a crash leaves: the attempt written ahead as ``submitting`` (no job id), the
    job created on SageMaker. `launch status` finds it by its deterministic name and records it;
    an attempt whose job was never created ends as failed, not pending for ever."""
    from launcher.runs import Attempt, Run

    fake.push(cuda_oom(gpus=1, oom_rank=0, hang_s=30))
    settings = {"bucket": BUCKET, "role": ROLE, "region": "us-east-1", "api_interval_s": 0,
                "log_settle_s": 0}
    run = Run.create(tmp_path / "state", "train", {"provider": "sagemaker",
                                                   "script": "train.py", "spec": settings})
    p = provider(aws_env)
    job = make_job(tmp_path, run_id=run.id)
    run.save_attempt(Attempt(number=1, plan=make_plan(), state="submitting"))
    job_id = p.schedule(p.dryrun(job))  # ... and the launcher dies here
    run.save_attempt(Attempt(number=2, plan=make_plan(), state="submitting"))

    assert p.adopt(run.id, 1, job.attempt_dir) == job_id
    status = cli("status", run.id, "--json")
    assert status.status == 0, status.stderr
    first, second = status.json()["attempts"]
    assert first["job_id"] == job_id and first["live_state"] == "running"
    assert second["state"] == "not_submitted" and "never submitted" in second["summary"]["message"]
    assert fake.count("CreateTrainingJob") == 1
    cancel = cli("cancel", run.id, "--json")
    assert cancel.status == 0, cancel.stderr
    assert fake.jobs[job_id].status == "Stopped"


def test_machines_lists_the_sagemaker_catalog(cli):
    result = cli("machines", "--provider", "sagemaker", "--json")
    assert result.status == 0, result.stderr
    names = {m["name"]: m for m in result.json()["machines"]}
    assert names["ml.p4d.24xlarge"]["gpu_count"] == 8
    assert all(m["gpu_count"] >= 1 for m in names.values())


def test_provider_errors_exit_6_through_the_cli(tmp_path, aws_env, fake, cli, monkeypatch):
    from launcher.runs import Attempt, Run

    run = Run.create(tmp_path / "state", "train", {"provider": "sagemaker", "spec": {
        "bucket": BUCKET, "role": ROLE, "region": "us-east-1"}})
    run.save_attempt(Attempt(number=1, plan=make_plan(), job_id="launch-gone-a1", state="running"))
    result = cli("status", run.id)
    assert result.status == 6
    assert "no SageMaker training job named launch-gone-a1" in result.stderr


def test_bootstrap_wires_torchrun_from_sagemakers_cluster_description(tmp_path, monkeypatch):
    """The file the package ships: node rank and master from resourceconfig.json (or the
    toolkit's SM_HOSTS / SM_CURRENT_HOST), one torchrun line per host."""
    import os
    import sys

    from launcher.providers.sagemaker import BOOTSTRAP

    namespace: dict[str, Any] = {"__name__": "launch_sagemaker"}
    exec(compile(BOOTSTRAP, BOOTSTRAP_NAME, "exec"), namespace)
    calls: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append(argv))
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    config = tmp_path / "resourceconfig.json"
    config.write_text(json.dumps({"current_host": "algo-2", "network_interface_name": "eth0",
                                  "hosts": ["algo-10", "algo-2", "algo-1"] + [
                                      f"algo-{i}" for i in range(3, 10)]}))
    argv = ["launch_sagemaker.py", "--nproc-per-node", "8", "--resource-config", str(config),
            "--master-port", "29500", "launch_train.py"]
    monkeypatch.setattr(sys, "argv", argv)
    namespace["main"]()
    assert calls[-1][1:] == [
        "-m", "torch.distributed.run", "--nproc_per_node", "8", "--nnodes", "10",
        "--node_rank", "1", "--master_addr", "algo-1", "--master_port", "29500",
        "--role", "local_rank", "--tee", "3", "launch_train.py"]
    assert os.environ["NCCL_SOCKET_IFNAME"] == "eth0"
    # Started by the SageMaker training toolkit instead: its variables say the same.
    monkeypatch.setattr(sys, "argv", [*argv[:4], str(tmp_path / "absent.json"), *argv[5:]])
    monkeypatch.setenv("SM_HOSTS", '["algo-1"]')
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-1")
    namespace["main"]()
    assert calls[-1][1:] == ["-m", "torch.distributed.run", "--nproc_per_node", "8",
                             "--standalone", "--role", "rank", "--tee", "3", "launch_train.py"]
    # The script's own arguments, after it, reach torchrun as they are (its own options too).
    mine = ["--train_file", "data with spaces.txt", "--nproc-per-node", "2", "--lr=3e-4", "-h"]
    monkeypatch.setattr(sys, "argv", [*sys.argv, *mine])
    namespace["main"]()
    assert calls[-1][-7:] == ["launch_train.py", *mine]


def test_logs_of_a_finished_job_come_whole_in_one_read(tmp_path, aws_env, fake):
    """`launch logs RUN` reads once: a finished job's output, its last status and its
    FailureReason all come in that one read, in order, and nothing after."""
    fake.push(host_oom())
    p = provider(aws_env, log_settle_s=5)
    job_id = p.schedule(p.dryrun(make_job(tmp_path)))
    fake.wait_ended(job_id)
    with fake.lock:  # as if it had ended two minutes ago: no waiting for late lines
        fake.jobs[job_id].end_time = time.time() - 120
    start = time.monotonic()
    lines, cursor = provider(aws_env, log_settle_s=5).logs(job_id)
    assert time.monotonic() - start < 4
    assert lines[-2:] == ["[sagemaker] Failed: Training job failed",
                          f"[sagemaker] FailureReason: {HOST_OOM_REASON}"]
    assert sum(1 for x in lines if x.startswith("[algo-1]")) == 4
    assert p.logs(job_id, cursor)[0] == []


# -- --timeout, and status calls against an endpoint that never answers ----------------------------


def test_timeout_sets_max_runtime_and_spot_waits_at_least_as_long(tmp_path):
    job = make_job(tmp_path, make_plan(cost_per_hour_usd=None))
    stopping = provider({}, timeout="90m").dryrun(job).kwargs["StoppingCondition"]
    assert stopping == {"MaxRuntimeInSeconds": 5400}
    spot = provider({}, timeout="12h", spot=True).dryrun(job).kwargs
    assert spot["StoppingCondition"] == {"MaxRuntimeInSeconds": 43200,
                                         "MaxWaitTimeInSeconds": 86400}
    botocore.validate.validate_parameters(spot, create_shape())
    # --timeout wins over a max_run_s from the config file; a max_wait_s below it is refused.
    assert provider({}, timeout="2d", max_run_s=600).dryrun(job).kwargs[
        "StoppingCondition"] == {"MaxRuntimeInSeconds": 172800}
    assert provider({}, timeout=7200, spot=True, max_wait_s=7200).dryrun(job).kwargs[
        "StoppingCondition"] == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 7200}
    with pytest.raises(UsageError, match=r"max_wait_s \(3600\) must be at least"):
        provider({}, timeout="2h", spot=True, max_wait_s=3600)
    # The budget still caps it: $22 at $43.92 an hour is about half an hour.
    capped = provider({}, timeout="12h", budget=22.0).dryrun(make_job(tmp_path))
    assert capped.kwargs["StoppingCondition"] == {"MaxRuntimeInSeconds": 1803}


def test_timeout_reaches_sagemaker(tmp_path, aws_env, fake):
    fake.push(success(steps=1))
    p = provider(aws_env, timeout="90m", spot=True)
    job_id = p.schedule(p.dryrun(make_job(tmp_path)))
    assert fake.jobs[job_id].request["StoppingCondition"] == {
        "MaxRuntimeInSeconds": 5400, "MaxWaitTimeInSeconds": 10800}
    assert fake.jobs[job_id].describe()["StoppingCondition"]["MaxRuntimeInSeconds"] == 5400


def test_plan_shows_the_timeout_in_the_request(cli, tiny_recipe):
    result = cli("plan", str(tiny_recipe), "--provider", "sagemaker", "--json",
                 "--machine", "ml.g5.xlarge", "--region", "us-east-1", "--bucket", BUCKET,
                 "--role", ROLE, "--timeout", "90m",
                 environ={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                          "AWS_EC2_METADATA_DISABLED": "true"})
    assert result.status == 0, result.stderr
    stopping = result.json()["request"]["create_training_job"]["StoppingCondition"]
    assert stopping == {"MaxRuntimeInSeconds": 5400}


@pytest.mark.parametrize("value", ["soon", "0", "29d", "-1h", "1.5 weeks"])
def test_a_bad_timeout_is_one_line_exit_2(cli, tiny_recipe, value):
    result = cli("plan", str(tiny_recipe), "--provider", "sagemaker", "--region", "us-east-1",
                 "--timeout", value, "--json")
    assert result.status == ExitStatus.USAGE == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("launch: error: ")
    assert f"--timeout {value!r}" in result.stderr and "Traceback" not in result.stderr


def _silent_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str,
                **settings: Any) -> tuple[Any, dict[str, str]]:
    from launcher.runs import Attempt, Run

    environ = isolated_aws_env(monkeypatch, tmp_path, AWS_ACCESS_KEY_ID="testing",
                               AWS_SECRET_ACCESS_KEY="testing-secret-value",
                               AWS_ENDPOINT_URL=endpoint)
    run = Run.create(tmp_path / "state", "train", {"provider": "sagemaker", "spec": {
        "bucket": BUCKET, "role": ROLE, "region": "us-east-1", **settings}})
    run.save_attempt(Attempt(number=1, plan=make_plan(), job_id="launch-silent-a1",
                             state="running"))
    return run, environ


def test_status_against_an_endpoint_that_never_answers_ends_within_the_deadline(
        tmp_path, cli, monkeypatch):
    """The endpoint takes the connection and never answers. With the long timeouts of uploads
    (six tries of a 60 s read) `launch status` took 7 minutes; status reads have their own
    deadline (12 s by default; 2 s here to keep the test short) and fail in one line, exit 6."""
    from tests.fakes.silent import silent_endpoint

    with silent_endpoint() as (host, port):
        run, environ = _silent_run(tmp_path, monkeypatch, f"http://{host}:{port}",
                                   aws_status_deadline_s=2)
        start = time.monotonic()
        result = cli("status", run.id, environ=environ)
        elapsed = time.monotonic() - start
    assert result.status == ExitStatus.PROVIDER_ERROR == 6, result.stderr
    assert elapsed < 15
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("launch: error: ")
    assert f"http://{host}:{port} did not answer" in result.stderr
    assert "describing training job launch-silent-a1" in result.stderr


def test_a_silent_endpoint_while_following_keeps_the_last_state(tmp_path, monkeypatch):
    """The supervisor's poll: the last answer stands in (the job has not moved backwards), and
    a log read that gets no answer returns what it has, both within the deadline."""
    from launcher.providers.sagemaker._aws import ClientSettings, Unanswered, call_within
    from tests.fakes.silent import silent_endpoint

    with silent_endpoint() as (host, port):
        _run, environ = _silent_run(tmp_path, monkeypatch, f"http://{host}:{port}")
        p = provider(environ, aws_status_deadline_s=1)
        p._described["launch-silent-a1"] = (time.monotonic() - 60, {
            "TrainingJobStatus": "InProgress", "SecondaryStatus": "Training"})
        start = time.monotonic()
        assert p.poll("launch-silent-a1").state == "running"
        lines, _cursor = p.logs("launch-silent-a1")
        assert lines == [] and time.monotonic() - start < 15
        with pytest.raises(ProviderError, match="did not answer") as caught:
            p.poll("launch-other-a1")  # nothing to stand in
        assert caught.value.status == ExitStatus.PROVIDER_ERROR
    # The deadline holds whatever the call does (a trickling answer, a stuck DNS lookup).
    start = time.monotonic()
    with pytest.raises(Unanswered, match="did not answer within 0.2 s"):
        call_within(0.2, lambda: time.sleep(5), "http://example.invalid")
    assert time.monotonic() - start < 1
    with pytest.raises(KeyError):
        call_within(1, lambda: {}["x"], "http://example.invalid")
    # The defaults: two tries of a third of the deadline each, the deadline under 15 s.
    settings = ClientSettings()
    status = settings.for_status()
    assert settings.status_deadline_s < 15 and status.max_attempts == 2
    assert status.max_attempts * status.read_timeout_s < settings.status_deadline_s
    assert (settings.max_attempts, settings.read_timeout_s) == (6, 60.0)  # uploads keep theirs


def test_the_container_refuses_a_code_archive_changed_in_the_bucket(tmp_path):
    """Jobs may write to the bucket; the container checks the archive against the hash the job
    was created with before it runs anything from it (the real entry shell, run by /bin/sh)."""
    import subprocess

    from launcher.providers.sagemaker import ENTRY_SHELL

    request = provider().dryrun(make_job(tmp_path))
    spec = request.kwargs["AlgorithmSpecification"]
    archive = tmp_path / "sourcedir.tar.gz"
    archive.write_bytes(request.package.data)
    args = [str(archive), str(tmp_path / "code-out"), *spec["ContainerArguments"][2:3],
            "sh", "-c", "ls launch_train.py"]
    ok = subprocess.run(["/bin/sh", "-c", ENTRY_SHELL, "launch", *args], capture_output=True,
                        text=True, check=False)
    assert ok.returncode == 0 and ok.stdout.strip() == "launch_train.py", ok.stderr
    archive.write_bytes(request.package.data[:-8] + b"tampered")
    bad = subprocess.run(["/bin/sh", "-c", ENTRY_SHELL, "launch", *args], capture_output=True,
                         text=True, check=False)
    assert bad.returncode != 0 and "not the archive this job was created with" in bad.stderr


SCRIPT_ARGS = ["--train_file", "data with spaces.txt", "--lr=3e-4", "$HOME", "it's"]


def test_the_script_s_own_arguments_follow_it_in_the_container_arguments(cli, write_script):
    """`launch plan --provider sagemaker SCRIPT -- ARGS`: one ContainerArguments element each,
    after the script (the entry shell's quoted "$@" hands them on unexpanded), within what
    CreateTrainingJob accepts; what it or torchrun would refuse is one line before any request."""
    script = write_script("print('hi')\n")
    settings = ["--params", "1M", "--provider", "sagemaker", "--region", "us-east-1",
                "--bucket", BUCKET, "--role", ROLE, "--machine", "ml.g5.xlarge", "--json"]
    environ = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_EC2_METADATA_DISABLED": "true"}
    result = cli("plan", str(script), *settings, "--", *SCRIPT_ARGS, environ=environ)
    assert result.status == 0, result.stderr
    kwargs = result.json()["request"]["create_training_job"]
    botocore.validate.validate_parameters(kwargs, create_shape())
    arguments = kwargs["AlgorithmSpecification"]["ContainerArguments"]
    assert arguments[-6:] == ["train.py", *SCRIPT_ARGS]
    assert "data with spaces.txt" not in json.dumps(kwargs["HyperParameters"])
    for args, words in ((["x" * 257], "is 257 characters; SageMaker allows 256"),
                        (["two\nlines"], "holds a line break"),
                        (["-v"] * 89, "89 script arguments are too many for SageMaker"),
                        (["--", "x"], "hold a bare --"),
                        (["--rdzv", "x"], "abbreviates torchrun's own --rdzv-backend")):
        refused = cli("plan", str(script), *settings, "--", *args, environ=environ)
        assert refused.status == ExitStatus.USAGE, (args, refused.stderr)
        assert refused.stderr.count("\n") == 1 and words in refused.stderr, refused.stderr
    assert cli("plan", str(script), *settings, "--", *["-v"] * 88,
               environ=environ).status == 0  # 12 of launch's own and 88: the 100 allowed
