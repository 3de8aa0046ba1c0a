"""Vertex AI's names and their rules: regions, buckets, custom job names, job states, run times.

Each value is checked where it enters (a region becomes part of a host name), with the one-line
error that says what was expected.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from launcher.providers.base import JobState, checked_duration, checked_region
from launcher.status import BadValue, UsageError

DEFAULT_PREFIX = "launch"
#: Vertex AI's own default and maximum run time for a custom job is 7 days.
DEFAULT_TIMEOUT_S = 7 * 24 * 3600
#: A Google Cloud region (us-central1, europe-west4, northamerica-northeast1): it becomes part of
#: the API's host name (REGION-aiplatform.googleapis.com), so nothing else may pass.
REGION = re.compile(r"[a-z]+(?:-[a-z]+)+[0-9]{1,2}")
REGION_SHAPE = ("lowercase words joined by hyphens and ending in a number, like us-central1 or "
                "europe-west4")
JOB_NAME = re.compile(r"^projects/([^/]+)/locations/([a-z]+(?:-[a-z]+)+[0-9]{1,2})/customJobs/"
                      r"([0-9]+)$")
#: Cloud Storage's bucket naming rules: 3 to 63 lowercase letters, digits, hyphens, underscores
#: and dots (up to 222 with dots, each dot-separated part at most 63), starting and ending with a
#: letter or digit; not an IP address, not starting with "goog", not holding "google".
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
_IP_ADDRESS = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}")
#: A Google Cloud project id: 6 to 30 lowercase letters, digits and hyphens, starting with a
#: letter, not ending with a hyphen. It becomes part of every resource name
#: (``projects/PROJECT/locations/...``), so nothing else may pass.
PROJECT_ID = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
#: A service account's email: NAME@PROJECT.iam.gserviceaccount.com, or a Google-managed one
#: (PROJECT_NUMBER-compute@developer.gserviceaccount.com): a name and a dotted domain.
SERVICE_ACCOUNT = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9._+-]{0,63}@[a-z0-9-]+(?:\.[a-z0-9-]+)+")

#: Vertex AI job states -> the launcher's.
STATES = {
    "JOB_STATE_UNSPECIFIED": JobState.PENDING, "JOB_STATE_QUEUED": JobState.PENDING,
    "JOB_STATE_PENDING": JobState.PENDING, "JOB_STATE_RUNNING": JobState.RUNNING,
    "JOB_STATE_UPDATING": JobState.RUNNING, "JOB_STATE_PAUSED": JobState.RUNNING,
    "JOB_STATE_SUCCEEDED": JobState.SUCCEEDED, "JOB_STATE_FAILED": JobState.FAILED,
    "JOB_STATE_EXPIRED": JobState.FAILED, "JOB_STATE_PARTIALLY_SUCCEEDED": JobState.FAILED,
    "JOB_STATE_CANCELLING": JobState.CANCELLED, "JOB_STATE_CANCELLED": JobState.CANCELLED,
}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_bucket(value: str) -> tuple[str, str]:
    """``NAME`` or ``gs://NAME/PREFIX`` -> (name, prefix); the prefix defaults to ``launch``.
    A name that breaks Cloud Storage's naming rules is a :class:`BadValue` (exit 2, also in a
    dry run): it becomes part of paths and URLs."""
    text = value.strip().removeprefix("gs://").strip("/")
    name, _, prefix = text.partition("/")
    if (not BUCKET_NAME.fullmatch(name) or ".." in name or _IP_ADDRESS.fullmatch(name)
            or ("." not in name and len(name) > 63)
            or any(len(part) > 63 for part in name.split("."))
            or name.startswith("goog") or "google" in name):
        raise BadValue(f"{_shown(value)} is not a Cloud Storage bucket name",
                       "pass --bucket NAME or gs://NAME/PREFIX: 3 to 63 lowercase letters, "
                       "digits, hyphens, underscores and dots")
    return name, prefix.strip("/") or DEFAULT_PREFIX


def check_project(project: Any, source: str = "") -> str:
    """``project`` when it is a Google Cloud project id (else a :class:`BadValue` naming it and
    where it came from: it becomes part of every resource name)."""
    if not isinstance(project, str) or not PROJECT_ID.fullmatch(project):
        where = f" (from {source})" if source else ""
        raise BadValue(f"project {_shown(project)}{where} is not a Google Cloud project id",
                       "6 to 30 lowercase letters, digits and hyphens, starting with a letter, "
                       "like my-project-123")
    return project


def check_service_account(account: Any) -> str:
    """``account`` when it is shaped like a service account's email (else a :class:`BadValue`
    naming it: it goes into the job's request as it is)."""
    if (not isinstance(account, str) or len(account) > 254
            or not SERVICE_ACCOUNT.fullmatch(account)):
        raise BadValue(f"service account {_shown(account)} is not an email address",
                       "pass --service-account NAME@PROJECT.iam.gserviceaccount.com")
    return account


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

def console_url(job_id: str, project: str) -> str:
    _p, location, number = parse_job_name(job_id)
    return (f"https://console.cloud.google.com/vertex-ai/locations/{location}/training/"
            f"{number}/cpu?project={project}")



def utc_time(moment: Any) -> datetime | None:
    if not moment:
        return None
    if isinstance(moment, datetime):
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return None

