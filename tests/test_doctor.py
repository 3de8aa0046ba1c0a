"""`launch doctor` against the loopback servers of the provider tests, driven by the real clients.

AWS: moto's server (STS, S3, IAM roles), started with the SageMaker tests' helper; IAM's
SimulatePrincipalPolicy and Service Quotas, which moto does not serve, by tests/infra/loopback.py
(the simulation evaluates the launcher policy of infra/aws itself). GCP: the Vertex AI fake
(JobService and Cloud Logging) and gcp-storage-emulator, from the Vertex tests' fixtures, and a
Cloud Quotas fake. Where a server lacks an API (moto and simulation or quotas), the check must
degrade to a warning, and that is tested too.
"""

from __future__ import annotations

import io
import json
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from launcher.doctor import DoctorReport, print_report, run_doctor
from launcher.providers.sagemaker.sdk import sdk_version
from launcher.status import ExitStatus, UsageError
from tests.fakes.sagemaker_server import (
    isolated_aws_env,
    moto_client,
    no_aws_credentials,
    start_moto,
)
from tests.infra.cases import aws_module, output
from tests.infra.loopback import CloudQuotas, GoogleIam, IamWithSimulation, ServiceQuotas
from tests.providers.test_vertex import (  # noqa: F401 (fixtures)
    PROJECT,
    REGION,
    fake,
    storage,
    storage_emulator,
    vertex_env,
)

ACCESS_KEY = "AKIADOCTORTEST000001"
SECRET_KEY = "doctor-secret-never-printed-0123456789"
TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"},
    "Action": "sts:AssumeRole"}]}


def printed(report: DoctorReport) -> str:
    out = io.StringIO()
    print_report(report, out)
    return out.getvalue()


def statuses(report: DoctorReport) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


# -- SageMaker ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto() -> Any:
    """moto's server. Not the SageMaker tests' fixture of that name: moto keeps its state per
    process, not per server, and that fixture creates a role that then already exists."""
    server, endpoint = start_moto()
    yield endpoint
    server.stop()


def _create(call: Any, **kwargs: Any) -> None:
    """Create, unless an earlier module of this process already did (moto's state is global)."""
    try:
        call(**kwargs)
    except Exception as exc:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        if code not in ("EntityAlreadyExists", "BucketAlreadyOwnedByYou",
                        "BucketAlreadyExists"):
            raise


@pytest.fixture(scope="module")
def terraform() -> Any:
    """infra/aws as applied in moto's account: the bucket, the role and the launcher policy."""
    return aws_module("us-east-1")


@pytest.fixture(scope="module")
def account(moto: str, terraform: Any) -> dict[str, str]:
    """What `terraform apply` of infra/aws creates, created in moto."""
    bucket, role = output(terraform, "bucket"), output(terraform, "role")
    _create(moto_client("s3", moto).create_bucket, Bucket=bucket)
    iam = moto_client("iam", moto)
    _create(iam.create_role, RoleName=role.rsplit("/", 1)[-1],
            AssumeRolePolicyDocument=json.dumps(TRUST))
    _create(iam.create_role, RoleName="NotForSageMaker", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole"}]}))
    _create(moto_client("s3", moto, "eu-west-1").create_bucket,
            Bucket="launch-doctor-in-ireland",
            CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return {"bucket": bucket, "role": role, "region": "us-east-1"}


@pytest.fixture
def aws_env(moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return isolated_aws_env(monkeypatch, tmp_path, AWS_ACCESS_KEY_ID=ACCESS_KEY,
                            AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_ENDPOINT_URL=moto)


@pytest.fixture
def simulation(moto: str, terraform: Any) -> Any:
    server = IamWithSimulation(moto, lambda principal: terraform.policy_document("launcher"))
    yield server
    server.close()


@pytest.fixture
def quotas() -> Any:
    server = ServiceQuotas({"ml.g5.xlarge for training job usage": 2,
                            "ml.p4d.24xlarge for training job usage": 0,
                            "ml.p5.48xlarge for training job usage": 1,
                            "ml.m5.xlarge for training job usage": 20})
    yield server
    server.close()


def test_sagemaker_ready_with_the_terraform_policy(account: dict[str, str],
                                                   aws_env: dict[str, str], simulation: Any,
                                                   quotas: Any) -> None:
    environ = {**aws_env, "AWS_ENDPOINT_URL_IAM": simulation.url,
               "AWS_ENDPOINT_URL_SERVICE_QUOTAS": quotas.url}
    report = run_doctor("sagemaker", {"bucket": account["bucket"], "role": account["role"]},
                        environ)
    assert statuses(report) == {
        "region": "ok", "credentials": "ok", "image": "ok", "identity": "ok", "bucket": "ok",
        "bucket write": "ok", "role": "ok", "permissions": "ok", "quota": "ok"}, printed(report)
    assert report.exit_status == ExitStatus.SUCCESS
    assert "AWS_ACCESS_KEY_ID" in report.check("credentials").detail  # the name, not the key
    # The image the SDK (sagemaker-core's image_uris) names for the region, and where from.
    assert report.check("image").detail == ("763104351884.dkr.ecr.us-east-1.amazonaws.com/"
                                            "pytorch-training:2.8.0-gpu-py312 (from "
                                            f"{sdk_version()})")
    assert "ml.g5.xlarge 2" in report.check("quota").detail
    assert "ml.p4d.24xlarge" not in report.check("quota").detail  # 0: not allowed
    assert "ml.m5.xlarge" not in report.check("quota").detail  # no GPU
    # IAM was asked about the caller, for every action the launcher uses, with PassRole to
    # SageMaker: the Terraform policy allows them all.
    simulated = [c for c in simulation.calls if c[0] == "SimulatePrincipalPolicy"]
    assert {arn for _, arn in simulated} == {"arn:aws:iam::123456789012:user/moto"}
    assert "iam:PassRole on " + account["role"] in report.check("permissions").needs
    text = printed(report) + json.dumps(report.to_dict())
    assert SECRET_KEY not in text and ACCESS_KEY not in text
    # The probe was removed again.
    listing = moto_client("s3", aws_env["AWS_ENDPOINT_URL"]).list_objects_v2(
        Bucket=account["bucket"], Prefix="launch/.launch-doctor/")
    assert listing.get("KeyCount", 0) == 0


def test_sagemaker_names_a_missing_permission_and_the_fix(account: dict[str, str],
                                                          aws_env: dict[str, str], moto: str,
                                                          terraform: Any) -> None:
    without_pass_role = [s for s in terraform.policy_document("launcher")
                         if "iam:PassRole" not in s.get("actions", [])]
    server = IamWithSimulation(moto, lambda principal: without_pass_role)
    try:
        report = run_doctor("sagemaker", {"bucket": account["bucket"], "role": account["role"]},
                            {**aws_env, "AWS_ENDPOINT_URL_IAM": server.url})
    finally:
        server.close()
    check = report.check("permissions")
    assert check.status == "fail"
    assert check.needs == (f"iam:PassRole on {account['role']}",)
    assert "launcher_policy_arn" in check.fix
    assert report.exit_status == ExitStatus.PROVIDER_ERROR == 6
    assert "fix: attach the launcher policy" in printed(report)


def test_sagemaker_degrades_to_warnings_where_moto_has_no_simulation_or_quotas(
        account: dict[str, str], aws_env: dict[str, str]) -> None:
    report = run_doctor("sagemaker", {"bucket": account["bucket"], "role": account["role"]},
                        aws_env)
    assert report.check("permissions").status == "warn"
    assert "iam:SimulatePrincipalPolicy" in report.check("permissions").needs[0]
    assert report.check("quota").status == "warn"
    assert "servicequotas:ListServiceQuotas" in report.check("quota").fix
    assert not report.failed
    assert report.exit_status == ExitStatus.SUCCESS


def test_sagemaker_quota_of_the_chosen_machine(account: dict[str, str], aws_env: dict[str, str],
                                               quotas: Any) -> None:
    environ = {**aws_env, "AWS_ENDPOINT_URL_SERVICE_QUOTAS": quotas.url}
    settings = {"bucket": account["bucket"], "role": account["role"]}
    zero = run_doctor("sagemaker", {**settings, "machine": "ml.p4d.24xlarge"}, environ)
    assert zero.check("quota").status == "fail"
    assert "request an increase" in zero.check("quota").fix
    one = run_doctor("sagemaker", {**settings, "machine": "ml.p5.48xlarge"}, environ)
    assert one.check("quota").status == "ok"


def test_sagemaker_bucket_and_role_problems(account: dict[str, str],
                                            aws_env: dict[str, str]) -> None:
    missing = run_doctor("sagemaker", {"bucket": "no-such-launch-bucket",
                                       "role": "arn:aws:iam::123456789012:role/NotForSageMaker"},
                         aws_env)
    assert missing.check("bucket").status == "fail"
    assert "does not exist" in missing.check("bucket").detail
    assert "infra/aws" in missing.check("bucket").fix
    assert missing.check("bucket write").status == "skip"
    assert missing.check("role").status == "fail"
    assert "sagemaker.amazonaws.com" in missing.check("role").fix
    elsewhere = run_doctor("sagemaker", {"bucket": "launch-doctor-in-ireland",
                                         "role": "arn:aws:iam::123456789012:role/Nope"}, aws_env)
    assert elsewhere.check("bucket").status == "fail"
    assert "eu-west-1" in elsewhere.check("bucket").detail
    assert elsewhere.check("role").status == "fail"
    assert "does not exist" in elsewhere.check("role").detail
    unset = run_doctor("sagemaker", {}, aws_env)
    assert unset.check("bucket").status == unset.check("role").status == "fail"
    assert "--bucket" in unset.check("bucket").fix and "--role" in unset.check("role").fix
    assert "terraform output" in unset.check("role").fix


def test_sagemaker_without_credentials_fails_within_two_seconds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blackhole = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    environ = no_aws_credentials(monkeypatch, tmp_path, blackhole.getsockname()[1])
    start = time.monotonic()
    try:
        # The image is pinned: the default one is looked up with the SageMaker SDK, whose
        # import alone takes 1.3-1.5 s on a slow 2-core VM, and what is timed here is the
        # credential chain, which must not wait on an instance-metadata endpoint.
        report = run_doctor("sagemaker", {
            "region": "us-east-1", "bucket": "b-launch",
            "role": "arn:aws:iam::123456789012:role/R",
            "image": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1"},
            environ)
    finally:
        blackhole.close()
    assert time.monotonic() - start < 2.0
    assert report.check("credentials").status == "fail"
    assert "AWS_PROFILE" in report.check("credentials").fix
    assert report.check("identity").status == "skip"
    assert report.exit_status == ExitStatus.PROVIDER_ERROR


def test_sagemaker_without_region(tmp_path: Path, aws_env: dict[str, str]) -> None:
    environ = {k: v for k, v in aws_env.items() if k != "AWS_REGION"}
    report = run_doctor("sagemaker", {"bucket": "b-launch"}, environ)
    assert report.check("region").status == "fail"
    assert "--region" in report.check("region").fix
    assert report.check("permissions").status == "skip"


def test_bad_usage_is_exit_2_before_anything_is_checked() -> None:
    with pytest.raises(UsageError) as caught:
        run_doctor("local", {}, {})
    assert caught.value.status == ExitStatus.USAGE == 2
    with pytest.raises(UsageError):
        run_doctor("sagemaker", {"role": "SageMakerRole"}, {})  # not an ARN
    with pytest.raises(UsageError):
        run_doctor("vertex", {"bucket": "gs://Not_A_Bucket"}, {})
    with pytest.raises(UsageError):
        run_doctor("vertex", {"service_account": "jobs"}, {})


# -- Vertex AI ---------------------------------------------------------------------------------


@pytest.fixture
def gcs_bucket(storage: Any) -> str:  # noqa: F811
    name = f"launch-doctor-{uuid.uuid4().hex[:8]}"
    storage.create_bucket(name, location=REGION)
    return name


@pytest.fixture
def cloud_quotas() -> Any:
    server = CloudQuotas(PROJECT, {
        "custom_model_training_nvidia_a100_gpus": {REGION: 16, "europe-west4": 8},
        "custom_model_training_nvidia_h100_gpus": {REGION: 0},
        "custom_model_training_nvidia_t4_gpus": {REGION: 4},
    })
    yield server
    server.close()


def vertex_settings(bucket: str) -> dict[str, str]:
    return {"project": PROJECT, "region": REGION, "bucket": f"gs://{bucket}/launch",
            "service_account": f"launch-jobs@{PROJECT}.iam.gserviceaccount.com"}


def test_vertex_ready(fake: Any, storage_emulator: str, gcs_bucket: str,  # noqa: F811
                      cloud_quotas: Any) -> None:
    environ = {**vertex_env(fake, storage_emulator), "LAUNCH_QUOTAS_ENDPOINT": cloud_quotas.url}
    report = run_doctor("vertex", vertex_settings(gcs_bucket), environ)
    found = statuses(report)
    # gcp-storage-emulator makes every bucket a US multi-region one without uniform access or
    # public access prevention: the doctor says so, as a warning.
    assert found.pop("bucket") == "warn", printed(report)
    assert "it is in us, the jobs run in us-central1" in report.check("bucket").detail
    assert set(found.values()) == {"ok"}, printed(report)
    assert report.exit_status == ExitStatus.SUCCESS
    assert fake.calls_to("ListCustomJobs") and fake.calls_to("ListLogEntries")
    assert "nvidia_a100_gpus 16" in report.check("quota").detail
    assert "h100" not in report.check("quota").detail
    assert len(cloud_quotas.calls) == 3  # every page read


def test_vertex_quota_of_the_chosen_machine(fake: Any, storage_emulator: str,  # noqa: F811
                                            gcs_bucket: str, cloud_quotas: Any) -> None:
    environ = {**vertex_env(fake, storage_emulator), "LAUNCH_QUOTAS_ENDPOINT": cloud_quotas.url}
    settings = vertex_settings(gcs_bucket)
    h100 = run_doctor("vertex", {**settings, "machine": "a3-highgpu-8g"}, environ)
    assert h100.check("quota").status == "fail", printed(h100)
    assert "a3-highgpu-8g node needs 8" in h100.check("quota").detail
    a100 = run_doctor("vertex", {**settings, "machine": "a2-highgpu-8g"}, environ)
    assert a100.check("quota").status == "ok", printed(a100)


def test_vertex_failures_say_how_to_fix(fake: Any, storage_emulator: str,  # noqa: F811
                                        gcs_bucket: str) -> None:
    from tests.fakes.vertex_server import Fault

    fake.faults.append(Fault("ListCustomJobs", "PERMISSION_DENIED", False,
                             "Vertex AI API has not been used in project launch-test before or "
                             "it is disabled (SERVICE_DISABLED)"))
    fake.fail_next("ListLogEntries", "PERMISSION_DENIED")
    environ = vertex_env(fake, storage_emulator)
    report = run_doctor("vertex", {**vertex_settings(gcs_bucket), "service_account": None},
                        environ)
    jobs = report.check("custom jobs")
    assert jobs.status == "fail"
    assert "gcloud services enable aiplatform.googleapis.com" in jobs.fix
    logs = report.check("logs")
    assert logs.status == "fail"
    assert "logging.logEntries.list" in logs.needs[0]
    assert report.check("service account").status == "warn"
    assert report.check("quota").status == "warn"  # loopback endpoints, no quota endpoint
    assert report.exit_status == ExitStatus.PROVIDER_ERROR
    missing = run_doctor("vertex", vertex_settings("no-such-bucket-here"), environ)
    assert missing.check("bucket").status == "fail"
    assert "gcloud storage buckets create gs://no-such-bucket-here" in missing.check("bucket").fix


def test_vertex_may_the_caller_act_as_the_jobs_account(fake: Any, storage_emulator: str,  # noqa: F811
                                                      gcs_bucket: str) -> None:
    settings = vertex_settings(gcs_bucket)
    account = settings["service_account"]
    iam = GoogleIam({account: {"iam.serviceAccounts.actAs"},
                     f"other@{PROJECT}.iam.gserviceaccount.com": set()})
    try:
        environ = {**vertex_env(fake, storage_emulator), "LAUNCH_IAM_ENDPOINT": iam.url}
        allowed = run_doctor("vertex", settings, environ)
        denied = run_doctor("vertex", {**settings, "service_account":
                                       f"other@{PROJECT}.iam.gserviceaccount.com"}, environ)
        missing = run_doctor("vertex", {**settings, "service_account":
                                        f"gone@{PROJECT}.iam.gserviceaccount.com"}, environ)
    finally:
        iam.close()
    assert allowed.check("service account").status == "ok"
    assert "you may act as it" in allowed.check("service account").detail
    assert denied.check("service account").status == "fail"
    assert "launcher_roles" in denied.check("service account").fix
    assert denied.check("service account").needs == (
        f"iam.serviceAccounts.actAs on other@{PROJECT}.iam.gserviceaccount.com",)
    assert missing.check("service account").status == "fail"
    assert "does not exist" in missing.check("service account").detail


def test_vertex_quota_denied_is_a_warning(fake: Any, storage_emulator: str,  # noqa: F811
                                          gcs_bucket: str) -> None:
    denied = CloudQuotas(PROJECT, {}, status=403)
    try:
        environ = {**vertex_env(fake, storage_emulator), "LAUNCH_QUOTAS_ENDPOINT": denied.url}
        report = run_doctor("vertex", vertex_settings(gcs_bucket), environ)
    finally:
        denied.close()
    quota = report.check("quota")
    assert quota.status == "warn"
    assert "cloudquotas.quotas.get" in quota.detail and "roles/cloudquotas.viewer" in quota.fix
    assert report.exit_status == ExitStatus.SUCCESS


def test_vertex_missing_settings(fake: Any, storage_emulator: str) -> None:  # noqa: F811
    report = run_doctor("vertex", {}, vertex_env(fake, storage_emulator))
    assert report.check("project").status == "fail"
    assert "--project" in report.check("project").fix
    assert report.check("region").status == "fail"
    assert report.check("custom jobs").status == "skip"
    with_env = run_doctor("vertex", {}, {**vertex_env(fake, storage_emulator),
                                         "GOOGLE_CLOUD_PROJECT": PROJECT,
                                         "LAUNCH_REGION": REGION})
    assert with_env.check("project").detail == f"{PROJECT} (from GOOGLE_CLOUD_PROJECT)"
    assert with_env.check("bucket").status == "fail"  # none given
    assert "--bucket" in with_env.check("bucket").fix


def test_vertex_without_credentials_fails_within_two_seconds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("HOME", str(tmp_path))
    start = time.monotonic()
    report = run_doctor("vertex", {"project": "p", "region": REGION, "bucket": "b-launch"}, {})
    assert time.monotonic() - start < 2.0
    assert report.check("credentials").status == "fail"
    assert "gcloud auth application-default login" in report.check("credentials").fix
    assert report.check("custom jobs").status == "skip"
    missing_key = run_doctor("vertex", {"project": "p", "region": REGION},
                             {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "key.json")})
    assert "key.json" in missing_key.check("credentials").detail


# -- printing and the command line -------------------------------------------------------------


def test_report_json_and_text(account: dict[str, str], aws_env: dict[str, str]) -> None:
    report = run_doctor("sagemaker", {"bucket": "no-such-launch-bucket",
                                      "role": account["role"]}, aws_env)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False and data["exit_status"] == 6
    assert {c["name"] for c in data["checks"]} >= {"credentials", "bucket", "role"}
    text = printed(report)
    assert "FAIL  bucket" in text and "fix: create it" in text
    assert text.rstrip().endswith("(exit 6)")


def test_cli_doctor_command(cli: Any, account: dict[str, str], aws_env: dict[str, str]) -> None:
    """`launch doctor` once the command is wired into launcher/cli.py (see docs/infra.md)."""
    from launcher.cli import cli as group

    if "doctor" not in group.commands:
        pytest.skip("the doctor command is not wired into launcher/cli.py yet")
    result = cli("doctor", "--provider", "sagemaker", "--bucket", account["bucket"],
                 "--role", account["role"], "--json", environ=aws_env)
    assert result.status == 0, result.stderr
    assert result.json()["ok"] is True
    bad = cli("doctor", "--provider", "local", environ=aws_env)
    assert bad.status == 2
