"""Following a Vertex AI job through Cloud Logging: the full stream (``logs``, paced to the read
quota, ``behind`` says how far it trails) and the event channel (``events``, filtered by Cloud
Logging to the templates' events and the failure classifier's out-of-memory needles).

:class:`VertexLogs` is a part of :class:`~launcher.providers.vertex.provider.VertexProvider`: it
reads the provider's job cache, clients, quota and backoffs (one provider, two files).
"""

from __future__ import annotations

import functools
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from launcher.providers.base import TERMINAL_STATES, JobState
from launcher.providers.vertex import _gcp
from launcher.providers.vertex._gcp import LogCursor
from launcher.providers.vertex.names import STATES, console_url, parse_job_name, utc_time

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


class VertexLogs:
    """The log-reading methods of the Vertex provider (mixed into it)."""

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
        terminal = STATES.get(job.state.name) in TERMINAL_STATES
        peek = peek_cursor(cursor)
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
        ended = utc_time(job.end_time) or utc_time(job.update_time) or datetime.now(UTC)
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
        if STATES.get(job.state.name) != JobState.RUNNING:
            if STATES.get(job.state.name) in TERMINAL_STATES:
                quota.forget(job_id)  # its share of the quota goes back to the stream
            return [], cursor
        backoff = self._backoff(job_id, "events")
        if quota.wait_s("events", job_id) > 0 or backoff.wait_s() > 0:
            return [], cursor
        from google.api_core import exceptions as gexc

        state = LogCursor.load(cursor)
        number = parse_job_name(job_id)[2]
        created = (utc_time(job.create_time) or datetime.now(UTC)) - timedelta(minutes=1)
        query = event_query(number, state.lower_bound(created, self.timing.log_overlap_s))
        sent = datetime.now(UTC)
        with _gcp.translating(f"reading the event channel of Vertex AI job {number}"):
            try:
                records, more = self.logs_reader().page(
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
        peek = peek_cursor(cursor)
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
        created = (utc_time(job.create_time) or datetime.now(UTC)) - timedelta(minutes=1)
        lower = state.lower_bound(created, self.timing.log_overlap_s)
        query = (f'resource.type="ml_job" AND resource.labels.job_id="{number}" '
                 f'AND timestamp>="{_gcp.rfc3339(lower)}"')
        quota, backoff = self._quota(), self._backoff(job_id, "log")
        with _gcp.translating(f"reading the log of Vertex AI job {number}"):
            if wait:
                time.sleep(backoff.wait_s())
                records, more = self.logs_reader().page(
                    query, LOG_PAGE_SIZE, before=lambda: quota.acquire("log"),
                    retry=self._retry(reads=True))
            else:
                try:
                    records, more = self.logs_reader().page(
                        query, LOG_PAGE_SIZE, before=lambda: quota.spend("log"))
                except Exception as exc:  # transient: try again later; anything else is raised
                    backoff.failed(exc)
                    return None
        backoff.succeeded()
        self._last_read[job_id] = time.monotonic()
        return state.accept(records, self.timing.log_overlap_s, cut=more)



@functools.cache
def event_needles() -> tuple[str, ...]:
    """What the event channel asks Cloud Logging for: the templates' event marker and the failure
    classifier's needles of :data:`EVENT_CATEGORIES` (their one home, launcher/failures; in lower
    case, which is no matter: the query language ignores case). A needle with a control
    character (a tab before "oom") is left out: the full stream still brings such a line."""
    from launcher.events import MARKER
    from launcher.failures import needles_for

    found = dict.fromkeys((MARKER, *needles_for(EVENT_CATEGORIES).needles))
    return tuple(needle for needle in found if needle.isprintable())


def event_query(number: str, lower: datetime) -> str:
    """The event channel's query for job ``number`` from ``lower`` on: the full stream's
    restriction, and a substring test of each needle on each field (:func:`_gcp.has_any`)."""
    return (f'resource.type="ml_job" AND resource.labels.job_id="{number}" '
            f'AND timestamp>="{_gcp.rfc3339(lower)}" '
            f'AND {_gcp.has_any(EVENT_FIELDS, event_needles())}')


def peek_cursor(cursor: Any) -> dict[str, Any]:
    """A cursor's fields without copying its insertIds (the supervisor asks every poll)."""
    if not cursor:
        return {}
    return json.loads(cursor) if isinstance(cursor, str) else cursor
