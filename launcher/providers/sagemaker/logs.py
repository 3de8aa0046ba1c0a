"""Following a SageMaker job: its CloudWatch log streams and the event channel."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
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
    from launcher.failures import GPU_OOM, HOST_OOM, RULES

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


class SageMakerLogs:
    """The log-reading methods of the SageMaker provider (mixed into it)."""

    def logs(self, job_id: str, cursor: Any = None) -> tuple[list[str], dict[str, Any]]:
        """New lines of the job, each once, in time order: SageMaker's status changes
        (``[sagemaker] Training: ...``) and every host's output (``[algo-N] ...``). Once the job
        has ended and its streams are drained, its last status and its ``FailureReason`` come
        last (the templates write their out-of-memory report there too, so that line carries the
        ``{"launch": "oom"}`` event even when the log lost it)."""
        state = _Cursor.load(cursor)
        notes = self._notes.pop(job_id, [])  # launch's own lines (a re-uploaded package)
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
        return notes + lines, state.dump()

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
        from launcher.providers.sagemaker._aws import (
            THROTTLING_CODES,
            Paced,
            error_code,
            is_transient,
        )

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
        from launcher.providers.sagemaker._aws import error_code, is_transient

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

