"""Vertex AI's names and their rules: regions, buckets, custom job names, job states, run times.

Each value is checked where it enters (a region becomes part of a host name), with the one-line
error that says what was expected.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from launcher.providers.base import JobState, checked_duration, checked_region
from launcher.status import UsageError

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
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")

#: Vertex AI job states -> the launcher's.
STATES = {
    "JOB_STATE_UNSPECIFIED": JobState.PENDING, "JOB_STATE_QUEUED": JobState.PENDING,
    "JOB_STATE_PENDING": JobState.PENDING, "JOB_STATE_RUNNING": JobState.RUNNING,
    "JOB_STATE_UPDATING": JobState.RUNNING, "JOB_STATE_PAUSED": JobState.RUNNING,
    "JOB_STATE_SUCCEEDED": JobState.SUCCEEDED, "JOB_STATE_FAILED": JobState.FAILED,
    "JOB_STATE_EXPIRED": JobState.FAILED, "JOB_STATE_PARTIALLY_SUCCEEDED": JobState.FAILED,
    "JOB_STATE_CANCELLING": JobState.CANCELLED, "JOB_STATE_CANCELLED": JobState.CANCELLED,
}


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

