"""`launch doctor --provider sagemaker`: is this machine and this AWS account ready?

Checks, in order, each with the permissions it relies on: region; credentials (the provider's own
two-second check, the source is named and the keys never are); identity (STS GetCallerIdentity,
which needs no permission); the training image of the region; the bucket (HeadBucket: exists,
readable, in the job's region); writing to it (a probe object put and deleted under
``<s3_prefix>/.launch-doctor/``); the execution role (GetRole: exists, trusts
sagemaker.amazonaws.com); the launcher's permissions (SimulatePrincipalPolicy over
:data:`SAGEMAKER_NEEDS`; a warning where IAM will not simulate); the training-job GPU quotas
(Service Quotas; a warning where they cannot be read).

Calls go through the provider's own plumbing (``_aws.Aws``), so the doctor talks to the same
endpoints with the same credentials as a launch does, and the loopback test servers stand in.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from launcher import strategies
from launcher.providers.checks import CALL_TIMEOUT_S, Check, Checks, Need, one_line
from launcher.status import LaunchError, UsageError

#: Where the bucket probe is written (and deleted): the one place the launcher policy allows a
#: delete.
PROBE_FOLDER = ".launch-doctor"
AWS_TERRAFORM = "infra/aws"
#: The instance type the doctor asks the SDK about: the default image is the same for every GPU
#: instance type of the catalog (tests/providers/test_sagemaker_sdk.py holds that).
DOCTOR_INSTANCE = "ml.g5.xlarge"

#: derives the same set from the provider code and fails when the two differ.
SAGEMAKER_NEEDS: tuple[Need, ...] = (
    Need("sagemaker:CreateTrainingJob", "job", "submit each attempt as a training job"),
    Need("sagemaker:AddTags", "job", "tag the job with its run (CreateTrainingJob with Tags)"),
    Need("sagemaker:DescribeTrainingJob", "job", "follow the job"),
    Need("sagemaker:StopTrainingJob", "job", "stop it at the first out-of-memory line"),
    Need("iam:PassRole", "role", "let SageMaker run the job as the execution role"),
    Need("iam:GetRole", "role", "check the role before anything is uploaded"),
    Need("s3:ListBucket", "bucket", "tell a code package not uploaded yet (404) from no access"),
    Need("s3:GetObject", "object", "look for the code package before uploading it"),
    Need("s3:PutObject", "object", "upload the code package"),
    Need("logs:DescribeLogStreams", "log-group", "find the job's log streams"),
    Need("logs:GetLogEvents", "log-stream", "read the job's output"),
    Need("logs:FilterLogEvents", "log-group", "read its events and failure lines first"),
)


def doctor_checks(settings: Mapping[str, Any], environ: Mapping[str, str]) -> list[Check]:
    """Every check, in order (:meth:`SageMakerProvider.doctor_checks`)."""
    doctor = SageMakerChecks(dict(settings), dict(environ))
    doctor.run()
    return doctor.checks


class SageMakerChecks(Checks):
    """`launch doctor --provider sagemaker`, one check after the other (:meth:`run`)."""

    s: Any  # SageMakerSettings, parsed in run()
    AFTER_CREDENTIALS = ("identity", "bucket", "bucket write", "role", "permissions", "quota")

    def run(self) -> None:
        from launcher.providers.sagemaker.settings import SageMakerSettings

        self.s = SageMakerSettings.from_mapping(self.settings)  # malformed: UsageError, exit 2
        region = self.region()
        aws = self.credentials(region or "us-east-1")
        if region:
            self.image(region)
        if aws is None:
            self.skip(self.AFTER_CREDENTIALS, "needs credentials")
            return
        identity = self.identity(aws)
        if identity is None:
            self.skip(self.AFTER_CREDENTIALS[1:], "needs a working identity")
            return
        bucket_ok = self.bucket(aws, region)
        if bucket_ok:
            self.bucket_write(aws)
        else:
            self.skip(("bucket write",), "needs the bucket")
        self.role(aws, identity)
        if region:
            self.permissions(aws, identity, region)
            self.quota(aws, region)
        else:
            self.skip(("permissions", "quota"), "needs a region")

    # -- settings and credentials

    def region(self) -> str | None:
        from launcher.providers.sagemaker._aws import resolve_region

        try:
            region = resolve_region(self.s.region, self.environ)
        except UsageError as exc:
            self.add("region", "fail", exc.message,
                     f"{exc.hint}; `terraform output region` in {AWS_TERRAFORM}")
            return None
        source = ("--region / LAUNCH_REGION / launch.toml" if self.s.region else
                  "AWS_REGION" if self.environ.get("AWS_REGION") else
                  "AWS_DEFAULT_REGION" if self.environ.get("AWS_DEFAULT_REGION") else
                  "the AWS profile")
        self.add("region", "ok", f"{region} (from {source})")
        return region

    def credentials(self, region: str) -> Any:
        """The provider's own fast check; the detail names where the credentials came from
        (never the keys)."""
        from launcher.providers.sagemaker._aws import Aws, ClientSettings

        try:
            aws = Aws(region, self.environ, ClientSettings(
                max_attempts=2, connect_timeout_s=3.0, read_timeout_s=CALL_TIMEOUT_S))
            aws.check_credentials()
        except LaunchError as exc:
            self.add("credentials", "fail", exc.message, exc.hint)
            return None
        method = getattr(aws.session.get_credentials(), "method", None) or "the AWS chain"
        self.add("credentials", "ok", f"found ({_aws_source(method, self.environ)})")
        return aws

    def image(self, region: str) -> None:
        from launcher.providers.images import default_image
        from launcher.providers.sagemaker.sdk import training_image

        if self.s.image:
            self.add("image", "ok", f"{self.s.image} (the image setting)")
            return
        default = default_image("sagemaker", strategies.REPLICATED)
        assert default is not None  # images.IMAGES has SageMaker's stock PyTorch image
        try:  # the URI is the same for every GPU instance type in the catalog
            image = training_image(region, strategies.REPLICATED, DOCTOR_INSTANCE,
                                   self.s.torch_version or default.torch, self.s.py_version)
        except UsageError as exc:
            self.add("image", "warn", exc.message, exc.hint)
            return
        self.add("image", "ok", f"{image.uri} (from {image.sdk})")

    def identity(self, aws: Any) -> dict[str, str] | None:
        from launcher.providers.sagemaker._aws import provider_error

        try:
            answer = aws.client("sts").get_caller_identity()
        except Exception as exc:
            error = provider_error(exc, "STS GetCallerIdentity")
            self.add("identity", "fail", error.message, error.hint or
                     "check the credentials and the network (sts needs no permission)")
            return None
        identity = {"account": str(answer.get("Account", "")), "arn": str(answer.get("Arn", ""))}
        self.add("identity", "ok", f"{identity['arn']} (account {identity['account']})")
        return identity

    # -- the bucket and the role

    def bucket(self, aws: Any, region: str | None) -> bool:
        from launcher.providers.sagemaker._aws import error_code, provider_error

        name = self.s.bucket_name
        if not name:
            self.add("bucket", "fail", "no S3 bucket configured",
                     f"pass --bucket NAME (LAUNCH_BUCKET, `bucket` in launch.toml); "
                     f"`terraform output bucket` in {AWS_TERRAFORM}")
            return False
        arn = f"arn:{self.partition(aws)}:s3:::{name}"
        try:
            head = aws.client("s3").head_bucket(Bucket=name)
        except Exception as exc:
            code = error_code(exc)
            if code in ("404", "NoSuchBucket", "NotFound"):
                self.add("bucket", "fail", f"s3://{name} does not exist",
                         f"create it: `terraform apply` in {AWS_TERRAFORM}, or "
                         f"`aws s3 mb s3://{name} --region {region or 'REGION'}`")
            elif code in ("403", "AccessDenied", "Forbidden"):
                self.add("bucket", "fail", f"no access to s3://{name}",
                         "attach the launcher policy (`terraform output launcher_policy_arn`), "
                         "or check the bucket name", needs=[f"s3:ListBucket on {arn}"])
            else:
                error = provider_error(exc, f"HeadBucket s3://{name}")
                self.add("bucket", "fail", error.message, error.hint)
            return False
        headers = head.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        where = head.get("BucketRegion") or headers.get("x-amz-bucket-region")
        if region and where and where != region:
            self.add("bucket", "fail", f"s3://{name} is in {where}, the jobs run in {region}",
                     f"SageMaker reads its input from the job's region: use a bucket in {region} "
                     f"or --region {where}")
            return False
        self.add("bucket", "ok", f"s3://{name} ({where or 'region not reported'})")
        return True

    def bucket_write(self, aws: Any) -> None:
        """Put and delete one small object where the launcher writes, so that a denied write
        shows up now and not after the plan."""
        from launcher.providers.sagemaker._aws import error_code, error_message

        name = self.s.bucket_name or ""
        folder = f"{self.s.prefix}/" if self.s.prefix else ""
        key = f"{folder}{PROBE_FOLDER}/probe-{uuid.uuid4().hex[:12]}"
        partition = self.partition(aws)
        s3 = aws.client("s3")
        try:
            s3.put_object(Bucket=name, Key=key, Body=b"written by launch doctor\n")
        except Exception as exc:
            self.add("bucket write", "fail",
                     f"cannot write to s3://{name}/{folder}: {error_code(exc)} "
                     f"{error_message(exc)}",
                     "attach the launcher policy (`terraform output launcher_policy_arn`)",
                     needs=[f"s3:PutObject on arn:{partition}:s3:::{name}/{folder}*"])
            return
        try:
            s3.delete_object(Bucket=name, Key=key)
        except Exception as exc:
            self.add("bucket write", "warn",
                     f"wrote s3://{name}/{key} but could not delete it ({error_code(exc)})",
                     "delete it by hand; the launcher itself never deletes",
                     needs=[f"s3:DeleteObject on arn:{partition}:s3:::{name}/{folder}"
                            f"{PROBE_FOLDER}/*"])
            return
        self.add("bucket write", "ok", f"wrote and deleted a probe under s3://{name}/{folder}")

    def role(self, aws: Any, identity: dict[str, str]) -> None:
        from launcher.providers.sagemaker._aws import error_code, error_message

        role = self.s.role
        if not role:
            self.add("role", "fail", "no SageMaker execution role configured",
                     "pass --role arn:aws:iam::ACCOUNT:role/NAME (LAUNCH_ROLE, `role` in "
                     f"launch.toml); `terraform output role` in {AWS_TERRAFORM}")
            return
        try:
            answer = aws.client("iam").get_role(RoleName=role.rsplit("/", 1)[-1])
        except Exception as exc:
            code = error_code(exc)
            if code == "NoSuchEntity":
                self.add("role", "fail", f"the role {role} does not exist",
                         f"`terraform apply` in {AWS_TERRAFORM} creates it; or pass another "
                         "--role")
            else:
                self.add("role", "warn",
                         f"cannot read the role ({code or 'error'}: {error_message(exc)}); "
                         "SageMaker checks it when the job is created",
                         "allow iam:GetRole on the role (the launcher policy does)",
                         needs=[f"iam:GetRole on {role}"])
            return
        found = answer.get("Role", {})
        trust = found.get("AssumeRolePolicyDocument") or {}
        if isinstance(trust, str):
            from urllib.parse import unquote

            trust = json.loads(unquote(trust))
        if found.get("Arn") and found["Arn"] != role:
            self.add("role", "fail", f"{role} is not the role's ARN ({found['Arn']})",
                     "pass the ARN exactly, with its path")
            return
        if not _trusts_sagemaker(trust):
            self.add("role", "fail", f"{role} does not let SageMaker assume it",
                     "its trust policy needs an Allow of sts:AssumeRole for the service "
                     f"sagemaker.amazonaws.com (the role {AWS_TERRAFORM} creates has it)")
            return
        account = role.split(":")[4] if role.count(":") >= 5 else ""
        if account and identity.get("account") and account != identity["account"]:
            self.add("role", "warn", f"{role} is in account {account}, you are in "
                     f"{identity['account']}",
                     "SageMaker runs the job in your account; passing another account's role "
                     "needs a trust and PassRole set up for it")
            return
        self.add("role", "ok", f"{role} (trusts sagemaker.amazonaws.com)")

    # -- permissions and quotas

    def partition(self, aws: Any) -> str:
        return "aws-cn" if aws.region.startswith("cn-") else (
            "aws-us-gov" if aws.region.startswith("us-gov-") else "aws")

    def resources(self, region: str, account: str, partition: str) -> dict[str, str]:
        """An ARN of each kind of resource of :data:`SAGEMAKER_NEEDS`, as a launch would use."""
        from launcher.providers.sagemaker.logs import LOG_GROUP
        from launcher.providers.sagemaker.package import PACKAGE_NAME

        s = self.s
        job = f"{s.job_prefix}-doctor-a1"
        folder = f"{s.prefix}/" if s.prefix else ""
        group = f"arn:{partition}:logs:{region}:{account}:log-group:{LOG_GROUP}"
        return {
            "job": f"arn:{partition}:sagemaker:{region}:{account}:training-job/{job.lower()}",
            "role": s.role or "",
            "bucket": f"arn:{partition}:s3:::{s.bucket_name}",
            "object": f"arn:{partition}:s3:::{s.bucket_name}/{folder}code/doctor/{PACKAGE_NAME}",
            "log-group": group,
            "log-stream": f"{group}:log-stream:{job}/algo-1-1700000000",
        }

    def permissions(self, aws: Any, identity: dict[str, str], region: str) -> None:
        """Ask IAM whether the caller may do each of :data:`SAGEMAKER_NEEDS` on the resources a
        launch would use (the role to SageMaker only)."""
        principal = _principal_arn(identity.get("arn", ""))
        if principal is None:
            self.add("permissions", "warn",
                     f"cannot simulate for {identity.get('arn')} (not a user or role)",
                     "run the doctor as the user or role that will launch")
            return
        if not self.s.role or not self.s.bucket_name:
            self.add("permissions", "skip", "needs the role and the bucket")
            return
        arns = self.resources(region, identity.get("account", ""), self.partition(aws))
        groups: dict[str, list[str]] = {}
        for need in SAGEMAKER_NEEDS:
            groups.setdefault(need.on, []).append(need.permission)
        iam = aws.client("iam")
        denied: list[str] = []
        try:
            for kind, actions in groups.items():
                kwargs: dict[str, Any] = {"PolicySourceArn": principal, "ActionNames": actions,
                                          "ResourceArns": [arns[kind]]}
                if kind == "role":
                    kwargs["ContextEntries"] = [{
                        "ContextKeyName": "iam:PassedToService", "ContextKeyType": "string",
                        "ContextKeyValues": ["sagemaker.amazonaws.com"]}]
                answer = iam.simulate_principal_policy(**kwargs)
                for result in answer.get("EvaluationResults", []):
                    if result.get("EvalDecision") != "allowed":
                        denied.append(f"{result.get('EvalActionName')} on {arns[kind]}")
        except Exception as exc:
            from launcher.providers.sagemaker._aws import error_code

            self.add("permissions", "warn",
                     f"IAM would not simulate the launcher's permissions "
                     f"({error_code(exc) or type(exc).__name__}: {one_line(exc)})",
                     "allow iam:SimulatePrincipalPolicy on yourself to have them checked (the "
                     f"launcher policy of {AWS_TERRAFORM} does, for IAM users)",
                     needs=[f"iam:SimulatePrincipalPolicy on {principal}"])
            return
        if denied:
            self.add("permissions", "fail",
                     f"{principal} may not do {len(denied)} of the launcher's "
                     f"{len(SAGEMAKER_NEEDS)} actions",
                     "attach the launcher policy (`terraform output launcher_policy_arn` in "
                     f"{AWS_TERRAFORM}) to {principal}", needs=denied)
            return
        self.add("permissions", "ok",
                 f"{principal} may do all {len(SAGEMAKER_NEEDS)} actions a launch uses",
                 needs=[f"{n.permission} on {arns[n.on]}" for n in SAGEMAKER_NEEDS])

    def quota(self, aws: Any, region: str) -> None:
        """SageMaker's "<instance type> for training job usage" quotas of the catalog's GPU
        instance types (the one of --machine when given)."""
        from launcher.plan.catalog import load_catalog

        try:
            paginator = aws.client("service-quotas").get_paginator("list_service_quotas")
            values: dict[str, float] = {}
            for page in paginator.paginate(ServiceCode="sagemaker"):
                for quota in page.get("Quotas", []):
                    values[str(quota.get("QuotaName"))] = float(quota.get("Value", 0))
        except Exception as exc:
            from launcher.providers.sagemaker._aws import error_code

            self.add("quota", "warn",
                     f"training quotas not available ({error_code(exc) or type(exc).__name__}: "
                     f"{one_line(exc)})",
                     "see Service Quotas > Amazon SageMaker in the console; allow "
                     "servicequotas:ListServiceQuotas to have them checked",
                     needs=["servicequotas:ListServiceQuotas on *"])
            return
        suffix = " for training job usage"
        machine = self.settings.get("machine")
        if machine:
            name = f"{machine}{suffix}"
            if name not in values:
                self.add("quota", "warn", f"Service Quotas reports no '{name}' in {region}",
                         "check the instance type and the region")
            elif values[name] < 1:
                self.add("quota", "fail", f"'{name}' is 0 in {region}",
                         f"request an increase: Service Quotas > Amazon SageMaker > '{name}'")
            else:
                self.add("quota", "ok", f"'{name}': {values[name]:g} in {region}")
            return
        gpus = [m.name for m in load_catalog("sagemaker").machines]
        above = [(n, values[f"{n}{suffix}"]) for n in gpus if values.get(f"{n}{suffix}", 0) >= 1]
        if not above:
            self.add("quota", "warn",
                     f"no GPU instance type has a training-job quota above 0 in {region}",
                     "request an increase: Service Quotas > Amazon SageMaker > "
                     "'<instance type> for training job usage'")
            return
        shown = ", ".join(f"{n} {v:g}" for n, v in above[:8])
        more = f" and {len(above) - 8} more" if len(above) > 8 else ""
        self.add("quota", "ok", f"training instances allowed in {region}: {shown}{more}")


def _aws_source(method: str, environ: Mapping[str, str]) -> str:
    """Where botocore found the credentials, in words (no key material)."""
    words = {
        "explicit": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY", "env": "environment variables",
        "shared-credentials-file": "the shared credentials file", "config-file": "the config file",
        "assume-role": "an assumed role (profile)", "sso": "AWS SSO",
        "assume-role-with-web-identity": "web identity (OIDC) federation",
        "container-role": "the container's role", "iam-role": "the instance's role",
    }
    text = words.get(method, method)
    profile = environ.get("AWS_PROFILE")
    return f"{text}, profile {profile}" if profile and method != "explicit" else text


def _principal_arn(caller: str) -> str | None:
    """The IAM ARN to simulate for an STS caller ARN: a user as is, an assumed role as its role
    (the path of a role is not in the session ARN; IAM then reports it missing, a warning)."""
    parts = caller.split(":", 5)
    if len(parts) < 6:
        return None
    partition, account, resource = parts[1], parts[4], parts[5]
    if resource.startswith("assumed-role/"):
        return f"arn:{partition}:iam::{account}:role/{resource.split('/')[1]}"
    if resource.startswith(("user/", "role/")):
        return f"arn:{partition}:iam::{account}:{resource}"
    return None


def _trusts_sagemaker(document: Mapping[str, Any]) -> bool:
    statements = document.get("Statement") or []
    if isinstance(statements, dict):
        statements = [statements]
    for statement in statements:
        if statement.get("Effect") != "Allow":
            continue
        actions = statement.get("Action") or []
        actions = [actions] if isinstance(actions, str) else actions
        if not any(a in ("sts:AssumeRole", "sts:*", "*") for a in actions):
            continue
        services = (statement.get("Principal") or {}).get("Service") or []
        services = [services] if isinstance(services, str) else services
        if "sagemaker.amazonaws.com" in services:
            return True
    return False

