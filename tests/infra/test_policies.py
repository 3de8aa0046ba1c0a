"""The Terraform in infra/ allows every cloud API call the launcher makes, on the resources it makes
it on, and nothing the code does not need.

The calls are read from the provider code and the doctor (tests/infra/derive.py: boto3 client
calls mapped through botocore's service models; Google client methods through a documented
table that must cover every one found); the resources from the providers' real dry-run requests
built with the settings the modules' outputs give. The policies are the modules themselves,
parsed with python-hcl2 and evaluated (tests/infra/hcl.py), then judged by an IAM evaluator
(tests/infra/iam.py) or by the GCP bindings and roles.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("hcl2")

from launcher.providers.sagemaker import LOG_GROUP, SageMakerSettings  # noqa: E402
from launcher.providers.sagemaker import doctor as sagemaker_doctor  # noqa: E402
from launcher.providers.vertex import doctor as vertex_doctor  # noqa: E402
from tests.infra import derive  # noqa: E402
from tests.infra.cases import (  # noqa: E402
    ACCOUNT,
    aws_module,
    gcp_bindings,
    gcp_custom_roles,
    gcp_module,
    output,
    partition_of,
    sagemaker_request,
    vertex_request,
)
from tests.infra.iam import Request, decide, granted_actions  # noqa: E402

#: Regions with the three kinds of image registry: the common account with SMP v2, a region
#: with its own registry and no SMP v2, and the China partition.
REGIONS = ("us-east-1", "ap-east-1", "cn-north-1")
USER = "alice"


# -- AWS: what the launcher calls --------------------------------------------------------------


def test_every_aws_call_in_the_code_maps_to_a_known_action() -> None:
    actions, problems = derive.aws_actions()
    assert not problems, problems
    by_module = {a.module for a in actions}
    assert {"sagemaker", "doctor"} <= by_module  # the scanner sees both
    assert "sagemaker:CreateTrainingJob" in {a.action for a in actions}


def test_the_doctor_checks_exactly_the_actions_the_provider_uses(tmp_path: Path) -> None:
    """SAGEMAKER_NEEDS (what `launch doctor` simulates) = the provider's calls + its request."""
    actions, _ = derive.aws_actions(derive.AWS_MODULES[:3])
    request = sagemaker_request(aws_module(), "us-east-1", tmp_path)
    implied = derive.request_actions("sagemaker", "CreateTrainingJob", request.kwargs,
                                     "sagemaker")
    derived = {(a.action, a.resource) for a in actions + implied}
    declared = {(n.permission, n.on) for n in sagemaker_doctor.SAGEMAKER_NEEDS}
    assert declared == derived


def _launcher_requests(ev: Any, region: str, tmp_path: Path, strategy: str = "ddp"
                       ) -> list[Request]:
    """Every call the launcher and the doctor make, on the resources a launch uses."""
    request = sagemaker_request(ev, region, tmp_path, strategy)
    kwargs = request.kwargs
    partition = partition_of(region)
    bucket, prefix = output(ev, "bucket"), output(ev, "s3_prefix")
    group = f"arn:{partition}:logs:{region}:{ACCOUNT}:log-group:{LOG_GROUP}"
    objects = {
        "sagemaker": f"arn:{partition}:s3:::{request.package.bucket}/{request.package.key}",
        "doctor": f"arn:{partition}:s3:::{bucket}/{prefix}/{sagemaker_doctor.PROBE_FOLDER}/"
                  "probe-0a1b2c3d",
    }
    kinds = {
        "job": f"arn:{partition}:sagemaker:{region}:{ACCOUNT}:training-job/"
               f"{kwargs['TrainingJobName'].lower()}",
        "role": kwargs["RoleArn"],
        "bucket": f"arn:{partition}:s3:::{bucket}",
        "log-group": group,
        "log-stream": f"{group}:log-stream:{kwargs['TrainingJobName']}/algo-1-1700000000",
        "self": f"arn:{partition}:iam::{ACCOUNT}:user/{USER}",
        "*": "*",
    }
    actions, problems = derive.aws_actions()
    assert not problems
    actions += derive.request_actions("sagemaker", "CreateTrainingJob", kwargs, "sagemaker")
    requests = []
    for a in actions:
        resource = objects[a.module] if a.resource == "object" else kinds[a.resource]
        context = {"aws:SecureTransport": "true", "aws:username": USER}
        if a.action == "iam:PassRole":
            context["iam:PassedToService"] = "sagemaker.amazonaws.com"
        requests.append(Request(a.action, resource, context, a.source))
    return requests + _kms_requests(ev, requests)


def _kms_requests(ev: Any, requests: list[Request]) -> list[Request]:
    """With a customer managed key, S3 reads decrypt and writes generate a data key with it
    (https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingKMSEncryption.html)."""
    key = ev.variables["kms_key_arn"]
    if key is None:
        return []
    needed = set()
    for r in requests:
        if r.action == "s3:GetObject":
            needed.add("kms:Decrypt")
        if r.action == "s3:PutObject":
            needed.add("kms:GenerateDataKey")
    return [Request(a, key, {}, "bucket encryption") for a in sorted(needed)]


def _statements(ev: Any, name: str) -> list[dict[str, Any]]:
    """An identity policy together with the bucket policy's denies (both apply to S3 calls)."""
    return ev.policy_document(name) + ev.policy_document("bucket")


@pytest.mark.parametrize("example", [False, True], ids=["defaults", "every-option"])
@pytest.mark.parametrize("region", REGIONS)
def test_the_launcher_policy_allows_every_call(region: str, example: bool,
                                               tmp_path: Path) -> None:
    ev = aws_module(region, example=example)
    statements = _statements(ev, "launcher")
    denied = [str(r) for r in _launcher_requests(ev, region, tmp_path)
              if decide(statements, r) != "allowed"]
    assert not denied, "\n".join(denied)


def test_the_ci_role_may_simulate_itself(tmp_path: Path) -> None:
    ev = aws_module(example=True)
    role = output(ev, "github_actions_role_arn")
    assert role.endswith(":role/launch-github-actions")
    simulate = Request("iam:SimulatePrincipalPolicy", role, {})
    assert decide(ev.policy_document("launcher"), simulate) == "allowed"
    attached = ev.evaluated("resource", "aws_iam_role_policy_attachment", "github")
    assert [a["policy_arn"] for a in attached] == [
        f"arn:aws:iam::{ACCOUNT}:policy/launch-launcher"]


@pytest.mark.parametrize("example", [False, True], ids=["defaults", "every-option"])
def test_the_launcher_policy_grants_nothing_the_code_does_not_call(example: bool,
                                                                   tmp_path: Path) -> None:
    ev = aws_module(example=example)
    needed = {r.action for r in _launcher_requests(ev, "us-east-1", tmp_path)}
    granted = granted_actions(ev.policy_document("launcher"))
    assert not any("*" in a or "?" in a for a in granted), granted
    assert granted == needed


@pytest.mark.parametrize("request_", [
    Request("sagemaker:CreateTrainingJob",
            f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-job/other-team-job"),
    Request("sagemaker:StopTrainingJob",
            f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-job/launched-by-someone"),
    Request("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/Admin",
            {"iam:PassedToService": "sagemaker.amazonaws.com"}),
    Request("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/launch-sagemaker-execution",
            {"iam:PassedToService": "ec2.amazonaws.com"}),
    Request("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/launch-sagemaker-execution"),
    Request("s3:PutObject", "arn:aws:s3:::someone-elses-bucket/launch/code/x.tar.gz"),
    Request("s3:PutObject", f"arn:aws:s3:::launch-{ACCOUNT}-us-east-1/outside/x"),
    Request("s3:DeleteObject", f"arn:aws:s3:::launch-{ACCOUNT}-us-east-1/launch/code/x.tar.gz"),
    Request("s3:GetObject", f"arn:aws:s3:::launch-{ACCOUNT}-us-east-1/launch/code/x",
            {"aws:SecureTransport": "false"}),
    Request("logs:GetLogEvents",
            f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/lambda/x:log-stream:y"),
    Request("iam:SimulatePrincipalPolicy", f"arn:aws:iam::{ACCOUNT}:user/bob",
            {"aws:username": "alice"}),
    Request("iam:GetRole", f"arn:aws:iam::{ACCOUNT}:role/Admin"),
], ids=lambda r: f"{r.action}-{r.resource.rsplit(':', 1)[-1]}-{len(r.context)}")
def test_the_launcher_policy_is_scoped(request_: Request) -> None:
    ev = aws_module(example=True)
    assert decide(_statements(ev, "launcher"), request_) != "allowed"


def test_job_names_with_capitals_still_match_the_lowercase_arn(tmp_path: Path) -> None:
    ev = aws_module(job_prefix="Team-A")
    request = sagemaker_request(ev, "us-east-1", tmp_path)
    name = request.kwargs["TrainingJobName"]
    assert name.startswith("Team-A-")
    arn = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-job/{name.lower()}"
    assert decide(ev.policy_document("launcher"),
                  Request("sagemaker:CreateTrainingJob", arn)) == "allowed"


# -- AWS: what the training jobs do -------------------------------------------------------------


def _job_requests(ev: Any, region: str, tmp_path: Path, strategy: str) -> list[Request]:
    request = sagemaker_request(ev, region, tmp_path, strategy)
    requests, used = derive.execution_requests(
        request.kwargs, region, ACCOUNT, partition_of(region), LOG_GROUP,
        request.package.s3_uri)
    unaccounted = derive.resource_strings(request.kwargs) - used
    assert not unaccounted, f"request values no execution-role rule covers: {unaccounted}"
    requests = [dataclasses.replace(r, context={**r.context, "aws:SecureTransport": "true"})
                for r in requests]
    return requests + _kms_requests(ev, requests)


def _strategies(region: str) -> list[str]:
    from launcher.providers.sagemaker import sdk

    return ["ddp", "smp_v2"] if region in sdk.published_regions("pytorch-smp", "2.5.1") else [
        "ddp"]


@pytest.mark.parametrize("example", [False, True], ids=["defaults", "every-option"])
@pytest.mark.parametrize("region", REGIONS)
def test_the_execution_role_allows_what_the_job_does(region: str, example: bool,
                                                     tmp_path: Path) -> None:
    ev = aws_module(region, example=example)
    statements = _statements(ev, "execution")
    for strategy in _strategies(region):
        denied = [str(r) for r in _job_requests(ev, region, tmp_path, strategy)
                  if decide(statements, r) != "allowed"]
        assert not denied, f"{strategy}:\n" + "\n".join(denied)


@pytest.mark.parametrize("example", [False, True], ids=["defaults", "every-option"])
def test_the_execution_role_grants_nothing_the_job_does_not_do(example: bool,
                                                               tmp_path: Path) -> None:
    ev = aws_module(example=example)
    needed = {r.action for s in _strategies("us-east-1")
              for r in _job_requests(ev, "us-east-1", tmp_path, s)}
    if ev.variables["data_read_arns"]:
        needed |= {"s3:GetObject", "s3:ListBucket"}  # the datasets the user named
    granted = granted_actions(ev.policy_document("execution"))
    assert not any("*" in a for a in granted), granted
    assert granted == needed


@pytest.mark.parametrize("request_", [
    Request("s3:GetObject", "arn:aws:s3:::someone-elses-bucket/x"),
    Request("s3:ListBucket", f"arn:aws:s3:::launch-{ACCOUNT}-us-east-1", {"s3:prefix": "other/"}),
    Request("s3:ListBucket", f"arn:aws:s3:::launch-{ACCOUNT}-us-east-1"),
    Request("s3:DeleteObject", f"arn:aws:s3:::launch-{ACCOUNT}-us-east-1/launch/x"),
    Request("ecr:BatchGetImage", f"arn:aws:ecr:us-east-1:{ACCOUNT}:repository/anything"),
    Request("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "Custom/Billing"}),
    Request("logs:PutLogEvents",
            f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/lambda/x:log-stream:y"),
], ids=lambda r: f"{r.action}-{len(r.context)}")
def test_the_execution_role_is_scoped(request_: Request) -> None:
    ev = aws_module()
    assert decide(_statements(ev, "execution"), request_) != "allowed"


def test_only_sagemaker_in_this_account_may_assume_the_execution_role() -> None:
    [statement] = aws_module().policy_document("execution_trust")
    assert statement["actions"] == ["sts:AssumeRole"]
    assert statement["principals"] == [{"type": "Service",
                                        "identifiers": ["sagemaker.amazonaws.com"]}]
    conditions = {c["variable"]: c["values"] for c in statement["condition"]}
    assert conditions["aws:SourceAccount"] == [ACCOUNT]


def test_only_pushes_to_main_of_one_repository_get_the_ci_role() -> None:
    [statement] = aws_module(example=True).policy_document("github_trust")
    assert statement["actions"] == ["sts:AssumeRoleWithWebIdentity"]
    conditions = {(c["test"], c["variable"]): c["values"] for c in statement["condition"]}
    assert conditions[("StringEquals", "token.actions.githubusercontent.com:aud")] == [
        "sts.amazonaws.com"]
    assert conditions[("StringEquals", "token.actions.githubusercontent.com:sub")] == [
        "repo:example-org/example-repo:ref:refs/heads/main"]


def test_the_image_registries_are_the_sdks() -> None:
    """The execution role may pull from the registries the SDK names the images in (the
    provider asks sagemaker-core's image_uris; the Terraform keeps a copy, held to it here)."""
    pytest.importorskip("sagemaker.core.image_uris")
    from launcher.providers.sagemaker import sdk

    ev = aws_module()
    assert ev.local("pytorch_registries") == sdk.registries("pytorch", "2.8.0")
    smp = sdk.registries("pytorch-smp", "2.5.1")
    assert {ev.local("smp_registry")} == set(smp.values())
    assert set(ev.local("smp_regions")) == set(smp)


# -- AWS: the bucket ---------------------------------------------------------------------------


def test_the_bucket_is_private_encrypted_and_expires_staged_code(tmp_path: Path) -> None:
    ev = aws_module()
    [block] = ev.evaluated("resource", "aws_s3_bucket_public_access_block", "this")
    assert all(block[k] is True for k in ("block_public_acls", "block_public_policy",
                                          "ignore_public_acls", "restrict_public_buckets"))
    [sse] = ev.evaluated("resource", "aws_s3_bucket_server_side_encryption_configuration",
                         "this")
    assert sse["rule"][0]["apply_server_side_encryption_by_default"][0]["sse_algorithm"] == \
        "AES256"
    [kms] = aws_module(example=True).evaluated(
        "resource", "aws_s3_bucket_server_side_encryption_configuration", "this")
    assert kms["rule"][0]["apply_server_side_encryption_by_default"][0]["sse_algorithm"] == \
        "aws:kms"
    [lifecycle] = ev.evaluated("resource", "aws_s3_bucket_lifecycle_configuration", "this")
    code_rule = next(r for r in lifecycle["rule"] if r["id"] == "staged-code")
    package_key = sagemaker_request(ev, "us-east-1", tmp_path).package.key
    assert package_key.startswith(code_rule["filter"][0]["prefix"])  # the code, not checkpoints
    assert code_rule["expiration"][0]["days"] == 30


# -- GCP ---------------------------------------------------------------------------------------


def test_every_google_call_in_the_code_has_a_documented_permission() -> None:
    permissions, problems = derive.gcp_permissions()
    assert not problems, problems
    assert {"vertex", "_gcp", "doctor"} <= {p.module for p in permissions}


def _vertex_needs(ev: Any, tmp_path: Path) -> tuple[set[tuple[str, str]], Any]:
    """(permission, scope) pairs of the launcher: its calls at the scopes of a real request."""
    request = vertex_request(ev, tmp_path)
    bucket = request.staging[0].uri.removeprefix("gs://").split("/", 1)[0]
    scopes = {"project": f"projects/{output(ev, 'project')}", "bucket": f"gs://{bucket}"}
    permissions, _ = derive.gcp_permissions()
    needs = {(p.permission, scopes[p.scope]) for p in permissions}
    account = request.custom_job["jobSpec"].get("serviceAccount")
    if account:  # https://cloud.google.com/vertex-ai/docs/general/custom-service-account
        needs.add(("iam.serviceAccounts.actAs", account))
    return needs, request


def _granted(ev: Any, member: str, permission: str, scope: str) -> bool:
    roles = gcp_custom_roles(ev)
    for b in gcp_bindings(ev):
        if b.member != member or b.scope not in (scope, f"projects/{output(ev, 'project')}"):
            continue
        permissions = roles.get(b.role) or derive.PREDEFINED_ROLES_INCLUDE.get(b.role, set())
        if permission in permissions:
            return True
    return False


def _launcher_members(ev: Any) -> list[str]:
    return ["group:ml-engineers@example.com",
            f"serviceAccount:launch-ci@{output(ev, 'project')}.iam.gserviceaccount.com"]


def test_the_doctor_checks_exactly_the_permissions_the_provider_uses(tmp_path: Path) -> None:
    permissions, _ = derive.gcp_permissions(derive.GCP_MODULES[:3])
    derived = {(p.permission, p.scope) for p in permissions}
    derived.add(("iam.serviceAccounts.actAs", "service account"))
    assert {(n.permission, n.on) for n in vertex_doctor.VERTEX_NEEDS} == derived


def test_the_launcher_roles_allow_every_call(tmp_path: Path) -> None:
    ev = gcp_module()
    needs, _ = _vertex_needs(ev, tmp_path)
    for member in _launcher_members(ev):
        missing = [n for n in sorted(needs) if not _granted(ev, member, *n)]
        assert not missing, f"{member}: {missing}"


def test_the_launcher_roles_grant_nothing_the_code_does_not_call(tmp_path: Path) -> None:
    ev = gcp_module()
    needs, _ = _vertex_needs(ev, tmp_path)
    roles = gcp_custom_roles(ev)
    members = set(_launcher_members(ev))
    optional = {"roles/cloudquotas.viewer"}  # launch doctor's quota check, read-only
    for b in gcp_bindings(ev):
        if b.member not in members:
            continue
        if b.role in optional:
            continue
        assert b.role in roles, f"{b.member} holds the predefined role {b.role}"
        extra = {p for p in roles[b.role] if (p, b.scope) not in needs}
        assert not extra, f"{b.role} on {b.scope}: {extra}"


def test_the_jobs_account_may_use_the_bucket_and_nothing_else(tmp_path: Path) -> None:
    ev = gcp_module()
    _, request = _vertex_needs(ev, tmp_path)
    account = request.custom_job["jobSpec"]["serviceAccount"]
    output_dir = request.custom_job["jobSpec"]["baseOutputDirectory"]["outputUriPrefix"]
    bucket = output_dir.removeprefix("gs://").split("/", 1)[0]
    assert all(a.uri.startswith(f"gs://{bucket}/") for a in request.staging)
    member = f"serviceAccount:{account}"
    for permission in derive.JOB_BUCKET_PERMISSIONS:
        assert _granted(ev, member, permission, f"gs://{bucket}"), permission
    assert [b.scope for b in gcp_bindings(ev) if b.member == member] == [f"gs://{bucket}"]


def test_only_pushes_to_main_of_one_repository_get_the_ci_account() -> None:
    ev = gcp_module()
    [provider] = ev.evaluated("resource", "google_iam_workload_identity_pool_provider", "github")
    assert provider["oidc"] == [{"issuer_uri": "https://token.actions.githubusercontent.com"}]
    assert provider["attribute_condition"] == \
        "assertion.sub=='repo:example-org/example-repo:ref:refs/heads/main'"
    [federation] = ev.evaluated("resource", "google_service_account_iam_member", "ci_federation")
    assert federation["role"] == "roles/iam.workloadIdentityUser"
    assert federation["member"].endswith("/attribute.repository/example-org/example-repo")
    assert gcp_module(example=False, project="p", region="us-central1").evaluated(
        "resource", "google_iam_workload_identity_pool_provider", "github") == []


def test_the_staging_bucket_is_private_and_expires_staged_code(tmp_path: Path) -> None:
    ev = gcp_module()
    [bucket] = ev.evaluated("resource", "google_storage_bucket", "staging")
    assert bucket["uniform_bucket_level_access"] is True
    assert bucket["public_access_prevention"] == "enforced"
    assert bucket["location"] == output(ev, "region")
    _, request = _vertex_needs(ev, tmp_path)
    expiring = [r for r in bucket["lifecycle_rule"]
                if r["condition"][0].get("matches_prefix")]
    [rule] = expiring
    [prefix] = rule["condition"][0]["matches_prefix"]
    assert rule["action"] == [{"type": "Delete"}]
    # The staged archives, and not the checkpoints, are what expires.
    assert all(a.uri.removeprefix(f"gs://{bucket['name']}/").startswith(prefix)
               for a in request.staging)
    checkpoints = next(e["value"] for e in request.custom_job["jobSpec"]["workerPoolSpecs"][0][
        "containerSpec"]["env"] if e["name"] == "LAUNCH_CHECKPOINT_DIR")
    assert not checkpoints.removeprefix(f"/gcs/{bucket['name']}/").startswith(prefix)


# -- outputs: one to one onto the launcher's settings ------------------------------------------

NOT_SETTINGS = {"launch_toml", "launcher_policy_arn", "github_actions_role_arn",
                "launcher_roles", "workload_identity_provider", "ci_service_account"}


def _vertex_setting_keys() -> set[str]:
    """The keys Vertex's settings class declares (what ``VertexProvider.from_settings`` reads)."""
    from launcher.providers.vertex import VertexSettings

    return {f.name for f in dataclasses.fields(VertexSettings)}


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_outputs_are_launcher_settings_and_launch_toml_loads(cloud: str, tmp_path: Path) -> None:
    from launcher.providers.vertex import VertexProvider
    from launcher.spec import load_config

    ev = aws_module(example=True) if cloud == "aws" else gcp_module()
    keys = ({f.name for f in dataclasses.fields(SageMakerSettings)} if cloud == "aws"
            else _vertex_setting_keys())
    required = {"region", "bucket", "role"} if cloud == "aws" else {
        "project", "region", "bucket", "service_account"}
    settings = set(ev.module.outputs) - NOT_SETTINGS
    assert settings <= keys, settings - keys
    assert required <= settings
    # launch_toml holds exactly those outputs (and the provider), and the launcher reads it.
    (tmp_path / "launch.toml").write_text(output(ev, "launch_toml"))
    config, _ = load_config(tmp_path)
    assert config == {"provider": "sagemaker" if cloud == "aws" else "vertex",
                      **{k: output(ev, k) for k in settings}}
    assert tomllib.loads(output(ev, "launch_toml")) == config
    if cloud == "aws":
        loaded = SageMakerSettings.from_mapping(config)
        assert (loaded.bucket_name, loaded.role) == (output(ev, "bucket"), output(ev, "role"))
    else:
        provider = VertexProvider.from_settings(config, {})
        assert f"gs://{provider.bucket}/{provider.prefix}" == output(ev, "bucket")
        assert provider.service_account == output(ev, "service_account")


def test_every_action_pattern_in_the_launcher_policy_is_an_aws_action() -> None:
    """A typo in an action name would silently allow nothing; the launcher's own actions are
    names botocore knows (or AddTags / PassRole, which are not API operations of theirs)."""
    granted = granted_actions(aws_module(example=True).policy_document("launcher"))
    for action in granted:
        prefix, name = action.split(":")
        services = {"sagemaker": "sagemaker", "s3": None, "logs": "logs", "iam": "iam",
                    "servicequotas": "service-quotas", "kms": "kms"}
        service = services[prefix]
        if service is None or name in ("PassRole",):
            continue
        assert name in derive._service_model(service).operation_names, action


def test_a_new_call_is_derived_or_reported(tmp_path: Path) -> None:
    """The derivation is not a list: a call added to the code shows up by itself, mapped where
    botocore's model says how, reported where no documented rule exists."""
    module = tmp_path / "new_provider.py"
    module.write_text(
        "def submit(aws, google_client, job):\n"
        "    sm = aws.client('sagemaker')\n"
        "    sm.list_training_jobs(NameContains='launch')\n"
        "    aws.client('s3').get_bucket_acl(Bucket='b')\n"
        "    aws.client('ec2').describe_instances()\n"
        "    google_client.delete_custom_job(name=job)\n"
        "    import hashlib\n"
        "    digest = hashlib.sha256()\n"
        "    digest.update(b'not a google call')\n")
    actions, problems = derive.aws_actions([str(module)])
    assert [a.action for a in actions] == []
    assert any("ListTrainingJobs has no resource kind" in p for p in problems)
    assert any("no IAM action known for GetBucketAcl" in p for p in problems)
    assert any("no IAM action known for DescribeInstances" in p for p in problems)
    _, problems = derive.gcp_permissions([str(module)])
    assert problems == [f"{module}:6 .delete_custom_job(): a Google client method with no "
                        "permission in GCP_METHODS"]


def test_names_fit_the_clouds_limits() -> None:
    """What `terraform validate` cannot see either: the names the longest allowed `name` makes
    fit AWS's and Google's length rules (checked by the APIs only at apply time)."""
    import re

    ev = aws_module("ap-southeast-1", example=True, name="n" * 31)
    assert len(output(ev, "bucket")) <= 63
    assert re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", output(ev, "bucket"))
    for rtype, name in (("aws_iam_role", "execution"), ("aws_iam_role", "github"),
                        ("aws_iam_policy", "launcher")):
        for args in ev.evaluated("resource", rtype, name):
            assert len(args["name"]) <= 64, args["name"]
    for long_name in ("abc", "n" * 15):
        ev = gcp_module(name=long_name)
        for args in ev.evaluated("resource", "google_service_account", "jobs") + \
                ev.evaluated("resource", "google_service_account", "ci"):
            assert re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", args["account_id"])
        [pool] = ev.evaluated("resource", "google_iam_workload_identity_pool", "github")
        [provider] = ev.evaluated("resource", "google_iam_workload_identity_pool_provider",
                                  "github")
        assert 4 <= len(pool["workload_identity_pool_id"]) <= 32
        assert len(pool["display_name"]) <= 32 and len(provider["display_name"]) <= 32
        for args in (a for n in ("launcher", "staging", "act_as")
                     for a in ev.evaluated("resource", "google_project_iam_custom_role", n)):
            assert re.fullmatch(r"[a-zA-Z0-9_.]{3,64}", args["role_id"])
            assert len(args["title"]) <= 100
