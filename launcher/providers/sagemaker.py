"""The SageMaker provider: one attempt is one SageMaker training job.

``dryrun`` builds the exact ``CreateTrainingJob`` payload and the code package (nothing is sent,
nothing is written: `launch plan --provider sagemaker --json` prints it); ``schedule`` uploads the
package to S3 (once per content hash) and creates the job, adopting it when a retried create finds
that the first one got through; ``poll`` reads ``DescribeTrainingJob``; ``logs`` reads every
CloudWatch Logs stream of the job, paced within the account's read quota, and ``behind`` says how
far that read trails; ``events`` is a channel of its own for the templates' event lines and the
failure lines (``FilterLogEvents``, filtered by CloudWatch), so an out-of-memory error is seen in
seconds however much the job logs; ``stop`` is ``StopTrainingJob``.

How the job runs (why a custom entrypoint instead of the SageMaker training toolkit)
-----------------------------------------------------------------------------------
The image is the AWS PyTorch training container (the SMP v2 image for ``smp_v2`` plans), but the
command is ours, in ``AlgorithmSpecification.ContainerEntrypoint``/``ContainerArguments``::

    /bin/sh -c 'set -e; mkdir -p "$2"; tar -xzf "$1" -C "$2"; cd "$2"; shift 2; exec "$@"' launch \
        /opt/ml/input/data/code/sourcedir.tar.gz /opt/ml/code \
        python3 launch_sagemaker.py --nproc-per-node 8 \
        --resource-config /opt/ml/input/config/resourceconfig.json launch_train.py

SageMaker downloads the ``code`` channel (our ``sourcedir.tar.gz``) to ``/opt/ml/input/data/code``;
the shell unpacks it and ``launch_sagemaker.py`` (shipped in the package) reads SageMaker's
``resourceconfig.json`` (the hosts and this host's name) and execs ``torchrun`` with the node rank
and the first host as rendezvous master: the same torchrun line the local provider runs, plus
``--nnodes/--node_rank/--master_addr``. Compared with the toolkit route (``sagemaker_program`` and
``sagemaker_torch_distributed_enabled`` hyperparameters), the request holds the whole command, so
`launch plan` shows what will run and the tests run that very command; the toolkit's conversion
of hyperparameters into script arguments and its own failure-file handling stay out of the way;
and the SMP v2 image is driven the same way (SMP v2 runs under plain torchrun).

Each ContainerEntrypoint/ContainerArguments element is limited to 256 characters, which is why the
multi-node logic lives in a shipped file rather than in a ``sh -c`` one-liner.

Checkpoints: ``CheckpointConfig`` maps ``/opt/ml/checkpoints`` to ``s3://<bucket>/<prefix>/<run>/
checkpoints``, shared by every attempt of a run, and ``LAUNCH_CHECKPOINT_DIR`` points the template
there, so a resubmitted attempt starts from the newest checkpoint of the one that ran out of memory.

Nothing from the launcher's environment goes into the request: no credentials in the
hyperparameters, the environment or the tags (the job gets the role's credentials).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import math
import os
import re
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from launcher import packaging
from launcher.packaging import Selection
from launcher.plan.plan import Plan
from launcher.providers.base import Job, JobStatus, Provider, checked_duration
from launcher.status import LaunchError, ProviderError, UsageError

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
OPT_ML = "/opt/ml"
CODE_CHANNEL = "code"
PACKAGE_NAME = "sourcedir.tar.gz"
CODE_ARCHIVE = f"{OPT_ML}/input/data/{CODE_CHANNEL}/{PACKAGE_NAME}"
CODE_DIR = f"{OPT_ML}/code"
RESOURCE_CONFIG = f"{OPT_ML}/input/config/resourceconfig.json"
CHECKPOINT_LOCAL = f"{OPT_ML}/checkpoints"
BOOTSTRAP_NAME = "launch_sagemaker.py"
#: Check the code channel's archive against the hash the job was created with (jobs can write to
#: the bucket), unpack it and run the rest of the arguments there. "$1" archive, "$2" folder,
#: "$3" its sha256.
ENTRY_SHELL = ('set -e; echo "$3  $1" | sha256sum -c --status || { echo "launch: $1 is not '
               'the archive this job was created with" >&2; exit 1; }; mkdir -p "$2"; '
               'tar -xzf "$1" -C "$2"; cd "$2"; shift 3; exec "$@"')
MASTER_PORT = 29500

#: The job name rule of the CreateTrainingJob API.
JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
JOB_NAME_MAX = 63
JOB_PREFIX_MAX = 20
ROLE_ARN = re.compile(r"^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$")
BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
S3_PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()/-]*$")

#: Fixed modification time of every packed file, so equal content gives an equal archive hash.
PACKAGE_MTIME = 946684800  # 2000-01-01T00:00:00Z

#: SageMaker's defaults: one day of runtime (the API's own default), a 30 GB volume (the SDK's).
DEFAULT_MAX_RUN_S = 24 * 3600
#: The longest MaxRuntimeInSeconds SageMaker takes for a training job: 28 days.
MAX_RUN_LIMIT_S = 28 * 24 * 3600
DEFAULT_VOLUME_GB = 30
#: Secondary statuses of an InProgress job that has not started the user's code yet.
PENDING_SECONDARY = frozenset({"Starting", "Pending", "LaunchingMLInstances",
                               "PreparingTrainingStack"})
#: "ml.m5.xlarge" and friends: real instance types, without a GPU.
NO_GPU_FAMILY = re.compile(r"^ml\.(?:[mcrtz]\d|trn\d|inf\d|x\d)")
_EXIT_CODE = re.compile(r"exit code:?\s*(-?\d+)", re.IGNORECASE)
_HOST = re.compile(r"^(algo-\d+)")

#: The most characters a CloudWatch Logs filter pattern may have (FilterLogEvents' limit).
FILTER_PATTERN_MAX = 1024
#: What one quoted term of our filter pattern may hold: a double quote or a backslash would need
#: an escape CloudWatch does not document, and tabs and the like cannot be typed into one.
_FILTER_TERM = re.compile(r"[A-Za-z0-9 _:./()<>=-]+")
#: Rules whose lines the event channel carries besides the templates' events, in this order of
#: need: GPU memory (the job hangs on its collectives until stopped), NCCL's errors and timeouts
#: (ranks that lost a peer), then host memory (SageMaker ends a job whose container the kernel
#: killed by itself, and says so in its FailureReason).
_CHANNEL_SIGNATURES = ("nccl_error", "nccl_timeout")
#: How far back each event-channel query looks past the newest event it has seen: CloudWatch
#: orders by the hosts' timestamps, and a host's batch can be ingested after a later one.
EVENT_LOOKBACK_MS = 30_000
#: Pages of one event-channel query read per call (the rest next call, from its token).
EVENT_PAGES = 5
#: Seconds between two listings of a followed job's log streams (DescribeLogStreams).
STREAMS_REFRESH_S = 5.0


def event_filter() -> tuple[str, tuple[str, ...]]:
    """The event channel's CloudWatch filter pattern, and the needles it leaves out.

    ``?"t1" ?"t2" ...`` matches an event holding any of the terms (CloudWatch's OR of quoted
    terms; matching is case-sensitive). The terms: the word of the templates' event lines
    (``{"launch": ...``, :data:`launcher.events.MARKER`), then the needles the failure classifier
    searches for (:mod:`launcher.failures._rules`, their one home): those of every memory rule,
    then NCCL's. A needle that holds a shorter kept one adds nothing, and one that cannot be
    quoted (a quote, a backslash, a tab) is left to the full log; so is whatever no longer fits
    in the 1024 characters CloudWatch allows. The channel is a pre-filter: what it returns goes
    through the same classifier as the log, and the full log still carries every line."""
    return _event_filter()


def _event_filter_uncached() -> tuple[str, tuple[str, ...]]:
    from launcher.events import MARKER
    from launcher.failures._rules import GPU_OOM, HOST_OOM, RULES

    wanted = [re.sub(r"\W", "", MARKER)]
    ordered = ([r for r in RULES if r.kind == GPU_OOM]
               + [r for s in _CHANNEL_SIGNATURES for r in RULES if r.signature == s]
               + [r for r in RULES if r.kind == HOST_OOM])
    for rule in ordered:
        wanted += [needle if isinstance(needle, str) else needle[0] for needle in rule.needles]
    wanted = list(dict.fromkeys(wanted))
    quotable = [t for t in wanted if _FILTER_TERM.fullmatch(t)]
    shortest: list[str] = []
    for term in sorted(quotable, key=len):  # CloudWatch matches substrings, case and all
        if not any(kept in term for kept in shortest):
            shortest.append(term)
    terms: list[str] = []
    pattern = ""
    for term in (t for t in wanted if t in shortest):
        longer = f'{pattern} ?"{term}"'.strip()
        if len(longer) <= FILTER_PATTERN_MAX:
            pattern = longer
            terms.append(term)
    left = tuple(t for t in wanted if t not in terms and not any(k in t for k in terms))
    return pattern, left


_EVENT_FILTER: tuple[str, tuple[str, ...]] | None = None


def _event_filter() -> tuple[str, tuple[str, ...]]:
    global _EVENT_FILTER
    if _EVENT_FILTER is None:
        _EVENT_FILTER = _event_filter_uncached()
    return _EVENT_FILTER


# -- settings ----------------------------------------------------------------------------------


def _number(value: Any, kind: type, name: str) -> Any:
    if value is None or value == "":
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"SageMaker setting {name} must be a number, not {value!r}") from None


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


@dataclass(frozen=True)
class SageMakerSettings:
    """The run's SageMaker settings (flags, config file, ``LAUNCH_*`` variables); never secrets.

    Besides the common ones (region, bucket, role, spot, budget) a config file may set: ``image``
    (another training image), ``s3_prefix`` (default ``launch``), ``job_prefix`` (default
    ``launch``), ``max_run_s``, ``max_wait_s`` (spot), ``volume_size_gb``, ``aws_retry_mode``
    (standard | adaptive), ``aws_max_attempts``, ``aws_connect_timeout_s``, ``aws_read_timeout_s``,
    ``aws_status_deadline_s`` (the most one status or log read may take, retries included),
    ``api_interval_s`` (least seconds between SageMaker/CloudWatch reads of one job),
    ``log_settle_s`` (how long to wait for late log lines once the job has ended),
    ``events_interval_s`` (least seconds between two event-channel queries of one job:
    FilterLogEvents), ``log_read_tps`` (GetLogEvents and DescribeLogStreams calls a second the
    full-log reader makes at most) and ``log_read_budget_s`` (how long one read of the full log
    may go on before it hands back, so the event channel is read again).

    ``timeout`` (``--timeout``: seconds, or ``90m``, ``12h``, ``2d``) sets ``max_run_s``, the
    job's ``MaxRuntimeInSeconds``, and wins over a ``max_run_s`` from the config file.
    """

    region: str | None = None
    bucket: str | None = None
    role: str | None = None
    spot: bool = False
    budget: float | None = None
    image: str | None = None
    s3_prefix: str = "launch"
    job_prefix: str = "launch"
    max_run_s: int = DEFAULT_MAX_RUN_S
    max_wait_s: int | None = None
    volume_size_gb: int | None = None
    aws_retry_mode: str = "standard"
    aws_max_attempts: int = 6
    aws_connect_timeout_s: float = 5.0
    aws_read_timeout_s: float = 60.0
    aws_status_deadline_s: float = 12.0
    api_interval_s: float = 2.0
    log_settle_s: float = 3.0
    log_page_size: int | None = None
    events_interval_s: float = 1.0
    log_read_tps: float = 10.0
    log_read_budget_s: float = 0.5

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> SageMakerSettings:
        values: dict[str, Any] = {}
        numbers = {"budget": float, "max_run_s": int, "max_wait_s": int, "volume_size_gb": int,
                   "aws_max_attempts": int, "aws_connect_timeout_s": float,
                   "aws_read_timeout_s": float, "aws_status_deadline_s": float,
                   "api_interval_s": float, "log_settle_s": float, "log_page_size": int,
                   "events_interval_s": float, "log_read_tps": float,
                   "log_read_budget_s": float}
        for f in dataclasses.fields(cls):
            value = settings.get(f.name)
            if value is None:
                continue
            if f.name in numbers:
                value = _number(value, numbers[f.name], f.name)
            elif f.name == "spot":
                value = _flag(value)
            elif isinstance(value, str):
                value = value.strip()
            values[f.name] = value
        if settings.get("timeout") not in (None, ""):
            values["max_run_s"] = parse_timeout(settings["timeout"])
        made = cls(**values)
        made.validate()
        return made

    def validate(self) -> None:
        """Formats only: a missing role or bucket is reported by the dry run that needs it."""
        if self.role is not None and not ROLE_ARN.match(self.role):
            raise UsageError(f"--role {self.role!r} is not an IAM role ARN",
                             "give the full ARN, like arn:aws:iam::123456789012:role/SageMakerRole")
        if self.bucket is not None:
            bucket = self.bucket.removeprefix("s3://").rstrip("/")
            if "/" in bucket or not BUCKET.match(bucket) or ".." in bucket:
                raise UsageError(f"--bucket {self.bucket!r} is not an S3 bucket name",
                                 "3 to 63 lowercase letters, digits, dots and hyphens (no s3:// "
                                 "path; set s3_prefix for a folder)")
        if not S3_PREFIX.match(self.s3_prefix) or len(self.s3_prefix) > 200:
            raise UsageError(f"s3_prefix {self.s3_prefix!r} has characters S3 keys should not")
        prefix = self.job_prefix
        if len(prefix) > JOB_PREFIX_MAX:
            raise UsageError(
                f"job_prefix {prefix[:30]!r}... is {len(prefix)} characters; SageMaker job names "
                f"have 63, so the prefix may have at most {JOB_PREFIX_MAX}")
        if not JOB_NAME.match(prefix):
            raise UsageError(f"job_prefix {prefix!r} may only hold letters, digits and hyphens, "
                             "starting and ending with a letter or digit")
        if self.max_run_s < 1:
            raise UsageError(f"max_run_s must be at least 1, not {self.max_run_s}")
        if self.max_wait_s is not None and self.max_wait_s < self.max_run_s:
            raise UsageError(f"max_wait_s ({self.max_wait_s}) must be at least the run time "
                             f"limit ({self.max_run_s} s: max_run_s or --timeout): SageMaker "
                             "counts the run inside the wait")
        if self.volume_size_gb is not None and self.volume_size_gb < 1:
            raise UsageError(f"volume_size_gb must be at least 1, not {self.volume_size_gb}")
        if self.aws_retry_mode not in ("standard", "adaptive"):
            raise UsageError(f"aws_retry_mode {self.aws_retry_mode!r} is not standard or adaptive")
        for name in ("log_read_tps", "log_read_budget_s"):
            if not getattr(self, name) > 0:
                raise UsageError(f"{name} must be positive, not {getattr(self, name)}")
        if self.events_interval_s < 0:
            raise UsageError(f"events_interval_s must not be negative, not "
                             f"{self.events_interval_s}")

    @property
    def bucket_name(self) -> str | None:
        return None if self.bucket is None else self.bucket.removeprefix("s3://").rstrip("/")

    @property
    def prefix(self) -> str:
        return self.s3_prefix.strip("/")


def parse_timeout(value: Any) -> int:
    """``--timeout`` (``3600``, ``90m``, ``12h``, ``2d``) as ``MaxRuntimeInSeconds``."""
    return checked_duration(value, 1, MAX_RUN_LIMIT_S, "SageMaker",
                            "MaxRuntimeInSeconds is between 1 second and 28 days")


# -- names -------------------------------------------------------------------------------------


def job_name(run_id: str, attempt: int, prefix: str = "launch") -> str:
    """``<prefix>-<run-id>-a<attempt>``: the same for every try of one attempt, so a retried
    create finds the job the first try made. SageMaker allows 63 characters of letters, digits and
    hyphens; a longer name keeps its start and gets 8 hex digits of the run id's hash, so two long
    run ids that share a start still get different names."""
    body = re.sub(r"[^a-zA-Z0-9]+", "-", run_id).strip("-") or "run"
    suffix = f"-a{attempt}"
    name = f"{prefix}-{body}{suffix}"
    if len(name) > JOB_NAME_MAX:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        room = JOB_NAME_MAX - len(prefix) - len(digest) - len(suffix) - 2
        name = f"{prefix}-{body[:room].rstrip('-')}-{digest}{suffix}"
    if not JOB_NAME.match(name):  # cannot happen with a valid prefix; guard the API rule anyway
        raise UsageError(f"cannot make a SageMaker job name from run id {run_id!r}")
    return name


# -- the code package --------------------------------------------------------------------------


@dataclass(frozen=True)
class CodePackage:
    """``sourcedir.tar.gz``: the recipe's folder, the rendered files and the bootstrap.

    Built in memory by the dry run (reading files only) so that the hash, and with it the S3 key,
    is part of the request; ``schedule`` uploads these very bytes.
    """

    bucket: str
    key: str
    sha256: str
    size_bytes: int
    files: tuple[str, ...]
    entrypoint: str                 # relative to the unpacked folder
    replaced: tuple[str, ...] = ()  # user files with the name of a rendered one (ours win)
    data: bytes = field(default=b"", repr=False, compare=False)
    upload: Selection | None = field(default=None, repr=False, compare=False)  # the code folder

    @property
    def s3_uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def channel_uri(self) -> str:
        """The folder holding only this archive: the ``code`` channel's S3 prefix."""
        return f"s3://{self.bucket}/{self.key.rsplit('/', 1)[0]}/"

    def to_dict(self) -> dict[str, Any]:
        return {"s3_uri": self.s3_uri, "sha256": self.sha256, "size_bytes": self.size_bytes,
                "entrypoint": self.entrypoint, "files": list(self.files),
                "replaced": list(self.replaced)}


def _relative_to(path: str, code_dir: Path, what: str) -> str:
    candidate = Path(path)
    if not candidate.is_absolute():
        return PurePosixPath(path).as_posix()
    try:
        return candidate.resolve().relative_to(code_dir.resolve()).as_posix()
    except ValueError:
        raise UsageError(f"the {what} {path} is outside its code folder {code_dir}",
                         "keep the script and what it imports in one folder") from None


def _tar(entries: dict[str, tuple[bytes, int]]) -> bytes:
    """A tar.gz whose bytes depend on names, contents and modes only (sorted, fixed times and
    owners, gzip without a timestamp)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            data, mode = entries[name]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            info.mtime = PACKAGE_MTIME
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def build_package(job: Job, bucket: str, prefix: str,
                  environ: Mapping[str, str] | None = None) -> CodePackage:
    """Pack the job's code; see :class:`CodePackage`. Which files of the code folder go is
    :func:`launcher.packaging.select`'s decision (shared with Vertex AI).

    ``plan.json`` is rewritten for the container: the recipe path relative to the unpacked folder
    and the checkpoint folder that SageMaker syncs (the rendered one names local paths).
    """
    code_dir = job.code_dir
    upload = packaging.select_for_job(job, environ, "S3 (read it in build_dataloader)")
    entries: dict[str, tuple[bytes, int]] = {
        f.name: (f.read(), 0o755 if f.executable else 0o644) for f in upload.files}
    rendered = job.rendered
    replaced = tuple(sorted(n for n in (*rendered.files, BOOTSTRAP_NAME) if n in entries))
    for name, text in rendered.files.items():
        if name == "plan.json":
            text = _container_plan(text, code_dir)
        entries[PurePosixPath(name).as_posix()] = (text.encode("utf-8"), 0o644)
    entries[BOOTSTRAP_NAME] = (BOOTSTRAP.encode("utf-8"), 0o755)
    entry = rendered.entrypoint
    entrypoint = entry if entry in rendered.files else _relative_to(entry, code_dir, "script")
    if entrypoint not in entries:
        raise UsageError(f"the script {entrypoint} is not in the package of {code_dir}",
                         "the packaging rule leaves it out (docs/packaging.md); rename or move "
                         "it")
    data = _tar(entries)
    digest = hashlib.sha256(data).hexdigest()
    key = "/".join(p for p in (prefix, "code", digest[:24], PACKAGE_NAME) if p)
    return CodePackage(bucket=bucket, key=key, sha256=digest, size_bytes=len(data),
                       files=tuple(sorted(entries)), entrypoint=entrypoint, replaced=replaced,
                       data=data, upload=upload)


def _container_plan(text: str, code_dir: Path) -> str:
    document = json.loads(text)
    if document.get("recipe_file"):
        document["recipe_file"] = _relative_to(document["recipe_file"], code_dir, "recipe")
    document["checkpoint_dir"] = CHECKPOINT_LOCAL
    return json.dumps(document, indent=2) + "\n"


# -- the request -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SageMakerRequest:
    """What ``schedule`` sends: ``kwargs`` is passed as is to ``create_training_job``."""

    region: str
    kwargs: dict[str, Any]
    package: CodePackage
    run_id: str
    attempt: int
    record_dir: str | None = field(default=None, compare=False)  # where request.json is kept

    @property
    def job_name(self) -> str:
        return self.kwargs["TrainingJobName"]

    def to_dict(self) -> dict[str, Any]:
        return {"api": "sagemaker:CreateTrainingJob", "region": self.region,
                "create_training_job": json.loads(json.dumps(self.kwargs)),
                "code_package": self.package.to_dict(),
                **({"upload": self.package.upload.to_dict()} if self.package.upload else {})}


def _metric_definitions() -> list[dict[str, str]]:
    """Rank 0's numbers from the templates' metrics lines, as SageMaker metrics (console graphs
    and CloudWatch), read from the JSON the template prints."""
    head = r'"launch": "metrics", "rank": 0, '
    number = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
    return [
        {"Name": "train:loss", "Regex": head + r'"step": \d+, "loss": ' + number},
        {"Name": "train:samples_per_s", "Regex": head + r'.*"samples_per_s": ' + number},
        {"Name": "gpu:peak_allocated_bytes", "Regex": head + r'.*"peak_allocated_bytes": (\d+)'},
    ]


def _volume_gb(plan: Plan, configured: int | None) -> int:
    """The training volume holds the checkpoints (kept ones, the one being written, and those
    downloaded on resume): three copies of the model and optimizer states, plus 30 GB of room;
    SageMaker's 30 GB when the plan does not know its state sizes."""
    if configured is not None:
        return configured
    memory = plan.memory
    if memory.parameters is None or memory.optimizer is None:
        return DEFAULT_VOLUME_GB
    shards = plan.world_size if plan.strategy in ("fsdp", "hybrid_shard", "smp_v2") else 1
    states = (memory.parameters + memory.optimizer) * shards
    return max(DEFAULT_VOLUME_GB, math.ceil(3 * states / 2**30) + DEFAULT_VOLUME_GB)


# -- status ------------------------------------------------------------------------------------


def status_of(description: Mapping[str, Any]) -> JobStatus:
    """DescribeTrainingJob -> JobStatus. ``Stopping`` is not over: the job still writes logs and
    syncs its last checkpoint, which the next attempt resumes from."""
    status = description.get("TrainingJobStatus", "")
    secondary = description.get("SecondaryStatus", "")
    transitions = description.get("SecondaryStatusTransitions") or []
    detail = (transitions[-1].get("StatusMessage") or "") if transitions else ""
    message = f"{secondary}: {detail}" if detail else secondary
    if status == "InProgress":
        return JobStatus("pending" if secondary in PENDING_SECONDARY else "running",
                         message=message)
    if status == "Stopping":
        return JobStatus("running", message=message or "Stopping")
    if status == "Completed":
        return JobStatus("succeeded", exit_code=0, message=message)
    reason = description.get("FailureReason") or ""
    if status == "Failed":
        match = _EXIT_CODE.search(reason)
        return JobStatus("failed", exit_code=int(match.group(1)) if match else None,
                         message=reason or message)
    if status == "Stopped":
        if secondary in ("MaxRuntimeExceeded", "MaxWaitTimeExceeded"):
            return JobStatus("failed", message=message)
        return JobStatus("cancelled", message=message)
    return JobStatus("pending", message=message or status)


def _host(stream: str) -> str:
    tail = stream.split("/", 1)[-1]
    match = _HOST.match(tail)
    return match.group(1) if match else tail


def _host_order(stream: str) -> tuple[int, str]:
    host = _host(stream)
    number = host.rsplit("-", 1)[-1]
    return (int(number) if number.isdigit() else 1 << 30, stream)


def _millis(value: Any) -> float:
    """A SageMaker timestamp (a datetime from botocore) in epoch milliseconds, CloudWatch's unit."""
    if hasattr(value, "timestamp"):
        return value.timestamp() * 1000
    return float(value or 0) * 1000


def _status_line(transition: Mapping[str, Any]) -> str:
    detail = transition.get("StatusMessage") or ""
    return f"[sagemaker] {transition.get('Status')}" + (f": {detail}" if detail else "")


@dataclass
class _Cursor:
    """Where the reader of one job is: a JSON-able dict, so a reconnecting `launch logs` or
    `launch attach` picks up exactly where the last read ended."""

    streams: dict[str, str] = field(default_factory=dict)  # stream -> nextForwardToken
    transitions: int = 0      # secondary status transitions already shown
    settled: bool = False     # waited once for late lines after the job ended
    final: bool = False       # the last status and the FailureReason shown
    # The paging state, which ``behind`` reads: the newest timestamp read of each stream (before
    # its first event for one not read yet), the streams with pages still to read, and which
    # stream the next read starts with (round robin, so a read cut short starves none).
    tails: dict[str, int] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    turn: int = 0

    @classmethod
    def load(cls, cursor: Any) -> _Cursor:
        if not cursor:
            return cls()
        data = json.loads(cursor) if isinstance(cursor, str) else cursor
        return cls(streams=dict(data.get("streams", {})),
                   transitions=int(data.get("transitions", 0)),
                   settled=bool(data.get("settled")), final=bool(data.get("final")),
                   tails={k: int(v) for k, v in data.get("tails", {}).items()},
                   pending=list(data.get("pending", [])), turn=int(data.get("turn", 0)))

    def dump(self) -> dict[str, Any]:
        return {"streams": dict(self.streams), "transitions": self.transitions,
                "settled": self.settled, "final": self.final, "tails": dict(self.tails),
                "pending": list(self.pending), "turn": self.turn}


@dataclass
class _EventCursor:
    """Where the event channel of one job is. FilterLogEvents interleaves the job's streams by
    timestamp, and a host's lines can be ingested after a later timestamp of another host's, so
    each query starts ``EVENT_LOOKBACK_MS`` before the newest event seen and the ids of the
    events already returned since then are kept, to return each once."""

    start: int = 0                                        # startTime (ms) of the next query
    seen: dict[str, int] = field(default_factory=dict)    # eventId -> its timestamp
    token: str | None = None                              # a query cut short: its nextToken
    query_start: int = 0                                  # ... and the startTime it was for

    @classmethod
    def load(cls, cursor: Any) -> _EventCursor:
        if not cursor:
            return cls()
        data = json.loads(cursor) if isinstance(cursor, str) else cursor
        return cls(start=int(data.get("start", 0)),
                   seen={str(k): int(v) for k, v in data.get("seen", {}).items()},
                   token=data.get("token") or None, query_start=int(data.get("query_start", 0)))

    def dump(self) -> dict[str, Any]:
        return {"start": self.start, "seen": dict(self.seen), "token": self.token,
                "query_start": self.query_start}


# -- the provider ------------------------------------------------------------------------------


class SageMakerProvider(Provider):
    """One attempt = one training job; the job id is the training job's name.

    Reads of one job (describe, log streams) happen at most once per ``api_interval_s``: the
    supervisor asks several times a second, SageMaker's and CloudWatch's read quotas are a few
    calls a second per account.
    """

    name = "sagemaker"

    def __init__(self, settings: SageMakerSettings, environ: Mapping[str, str] | None = None):
        self.settings = settings
        self.environ = dict(os.environ if environ is None else environ)
        self._region: str | None = None
        if (settings.region or self.environ.get("AWS_REGION")
                or self.environ.get("AWS_DEFAULT_REGION")):
            # Checked now, so a malformed region stops even `launch plan` (exit 2); only the
            # profile's region waits for first use (finding it imports botocore).
            from launcher.providers._aws import resolve_region

            self._region = resolve_region(settings.region, self.environ)
        self._aws_handle: Any = None
        self._described: dict[str, tuple[float, dict[str, Any]]] = {}
        self._fetched: dict[str, float] = {}
        self._queried: dict[str, float] = {}  # job -> when its event channel was last asked
        self._listed: dict[str, float] = {}   # job -> when its log streams were last listed
        self._no_events = False  # FilterLogEvents was denied: the full log only

    @classmethod
    def from_settings(cls, settings: dict[str, Any], environ: dict[str, str] | None = None
                      ) -> SageMakerProvider:
        return cls(SageMakerSettings.from_mapping(settings), environ)

    # -- configuration ---------------------------------------------------------------------

    @property
    def region(self) -> str:
        if self._region is None:
            from launcher.providers._aws import resolve_region

            self._region = resolve_region(self.settings.region, self.environ)
        return self._region

    def _aws(self) -> Any:
        """The AWS session and clients, credentials checked (fast) on first use."""
        if self._aws_handle is None:
            from launcher.providers._aws import Aws, ClientSettings

            s = self.settings
            self._aws_handle = Aws(self.region, self.environ, ClientSettings(
                retry_mode=s.aws_retry_mode, max_attempts=s.aws_max_attempts,
                connect_timeout_s=s.aws_connect_timeout_s, read_timeout_s=s.aws_read_timeout_s,
                status_deadline_s=s.aws_status_deadline_s))
        self._aws_handle.check_credentials()
        return self._aws_handle

    def check_settings(self) -> tuple[str, str]:
        """(role, bucket), or the one line that says which is missing and how to give it. The
        dry run calls it; a caller that wants to fail before planning may call it first."""
        role, bucket = self.settings.role, self.settings.bucket_name
        if not role:
            raise UsageError("SageMaker needs an execution role for the job",
                             "pass --role arn:aws:iam::<account>:role/<name> (or LAUNCH_ROLE, or "
                             "role in launch.toml)")
        if not bucket:
            raise UsageError("SageMaker needs an S3 bucket for the code, checkpoints and output",
                             "pass --bucket NAME (or LAUNCH_BUCKET, or bucket in launch.toml)")
        return role, bucket

    # -- dry run ---------------------------------------------------------------------------

    def machine(self, plan: Plan) -> Any:
        """The catalog entry of the plan's instance type; one line when it is not a GPU
        training instance SageMaker offers."""
        from launcher.plan.catalog import UnknownMachine, load_catalog

        catalog = load_catalog("sagemaker")
        name = plan.machine
        try:
            machine = catalog.get(name)
        except UnknownMachine as exc:
            if NO_GPU_FAMILY.match(name.strip().lower()):
                raise UsageError(f"{name} has no GPU; launch plans GPU training jobs",
                                 "run `launch machines --provider sagemaker` for the GPU "
                                 "instance types") from None
            raise UsageError(exc.message, "run `launch machines --provider sagemaker`") from None
        if plan.gpus_per_node > machine.gpu_count:
            raise UsageError(f"{machine.name} has {machine.gpu_count} GPU(s), not "
                             f"{plan.gpus_per_node}", "lower --gpus-per-node or pick a larger "
                             "machine")
        if plan.nodes < 1:
            raise UsageError(f"a SageMaker job needs at least one instance, not {plan.nodes}")
        return machine

    def dryrun(self, job: Job) -> SageMakerRequest:
        """The exact CreateTrainingJob call and code package for ``job``. Reads the code folder;
        sends and writes nothing, needs no credentials."""
        from launcher.providers._aws import training_image
        from launcher.providers.images import check_image

        role, bucket = self.check_settings()
        s = self.settings
        plan = job.plan
        machine = self.machine(plan)
        region = self.region
        name = job_name(job.run_id, job.attempt, s.job_prefix)
        package = build_package(job, bucket, s.prefix, self.environ)
        run_root = "/".join(p for p in (s.prefix, job.run_id) if p)
        image = s.image or training_image(region, plan.strategy)
        check_image(image, plan.strategy, plan.optimizer, self.name)  # its torch: images.py

        environment = {
            **job.rendered.env,
            "LAUNCH_CHECKPOINT_DIR": CHECKPOINT_LOCAL,
            "LAUNCH_PLAN": "plan.json",
            "LAUNCH_RUN_ID": job.run_id,
            "LAUNCH_ATTEMPT": str(job.attempt),
            "LAUNCH_PROVIDER": "sagemaker",
            "PYTHONUNBUFFERED": "1",  # lines reach CloudWatch as they are printed
        }
        for key, value in environment.items():
            if len(value) > 512:
                raise UsageError(f"environment variable {key} is {len(value)} characters; "
                                 "SageMaker allows 512")
        hyperparameters = {
            "strategy": plan.strategy, "micro_batch_size": str(plan.micro_batch_size),
            "grad_accum_steps": str(plan.grad_accum_steps),
            "global_batch_size": str(plan.global_batch_size), "precision": plan.precision,
            "optimizer": plan.optimizer,
            "activation_checkpointing": str(plan.activation_checkpointing).lower(),
            "steps": str(plan.steps), "lr": repr(float(plan.lr)), "nodes": str(plan.nodes),
            "gpus_per_node": str(plan.gpus_per_node), "launch_run_id": job.run_id,
            "launch_attempt": str(job.attempt),
        }
        max_run = s.max_run_s
        if s.budget is not None and plan.cost_per_hour_usd:
            # A hard stop from SageMaker itself: no attempt runs longer than the whole budget
            # pays for, even when the launcher that follows it is gone.
            max_run = min(max_run, max(1, int(s.budget / plan.cost_per_hour_usd * 3600)))
        stopping: dict[str, int] = {"MaxRuntimeInSeconds": max_run}
        if s.spot:
            stopping["MaxWaitTimeInSeconds"] = max(s.max_wait_s or 2 * max_run, max_run)
        arguments = [
            CODE_ARCHIVE, CODE_DIR, package.sha256,
            "python3", BOOTSTRAP_NAME, "--nproc-per-node", str(plan.gpus_per_node),
            "--resource-config", RESOURCE_CONFIG, "--master-port", str(MASTER_PORT),
            package.entrypoint,
        ]
        for argument in arguments:
            if len(argument) > 256:
                raise UsageError(f"the script path {argument[:60]}... is longer than the 256 "
                                 "characters SageMaker allows in a container argument")
        kwargs: dict[str, Any] = {
            "TrainingJobName": name,
            "RoleArn": role,
            "AlgorithmSpecification": {
                "TrainingImage": image,
                "TrainingInputMode": "File",
                "ContainerEntrypoint": ["/bin/sh", "-c", ENTRY_SHELL, "launch"],
                "ContainerArguments": arguments,
                "MetricDefinitions": _metric_definitions(),
            },
            "HyperParameters": hyperparameters,
            "Environment": environment,
            "InputDataConfig": [{
                "ChannelName": CODE_CHANNEL,
                "DataSource": {"S3DataSource": {
                    "S3DataType": "S3Prefix", "S3Uri": package.channel_uri,
                    "S3DataDistributionType": "FullyReplicated"}},
                "InputMode": "File",
                "CompressionType": "None",
            }],
            "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/{run_root}/output"},
            "ResourceConfig": {"InstanceType": machine.name, "InstanceCount": plan.nodes,
                               "VolumeSizeInGB": _volume_gb(plan, s.volume_size_gb)},
            "StoppingCondition": stopping,
            "CheckpointConfig": {"S3Uri": f"s3://{bucket}/{run_root}/checkpoints",
                                 "LocalPath": CHECKPOINT_LOCAL},
            "EnableManagedSpotTraining": bool(s.spot),
            "Tags": [
                {"Key": "launch:run-id", "Value": job.run_id},
                {"Key": "launch:attempt", "Value": str(job.attempt)},
                {"Key": "launch:strategy", "Value": plan.strategy},
                {"Key": "launch:code-sha256", "Value": package.sha256[:24]},
            ],
        }
        return SageMakerRequest(region=region, kwargs=kwargs, package=package,
                                run_id=job.run_id, attempt=job.attempt,
                                record_dir=str(job.attempt_dir))

    # -- submission ------------------------------------------------------------------------

    def schedule(self, request: SageMakerRequest) -> str:  # type: ignore[override]
        """Upload the package (unless that hash is there), then create the job. Idempotent: the
        name is fixed per run and attempt, and a create that AWS may have executed before the
        connection broke or the call was throttled is followed by a describe that adopts it."""
        aws = self._aws()
        if request.record_dir:
            from launcher.runs import write_json

            write_json(Path(request.record_dir) / "request.json", request.to_dict())
        self._check_role(aws, request.kwargs["RoleArn"])
        self._upload(aws, request.package)
        name = request.job_name
        sagemaker = aws.client("sagemaker")
        try:
            sagemaker.create_training_job(**request.kwargs)
        except Exception as exc:
            from launcher.providers._aws import error_code, error_message, is_transient

            code = error_code(exc)
            exists = code == "ResourceInUse" or (
                code == "ValidationException" and "already exists" in error_message(exc))
            if not exists and not is_transient(exc):
                raise self._error(exc, f"creating training job {name}") from None
            adopted = self._adopt(request.job_name, request.run_id, request.attempt)
            if adopted is None:
                raise self._error(exc, f"creating training job {name}") from None
        self._described.pop(name, None)
        return name

    def adopt(self, run_id: str, attempt: int, attempt_dir: Path) -> str | None:
        """An attempt's job, by the deterministic name its dry run gave it."""
        return self._adopt(job_name(run_id, attempt, self.settings.job_prefix), run_id, attempt)

    def _adopt(self, name: str, run_id: str, attempt: int) -> str | None:
        """The job of this name, when it is this run's attempt (its environment says so)."""
        try:
            description = self._aws().read("sagemaker", "describe_training_job",
                                           TrainingJobName=name)
        except LaunchError:
            raise
        except Exception as exc:
            from launcher.providers._aws import error_code

            if error_code(exc) == "ValidationException":  # "Requested resource not found"
                return None
            raise self._error(exc, f"describing training job {name}") from None
        environment = description.get("Environment") or {}
        if (environment.get("LAUNCH_RUN_ID") == run_id
                and environment.get("LAUNCH_ATTEMPT") == str(attempt)):
            return name
        raise ProviderError(f"a SageMaker training job named {name} already exists and is not "
                            f"attempt {attempt} of run {run_id}",
                            "job names are unique per account and region; set another "
                            "job_prefix")

    def _check_role(self, aws: Any, role: str) -> None:
        """A role that does not exist is one clear line here instead of a ValidationException
        later; without iam:GetRole permission the check is skipped (CreateTrainingJob checks)."""
        from launcher.providers._aws import error_code

        role_name = role.rsplit("/", 1)[-1]
        try:
            aws.client("iam").get_role(RoleName=role_name)
        except Exception as exc:
            if error_code(exc) == "NoSuchEntity":
                raise ProviderError(f"the IAM role {role} does not exist",
                                    "create a SageMaker execution role or pass another --role"
                                    ) from None
            return

    def _upload(self, aws: Any, package: CodePackage) -> bool:
        """Put the archive at its content-addressed key unless it is there; True if uploaded."""
        from launcher.providers._aws import error_code

        s3 = aws.client("s3")
        try:
            head = s3.head_object(Bucket=package.bucket, Key=package.key)
            if (head.get("ContentLength") == package.size_bytes
                    and (head.get("Metadata") or {}).get("sha256") == package.sha256):
                return False
        except Exception as exc:
            if error_code(exc) not in ("404", "NoSuchKey", "NotFound"):
                raise self._error(exc, f"reading {package.s3_uri}") from None
        try:
            s3.put_object(Bucket=package.bucket, Key=package.key, Body=package.data,
                          ContentType="application/gzip", Metadata={"sha256": package.sha256})
        except Exception as exc:
            if error_code(exc) == "NoSuchBucket":
                raise ProviderError(f"the S3 bucket {package.bucket} does not exist",
                                    f"create it in {self.region} or pass another --bucket"
                                    ) from None
            raise self._error(exc, f"uploading the code to {package.s3_uri}") from None
        return True

    # -- following -------------------------------------------------------------------------

    def _describe(self, job_id: str, max_age: float | None = None) -> dict[str, Any]:
        """DescribeTrainingJob, at most once per ``api_interval_s`` per job, within
        ``aws_status_deadline_s`` (an endpoint that never answers is one line, exit 6, in
        seconds). After retries fail on throttling or the connection, the last answer stands in
        (the job has not moved backwards), so a blip does not end the watch."""
        from launcher.providers._aws import error_code, is_transient

        age = self.settings.api_interval_s if max_age is None else max_age
        cached = self._described.get(job_id)
        now = time.monotonic()
        if cached is not None and now - cached[0] < age:
            return cached[1]
        try:
            description = self._aws().read("sagemaker", "describe_training_job",
                                           TrainingJobName=job_id)
        except Exception as exc:
            if cached is not None and is_transient(exc):
                return cached[1]
            if error_code(exc) == "ValidationException":
                raise ProviderError(f"no SageMaker training job named {job_id} in {self.region}",
                                    "check --region (or AWS_REGION)") from None
            raise self._error(exc, f"describing training job {job_id}") from None
        self._described[job_id] = (now, description)
        return description

    def poll(self, job_id: str) -> JobStatus:
        return status_of(self._describe(job_id))

    def logs(self, job_id: str, cursor: Any = None) -> tuple[list[str], dict[str, Any]]:
        """New lines of the job, each once, in time order: SageMaker's status changes
        (``[sagemaker] Training: ...``) and every host's output (``[algo-N] ...``). Once the job
        has ended and its streams are drained, its last status and its ``FailureReason`` come
        last (the templates write their out-of-memory report there too, so that line carries the
        ``{"launch": "oom"}`` event even when the log lost it)."""
        state = _Cursor.load(cursor)
        description = self._describe(job_id)
        transitions = description.get("SecondaryStatusTransitions") or []
        terminal = description.get("TrainingJobStatus") in ("Completed", "Failed", "Stopped")
        # The final status waits until the output before it has been read.
        visible = transitions[:-1] if terminal and not state.final else transitions
        entries: list[tuple[float, tuple[int, str], int, str]] = [
            (_millis(t.get("StartTime")), (-1, ""), i, _status_line(t))
            for i, t in enumerate(visible[state.transitions:])]
        state.transitions = max(state.transitions, len(visible))
        now = time.monotonic()
        due = terminal or now - self._fetched.get(job_id, -math.inf) >= \
            self.settings.api_interval_s
        read: list[tuple[float, tuple[int, str], int, str]] = []
        complete = True
        if due:
            self._fetched[job_id] = now
            hosts = int((description.get("ResourceConfig") or {}).get("InstanceCount") or 1)
            # Until every host has a stream, each read looks for the missing ones.
            complete = self._read_streams(job_id, state, read, drain=terminal,
                                          relist=terminal or len(state.tails) < hosts)
            if terminal and complete and not state.settled:
                # CloudWatch may still be ingesting the last lines when the job reports its end
                # (not worth waiting for when it ended a while ago).
                ended = _millis(description.get("TrainingEndTime")
                                or description.get("LastModifiedTime")) / 1000
                if time.time() - ended < 60:
                    time.sleep(max(0.0, self.settings.log_settle_s))
                state.settled = True
                complete = self._read_streams(job_id, state, read, relist=True, drain=True)
        entries += read
        entries.sort(key=lambda e: (e[0], e[1], e[2]))
        lines = [line for *_, line in entries]
        if terminal and complete and state.settled and not state.final:
            lines += [_status_line(t) for t in transitions[state.transitions:]]
            state.transitions = len(transitions)
            reason = description.get("FailureReason")
            if reason:
                lines += [f"[sagemaker] FailureReason: {part}"
                          for part in reason.splitlines() if part.strip()]
            state.final = True
        return lines, state.dump()

    def _read_streams(self, job_id: str, state: _Cursor,
                      events: list[tuple[float, tuple[int, str], int, str]],
                      relist: bool = False, drain: bool = False) -> bool:
        """Append (time, host order, sequence, line) for the new lines of the job's streams to
        ``events`` and advance ``state`` page by page. Returns True when every stream was read
        to its end.

        Paced: DescribeLogStreams and GetLogEvents go through one :class:`Pacer` of
        ``log_read_tps`` calls a second, one attempt each (a throttling answer backs the pacer
        off instead of botocore sleeping), one page per stream in turn, for at most
        ``log_read_budget_s``: a job that writes faster than the quota lets us read is read as
        fast as the quota allows, the caller gets back to the event channel in time, and
        ``behind`` says how far the log trails. A read that has read nothing yet, and any read
        of a job that has ended (``drain``), waits for the pacer (up to
        ``aws_status_deadline_s``), so no lines means nothing new, not "paced". The streams are
        listed every ``STREAMS_REFRESH_S`` (each listing spends the same quota), or on every
        read while ``relist``.
        A call that failed after its retries (throttling, a dropped connection) ends the read:
        what was read is kept and the cursor stops right after it, so the next read neither
        repeats nor skips a line."""
        from launcher.providers._aws import THROTTLING_CODES, Paced, error_code, is_transient

        aws = self._aws()
        pacer = aws.pacer("logs:read", self.settings.log_read_tps)
        began = time.monotonic()
        hard_end = began + max(self.settings.log_read_budget_s,
                               self.settings.aws_status_deadline_s)
        # An ended job has no event channel to get back to: its reads go on to the deadline.
        budget_end = hard_end if drain else began + self.settings.log_read_budget_s
        before = len(events)

        def call(send: Callable[[], Any]) -> Any:
            while True:
                try:
                    return send()
                except Paced as paced:
                    wait = paced.wait_s
                except Exception as exc:
                    if error_code(exc) not in THROTTLING_CODES:
                        raise
                    wait = pacer.take()  # the backoff the throttle set (0: try at once)
                    if wait == 0:
                        continue
                end = budget_end if len(events) > before else hard_end
                if time.monotonic() + wait > end:
                    raise Paced(wait)
                time.sleep(wait)

        pending = set(state.pending)
        streams: list[str] = []
        listed = self._listed.get(job_id, -math.inf)
        # New streams (a host that starts late) are looked for every STREAMS_REFRESH_S: each
        # look is a call of the same quota the pages need. ``relist``: a host has no stream
        # yet, or the job has ended and its last streams must not be missed.
        look = relist or not state.tails or time.monotonic() - listed >= STREAMS_REFRESH_S
        try:
            token: str | None = None
            if look:
                self._listed[job_id] = time.monotonic()
            while look:
                kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP,
                                          "logStreamNamePrefix": job_id + "/"}
                if token:
                    kwargs["nextToken"] = token
                page = call(lambda kw=kwargs: aws.read(
                    "logs", "describe_log_streams", pacer=pacer, **kw))
                for found in page.get("logStreams", []):
                    name = found["logStreamName"]
                    streams.append(name)
                    if name not in state.tails:  # new: all of it is still to read
                        first = found.get("firstEventTimestamp") or found.get("creationTime")
                        state.tails[name] = int(first or time.time() * 1000) - 1
                        pending.add(name)
                token = page.get("nextToken")
                if not token:
                    break
        except Exception as exc:
            if error_code(exc) == "ResourceNotFoundException":  # no job has logged yet
                return True
            if not isinstance(exc, Paced) and not is_transient(exc):
                raise self._error(exc, f"reading the logs of {job_id}") from None
            if not state.tails:
                return False
            streams = list(state.tails)  # the streams known so far: read those now
        ordered = sorted(set(streams) | set(state.tails), key=_host_order)
        if ordered:
            shift = state.turn % len(ordered)
            ordered = ordered[shift:] + ordered[:shift]
            state.turn += 1
        unread = list(ordered)
        complete = True
        try:
            while unread:
                for stream in list(unread):
                    if time.monotonic() >= budget_end and len(events) > before:
                        raise Paced(0.0)
                    token = state.streams.get(stream)
                    kwargs = {"logGroupName": LOG_GROUP, "logStreamName": stream,
                              "startFromHead": True}
                    if token:
                        kwargs["nextToken"] = token
                    if self.settings.log_page_size:
                        kwargs["limit"] = self.settings.log_page_size
                    page = call(lambda kw=kwargs: aws.read(
                        "logs", "get_log_events", pacer=pacer, **kw))
                    batch = page.get("events", [])
                    host = _host(stream)
                    order = _host_order(stream)
                    for event in batch:
                        stamp = int(event.get("timestamp", 0))
                        state.tails[stream] = max(state.tails.get(stream, 0), stamp)
                        for part in str(event.get("message", "")).splitlines() or [""]:
                            events.append((float(stamp), order, len(events),
                                           f"[{host}] {part.rstrip()}"))
                    following = page.get("nextForwardToken")
                    if following:
                        state.streams[stream] = following
                    # The end: the same token comes back (or nothing more came).
                    if not batch or not following or following == token:
                        unread.remove(stream)
                        pending.discard(stream)
                    else:
                        pending.add(stream)
        except Paced:
            complete = False
        except Exception as exc:
            if not is_transient(exc):
                raise self._error(exc, f"reading the logs of {job_id}") from None
            complete = False
        state.pending = sorted(pending, key=_host_order)
        return complete

    def behind(self, job_id: str, cursor: Any) -> float | None:
        """Seconds of log not yet read, from the paging state in ``cursor``: for each stream
        with pages still to read, now minus the newest timestamp read from it (its first
        event's, for one not read yet); the largest. None when every stream was read to its
        end (the job may be quiet, not the reader late)."""
        state = _Cursor.load(cursor)
        if not state.pending:
            return None
        now = time.time() * 1000
        lag = max(now - state.tails.get(stream, now) for stream in state.pending)
        return max(0.0, lag / 1000)

    def events(self, job_id: str, cursor: Any = None) -> tuple[list[str], dict[str, Any]]:
        """The job's event lines and failure lines, from a channel of their own: FilterLogEvents
        on the job's streams (``<job>/`` in ``/aws/sagemaker/TrainingJobs``) with
        :func:`event_filter`'s pattern, at most every ``events_interval_s``. CloudWatch filters
        on its side, so a job writing thousands of lines a second costs one call a second here,
        whatever the full log's reader still has to page through. botocore retries a throttled
        query (two attempts, jittered backoff); one that still fails returns nothing now and is
        asked again next time. Lines look like the full log's (``[algo-2] ...``) and come again
        there: this channel only comes first."""
        from launcher.providers._aws import error_code, is_transient

        state = _EventCursor.load(cursor)
        now = time.monotonic()
        if self._no_events or (
                now - self._queried.get(job_id, -math.inf) < self.settings.events_interval_s):
            return [], state.dump()
        self._queried[job_id] = now
        aws = self._aws()
        if not state.start and not state.token:
            created = self._describe(job_id).get("CreationTime")
            state.start = max(0, int(_millis(created)) - EVENT_LOOKBACK_MS) if created else 0
        pattern, _ = event_filter()
        start = state.query_start if state.token else state.start
        token = state.token
        found: list[tuple[int, tuple[int, str], str, str]] = []
        try:
            for _page in range(EVENT_PAGES):
                kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP,
                                          "logStreamNamePrefix": job_id + "/",
                                          "filterPattern": pattern, "startTime": start}
                if token:
                    kwargs["nextToken"] = token
                page = aws.read("logs", "filter_log_events", **kwargs)
                for event in page.get("events", []):
                    event_id = str(event.get("eventId"))
                    stamp = int(event.get("timestamp", 0))
                    stream = str(event.get("logStreamName", ""))
                    if event_id in state.seen or not stream.startswith(job_id + "/"):
                        continue  # (a server that ignored the prefix: another job's line)
                    state.seen[event_id] = stamp
                    found += [(stamp, _host_order(stream), event_id,
                               f"[{_host(stream)}] {part.rstrip()}")
                              for part in str(event.get("message", "")).splitlines() or [""]]
                token = page.get("nextToken") or None
                if token is None:
                    break
        except Exception as exc:
            code = error_code(exc)
            if code in ("AccessDenied", "AccessDeniedException"):
                # An identity without logs:FilterLogEvents (a policy older than this channel):
                # the full log still carries every line, only later. `launch doctor` says so.
                self._no_events = True
                return [], state.dump()
            if code != "ResourceNotFoundException" and not is_transient(exc):
                raise self._error(exc, f"reading the events of {job_id}") from None
            # No job of this group has logged yet, or CloudWatch kept refusing: what came is
            # kept, and the query goes on from its last page next time.
        state.token, state.query_start = token, (start if token else 0)
        if token is None and state.seen:
            state.start = max(state.start, max(state.seen.values()) - EVENT_LOOKBACK_MS)
            state.seen = {k: v for k, v in state.seen.items() if v >= state.start}
        found.sort(key=lambda e: (e[0], e[1], e[2]))
        return [line for *_, line in found], state.dump()

    def stop(self, job_id: str) -> None:
        """StopTrainingJob; a job that is stopping or has ended already is left alone."""
        from launcher.providers._aws import error_code

        try:
            self._aws().client("sagemaker").stop_training_job(TrainingJobName=job_id)
        except Exception as exc:
            if error_code(exc) != "ValidationException":
                raise self._error(exc, f"stopping training job {job_id}") from None
            status = self._describe(job_id, max_age=0).get("TrainingJobStatus")
            if status not in ("Stopping", "Stopped", "Completed", "Failed"):
                raise self._error(exc, f"stopping training job {job_id}") from None
        self._described.pop(job_id, None)

    def _error(self, exc: BaseException, doing: str) -> ProviderError:
        from launcher.providers._aws import provider_error

        return provider_error(exc, doing)


# -- the bootstrap shipped in the package ------------------------------------------------------

BOOTSTRAP = '''\
"""Start torchrun on this SageMaker host. Written by `launch`; runs inside the training container.

SageMaker describes the cluster in /opt/ml/input/config/resourceconfig.json:
    {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"}
Every host runs this same command. A host's place in the host list is its node rank and the
first host is the rendezvous master, so all hosts agree without talking first. Containers started
by the SageMaker training toolkit describe the same facts in SM_HOSTS and SM_CURRENT_HOST.
"""

import argparse
import json
import os
import sys


def cluster(path):
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        hosts, current = config["hosts"], config["current_host"]
        interface = config.get("network_interface_name")
    except FileNotFoundError:
        hosts = json.loads(os.environ.get("SM_HOSTS") or '["algo-1"]')
        current = os.environ.get("SM_CURRENT_HOST") or hosts[0]
        interface = os.environ.get("SM_NETWORK_INTERFACE_NAME")
    number = lambda host: (int(host.rsplit("-", 1)[-1]) if host.rsplit("-", 1)[-1].isdigit()
                           else 1 << 30, host)
    return sorted(hosts, key=number), current, interface


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--resource-config", required=True)
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    hosts, current, interface = cluster(options.resource_config)
    argv = [sys.executable, "-m", "torch.distributed.run",
            "--nproc_per_node", str(options.nproc_per_node)]
    if len(hosts) == 1:
        argv += ["--standalone", "--role", "rank"]
    else:
        argv += ["--nnodes", str(len(hosts)), "--node_rank", str(hosts.index(current)),
                 "--master_addr", hosts[0], "--master_port", str(options.master_port),
                 "--role", "local_rank"]
        if interface:
            os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    # --tee: every line of every process, prefixed with its (local) rank, in the host's log.
    argv += ["--tee", "3", options.script, *options.args]
    print(f"launch: {current}, node {hosts.index(current)} of {len(hosts)}: " + " ".join(argv),
          flush=True)
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
'''
