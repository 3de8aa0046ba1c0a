"""`launch doctor --provider vertex|sagemaker`: is this machine and this cloud account ready?

A first job that fails twenty minutes in because a role cannot be passed, or a bucket is in the
wrong region, costs more than the minute this takes. Each check names what it looked at, and a
failing one says how to fix it (usually: the Terraform in ``infra/`` and one of its outputs).

Checks, in order, each with the permissions it relies on:

* SageMaker: region; credentials (the provider's own two-second check, the source is named and the
  keys never are); identity (STS GetCallerIdentity, which needs no permission); the training image
  of the region; the bucket (HeadBucket: exists, readable, in the job's region); writing to it (a
  probe object put and deleted under ``<s3_prefix>/.launch-doctor/``); the execution role (GetRole:
  exists, trusts sagemaker.amazonaws.com); the launcher's permissions (SimulatePrincipalPolicy over
  :data:`SAGEMAKER_NEEDS`; a warning where IAM will not simulate); the training-job GPU quotas
  (Service Quotas; a warning where they cannot be read).
* Vertex AI: application-default credentials (same two-second rule); project; region; the bucket
  (get, location, uniform access, public access prevention; testIamPermissions for the staging
  permissions); the jobs' service account (its testIamPermissions: may the caller act as it);
  listing custom jobs (the custom jobs permission and the API being enabled); reading log
  entries; the region's custom-training GPU quotas (Cloud Quotas; a warning where they cannot be
  read).

Exit status (:attr:`DoctorReport.exit_status`): 0 when nothing failed (warnings allowed), 6 when a
check failed; malformed input (an unknown provider, a role that is not an ARN, a bucket that is
not a bucket name) raises :class:`UsageError` before anything is checked (2). A setting that is
missing is a failed check, with the flag, variable, config key and Terraform output that give it.

Calls go through the providers' own plumbing (``_aws.Aws``, the Vertex provider's clients), so the
doctor talks to the same endpoints with the same credentials as a launch does, and the loopback
test servers stand in for both.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from launcher.status import ExitStatus, LaunchError, UsageError

PROVIDERS = ("vertex", "sagemaker")
Status = Literal["ok", "warn", "fail", "skip"]

#: Seconds each doctor call may take (connect and read); a dead endpoint is a failed check.
CALL_TIMEOUT_S = 10.0
#: The credential lookup gets this long, all of it (the metadata services of the clouds can hang).
CREDENTIALS_DEADLINE_S = 1.5
#: Where the bucket probe is written (and deleted): the one place the launcher policy allows a
#: delete.
PROBE_FOLDER = ".launch-doctor"
#: Override the Cloud Quotas and IAM endpoints (``http://HOST:PORT``: a loopback test server,
#: called without credentials).
QUOTAS_ENDPOINT_VARIABLE = "LAUNCH_QUOTAS_ENDPOINT"
IAM_ENDPOINT_VARIABLE = "LAUNCH_IAM_ENDPOINT"
CLOUD_QUOTAS = "https://cloudquotas.googleapis.com"
GOOGLE_IAM = "https://iam.googleapis.com"

AWS_TERRAFORM = "infra/aws"
GCP_TERRAFORM = "infra/gcp"


@dataclass(frozen=True)
class Need:
    """One permission a step of the launcher needs, on what, and why (shown to the user)."""

    permission: str
    on: str
    why: str


#: Every AWS action `launch --provider sagemaker` uses, on what kind of resource, and for what.
#: ``launch doctor`` asks IAM about each (SimulatePrincipalPolicy); tests/infra/test_policies.py
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

#: Every Google Cloud permission `launch --provider vertex` uses, and where it is granted.
#: tests/infra/test_policies.py derives the same set from the provider code.
VERTEX_NEEDS: tuple[Need, ...] = (
    Need("aiplatform.customJobs.create", "project", "submit each attempt as a custom job"),
    Need("aiplatform.customJobs.get", "project", "follow the job"),
    Need("aiplatform.customJobs.list", "project", "find a job a retried create already made"),
    Need("aiplatform.customJobs.cancel", "project", "cancel it at the first out-of-memory line"),
    Need("logging.logEntries.list", "project", "read the job's output"),
    Need("storage.buckets.get", "bucket", "check the bucket exists before staging"),
    Need("storage.objects.get", "bucket", "look for a staged archive before uploading it"),
    Need("storage.objects.create", "bucket", "stage the code archives"),
    Need("iam.serviceAccounts.actAs", "service account", "run the job as --service-account"),
)


@dataclass(frozen=True)
class Check:
    """One thing looked at: ``ok``, ``warn`` (works, but worth knowing), ``fail`` (a launch would
    fail; ``fix`` says what to do) or ``skip`` (could not be looked at because an earlier check
    failed)."""

    name: str
    status: Status
    detail: str
    fix: str = ""
    needs: tuple[str, ...] = ()  # the permissions (on what) this check relies on or found missing

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix,
                "needs": list(self.needs)}


@dataclass
class DoctorReport:
    provider: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warn"]

    @property
    def exit_status(self) -> ExitStatus:
        """0 with warnings; 6 (provider or credentials error) as soon as one check failed."""
        return ExitStatus.PROVIDER_ERROR if self.failed else ExitStatus.SUCCESS

    def check(self, name: str) -> Check:
        for item in self.checks:
            if item.name == name:
                return item
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "ok": not self.failed,
                "exit_status": int(self.exit_status),
                "checks": [c.to_dict() for c in self.checks]}


def run_doctor(provider: str, settings: Mapping[str, Any], environ: Mapping[str, str]
               ) -> DoctorReport:
    """Check everything a launch on ``provider`` needs, with these settings (flags and config
    file keys: region, bucket, project, service_account, role, machine, s3_prefix, job_prefix ...)
    and this environment. Raises :class:`UsageError` for an unknown provider or a malformed
    setting; everything else is a check in the report."""
    if provider not in PROVIDERS:
        raise UsageError(f"launch doctor checks a cloud account, not {provider!r}",
                         "pass --provider vertex or --provider sagemaker")
    values = {k: v for k, v in dict(settings).items() if v is not None and v != ""}
    env = dict(environ)
    report = DoctorReport(provider)
    if provider == "sagemaker":
        _SageMakerDoctor(values, env, report.checks).run()
    else:
        _VertexDoctor(values, env, report.checks).run()
    return report


# -- printing ----------------------------------------------------------------------------------

_LABELS = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def print_report(report: DoctorReport, out: TextIO, as_json: bool = False) -> None:
    """The report as one line per check (a failure or warning adds its fix and what it needs),
    or as JSON (``--json``)."""
    if as_json:
        out.write(json.dumps(report.to_dict(), indent=2) + "\n")
        return
    width = max((len(c.name) for c in report.checks), default=0)
    out.write(f"launch doctor --provider {report.provider}\n")
    for c in report.checks:
        out.write(f"  {_LABELS[c.status]:<4}  {c.name:<{width}}  {c.detail}\n")
        if c.status in ("fail", "warn"):
            pad = " " * (8 + width)
            if c.fix:
                out.write(f"{pad}fix: {c.fix}\n")
            if c.needs:
                out.write(f"{pad}needs: {'; '.join(c.needs)}\n")
    failed, warned = len(report.failed), len(report.warnings)
    if failed:
        summary = f"{failed} check(s) failed, {warned} warning(s): a launch would fail"
    elif warned:
        summary = f"ready, with {warned} warning(s)"
    else:
        summary = "ready"
    out.write(f"{summary} (exit {int(report.exit_status)})\n")


# -- shared ------------------------------------------------------------------------------------


def _within(deadline: float, work: Callable[[], Any]) -> tuple[bool, Any, BaseException | None]:
    """Run ``work`` on a daemon thread for at most ``deadline`` seconds: (finished, result,
    error). A lookup that neither answers nor fails cannot hold the doctor past the deadline."""
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # reported, never raised on the thread
            error.append(exc)

    thread = threading.Thread(target=target, name="launch-doctor", daemon=True)
    thread.start()
    thread.join(deadline)
    if thread.is_alive():
        return False, None, None
    return True, result[0] if result else None, error[0] if error else None


def _one_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    lines = [part.strip() for part in str(text).splitlines() if part.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


class _Doctor:
    """The checks of one provider, appended to ``checks`` as they are made."""

    def __init__(self, settings: dict[str, Any], environ: dict[str, str], checks: list[Check]):
        self.settings = settings
        self.environ = environ
        self.checks = checks

    def add(self, name: str, status: Status, detail: str, fix: str = "",
            needs: tuple[str, ...] | list[str] = ()) -> Check:
        check = Check(name, status, detail, fix, tuple(needs))
        self.checks.append(check)
        return check

    def skip(self, names: tuple[str, ...], why: str) -> None:
        for name in names:
            self.add(name, "skip", why)


# -- SageMaker ---------------------------------------------------------------------------------


class _SageMakerDoctor(_Doctor):
    s: Any  # SageMakerSettings, parsed in run()
    AFTER_CREDENTIALS = ("identity", "bucket", "bucket write", "role", "permissions", "quota")

    def run(self) -> None:
        from launcher.providers.sagemaker import SageMakerSettings

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
        from launcher.providers._aws import resolve_region

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
        from launcher.providers._aws import Aws, ClientSettings

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
        from launcher.providers._aws import training_image

        if self.s.image:
            self.add("image", "ok", f"{self.s.image} (the image setting)")
            return
        try:
            image = training_image(region, "ddp")
        except UsageError as exc:
            self.add("image", "warn", exc.message, exc.hint)
            return
        self.add("image", "ok", image)

    def identity(self, aws: Any) -> dict[str, str] | None:
        from launcher.providers._aws import provider_error

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
        from launcher.providers._aws import error_code, provider_error

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
        from launcher.providers._aws import error_code, error_message

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
        from launcher.providers._aws import error_code, error_message

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
        from launcher.providers.sagemaker import LOG_GROUP, PACKAGE_NAME

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
            from launcher.providers._aws import error_code

            self.add("permissions", "warn",
                     f"IAM would not simulate the launcher's permissions "
                     f"({error_code(exc) or type(exc).__name__}: {_one_line(exc)})",
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
            from launcher.providers._aws import error_code

            self.add("quota", "warn",
                     f"training quotas not available ({error_code(exc) or type(exc).__name__}: "
                     f"{_one_line(exc)})",
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


# -- Vertex AI ---------------------------------------------------------------------------------


class _VertexDoctor(_Doctor):
    AFTER_SETTINGS = ("bucket", "service account", "custom jobs", "logs", "quota")

    def run(self) -> None:
        from launcher.providers import _gcp
        from launcher.providers.vertex import parse_bucket

        bucket: str | None = None
        prefix = ""
        raw_bucket = self.settings.get("bucket") or self.environ.get("LAUNCH_BUCKET")
        if raw_bucket:
            bucket, prefix = parse_bucket(str(raw_bucket))  # malformed: UsageError, exit 2
        account = self.settings.get("service_account")
        if account is not None and "@" not in str(account):
            raise UsageError(f"service account {account!r} is not an email address",
                             "pass --service-account NAME@PROJECT.iam.gserviceaccount.com")
        endpoints = [_gcp.parse_endpoint(self.environ.get(v)) for v in
                     ("LAUNCH_VERTEX_ENDPOINT", "LAUNCH_LOGGING_ENDPOINT")]
        loopback = all(e.anonymous for e in endpoints)
        credentials, adc_project = self.credentials(loopback)
        project = self.project(adc_project)
        region = self.region()
        if credentials is None and not loopback:
            self.skip(self.AFTER_SETTINGS, "needs credentials")
            return
        if not project or not region:
            self.skip(self.AFTER_SETTINGS, "needs the project and the region")
            return
        provider = self.provider(project, region, bucket, prefix, account, credentials)
        self.bucket(provider, region)
        self.service_account(account, credentials, loopback)
        self.custom_jobs(provider)
        self.logs(provider)
        self.quota(project, region, credentials, loopback)

    # -- settings and credentials

    def credentials(self, loopback: bool) -> tuple[Any, str | None]:
        """Application-default credentials within :data:`CREDENTIALS_DEADLINE_S`; anonymous for
        loopback test endpoints. The detail names the kind of credentials, not their content."""
        from launcher.providers import _gcp

        if loopback:
            self.add("credentials", "ok", "anonymous (loopback test endpoints)")
            return None, None

        def lookup() -> tuple[Any, str | None]:
            import google.auth

            credentials = _gcp.load_credentials(self.environ, anonymous=False)
            try:
                _, project = google.auth.default(scopes=_gcp.SCOPES)
            except Exception:
                project = None
            return credentials, project

        done, found, error = _within(CREDENTIALS_DEADLINE_S, lookup)
        if not done:
            self.add("credentials", "fail",
                     f"no application-default credentials within {CREDENTIALS_DEADLINE_S:g} s "
                     "(the metadata server did not answer)", _gcp.ADC_HINT)
            return None, None
        if error is not None:
            if isinstance(error, LaunchError):
                self.add("credentials", "fail", error.message, error.hint)
            else:
                self.add("credentials", "fail", f"credentials: {_one_line(error)}", _gcp.ADC_HINT)
            return None, None
        credentials, project = found
        self.add("credentials", "ok", f"found ({_gcp_kind(credentials, self.environ)})")
        return credentials, project

    def project(self, adc_project: str | None) -> str | None:
        sources = [("--project / launch.toml", self.settings.get("project"))]
        sources += [(name, self.environ.get(name)) for name in
                    ("LAUNCH_PROJECT", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT",
                     "GCLOUD_PROJECT")]
        sources.append(("the application-default credentials", adc_project))
        for source, value in sources:
            if value:
                self.add("project", "ok", f"{value} (from {source})")
                return str(value)
        self.add("project", "fail", "no Google Cloud project",
                 "pass --project (LAUNCH_PROJECT, `project` in launch.toml); `terraform output "
                 f"project` in {GCP_TERRAFORM}")
        return None

    def region(self) -> str | None:
        import re

        for source, value in (("--region / launch.toml", self.settings.get("region")),
                              ("LAUNCH_REGION", self.environ.get("LAUNCH_REGION")),
                              ("CLOUDSDK_AI_REGION", self.environ.get("CLOUDSDK_AI_REGION"))):
            if not value:
                continue
            if not re.fullmatch(r"[a-z]+(-[a-z]+)+\d+", str(value)):
                self.add("region", "fail", f"{value!r} ({source}) is not a Google Cloud region",
                         "for example us-central1; Vertex AI's regions: "
                         "https://cloud.google.com/vertex-ai/docs/general/locations")
                return None
            self.add("region", "ok", f"{value} (from {source})")
            return str(value)
        self.add("region", "fail", "no region for Vertex AI",
                 f"pass --region (LAUNCH_REGION, `region` in launch.toml); `terraform output "
                 f"region` in {GCP_TERRAFORM}")
        return None

    def provider(self, project: str, region: str, bucket: str | None, prefix: str,
                 account: str | None, credentials: Any) -> Any:
        """The Vertex provider's own clients (endpoints, transports, credentials), with short
        timeouts and retries: a doctor reports, it does not wait two minutes."""
        from launcher.providers.vertex import Timing, VertexProvider

        timing = Timing(rpc_timeout_s=CALL_TIMEOUT_S, retry_initial_s=0.2,
                        retry_deadline_s=CALL_TIMEOUT_S)
        provider = VertexProvider(project=project, region=region, bucket=bucket,
                                  prefix=prefix or "launch", service_account=account,
                                  environ=self.environ, timing=timing)
        if credentials is not None:
            provider._credentials = credentials  # found once, within the deadline, above
        return provider

    # -- the bucket and the service account

    def bucket(self, provider: Any, region: str) -> None:
        from launcher.providers import _gcp

        name = provider.bucket
        if not name:
            self.add("bucket", "fail", "no Cloud Storage bucket configured",
                     "pass --bucket NAME or gs://NAME/PREFIX (LAUNCH_BUCKET, `bucket` in "
                     f"launch.toml); `terraform output bucket` in {GCP_TERRAFORM}")
            return
        needed = [n.permission for n in VERTEX_NEEDS if n.on == "bucket"]
        try:
            client = provider._storage_client()
            found = client.lookup_bucket(name, timeout=CALL_TIMEOUT_S)
            if found is None:
                self.add("bucket", "fail", f"gs://{name} does not exist",
                         f"`terraform apply` in {GCP_TERRAFORM}, or `gcloud storage buckets "
                         f"create gs://{name} --location={region}`")
                return
            granted = set(found.test_iam_permissions(needed, timeout=CALL_TIMEOUT_S))
        except LaunchError as exc:
            self.add("bucket", "fail", exc.message, exc.hint)
            return
        except Exception as exc:
            error = _gcp.provider_error(exc, f"reading gs://{name}")
            self.add("bucket", "fail", error.message, error.hint,
                     needs=[f"storage.buckets.get on gs://{name}"])
            return
        missing = [p for p in needed if p not in granted]
        if missing:
            self.add("bucket", "fail", f"gs://{name} exists, but you lack {len(missing)} of the "
                     "staging permissions",
                     f"grant the staging role on the bucket (`terraform output launcher_roles` "
                     f"in {GCP_TERRAFORM}: bucket)", needs=[f"{p} on gs://{name}" for p in missing])
            return
        location = str(found.location or "").lower()
        notes = []
        if location and location != region.lower():
            notes.append(f"it is in {location}, the jobs run in {region}")
        if found.iam_configuration.uniform_bucket_level_access_enabled is False:
            notes.append("uniform bucket-level access is off")
        prevention = str(found.iam_configuration.public_access_prevention or "").lower()
        if prevention != "enforced":
            notes.append(f"public access prevention is {prevention or 'not set'}, not enforced")
        granted_needs = [f"{p} on gs://{name}" for p in needed]
        if notes:
            self.add("bucket", "warn", f"gs://{name} works, but {'; '.join(notes)}",
                     f"the bucket {GCP_TERRAFORM} creates is in the jobs' region (staging and "
                     "checkpoints stay fast, no egress), with uniform access and public access "
                     "prevention enforced", needs=granted_needs)
            return
        self.add("bucket", "ok", f"gs://{name} ({location}; staging permissions granted)",
                 needs=granted_needs)

    def service_account(self, account: str | None, credentials: Any, loopback: bool) -> None:
        """The jobs' account: may the caller start jobs that run as it (actAs)? Asked with the
        account's testIamPermissions, which needs no permission of its own."""
        if not account:
            self.add("service account", "warn",
                     "no --service-account: jobs run as the Vertex AI Custom Code Service Agent",
                     "give the jobs their own account with access to the bucket only: "
                     f"`terraform output service_account` in {GCP_TERRAFORM}")
            return
        needs = [f"iam.serviceAccounts.actAs on {account}"]
        endpoint = self.environ.get(IAM_ENDPOINT_VARIABLE)
        if loopback and not endpoint:
            self.add("service account", "ok", f"jobs run as {account} (actAs not checked "
                     "against loopback test endpoints)", needs=needs)
            return
        url = (f"{(endpoint or GOOGLE_IAM).rstrip('/')}/v1/projects/-/serviceAccounts/"
               f"{account}:testIamPermissions")
        try:
            answer = _rest(url, _session_credentials(endpoint, credentials), method="POST",
                           body={"permissions": ["iam.serviceAccounts.actAs"]})
        except _HttpError as exc:
            if exc.status == 404:
                self.add("service account", "fail", f"{account} does not exist",
                         f"`terraform apply` in {GCP_TERRAFORM} creates it, or pass another "
                         "--service-account")
            else:
                self.add("service account", "warn", f"cannot ask IAM about {account} ({exc})",
                         "Vertex AI checks iam.serviceAccounts.actAs when a job is created",
                         needs=needs)
            return
        except Exception as exc:
            self.add("service account", "warn", f"cannot ask IAM about {account} "
                     f"({_one_line(exc)})", "Vertex AI checks iam.serviceAccounts.actAs when a "
                     "job is created", needs=needs)
            return
        if "iam.serviceAccounts.actAs" not in answer.get("permissions", []):
            self.add("service account", "fail",
                     f"you may not start jobs that run as {account}",
                     "grant the act_as role on that account (`terraform output launcher_roles` "
                     f"in {GCP_TERRAFORM}: service_account), or roles/iam.serviceAccountUser on "
                     "it", needs=needs)
            return
        self.add("service account", "ok", f"jobs run as {account} (you may act as it)",
                 needs=needs)

    # -- custom jobs, logs, quotas

    def custom_jobs(self, provider: Any) -> None:
        from launcher.providers import _gcp

        parent = provider.parent
        try:
            pager = provider._job_client(provider.region).list_custom_jobs(
                request={"parent": parent, "page_size": 1},
                retry=_gcp.retry_policy(reads=True, initial=0.2, deadline=CALL_TIMEOUT_S),
                timeout=CALL_TIMEOUT_S)
            first = list(pager.custom_jobs)
        except LaunchError as exc:
            self.add("custom jobs", "fail", exc.message, exc.hint)
            return
        except Exception as exc:
            error = _gcp.provider_error(exc, f"listing the custom jobs of {parent}")
            self.add("custom jobs", "fail", error.message, _api_fix(exc, "aiplatform") or
                     error.hint, needs=[f"aiplatform.customJobs.list on projects/"
                                        f"{provider.project}"])
            return
        self.add("custom jobs", "ok", f"Vertex AI answers for {parent} "
                 f"({'jobs found' if first else 'no jobs yet'})",
                 needs=[f"{n.permission} on projects/{provider.project}" for n in VERTEX_NEEDS
                        if n.permission.startswith("aiplatform.")])

    def logs(self, provider: Any) -> None:
        from datetime import UTC, datetime, timedelta

        from launcher.providers import _gcp

        since = _gcp.rfc3339(datetime.now(UTC) - timedelta(hours=1))
        query = f'resource.type="ml_job" AND timestamp>="{since}"'
        try:
            records = provider._logs_reader().read(query, limit=1, page_size=1)
        except LaunchError as exc:
            self.add("logs", "fail", exc.message, exc.hint)
            return
        except Exception as exc:
            error = _gcp.provider_error(exc, "reading Cloud Logging")
            self.add("logs", "fail", error.message, _api_fix(exc, "logging") or error.hint,
                     needs=[f"logging.logEntries.list on projects/{provider.project}"])
            return
        self.add("logs", "ok", "Cloud Logging answers (" + (
            "training entries in the last hour" if records else "no training entries in the "
            "last hour") + ")", needs=[f"logging.logEntries.list on projects/{provider.project}"])

    def quota(self, project: str, region: str, credentials: Any, loopback: bool) -> None:
        """The region's custom-training GPU quotas from the Cloud Quotas API."""
        endpoint = self.environ.get(QUOTAS_ENDPOINT_VARIABLE)
        if loopback and not endpoint:
            self.add("quota", "warn", "not checked against loopback test endpoints",
                     f"set {QUOTAS_ENDPOINT_VARIABLE} to a Cloud Quotas endpoint")
            return
        base = (endpoint or CLOUD_QUOTAS).rstrip("/")
        url = (f"{base}/v1/projects/{project}/locations/global/services/"
               "aiplatform.googleapis.com/quotaInfos")
        try:
            infos = _quota_infos(url, _session_credentials(endpoint, credentials))
        except Exception as exc:
            self.add("quota", "warn", f"GPU quotas not available ({_one_line(exc)})",
                     "see IAM & Admin > Quotas (Vertex AI API, custom model training GPUs); "
                     "roles/cloudquotas.viewer lets the doctor read them",
                     needs=[f"cloudquotas.quotas.get on projects/{project}"])
            return
        gpus = _gpu_quotas(infos, region)
        machine = self.settings.get("machine")
        if machine:
            from launcher.providers.vertex import machine_spec

            try:
                spec = machine_spec(str(machine), 1)
            except LaunchError as exc:
                self.add("quota", "warn", f"cannot tell the GPU of {machine}: {exc.message}")
                return
            wanted = (spec.accelerator_type or "").lower()
            matching = _quota_for(wanted, gpus)
            if not matching:
                self.add("quota", "warn", f"no custom-training quota for {wanted or machine} "
                         f"reported in {region}", "check the machine and the region")
            elif max(matching.values()) < spec.accelerator_count:
                self.add("quota", "fail",
                         f"custom-training quota for {wanted} in {region}: "
                         f"{max(matching.values()):g}, a {machine} node needs "
                         f"{spec.accelerator_count}",
                         "request an increase: IAM & Admin > Quotas > Vertex AI API > "
                         f"{next(iter(matching))}")
            else:
                self.add("quota", "ok", f"{', '.join(f'{k} {v:g}' for k, v in matching.items())}"
                         f" in {region}")
            return
        above = {k: v for k, v in gpus.items() if v >= 1}
        if not above:
            self.add("quota", "warn", f"no custom-training GPU quota above 0 in {region}",
                     "request an increase: IAM & Admin > Quotas > Vertex AI API > "
                     "custom_model_training_<gpu>_gpus for the region")
            return
        self.add("quota", "ok", f"custom-training GPUs in {region}: "
                 + ", ".join(f"{k} {v:g}" for k, v in sorted(above.items())))


def _gcp_kind(credentials: Any, environ: Mapping[str, str]) -> str:
    """What kind of application-default credentials these are, in words (no key material)."""
    module = type(credentials).__module__
    email = getattr(credentials, "service_account_email", None)
    if "service_account" in module:
        return f"service account key {email}" if email else "service account key"
    if "external_account" in module or "identity_pool" in module:
        return "workload identity federation"
    if "compute_engine" in module:
        return "the metadata server's service account"
    if "impersonated" in module:
        return "impersonated service account"
    if environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return "GOOGLE_APPLICATION_CREDENTIALS"
    return "gcloud application-default login"


def _api_fix(exc: BaseException, api: str) -> str:
    """The fix when Google says the API is not enabled on the project."""
    text = str(exc)
    if "SERVICE_DISABLED" in text or "has not been used" in text or "is disabled" in text:
        return (f"enable it: `gcloud services enable {api}.googleapis.com` (the Terraform in "
                f"{GCP_TERRAFORM} does)")
    return ""


class _HttpError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def _session_credentials(endpoint: str | None, credentials: Any) -> Any:
    """No credentials for a plain-HTTP (loopback) endpoint override; ADC otherwise."""
    return None if endpoint and endpoint.startswith("http://") else credentials


def _rest(url: str, credentials: Any, method: str = "GET", params: dict[str, Any] | None = None,
          body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One Google REST call (with the credentials' token when there are credentials)."""
    if credentials is None:
        import requests

        session: Any = requests.Session()
    else:
        from google.auth.transport.requests import AuthorizedSession

        session = AuthorizedSession(credentials)
    answer = session.request(method, url, params=params, json=body, timeout=CALL_TIMEOUT_S)
    if answer.status_code != 200:
        try:
            message = answer.json()["error"]["message"]
        except Exception:
            message = answer.text[:200]
        raise _HttpError(answer.status_code, str(message))
    data = answer.json()
    return data if isinstance(data, dict) else {}


def _quota_infos(url: str, credentials: Any) -> list[dict[str, Any]]:
    """Every QuotaInfo of the service, page by page."""
    infos: list[dict[str, Any]] = []
    token = ""
    for _ in range(50):
        params = {"pageSize": 500, **({"pageToken": token} if token else {})}
        data = _rest(url, credentials, params=params)
        infos += data.get("quotaInfos", [])
        token = data.get("nextPageToken", "")
        if not token:
            break
    return infos


def _gpu_quotas(infos: list[dict[str, Any]], region: str) -> dict[str, float]:
    """``custom_model_training_<gpu>_gpus`` metric name -> its value in ``region``."""
    found: dict[str, float] = {}
    for info in infos:
        metric = str(info.get("metric", "")).rsplit("/", 1)[-1]
        if not (metric.startswith("custom_model_training_") and metric.endswith("gpus")):
            continue
        for dimension in info.get("dimensionsInfos", []):
            where = (dimension.get("dimensions") or {}).get("region")
            if where not in (region, None):
                continue
            try:
                value = float((dimension.get("details") or {}).get("value", 0))
            except (TypeError, ValueError):
                continue
            if where == region or metric not in found:
                found[metric] = value
    return found


def _gpu_words(name: str) -> frozenset[str]:
    return frozenset(w for w in name.lower().replace("-", "_").split("_")
                     if w and w not in ("tesla", "gpus", "custom", "model", "training"))


def _quota_for(accelerator: str, gpus: dict[str, float]) -> dict[str, float]:
    """The quota metric of an accelerator type: the one with the same words (NVIDIA_A100_80GB:
    custom_model_training_nvidia_a100_80gb_gpus), else the most specific one whose words it has
    (NVIDIA_H100_80GB: ..._nvidia_h100_gpus; NVIDIA_TESLA_T4: ..._nvidia_t4_gpus)."""
    words = _gpu_words(accelerator)
    exact = {k: v for k, v in gpus.items() if _gpu_words(k) == words}
    if exact:
        return exact
    inside = [k for k in gpus if _gpu_words(k) <= words and len(_gpu_words(k)) > 1]
    if not inside:
        return {}
    best = max(len(_gpu_words(k)) for k in inside)
    return {k: gpus[k] for k in inside if len(_gpu_words(k)) == best}
