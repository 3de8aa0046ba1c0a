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

import functools
import json
import os
import re
import time
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from launcher import packaging
from launcher.packaging import Selection
from launcher.plan.plan import Plan
from launcher.providers import _gcp, images
from launcher.providers._gcp import LogCursor
from launcher.providers.base import Job, JobStatus, Provider, checked_duration, checked_region
from launcher.render import PLAN_NAME
from launcher.status import ProviderError, UsageError

#: The prebuilt PyTorch GPU training image (Artifact Registry, per continent); ``image`` replaces
#: it. See https://cloud.google.com/vertex-ai/docs/training/pre-built-containers
#: Its torch (2.4) is in launcher/providers/images.py, with the oldest torch each strategy's
#: script ran under: plans that need a newer torch get the official PyTorch image (image_for).
DEFAULT_IMAGE = "{geo}-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest"
DEFAULT_PREFIX = "launch"
#: Vertex AI's own default and maximum run time for a custom job is 7 days.
DEFAULT_TIMEOUT_S = 7 * 24 * 3600
LABEL_RUN, LABEL_ATTEMPT, LABEL_TOOL = "launch_run_id", "launch_attempt", "launched_by"
#: A Google Cloud region (us-central1, europe-west4, northamerica-northeast1): it becomes part of
#: the API's host name (REGION-aiplatform.googleapis.com), so nothing else may pass.
REGION = re.compile(r"[a-z]+(?:-[a-z]+)+[0-9]{1,2}")
REGION_SHAPE = ("lowercase words joined by hyphens and ending in a number, like us-central1 or "
                "europe-west4")
JOB_NAME = re.compile(r"^projects/([^/]+)/locations/([a-z]+(?:-[a-z]+)+[0-9]{1,2})/customJobs/"
                      r"([0-9]+)$")
#: Entries read from Cloud Logging per request (entries.list answers 1000 at most); each read is
#: one request, and the cursor carries on from there.
LOG_PAGE_SIZE = _gcp.MAX_PAGE_SIZE
#: Which of the failure classifier's findings the event channel asks Cloud Logging for: those that
#: stop a job at once (memory failures, launcher/failures/_rules.py) and the templates' own oom
#: and done lines. Other failures (NCCL errors, timeouts, tracebacks) end a job by themselves and
#: their needles ("error", "exception") would bring a chatty job's every warning along; the full
#: stream carries them to the diagnosis.
EVENT_CATEGORIES = frozenset({"oom", "event", "done"})
#: Where a replica's output is in its log entry (the reader takes both).
EVENT_FIELDS = ("textPayload", "jsonPayload.message")
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")

#: Runs on every node as ``python3 -c BOOTSTRAP <torchrun args>``: fetch the staged archives,
#: find this node's rank, exec torchrun. Python 3.8+ and the standard library only (plus
#: google-cloud-storage when /gcs is not mounted), so it runs in the prebuilt images and in most
#: users' own.
BOOTSTRAP = '''\
import hashlib, io, json, os, re, sys, tarfile, tempfile

def unpack(uri, data):
    """Extract an archive after checking it is the one the job was created with: its name
    carries the hash of its files (names, modes, contents), and the bucket is writable by jobs."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = sorted(tar.getmembers(), key=lambda m: m.name)
        digest = hashlib.sha256()
        for m in members:
            if not m.isfile():
                sys.exit("launch: %s holds %s, which is not a plain file" % (uri, m.name))
            body = hashlib.sha256(tar.extractfile(m).read()).hexdigest()
            mode = "x" if m.mode & 0o100 else "-"
            digest.update(("%s\\0%s\\0%s\\n" % (m.name, mode, body)).encode())
        want = re.search(r"-([0-9a-f]{32})[.]tar[.]gz$", uri)
        if want is None or digest.hexdigest()[:32] != want.group(1):
            sys.exit("launch: %s is not the archive this job was created with (changed in the "
                     "bucket since it was staged)" % uri)
        if hasattr(tarfile, "data_filter"):
            tar.extraction_filter = tarfile.data_filter
        tar.extractall()

def fetch(uri):
    bucket, _, name = uri[len("gs://"):].partition("/")
    mounted = os.path.join("/gcs", bucket, name)
    if os.path.isfile(mounted):  # Cloud Storage FUSE: Vertex AI mounts buckets under /gcs
        with open(mounted, "rb") as f:
            return f.read()
    from google.cloud import storage
    return storage.Client().bucket(bucket).blob(name).download_as_bytes()

# -- run --
os.chdir(tempfile.mkdtemp(prefix="launch-"))
for uri in os.environ["LAUNCH_STAGED"].split():
    unpack(uri, fetch(uri))

spec = json.loads(os.environ.get("CLUSTER_SPEC") or "{}")
pools = spec.get("cluster", {})
task = spec.get("task", {})
primary, workers = pools.get("workerpool0", []), pools.get("workerpool1", [])
nodes = len(primary) + len(workers) if primary else int(os.environ.get("WORLD_SIZE", "1"))
if nodes > 1 and primary:
    host, _, port = primary[0].rpartition(":")
    rank = 0 if task.get("type") == "workerpool0" else 1 + int(task.get("index", 0))
    port = os.environ.get("MASTER_PORT") or port
elif nodes > 1:
    host, port = os.environ["MASTER_ADDR"], os.environ.get("MASTER_PORT", "29500")
    rank = int(os.environ["RANK"])
if nodes > 1:
    where = ["--nnodes", str(nodes), "--node_rank", str(rank),
             "--master_addr", host, "--master_port", str(port)]
else:
    rank, where = 0, ["--standalone", "--nnodes", "1"]
argv = [sys.executable, "-m", "torch.distributed.run"] + where + sys.argv[1:]
print("launch: node %d of %d in %s: %s" % (rank, nodes, os.getcwd(), " ".join(argv[3:])),
      flush=True)
os.execv(sys.executable, argv)
'''

#: Vertex AI job states -> the launcher's.
STATES = {
    "JOB_STATE_UNSPECIFIED": "pending", "JOB_STATE_QUEUED": "pending",
    "JOB_STATE_PENDING": "pending", "JOB_STATE_RUNNING": "running",
    "JOB_STATE_UPDATING": "running", "JOB_STATE_PAUSED": "running",
    "JOB_STATE_SUCCEEDED": "succeeded", "JOB_STATE_FAILED": "failed",
    "JOB_STATE_EXPIRED": "failed", "JOB_STATE_PARTIALLY_SUCCEEDED": "failed",
    "JOB_STATE_CANCELLING": "cancelled", "JOB_STATE_CANCELLED": "cancelled",
}

#: Short GPU names accepted in ``MACHINE+GPUxCOUNT`` -> Vertex AI's AcceleratorType.
ACCELERATORS = {
    "t4": "NVIDIA_TESLA_T4", "v100": "NVIDIA_TESLA_V100", "p100": "NVIDIA_TESLA_P100",
    "p4": "NVIDIA_TESLA_P4", "k80": "NVIDIA_TESLA_K80", "l4": "NVIDIA_L4",
    "a100": "NVIDIA_TESLA_A100", "a100-40gb": "NVIDIA_TESLA_A100",
    "a100-80gb": "NVIDIA_A100_80GB", "h100": "NVIDIA_H100_80GB",
    "h100-80gb": "NVIDIA_H100_80GB", "h100-mega": "NVIDIA_H100_MEGA_80GB",
    "h200": "NVIDIA_H200_141GB", "b200": "NVIDIA_B200",
}
#: GPUs that attach to N1 machine types (the other GPU families come built into theirs).
N1_ACCELERATORS = ("NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_P100",
                   "NVIDIA_TESLA_P4", "NVIDIA_TESLA_K80")
N1_COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Timing:
    """How often to ask, how long to wait. Production defaults; tests set them near zero through
    ``LAUNCH_VERTEX_<FIELD>`` environment variables (``LAUNCH_VERTEX_POLL_S=0`` ...)."""

    #: Least time between two get_custom_job calls for one job (the supervisor loops every 0.2 s).
    poll_s: float = 5.0
    #: Least time between two reads of a job's full log once it has caught up (a read that
    #: found the end); while more is waiting, the read quota alone paces it.
    log_poll_s: float = 3.0
    #: Least time between two reads of a job's event channel: an out-of-memory line is seen at
    #: most this long (and the query's time) after Cloud Logging shows it. At most half the read
    #: quota goes to the channel, whatever this says.
    event_poll_s: float = 2.0
    #: entries.list requests a minute this process sends to one project at most: Cloud Logging's
    #: default read quota is 60, shared by everyone reading the project's logs (lower it when
    #: others read them while jobs run, raise it with the quota). Not seconds.
    log_reads_per_min: float = _gcp.READS_PER_MINUTE
    #: After a job ends, how long its log is still read for entries Cloud Logging has yet to show.
    log_settle_s: float = 20.0
    #: How far back each read starts before the newest entry already read (late entries).
    log_overlap_s: float = 30.0
    #: Each create / get / cancel / list call.
    rpc_timeout_s: float = 30.0
    #: Backoff of retried calls: the first wait, and the most time spent retrying one call.
    retry_initial_s: float = 1.0
    retry_deadline_s: float = 120.0
    #: Reading a job's state (`launch status`, the supervisor's poll): each try, and all tries
    #: together. An endpoint that takes the connection and never answers is one line within
    #: about deadline + timeout (12 s); a follower keeps the last state meanwhile, for at most
    #: ``retry_deadline_s`` since the last answer.
    status_timeout_s: float = 4.0
    status_deadline_s: float = 8.0

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> Timing:
        values: dict[str, float] = {}
        for f in fields(cls):
            raw = environ.get(f"LAUNCH_VERTEX_{f.name.upper()}")
            if raw:
                try:
                    values[f.name] = float(raw)
                except ValueError:
                    raise UsageError(f"LAUNCH_VERTEX_{f.name.upper()}={raw!r} is not a number"
                                     ) from None
        return cls(**values)


@dataclass(frozen=True)
class MachineSpec:
    machine_type: str
    accelerator_type: str | None
    accelerator_count: int

    def to_dict(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"machineType": self.machine_type}
        if self.accelerator_type:
            spec["acceleratorType"] = self.accelerator_type
            spec["acceleratorCount"] = self.accelerator_count
        return spec


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


class VertexProvider(Provider):
    name: ClassVar[str] = "vertex"

    def __init__(self, *, project: str, region: str, bucket: str | None = None,
                 prefix: str = DEFAULT_PREFIX, service_account: str | None = None,
                 spot: bool = False, image: str | None = None,
                 timeout_s: int = DEFAULT_TIMEOUT_S, environ: dict[str, str] | None = None,
                 timing: Timing | None = None):
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
        self._credentials: Any = None
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
        bucket, prefix = None, DEFAULT_PREFIX
        raw_bucket = settings.get("bucket") or environ.get("LAUNCH_BUCKET")
        if raw_bucket:
            bucket, prefix = parse_bucket(str(raw_bucket))
        region = None
        for source, value in (("--region or LAUNCH_REGION", settings.get("region")),
                              ("LAUNCH_REGION", environ.get("LAUNCH_REGION")),
                              ("CLOUDSDK_AI_REGION", environ.get("CLOUDSDK_AI_REGION"))):
            if value:
                region = check_region(value, source)
                break
        if not region:
            raise UsageError("no region for Vertex AI",
                             "pass --region (e.g. us-central1) or set LAUNCH_REGION")
        anonymous = _gcp.parse_endpoint(environ.get("LAUNCH_VERTEX_ENDPOINT")).anonymous
        project = (settings.get("project") or environ.get("LAUNCH_PROJECT")
                   or (None if anonymous else _gcp.default_project(environ)))
        if not project:
            raise UsageError("no Google Cloud project for Vertex AI",
                             "pass --project or set LAUNCH_PROJECT (or GOOGLE_CLOUD_PROJECT)")
        account = settings.get("service_account") or None
        if account is not None and "@" not in account:
            raise UsageError(f"service account {account!r} is not an email address",
                             "pass --service-account NAME@PROJECT.iam.gserviceaccount.com")
        timeout = settings.get("timeout") or environ.get("LAUNCH_VERTEX_TIMEOUT")
        return cls(project=str(project), region=str(region), bucket=bucket, prefix=prefix,
                   service_account=account, spot=bool(settings.get("spot")),
                   image=settings.get("image") or environ.get("LAUNCH_VERTEX_IMAGE"),
                   timeout_s=parse_duration(timeout) if timeout else DEFAULT_TIMEOUT_S,
                   environ=environ)

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"

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
        container = {
            "imageUri": image,
            "command": ["python3", "-c", BOOTSTRAP],
            "args": ["--nproc_per_node", str(plan.gpus_per_node), "--tee", "3", entry],
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
        path = Path(entry)
        path = path if path.is_absolute() else job.code_dir / path
        try:
            relative = path.resolve().relative_to(job.code_dir.resolve())
        except ValueError:
            raise UsageError(f"the script {path} is outside its code folder {job.code_dir}",
                             "keep the script in the folder that is staged") from None
        return str(PurePosixPath("code", relative.as_posix()))

    # -- sending -----------------------------------------------------------------------------

    def schedule(self, request: VertexRequest) -> str:  # type: ignore[override]
        """Stage what is missing, then create the job; return its resource name."""
        self._stage(request.staging)
        if request.attempt_dir:
            _write_json(Path(request.attempt_dir) / "request.json", request.to_dict())
        job = self._create(request)
        if request.attempt_dir:
            _write_json(Path(request.attempt_dir) / "job.json",
                        {"name": job.name, "console": console_url(job.name, self.project)})
        self._jobs[job.name] = (time.monotonic(), job)
        return str(job.name)

    def _stage(self, archives: tuple[_gcp.StagedArchive, ...]) -> None:
        bucket = self.bucket or ""
        with _gcp.translating(f"staging the code to gs://{bucket}"):
            client = self._storage_client()
            if client.lookup_bucket(bucket, timeout=self.timing.rpc_timeout_s) is None:
                raise ProviderError(
                    f"the bucket gs://{bucket} does not exist",
                    f"create it with `gcloud storage buckets create gs://{bucket} "
                    f"--location={self.region}`, or pass another --bucket")
            for archive in archives:
                _gcp.stage(client, archive, self.timing.rpc_timeout_s)

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
            client = self._job_client(self.region)
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
        pager = self._job_client(self.region).list_custom_jobs(
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
        mapped = STATES.get(job.state.name, "running")
        message = job.error.message if job.error and job.error.message else ""
        if not message and mapped == "cancelled":
            message = "cancelled"
        return JobStatus(state=mapped, exit_code=None, message=message)

    def _get(self, job_id: str, fresh: bool = False) -> Any:
        """The job, from a cache at most ``poll_s`` old (the supervisor asks five times a
        second; Vertex AI's read quota is per minute). An ended job never changes again."""
        _project, location, _number = parse_job_name(job_id)
        cached = self._jobs.get(job_id)
        if cached and not fresh:
            ended = STATES.get(cached[1].state.name) in ("succeeded", "failed")
            if ended or time.monotonic() - cached[0] < self.timing.poll_s:
                return cached[1]
        from google.api_core import exceptions as gexc

        started = time.monotonic()
        with _gcp.translating(f"reading the Vertex AI job {job_id}"):
            try:
                job = self._job_client(location).get_custom_job(
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

    def logs(self, job_id: str, cursor: Any = None) -> tuple[list[str], dict[str, Any]]:
        """New lines since ``cursor``: state changes, the replicas' output, and at the end the
        job's error; one page (one entries.list request) a call at most.

        While the job runs, a read is made only when it is due: the read quota's share for the
        full stream (:class:`_gcp.ReadQuota`), ``log_poll_s`` once the log has been read to its
        end, and any backoff after RESOURCE_EXHAUSTED; otherwise nothing is read and the call
        returns at once, so a supervisor reading the event channel every poll is never held up
        by the log. After the job ends a read waits for its turn instead, and the log is read
        until ``log_settle_s`` has passed since the end with nothing new (Cloud Logging shows
        entries seconds after they are written), so a follower that stops at the first empty
        answer after a terminal state loses nothing."""
        job = self._get(job_id)
        terminal = STATES.get(job.state.name) in ("succeeded", "failed", "cancelled")
        peek = _peek(cursor)
        if (not terminal and peek.get("state") == job.state.name and job_id not in self._notes
                and self._log_wait_s(job_id, bool(peek.get("behind"))) > 0):
            return [], peek  # nothing due: the cursor as it was (no copy of its insertIds)
        state = LogCursor.load(cursor)
        lines = self._state_lines(job_id, job, state) + self._notes.pop(job_id, [])
        if state.finished:
            return lines, state.to_json()
        if not terminal:
            if self._log_wait_s(job_id, state.behind) <= 0:
                records = self._read(job_id, job, state, wait=False)
                lines += [line for record in records or () for line in _gcp.record_lines(record)]
            return lines, state.to_json()
        records = self._read(job_id, job, state, wait=True) or []
        ended = _utc(job.end_time) or _utc(job.update_time) or datetime.now(UTC)
        settle = self.timing.log_settle_s
        while not records and (datetime.now(UTC) - ended).total_seconds() < settle:
            time.sleep(max(0.05, min(self.timing.log_poll_s, settle)))
            job = self._get(job_id)  # CANCELLING becomes CANCELLED meanwhile
            records = self._read(job_id, job, state, wait=True) or []
        lines += [line for record in records for line in _gcp.record_lines(record)]
        if not records:
            # Ended, and nothing new for the whole settling time: say how it ended, once.
            state.finished, state.state = True, job.state.name
            number = parse_job_name(job_id)[2]
            lines.append(f"[vertex] job {number} ended: {job.state.name}")
            if job.error and job.error.message:
                lines.append(f"[vertex] job {number} error: {job.error.message}")
        return lines, state.to_json()

    def events(self, job_id: str, cursor: Any = None) -> tuple[list[str], Any]:
        """The lines of the job's log that hold a template event (``{"launch": ...}``) or an
        out-of-memory needle of the failure classifier, found by Cloud Logging itself (the
        query of :func:`event_query`): a few lines however much the job writes, so an OOM
        is seen within ``event_poll_s`` of Cloud Logging showing it even while the full stream
        trails by minutes. Read while the job runs; the cursor is the stream's kind, with its
        own position. The same lines come again in the full stream, which stays the record
        (``launch logs`` shows each line once); the job's state stays the last word."""
        if job_id in self._events_off:
            return [], cursor
        job = self._get(job_id)
        quota = self._quota()
        if STATES.get(job.state.name) != "running":
            if STATES.get(job.state.name) in ("succeeded", "failed", "cancelled"):
                quota.forget(job_id)  # its share of the quota goes back to the stream
            return [], cursor
        backoff = self._backoff(job_id, "events")
        if quota.wait_s("events", job_id) > 0 or backoff.wait_s() > 0:
            return [], cursor
        from google.api_core import exceptions as gexc

        state = LogCursor.load(cursor)
        number = parse_job_name(job_id)[2]
        created = (_utc(job.create_time) or datetime.now(UTC)) - timedelta(minutes=1)
        query = event_query(number, state.lower_bound(created, self.timing.log_overlap_s))
        sent = datetime.now(UTC)
        with _gcp.translating(f"reading the event channel of Vertex AI job {number}"):
            try:
                records, more = self._logs_reader().page(
                    query, LOG_PAGE_SIZE, before=lambda: quota.spend("events", job_id))
            except (gexc.InvalidArgument, gexc.BadRequest) as exc:
                # The query was refused: the full stream still carries every line.
                self._events_off.add(job_id)
                quota.forget(job_id)
                why = (str(getattr(exc, "message", "") or exc).strip().splitlines() or [""])[0]
                self._notes.setdefault(job_id, []).append(
                    f"[vertex] the event channel's query was refused ({why}); out-of-memory "
                    "errors are found in the full log only, as it is read")
                return [], cursor
            except Exception as exc:  # transient: try again later; anything else is raised
                backoff.failed(exc)
                return [], state.to_json()
        backoff.succeeded()
        fresh = state.accept(records, self.timing.log_overlap_s, cut=more, sent_at=sent)
        return [line for record in fresh for line in _gcp.record_lines(record)], state.to_json()

    def behind(self, job_id: str, cursor: Any) -> float | None:
        """Seconds between now and the newest entry the full stream has read, while its last
        read was a full page with more waiting; None once a read found the end."""
        peek = _peek(cursor)
        if peek.get("finished"):
            return None
        return LogCursor(since=peek.get("since"), behind=bool(peek.get("behind"))).lag_s()

    def _state_lines(self, job_id: str, job: Any, state: LogCursor) -> list[str]:
        """A line when the job's state changed since this follower last looked: progress."""
        name = job.state.name
        if state.state == name:
            return []
        before, state.state = state.state, name
        number = parse_job_name(job_id)[2]
        if before is None:
            return [f"[vertex] job {number}: {name} ({console_url(job_id, self.project)})"]
        return [f"[vertex] job {number}: {before} -> {name}"]

    def _log_wait_s(self, job_id: str, behind: bool) -> float:
        """Seconds until the full stream may be read again while the job runs."""
        wait = max(self._quota().wait_s("log"), self._backoff(job_id, "log").wait_s())
        if not behind:
            last = self._last_read.get(job_id, float("-inf"))
            wait = max(wait, last + self.timing.log_poll_s - time.monotonic())
        return wait

    def _read(self, job_id: str, job: Any, state: LogCursor, *, wait: bool
              ) -> list[_gcp.LogRecord] | None:
        """One page of the full stream after ``state``. ``wait``: wait for the quota's turn and
        retry failures here (the job has ended); else a failure that may pass (RESOURCE_EXHAUSTED,
        UNAVAILABLE) sets the stream's backoff and the answer is None."""
        number = parse_job_name(job_id)[2]
        # The first read starts at the job's creation (less a minute for clock skew); Cloud
        # Logging would otherwise search the project's whole retention.
        created = (_utc(job.create_time) or datetime.now(UTC)) - timedelta(minutes=1)
        lower = state.lower_bound(created, self.timing.log_overlap_s)
        query = (f'resource.type="ml_job" AND resource.labels.job_id="{number}" '
                 f'AND timestamp>="{_gcp.rfc3339(lower)}"')
        quota, backoff = self._quota(), self._backoff(job_id, "log")
        with _gcp.translating(f"reading the log of Vertex AI job {number}"):
            if wait:
                time.sleep(backoff.wait_s())
                records, more = self._logs_reader().page(
                    query, LOG_PAGE_SIZE, before=lambda: quota.acquire("log"),
                    retry=self._retry(reads=True))
            else:
                try:
                    records, more = self._logs_reader().page(
                        query, LOG_PAGE_SIZE, before=lambda: quota.spend("log"))
                except Exception as exc:  # transient: try again later; anything else is raised
                    backoff.failed(exc)
                    return None
        backoff.succeeded()
        self._last_read[job_id] = time.monotonic()
        return state.accept(records, self.timing.log_overlap_s, cut=more)

    def stop(self, job_id: str) -> None:
        """cancel_custom_job; a job that has already ended is left as it is."""
        from google.api_core import exceptions as gexc

        _project, location, _number = parse_job_name(job_id)
        with _gcp.translating(f"cancelling the Vertex AI job {job_id}"):
            try:
                self._job_client(location).cancel_custom_job(
                    name=job_id, retry=self._retry(reads=True),
                    timeout=self.timing.rpc_timeout_s)
            except (gexc.FailedPrecondition, gexc.BadRequest):
                # Vertex AI refuses to cancel a job that has ended: nothing left to stop.
                job = self._get(job_id, fresh=True)
                if STATES.get(job.state.name) not in ("succeeded", "failed", "cancelled"):
                    raise
        self._jobs.pop(job_id, None)

    # -- clients -----------------------------------------------------------------------------

    def _creds(self, anonymous: bool) -> Any:
        if anonymous:
            return _gcp.load_credentials(self.environ, anonymous=True)
        if self._credentials is None:
            self._credentials = _gcp.load_credentials(self.environ, anonymous=False)
        return self._credentials

    def _job_client(self, location: str) -> Any:
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

    def _logs_reader(self) -> _gcp.LogReader:
        if self._log_reader is None:
            endpoint = self.logging_endpoint
            self._log_reader = _gcp.LogReader(
                self.project, endpoint, self._creds(endpoint.anonymous),
                _gcp.retry_policy(reads=True, initial=self.timing.retry_initial_s,
                                  deadline=self.timing.retry_deadline_s),
                self.timing.rpc_timeout_s)
        return self._log_reader

    def _storage_client(self) -> Any:
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

def machine_spec(machine: str, gpus_per_node: int) -> MachineSpec:
    """The machineSpec of a plan's machine: a catalog name (``a2-ultragpu-8g``,
    ``n1-standard-8+t4x1``), or ``MACHINE_TYPE+GPUxCOUNT`` for a combination the catalog does not
    list, checked against what the machine type can take."""
    from launcher.plan.catalog import load_catalog

    catalog = load_catalog("vertex")
    if machine in catalog:
        row = catalog.get(machine)
        spec = MachineSpec(row.machine_type or row.name, row.accelerator_type, row.gpu_count)
    else:
        spec = _parse_machine(machine)
        _check_accelerator(spec, catalog)
    if spec.accelerator_type and gpus_per_node > spec.accelerator_count:
        raise UsageError(f"{machine} has {spec.accelerator_count} GPU(s), the plan runs "
                         f"{gpus_per_node} processes per node",
                         "pass --gpus-per-node at most the machine's GPU count")
    return spec


def _parse_machine(machine: str) -> MachineSpec:
    machine_type, plus, gpus = machine.strip().partition("+")
    if not plus:
        return MachineSpec(machine_type, None, 0)
    match = re.fullmatch(r"(.+?)x(\d+)", gpus)
    if match is None:
        raise UsageError(f"cannot read the GPUs of machine {machine!r}",
                         "write MACHINE_TYPE+GPUxCOUNT, e.g. n1-standard-8+t4x1")
    name, count = match.group(1), int(match.group(2))
    accelerator = ACCELERATORS.get(name.lower(), name.upper())
    return MachineSpec(machine_type, accelerator, count)


def _check_accelerator(spec: MachineSpec, catalog: Any) -> None:
    """Refuse what Vertex AI would refuse anyway, minutes later and in less plain words."""
    from google.cloud.aiplatform_v1.types import AcceleratorType

    fixed = {(m.accelerator_type, m.gpu_count) for m in catalog
             if (m.machine_type or m.name) == spec.machine_type}
    family = spec.machine_type.split("-")[0]
    if spec.accelerator_type is None:
        if fixed and all(acc for acc, _ in fixed):
            acc, count = sorted(fixed, key=str)[0]
            raise UsageError(f"machine type {spec.machine_type} comes with {count} x {acc}",
                             f"use the catalog name {spec.machine_type}")
        return
    if spec.accelerator_type not in AcceleratorType.__members__:
        raise UsageError(f"unknown accelerator type {spec.accelerator_type!r}",
                         f"use one of {', '.join(sorted(set(ACCELERATORS)))}, or a Vertex AI "
                         "AcceleratorType name")
    if family == "n1":
        if spec.accelerator_type not in N1_ACCELERATORS:
            raise UsageError(
                f"machine type {spec.machine_type} cannot take {spec.accelerator_type}",
                f"N1 machines take {', '.join(N1_ACCELERATORS)}; "
                "`launch machines --provider vertex` lists the combinations")
        if spec.accelerator_count not in N1_COUNTS:
            raise UsageError(f"{spec.accelerator_count} GPUs cannot attach to an N1 machine",
                             f"attach {', '.join(map(str, N1_COUNTS))} GPUs")
        return
    if fixed:
        if (spec.accelerator_type, spec.accelerator_count) not in fixed:
            acc, count = sorted(fixed, key=str)[0]
            raise UsageError(
                f"machine type {spec.machine_type} cannot take {spec.accelerator_count} x "
                f"{spec.accelerator_type}; it comes with {count} x {acc}",
                f"use the catalog name {spec.machine_type}")
        return
    raise UsageError(
        f"machine type {spec.machine_type} cannot take {spec.accelerator_type}",
        "GPUs attach to N1 machine types, or come built into A2, A3, A4 and G2 ones; "
        "`launch machines --provider vertex` lists them")


def parse_bucket(value: str) -> tuple[str, str]:
    """``NAME`` or ``gs://NAME/PREFIX`` -> (name, prefix); the prefix defaults to ``launch``."""
    text = value.strip().removeprefix("gs://").strip("/")
    name, _, prefix = text.partition("/")
    if not BUCKET_NAME.fullmatch(name) or ".." in name:
        raise UsageError(f"{value!r} is not a Cloud Storage bucket name",
                         "pass --bucket NAME or gs://NAME/PREFIX")
    return name, prefix.strip("/") or DEFAULT_PREFIX


def parse_duration(value: Any) -> int:
    """``--timeout``: seconds, or a number with s, m, h or d, within what Vertex AI allows."""
    return checked_duration(value, 60, DEFAULT_TIMEOUT_S, "Vertex AI",
                            "between a minute and 7 days")


def check_region(region: Any, source: str = "") -> str:
    """``region`` when it is shaped like a Google Cloud region (else exit 2, naming it)."""
    return checked_region(region, REGION, 40, "a Google Cloud region", REGION_SHAPE, source)


def parse_job_name(job_id: str) -> tuple[str, str, str]:
    """(project, location, numeric id) of ``projects/P/locations/L/customJobs/N``."""
    match = JOB_NAME.fullmatch(job_id or "")
    if match is None:
        raise UsageError(f"{job_id!r} is not a Vertex AI custom job name",
                         "expected projects/PROJECT/locations/REGION/customJobs/ID")
    return match.group(1), match.group(2), match.group(3)


@functools.cache
def event_needles() -> tuple[str, ...]:
    """What the event channel asks Cloud Logging for: the templates' event marker and the failure
    classifier's needles of :data:`EVENT_CATEGORIES` (their one home, launcher/failures; in lower
    case, which is no matter: the query language ignores case). A needle with a control
    character (a tab before "oom") is left out: the full stream still brings such a line."""
    from launcher.events import MARKER
    from launcher.failures._anchors import needles_for

    found = dict.fromkeys((MARKER, *needles_for(EVENT_CATEGORIES).needles))
    return tuple(needle for needle in found if needle.isprintable())


def event_query(number: str, lower: datetime) -> str:
    """The event channel's query for job ``number`` from ``lower`` on: the full stream's
    restriction, and a substring test of each needle on each field (:func:`_gcp.has_any`)."""
    return (f'resource.type="ml_job" AND resource.labels.job_id="{number}" '
            f'AND timestamp>="{_gcp.rfc3339(lower)}" '
            f'AND {_gcp.has_any(EVENT_FIELDS, event_needles())}')


def _peek(cursor: Any) -> dict[str, Any]:
    """A cursor's fields without copying its insertIds (the supervisor asks every poll)."""
    if not cursor:
        return {}
    return json.loads(cursor) if isinstance(cursor, str) else cursor


def console_url(job_id: str, project: str) -> str:
    _p, location, number = parse_job_name(job_id)
    return (f"https://console.cloud.google.com/vertex-ai/locations/{location}/training/"
            f"{number}/cpu?project={project}")


def _rewrite_plan(text: str, job: Job, checkpoints: str) -> str:
    """plan.json as the job sees it on Vertex AI: the recipe (or script) under ``code/``, the
    checkpoints in the run's folder of the bucket. Local paths mean nothing on the node."""
    document = json.loads(text)
    recipe = Path(document.get("recipe_file") or job.rendered.entrypoint)
    recipe = recipe if recipe.is_absolute() else job.code_dir / recipe
    try:
        relative = recipe.resolve().relative_to(job.code_dir.resolve())
    except ValueError:
        raise UsageError(f"the script {recipe} is outside its code folder {job.code_dir}",
                         "keep the script in the folder that is staged") from None
    document["recipe_file"] = str(PurePosixPath("code", relative.as_posix()))
    document["checkpoint_dir"] = checkpoints
    return json.dumps(document, indent=2) + "\n"


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


def _utc(moment: Any) -> datetime | None:
    if not moment:
        return None
    if isinstance(moment, datetime):
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return None


def _write_json(path: Path, data: Any) -> None:
    from launcher.runs import write_json

    write_json(path, data)
