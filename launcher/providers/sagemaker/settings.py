"""The run's SageMaker settings, its training job names and job states."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.flags import flag
from launcher.providers.base import JobState, JobStatus, checked_duration
from launcher.status import BadValue, UsageError

#: The job name rule of the CreateTrainingJob API.
JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
JOB_NAME_MAX = 63
JOB_PREFIX_MAX = 20
ROLE_ARN = re.compile(r"arn:aws[a-z\-]*:iam::[0-9]{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+")
#: S3's bucket naming rules: 3 to 63 lowercase letters, digits, dots and hyphens, starting and
#: ending with a letter or digit, no two dots together, not an IP address, and none of the
#: prefixes and suffixes S3 keeps for itself.
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP_ADDRESS = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}")
_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
S3_PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()/-]*$")

#: SageMaker's defaults: one day of runtime (the API's own default), a 30 GB volume (the SDK's).
DEFAULT_MAX_RUN_S = 24 * 3600
#: The longest MaxRuntimeInSeconds SageMaker takes for a training job: 28 days.
MAX_RUN_LIMIT_S = 28 * 24 * 3600
DEFAULT_VOLUME_GB = 30
#: Secondary statuses of an InProgress job that has not started the user's code yet.
PENDING_SECONDARY = frozenset({"Starting", "Pending", "LaunchingMLInstances",
                               "PreparingTrainingStack"})
_EXIT_CODE = re.compile(r"exit code:?\s*(-?\d+)", re.IGNORECASE)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
    (another training image), ``torch_version`` and ``py_version`` (of the default image, which
    sagemaker-core names), ``s3_prefix`` (default ``launch``), ``job_prefix`` (default
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
    role: str | None = flag("Execution role ARN.", envvar="LAUNCH_ROLE")
    spot: bool = False
    budget: float | None = None
    image: str | None = None
    #: The PyTorch (and Python) of the default image, asked of sagemaker-core's image_uris
    #: (``2.9.0``, ``py312``); unset: the torch the strategy's script ran under (images.py) and
    #: the newest Python the SDK has for it. Ignored with ``image``.
    torch_version: str | None = None
    py_version: str | None = None
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
        """Formats only: a missing role or bucket is reported by the dry run that needs it; a
        malformed role or bucket is a :class:`BadValue` (exit 2, also in a dry run), as a
        malformed region is."""
        if self.role is not None and not ROLE_ARN.fullmatch(self.role):
            raise BadValue(f"--role {_shown(self.role)} is not an IAM role ARN",
                           "give the full ARN, like arn:aws:iam::123456789012:role/SageMakerRole")
        if self.bucket is not None:
            bucket = self.bucket.removeprefix("s3://").rstrip("/")
            if ("/" in bucket or not BUCKET.fullmatch(bucket) or ".." in bucket
                    or _IP_ADDRESS.fullmatch(bucket) or bucket.startswith(_RESERVED_PREFIXES)
                    or bucket.endswith(_RESERVED_SUFFIXES)):
                raise BadValue(f"--bucket {_shown(self.bucket)} is not an S3 bucket name",
                               "3 to 63 lowercase letters, digits, dots and hyphens; no s3:// "
                               "path: set s3_prefix for a folder")
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


def status_of(description: Mapping[str, Any]) -> JobStatus:
    """DescribeTrainingJob -> JobStatus. ``Stopping`` is not over: the job still writes logs and
    syncs its last checkpoint, which the next attempt resumes from."""
    status = description.get("TrainingJobStatus", "")
    secondary = description.get("SecondaryStatus", "")
    transitions = description.get("SecondaryStatusTransitions") or []
    detail = (transitions[-1].get("StatusMessage") or "") if transitions else ""
    message = f"{secondary}: {detail}" if detail else secondary
    if status == "InProgress":
        return JobStatus(JobState.PENDING if secondary in PENDING_SECONDARY else JobState.RUNNING,
                         message=message)
    if status == "Stopping":
        return JobStatus(JobState.RUNNING, message=message or "Stopping")
    if status == "Completed":
        return JobStatus(JobState.SUCCEEDED, exit_code=0, message=message)
    reason = description.get("FailureReason") or ""
    if status == "Failed":
        match = _EXIT_CODE.search(reason)
        return JobStatus(JobState.FAILED, exit_code=int(match.group(1)) if match else None,
                         message=reason or message)
    if status == "Stopped":
        if secondary in ("MaxRuntimeExceeded", "MaxWaitTimeExceeded"):
            return JobStatus(JobState.FAILED, message=message)
        return JobStatus(JobState.CANCELLED, message=message)
    return JobStatus(JobState.PENDING, message=message or status)
