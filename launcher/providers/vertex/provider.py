"""The Vertex AI provider: a CustomJob per attempt, followed through Cloud Logging, cancelled the
moment a rank runs out of memory.

What is sent (``dryrun``, pure; ``launch plan --provider vertex --json`` shows it):

- a ``CustomJob`` in its REST JSON form (the body of ``projects.locations.customJobs.create``):
  worker pool 0 is the primary node (one replica), pool 1 the other ``nodes - 1``; each runs the
  prebuilt PyTorch training container (or ``image``) with a small bootstrap as its command;
  ``baseOutputDirectory`` is the run's folder in the bucket, shared by all its attempts;
  ``scheduling.disableRetries`` so an out-of-memory failure fails at once instead of being
  restarted with the same plan; labels carry the run id and attempt number;
- two archives staged to ``gs://BUCKET/PREFIX/staging/``, each named by its content hash, so the
  user's code is uploaded once however many attempts and runs use it: ``code-<hash>.tar.gz``
  (the script's folder, under ``code/``) and ``job-<hash>.tar.gz`` (``launch_train.py`` and
  ``plan.json``, which differ per attempt).

On the node, the bootstrap (:data:`BOOTSTRAP`) unpacks both archives, works out this node's place
from ``CLUSTER_SPEC`` (which Vertex AI sets in every container; ``MASTER_ADDR``/``RANK`` as the
prebuilt PyTorch images also set are the fallback) and execs ``torchrun``. It reads the archives
through Cloud Storage FUSE (``/gcs/BUCKET/...``, mounted on every Vertex AI training node), with
``google-cloud-storage`` (in the prebuilt images) as the fallback, so no gsutil or gcloud is
needed in the image. Checkpoints go to ``/gcs/BUCKET/PREFIX/runs/RUN/checkpoints``: the same
folder for every attempt of a run, so a resubmitted plan resumes (docs/providers/vertex.md).

Following: ``get_custom_job`` for the state (state changes come out as ``[vertex]`` lines), Cloud
Logging for the replicas' output (``resource.type="ml_job"``), read in timestamp order with a JSON
cursor that de-duplicates by insertId, and the job's ``error.message`` as a last line, since a
replica killed by the kernel's OOM killer prints nothing itself. Cloud Logging is read through two
channels sharing the project's read quota: ``events``, a query filtered on Google's side to the
templates' event lines and the failure classifier's out-of-memory needles, read first every poll,
so an OOM is seen seconds after it is written however much the job logs; and ``logs``, the full
stream, a page at a time, paced to the rest of the quota (``behind`` says how far it trails).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from launcher import packaging
from launcher.packaging import Selection
from launcher.plan.plan import Plan
from launcher.providers import images
from launcher.providers.base import (
    TERMINAL_STATES,
    Job,
    JobState,
    JobStatus,
    Provider,
    in_code_folder,
    torchrun_script_args,
)
from launcher.providers.checks import Check
from launcher.providers.vertex import _gcp
from launcher.providers.vertex.logs import VertexLogs
from launcher.providers.vertex.machines import machine_spec
from launcher.providers.vertex.names import (
    DEFAULT_PREFIX,
    DEFAULT_TIMEOUT_S,
    STATES,
    check_project,
    check_region,
    check_service_account,
    console_url,
    parse_bucket,
    parse_duration,
    parse_job_name,
)
from launcher.providers.vertex.settings import VertexSettings
from launcher.providers.vertex.timing import Timing
from launcher.render import PLAN_NAME
from launcher.status import ProviderError, UsageError

#: The prebuilt PyTorch GPU training image (Artifact Registry, per continent); ``image`` replaces
#: it. See https://cloud.google.com/vertex-ai/docs/training/pre-built-containers
#: Its torch (2.4) is in launcher/providers/images.py, with the oldest torch each strategy's
#: script ran under: plans that need a newer torch get the official PyTorch image (image_for).
DEFAULT_IMAGE = "{geo}-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest"
LABEL_RUN, LABEL_ATTEMPT, LABEL_TOOL = "launch_run_id", "launch_attempt", "launched_by"
#: Vertex AI's ways of saying it had no machines to give (Compute Engine's stockouts), or took
#: them away: the same plan is worth another attempt (:meth:`VertexProvider.lost_capacity`).
CAPACITY_PATTERNS = ("insufficient capacity", "resources are insufficient",
                     "does not have enough resources", "ZONE_RESOURCE_POOL_EXHAUSTED", "stockout")


def bootstrap_source() -> str:
    """What runs on every node as ``python3 -c BOOTSTRAP <torchrun args>``: fetch the staged
    archives, find this node's rank, exec torchrun (``bootstrap.py`` of this package, shipped as
    package data, without its first line: a note for the linter). Python 3.8+ and the standard
    library only (plus google-cloud-storage when /gcs is not mounted), so it runs in the prebuilt
    images and in most users' own."""
    text = resources.files(__package__).joinpath("bootstrap.py").read_text(encoding="utf-8")
    return text.split("\n", 1)[1] if text.startswith("# ruff: noqa") else text


BOOTSTRAP = bootstrap_source()


@dataclass(frozen=True)
class VertexRequest:
    """Exactly what ``schedule`` sends: the CustomJob's REST JSON (canonical proto3 JSON, so
    ``CustomJob`` parses it strictly and prints it back unchanged), its parent, and the archives
    staged before it."""

    parent: str
    custom_job: dict[str, Any]
    staging: tuple[_gcp.StagedArchive, ...]
    attempt_dir: str | None = field(default=None, compare=False)  # where request.json is kept
    upload: Selection | None = field(default=None, repr=False)  # the code folder's files

    def to_dict(self) -> dict[str, Any]:
        data = {"parent": self.parent, "customJob": self.custom_job,
                "staging": [archive.to_dict() for archive in self.staging]}
        if self.upload is not None:  # what the code archive holds, and what was left out
            data["upload"] = self.upload.to_dict()
        return data


class VertexProvider(VertexLogs, Provider):
    name: ClassVar[str] = "vertex"
    has_doctor: ClassVar[bool] = True
    capacity_patterns: ClassVar[tuple[str, ...]] = CAPACITY_PATTERNS
    # Vertex AI, and AI Platform / Cloud ML Engine before it: its API host, its worker pools and
    # replicas, the training container's names.
    platform_pattern: ClassVar[str] = (
        r"ml\.googleapis\.com|runcloudml|cloudml|aiplatform|workerpool\d|The replica |"
        r"cmle-training|Vertex AI|vertex-ai|vertex_ai")
    platform_needles: ClassVar[tuple[str, ...]] = (
        "googleapis", "cloudml", "aiplatform", "workerpool", "the replica ", "cmle-training",
        "vertex ai", "vertex-ai", "vertex_ai")
    platform_aliases: ClassVar[tuple[str, ...]] = ("cloudml", "aiplatform")

    def __init__(self, *, project: str, region: str, bucket: str | None = None,
                 prefix: str = DEFAULT_PREFIX, service_account: str | None = None,
                 spot: bool = False, image: str | None = None,
                 timeout_s: int = DEFAULT_TIMEOUT_S, environ: dict[str, str] | None = None,
                 timing: Timing | None = None, credentials: Any = None):
        """``credentials``: found already (``launch doctor`` looks them up within a deadline);
        None: application-default credentials, looked up at the first call that needs them."""
        self.project = project
        self.region = check_region(region)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.service_account = service_account
        self.spot = spot
        self.image = image  # None: the default for each plan's strategy (image_for)
        self.timeout_s = timeout_s
        self.environ = dict(os.environ if environ is None else environ)
        self.timing = timing or Timing.from_environ(self.environ)
        self.vertex_endpoint = _gcp.parse_endpoint(self.environ.get("LAUNCH_VERTEX_ENDPOINT"))
        self.logging_endpoint = _gcp.parse_endpoint(self.environ.get("LAUNCH_LOGGING_ENDPOINT"))
        self.storage_emulator = self.environ.get("STORAGE_EMULATOR_HOST")
        self._credentials: Any = credentials
        self._job_clients: dict[str, Any] = {}
        self._log_reader: Any = None
        self._storage: Any = None
        self._jobs: dict[str, tuple[float, Any]] = {}   # job name -> (monotonic time, CustomJob)
        self._last_read: dict[str, float] = {}          # job name -> monotonic time of last read
        self._backoffs: dict[tuple[str, str], _gcp.Backoff] = {}  # (job, channel) -> backoff
        self._events_off: set[str] = set()               # jobs whose event channel was refused
        self._notes: dict[str, list[str]] = {}           # job -> lines for the next logs()

    # -- configuration ---------------------------------------------------------------------------

    @classmethod
    def from_settings(cls, settings: dict[str, Any], environ: dict[str, str] | None = None
                      ) -> VertexProvider:
        """Settings: project, region, bucket (``NAME`` or ``gs://NAME/PREFIX``), service_account,
        spot, image, timeout (seconds, or ``90m``, ``12h``, ``2d``). Credentials never are: they
        come from application-default credentials when the first call is made."""
        environ = dict(os.environ if environ is None else environ)
        given = VertexSettings.from_mapping(settings)
        bucket, prefix = None, DEFAULT_PREFIX
        raw_bucket = given.bucket or environ.get("LAUNCH_BUCKET")
        if raw_bucket:
            bucket, prefix = parse_bucket(str(raw_bucket))
        region = None
        for source, value in (("--region or LAUNCH_REGION", given.region),
                              ("LAUNCH_REGION", environ.get("LAUNCH_REGION")),
                              ("CLOUDSDK_AI_REGION", environ.get("CLOUDSDK_AI_REGION"))):
            if value:
                region = check_region(value, source)
                break
        if not region:
            raise UsageError("no region for Vertex AI",
                             "pass --region (e.g. us-central1) or set LAUNCH_REGION")
        anonymous = _gcp.parse_endpoint(environ.get("LAUNCH_VERTEX_ENDPOINT")).anonymous
        project, source = given.project, "--project or LAUNCH_PROJECT"
        if not project:
            project, source = environ.get("LAUNCH_PROJECT"), "LAUNCH_PROJECT"
        if not project and not anonymous:
            project, source = _gcp.default_project(environ), "the environment's default project"
        if not project:
            raise UsageError("no Google Cloud project for Vertex AI",
                             "pass --project or set LAUNCH_PROJECT (or GOOGLE_CLOUD_PROJECT)")
        project = check_project(project, source)
        account = given.service_account
        if account is not None:
            account = check_service_account(account)
        timeout = given.timeout or environ.get("LAUNCH_VERTEX_TIMEOUT")
        return cls(project=str(project), region=str(region), bucket=bucket, prefix=prefix,
                   service_account=account, spot=given.spot,
                   image=given.image or environ.get("LAUNCH_VERTEX_IMAGE"),
                   timeout_s=parse_duration(timeout) if timeout else DEFAULT_TIMEOUT_S,
                   environ=environ)

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"

    @classmethod
    def doctor_checks(cls, settings: Mapping[str, Any], environ: Mapping[str, str]
                      ) -> list[Check]:
        """Credentials, project, region, bucket, service account, custom jobs, logs and GPU
        quota (launcher/providers/vertex/doctor.py), through this provider's own clients."""
        from launcher.providers.vertex.doctor import doctor_checks

        return doctor_checks(settings, environ, cls)

    # -- the request -------------------------------------------------------------------------

    def image_for(self, plan: Plan) -> str:
        """``image`` if given, else the prebuilt PyTorch image where its torch (2.4) runs the
        plan's script, else the official PyTorch image (launcher/providers/images.py)."""
        if self.image:
            return self.image
        chosen = images.default_image(self.name, plan.strategy, plan.optimizer)
        if chosen is None or chosen.repository.startswith("vertex-ai/"):
            return DEFAULT_IMAGE.format(geo=_geo(self.region))
        return f"docker.io/{chosen.repository}:{chosen.tag}"

    def dryrun(self, job: Job) -> VertexRequest:
        """The CustomJob and the archives to stage, from local files only: no network, no
        writes."""
        plan = job.plan
        if not self.bucket:
            raise UsageError("no bucket for the code and checkpoints of a Vertex AI job",
                             "pass --bucket NAME (a Cloud Storage bucket in the job's region)")
        if plan.nodes < 1 or plan.gpus_per_node < 1:
            raise UsageError(f"a plan of {plan.nodes} node(s) x {plan.gpus_per_node} GPU(s) "
                             "cannot run")
        # The image's torch must be one the strategy's script was run under (images.MIN_TORCH).
        image = self.image_for(plan)
        images.check_image(image, plan.strategy, plan.optimizer, self.name)
        machine = machine_spec(plan.machine, plan.gpus_per_node)
        run_root = f"{self.prefix}/runs/{job.run_id}" if self.prefix else f"runs/{job.run_id}"
        checkpoints = f"/gcs/{self.bucket}/{run_root}/checkpoints"
        staging = f"gs://{self.bucket}/{self.prefix + '/' if self.prefix else ''}staging"

        upload = packaging.select_for_job(job, self.environ, "Cloud Storage (jobs read "
                                          "gs://BUCKET/... as /gcs/BUCKET/...)")
        code_members = _gcp.code_members(upload, "code")
        entry = self._entrypoint(job)
        files = dict(job.rendered.files)
        if PLAN_NAME in files:
            files[PLAN_NAME] = _rewrite_plan(files[PLAN_NAME], job, checkpoints)
        job_members = _gcp.text_members(files)
        code_hash = _gcp.content_hash(code_members)
        job_hash = _gcp.content_hash(job_members)
        archives = (
            _gcp.StagedArchive(uri=f"{staging}/code-{code_hash[:32]}.tar.gz", sha256=code_hash,
                               members=tuple(code_members), source=str(job.code_dir)),
            _gcp.StagedArchive(uri=f"{staging}/job-{job_hash[:32]}.tar.gz", sha256=job_hash,
                               members=tuple(job_members),
                               source=f"{', '.join(sorted(files))} of attempt {job.attempt}"),
        )
        env = {
            **job.rendered.env,
            "LAUNCH_CHECKPOINT_DIR": checkpoints,
            "LAUNCH_PLAN": PLAN_NAME,
            "LAUNCH_RUN_ID": job.run_id,
            "LAUNCH_ATTEMPT": str(job.attempt),
            "LAUNCH_STAGED": " ".join(a.uri for a in archives),
            "PYTHONUNBUFFERED": "1",
            # torchrun's --tee prefix with the global rank ("[rank9]:"), not the local one.
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:",
        }
        # The script's own arguments follow it in the container's args, each one element: the
        # bootstrap hands its sys.argv[1:] to torchrun as they are (no shell), and torchrun
        # hands what follows the script to it (the framework shim, to the script it runs).
        container = {
            "imageUri": image,
            "command": ["python3", "-c", BOOTSTRAP],
            "args": ["--nproc_per_node", str(plan.gpus_per_node), "--tee", "3", entry,
                     *torchrun_script_args(job.rendered.args)],
            "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        }
        pools = [{"machineSpec": machine.to_dict(), "replicaCount": "1",
                  "containerSpec": container}]
        if plan.nodes > 1:
            pools.append({"machineSpec": machine.to_dict(), "replicaCount": str(plan.nodes - 1),
                          "containerSpec": json.loads(json.dumps(container))})
        scheduling: dict[str, Any] = {"timeout": f"{self.timeout_s}s", "disableRetries": True}
        if self.spot:
            scheduling["strategy"] = "SPOT"
        spec: dict[str, Any] = {
            "workerPoolSpecs": pools,
            "scheduling": scheduling,
            "baseOutputDirectory": {"outputUriPrefix": f"gs://{self.bucket}/{run_root}"},
        }
        if self.service_account:
            spec["serviceAccount"] = self.service_account
        custom_job = {
            "displayName": f"launch-{job.run_id}-attempt-{job.attempt}"[:128],
            "jobSpec": spec,
            "labels": {LABEL_RUN: _gcp.label_value(job.run_id), LABEL_ATTEMPT: str(job.attempt),
                       LABEL_TOOL: "launch"},
        }
        return VertexRequest(parent=self.parent, custom_job=custom_job, staging=archives,
                             attempt_dir=str(job.attempt_dir), upload=upload)

    @staticmethod
    def _entrypoint(job: Job) -> str:
        """The script torchrun starts, relative to the unpacked job folder."""
        entry = job.rendered.entrypoint
        if entry in job.rendered.files:
            return entry
        return str(PurePosixPath("code", in_code_folder(entry, job.code_dir)))

    # -- sending -----------------------------------------------------------------------------

    def schedule(self, request: VertexRequest) -> str:  # type: ignore[override]
        """Stage what is missing, then create the job; return its resource name. An archive
        staged under a fresh name (another object held its own: ``_gcp.stage``) is sent under
        that one, and said so in the job's first log lines."""
        staged = self._stage(request.staging)
        if staged != request.staging:
            request = _restaged(request, staged)
        if request.attempt_dir:
            _write_json(Path(request.attempt_dir) / "request.json", request.to_dict())
        job = self._create(request)
        if request.attempt_dir:
            _write_json(Path(request.attempt_dir) / "job.json",
                        {"name": job.name, "console": console_url(job.name, self.project)})
        self._jobs[job.name] = (time.monotonic(), job)
        for archive in staged:
            if archive.instead_of:
                self._notes.setdefault(str(job.name), []).append(
                    f"[vertex] {archive.instead_of} holds other bytes than launch staged there "
                    f"(someone who can write the bucket put them); the job reads {archive.uri} "
                    "instead. Delete that object so that later launches reuse one upload")
        return str(job.name)

    def _stage(self, archives: tuple[_gcp.StagedArchive, ...]
               ) -> tuple[_gcp.StagedArchive, ...]:
        bucket = self.bucket or ""
        with _gcp.translating(f"staging the code to gs://{bucket}"):
            client = self.storage_client()
            if client.lookup_bucket(bucket, timeout=self.timing.rpc_timeout_s) is None:
                raise ProviderError(
                    f"the bucket gs://{bucket} does not exist",
                    f"create it with `gcloud storage buckets create gs://{bucket} "
                    f"--location={self.region}`, or pass another --bucket")
            return tuple(_gcp.stage(client, archive, self.timing.rpc_timeout_s)
                         for archive in archives)

    def _create(self, request: VertexRequest) -> Any:
        """create_custom_job, retried on transient errors; before each retry, look the job up by
        its labels, since the failed call may have created it (create is not idempotent)."""
        from google.cloud.aiplatform_v1.types import CustomJob
        from google.protobuf import json_format

        body = CustomJob()
        json_format.ParseDict(request.custom_job, CustomJob.pb(body))
        labels = request.custom_job["labels"]
        sent = False

        def once() -> Any:
            nonlocal sent
            if sent:
                found = self._find(request.parent, labels)
                if found is not None:
                    return found
            sent = True
            return client.create_custom_job(parent=request.parent, custom_job=body, retry=None,
                                            timeout=self.timing.rpc_timeout_s)

        with _gcp.translating("creating the Vertex AI custom job"):
            client = self.job_client(self.region)
            return _gcp.call_with(self._retry(reads=False), once)

    def adopt(self, run_id: str, attempt: int, attempt_dir: Path) -> str | None:
        """An attempt's job, by the labels its dry run gave it (job names are the server's)."""
        labels = {LABEL_RUN: _gcp.label_value(run_id), LABEL_ATTEMPT: str(attempt)}
        with _gcp.translating("looking for the job of an unrecorded attempt"):
            found = self._find(self.parent, labels)
        return str(found.name) if found is not None else None

    def _find(self, parent: str, labels: dict[str, str]) -> Any:
        """The job this run and attempt already created, if any (the newest)."""
        query = " AND ".join(f'labels.{key}="{labels[key]}"' for key in (LABEL_RUN, LABEL_ATTEMPT))
        pager = self.job_client(self.region).list_custom_jobs(
            request={"parent": parent, "filter": query}, retry=self._retry(reads=True),
            timeout=self.timing.rpc_timeout_s)
        found = list(pager)
        return max(found, key=lambda job: job.create_time) if found else None

    def _retry(self, reads: bool) -> Any:
        return _gcp.retry_policy(reads=reads, initial=self.timing.retry_initial_s,
                                 deadline=self.timing.retry_deadline_s)

    # -- following ---------------------------------------------------------------------------

    def poll(self, job_id: str) -> JobStatus:
        job = self._get(job_id)
        mapped = STATES.get(job.state.name, JobState.RUNNING)
        message = job.error.message if job.error and job.error.message else ""
        if not message and mapped == JobState.CANCELLED:
            message = "cancelled"
        return JobStatus(state=mapped, exit_code=None, message=message)

    def _get(self, job_id: str, fresh: bool = False) -> Any:
        """The job, from a cache at most ``poll_s`` old (the supervisor asks five times a
        second; Vertex AI's read quota is per minute). An ended job never changes again."""
        _project, location, _number = parse_job_name(job_id)
        cached = self._jobs.get(job_id)
        if cached and not fresh:
            ended = STATES.get(cached[1].state.name) in (JobState.SUCCEEDED, JobState.FAILED)
            if ended or time.monotonic() - cached[0] < self.timing.poll_s:
                return cached[1]
        from google.api_core import exceptions as gexc

        started = time.monotonic()
        with _gcp.translating(f"reading the Vertex AI job {job_id}"):
            try:
                job = self.job_client(location).get_custom_job(
                    name=job_id, retry=_gcp.retry_policy(
                        reads=True, initial=self.timing.retry_initial_s,
                        deadline=self.timing.status_deadline_s),
                    timeout=self.timing.status_timeout_s)
            except gexc.RetryError as exc:
                # The last answer stands in while it is recent (a blip does not end a watch).
                if cached and time.monotonic() - cached[0] < self.timing.retry_deadline_s:
                    return cached[1]
                if _unanswered(exc.cause):
                    raise ProviderError(
                        f"reading the Vertex AI job {job_id}: {self._address(location)} did "
                        f"not answer; gave up after {time.monotonic() - started:.1f} s",
                        "check the network (and LAUNCH_VERTEX_ENDPOINT, if set) and "
                        "https://status.cloud.google.com; the job itself is not affected"
                    ) from None
                raise
        self._jobs[job_id] = (time.monotonic(), job)
        return job

    def stop(self, job_id: str) -> None:
        """cancel_custom_job; a job that has already ended is left as it is."""
        from google.api_core import exceptions as gexc

        _project, location, _number = parse_job_name(job_id)
        with _gcp.translating(f"cancelling the Vertex AI job {job_id}"):
            try:
                self.job_client(location).cancel_custom_job(
                    name=job_id, retry=self._retry(reads=True),
                    timeout=self.timing.rpc_timeout_s)
            except (gexc.FailedPrecondition, gexc.BadRequest):
                # Vertex AI refuses to cancel a job that has ended: nothing left to stop.
                job = self._get(job_id, fresh=True)
                if STATES.get(job.state.name) not in TERMINAL_STATES:
                    raise
        self._jobs.pop(job_id, None)

    # -- clients -----------------------------------------------------------------------------

    def _creds(self, anonymous: bool) -> Any:
        if anonymous:
            return _gcp.load_credentials(self.environ, anonymous=True)
        if self._credentials is None:
            self._credentials = _gcp.load_credentials(self.environ, anonymous=False)
        return self._credentials

    def job_client(self, location: str) -> Any:
        client = self._job_clients.get(location)
        if client is not None:
            return client
        from google.api_core.client_options import ClientOptions
        from google.cloud.aiplatform_v1.services.job_service import JobServiceClient

        endpoint = self.vertex_endpoint
        if endpoint.kind == "grpc":
            import grpc
            from google.cloud.aiplatform_v1.services.job_service.transports import (
                JobServiceGrpcTransport,
            )

            client = JobServiceClient(transport=JobServiceGrpcTransport(
                channel=grpc.insecure_channel(endpoint.address)))
        elif endpoint.kind == "rest":
            client = JobServiceClient(transport="rest", credentials=self._creds(True),
                                      client_options=ClientOptions(api_endpoint=endpoint.address))
        else:
            address = self._address(location)
            client = JobServiceClient(credentials=self._creds(False),
                                      client_options=ClientOptions(api_endpoint=address))
        self._job_clients[location] = client
        return client

    def _address(self, location: str) -> str:
        """Where the job service of ``location`` is: Vertex AI answers for a region only at that
        region's endpoint, whose host name holds the region (checked again here)."""
        if self.vertex_endpoint.address:
            return self.vertex_endpoint.address
        return f"{check_region(location, 'the job name')}-aiplatform.googleapis.com"

    def _quota(self) -> _gcp.ReadQuota:
        return _gcp.read_quota(self.project, self.logging_endpoint, self.timing.log_reads_per_min,
                               self.timing.event_poll_s)

    def _backoff(self, job_id: str, channel: str) -> _gcp.Backoff:
        backoff = self._backoffs.get((job_id, channel))
        if backoff is None:
            backoff = self._backoffs[job_id, channel] = _gcp.Backoff(
                self.timing.retry_initial_s, self.timing.retry_deadline_s)
        return backoff

    def logs_reader(self) -> _gcp.LogReader:
        if self._log_reader is None:
            endpoint = self.logging_endpoint
            self._log_reader = _gcp.LogReader(
                self.project, endpoint, self._creds(endpoint.anonymous),
                _gcp.retry_policy(reads=True, initial=self.timing.retry_initial_s,
                                  deadline=self.timing.retry_deadline_s),
                self.timing.rpc_timeout_s)
        return self._log_reader

    def storage_client(self) -> Any:
        if self._storage is None:
            from google.cloud import storage

            if self.storage_emulator:
                host = self.storage_emulator
                host = host if host.startswith("http") else f"http://{host}"
                self._storage = storage.Client(project=self.project,
                                               credentials=self._creds(True),
                                               client_options={"api_endpoint": host})
            else:
                self._storage = storage.Client(project=self.project,
                                               credentials=self._creds(False))
        return self._storage


# -- helpers -----------------------------------------------------------------------------------
def _rewrite_plan(text: str, job: Job, checkpoints: str) -> str:
    """plan.json as the job sees it on Vertex AI: the recipe (or script) under ``code/``, the
    checkpoints in the run's folder of the bucket. Local paths mean nothing on the node."""
    document = json.loads(text)
    recipe = document.get("recipe_file") or job.rendered.entrypoint
    document["recipe_file"] = str(PurePosixPath("code", in_code_folder(recipe, job.code_dir)))
    document["checkpoint_dir"] = checkpoints
    return json.dumps(document, indent=2) + "\n"


def _restaged(request: VertexRequest, staged: tuple[_gcp.StagedArchive, ...]) -> VertexRequest:
    """``request`` with its archives where ``stage`` put them: the staging list and every
    container's ``LAUNCH_STAGED``, the list the bootstrap fetches."""
    custom_job = json.loads(json.dumps(request.custom_job))
    for pool in custom_job["jobSpec"]["workerPoolSpecs"]:
        for variable in pool["containerSpec"]["env"]:
            if variable["name"] == "LAUNCH_STAGED":
                variable["value"] = " ".join(a.uri for a in staged)
    return replace(request, custom_job=custom_job, staging=staged)


def _unanswered(cause: BaseException | None) -> bool:
    """Whether a call gave up because nothing answered (rather than answers that were errors)."""
    import requests
    from google.api_core import exceptions as gexc

    return cause is None or isinstance(cause, (
        gexc.DeadlineExceeded, requests.exceptions.Timeout, requests.exceptions.ConnectionError))


def _geo(region: str) -> str:
    if region.startswith("europe"):
        return "europe"
    if region.startswith(("asia", "australia", "me-")):
        return "asia"
    return "us"


def _write_json(path: Path, data: Any) -> None:
    from launcher.statefiles import write_json

    write_json(path, data)
