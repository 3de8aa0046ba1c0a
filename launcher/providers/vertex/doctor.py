"""`launch doctor --provider vertex`: is this machine and this Google Cloud project ready?

Checks, in order, each with the permissions it relies on: application-default credentials
(within :data:`~launcher.providers.checks.CREDENTIALS_DEADLINE_S`; the kind is named, the content
never is); project; region; the bucket (get, location, uniform access, public access prevention;
testIamPermissions for the staging permissions); the jobs' service account (its
testIamPermissions: may the caller act as it); listing custom jobs (the custom jobs permission and
the API being enabled); reading log entries; the region's custom-training GPU quotas (Cloud
Quotas; a warning where they cannot be read).

Calls go through the provider's own clients (:class:`VertexProvider`), so the doctor talks to the
same endpoints with the same credentials as a launch does, and the loopback test servers stand in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.providers.checks import (
    CALL_TIMEOUT_S,
    CREDENTIALS_DEADLINE_S,
    Check,
    Checks,
    Need,
    one_line,
    within,
)
from launcher.status import LaunchError

#: Override the Cloud Quotas and IAM endpoints (``http://HOST:PORT``: a loopback test server,
#: called without credentials).
QUOTAS_ENDPOINT_VARIABLE = "LAUNCH_QUOTAS_ENDPOINT"
IAM_ENDPOINT_VARIABLE = "LAUNCH_IAM_ENDPOINT"
CLOUD_QUOTAS = "https://cloudquotas.googleapis.com"
GOOGLE_IAM = "https://iam.googleapis.com"
GCP_TERRAFORM = "infra/gcp"

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


def doctor_checks(settings: Mapping[str, Any], environ: Mapping[str, str], provider_class: Any
                  ) -> list[Check]:
    """Every check, in order (:meth:`VertexProvider.doctor_checks` passes itself)."""
    doctor = VertexChecks(dict(settings), dict(environ), provider_class)
    doctor.run()
    return doctor.checks


class VertexChecks(Checks):
    """`launch doctor --provider vertex`, one check after the other (:meth:`run`), with the
    provider's own clients (``provider_class``: :class:`VertexProvider`)."""

    def __init__(self, settings: dict[str, Any], environ: dict[str, str], provider_class: Any):
        super().__init__(settings, environ)
        self.provider_class = provider_class

    AFTER_SETTINGS = ("bucket", "service account", "custom jobs", "logs", "quota")

    def run(self) -> None:
        from launcher.providers.vertex import _gcp
        from launcher.providers.vertex.names import check_service_account, parse_bucket

        bucket: str | None = None
        prefix = ""
        raw_bucket = self.settings.get("bucket") or self.environ.get("LAUNCH_BUCKET")
        if raw_bucket:
            bucket, prefix = parse_bucket(str(raw_bucket))  # malformed: BadValue, exit 2
        account = self.settings.get("service_account")
        if account is not None:
            account = check_service_account(account)  # malformed: BadValue, exit 2
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
        from launcher.providers.vertex import _gcp

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

        done, found, error = within(CREDENTIALS_DEADLINE_S, lookup)
        if not done:
            self.add("credentials", "fail",
                     f"no application-default credentials within {CREDENTIALS_DEADLINE_S:g} s "
                     "(the metadata server did not answer)", _gcp.ADC_HINT)
            return None, None
        if error is not None:
            if isinstance(error, LaunchError):
                self.add("credentials", "fail", error.message, error.hint)
            else:
                self.add("credentials", "fail", f"credentials: {one_line(error)}", _gcp.ADC_HINT)
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
        from launcher.providers.vertex.names import check_project

        for source, value in sources:
            if value:
                try:
                    check_project(value, source)
                except LaunchError as exc:  # as a malformed region: a failed check
                    self.add("project", "fail", exc.message, exc.hint)
                    return None
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
        from launcher.providers.vertex.timing import Timing

        timing = Timing(rpc_timeout_s=CALL_TIMEOUT_S, retry_initial_s=0.2,
                        retry_deadline_s=CALL_TIMEOUT_S)
        # The credentials were found once, within the deadline, above (None: loopback).
        return self.provider_class(project=project, region=region, bucket=bucket,
                                   prefix=prefix or "launch", service_account=account,
                                   environ=self.environ, timing=timing, credentials=credentials)

    # -- the bucket and the service account

    def bucket(self, provider: Any, region: str) -> None:
        from launcher.providers.vertex import _gcp

        name = provider.bucket
        if not name:
            self.add("bucket", "fail", "no Cloud Storage bucket configured",
                     "pass --bucket NAME or gs://NAME/PREFIX (LAUNCH_BUCKET, `bucket` in "
                     f"launch.toml); `terraform output bucket` in {GCP_TERRAFORM}")
            return
        needed = [n.permission for n in VERTEX_NEEDS if n.on == "bucket"]
        try:
            client = provider.storage_client()
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
                     f"({one_line(exc)})", "Vertex AI checks iam.serviceAccounts.actAs when a "
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
        from launcher.providers.vertex import _gcp

        parent = provider.parent
        try:
            pager = provider.job_client(provider.region).list_custom_jobs(
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

        from launcher.providers.vertex import _gcp

        since = _gcp.rfc3339(datetime.now(UTC) - timedelta(hours=1))
        query = f'resource.type="ml_job" AND timestamp>="{since}"'
        try:
            records = provider.logs_reader().read(query, limit=1, page_size=1)
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
            self.add("quota", "warn", f"GPU quotas not available ({one_line(exc)})",
                     "see IAM & Admin > Quotas (Vertex AI API, custom model training GPUs); "
                     "roles/cloudquotas.viewer lets the doctor read them",
                     needs=[f"cloudquotas.quotas.get on projects/{project}"])
            return
        gpus = _gpu_quotas(infos, region)
        machine = self.settings.get("machine")
        if machine:
            from launcher.providers.vertex.machines import machine_spec

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
