"""Google Cloud plumbing for the Vertex AI provider: endpoints, credentials, retries, errors,
code staging to Cloud Storage and reading a job's entries from Cloud Logging.

Kept apart from ``vertex.py`` so that the provider reads as "what is sent and when", and this
module as "how one talks to Google Cloud and survives it". Every SDK import happens inside the
function that needs it: importing this module costs nothing, and `launch --help` stays instant.

Endpoints can be pointed elsewhere (tests run the real client libraries against servers on
127.0.0.1): ``http://host:port`` means the REST transport over plain HTTP, ``grpc://host:port``
gRPC over an insecure channel, both with anonymous credentials; a bare ``host[:port]`` is a
production-style endpoint (a private service connect address, say) used with real credentials.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from launcher.status import LaunchError, ProviderError, UsageError

if TYPE_CHECKING:
    from launcher.packaging import Selection

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
ADC_HINT = ("run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS "
            "to a service-account key file")

# -- endpoints and credentials -----------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where a client connects. ``kind``: default (Google's), rest (http://), grpc (grpc://), host
    (a bare host[:port], real credentials)."""

    kind: Literal["default", "rest", "grpc", "host"]
    address: str = ""  # the URL for rest, host:port for grpc and host

    @property
    def anonymous(self) -> bool:
        """Loopback test servers take no credentials (and the user may have none)."""
        return self.kind in ("rest", "grpc")


def parse_endpoint(value: str | None) -> Endpoint:
    if not value:
        return Endpoint("default")
    value = value.strip().rstrip("/")
    if value.startswith(("http://", "https://")):
        return Endpoint("rest", value)
    if value.startswith("grpc://"):
        return Endpoint("grpc", value.removeprefix("grpc://"))
    return Endpoint("host", value)


def load_credentials(environ: dict[str, str], anonymous: bool) -> Any:
    """Application-default credentials, or anonymous ones for loopback test endpoints.

    A key file named by ``GOOGLE_APPLICATION_CREDENTIALS`` in the launcher's environment (the
    one tests inject) that does not exist is named in the error, rather than reported as "no
    credentials".
    """
    if anonymous:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    key_file = environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if key_file and not Path(key_file).is_file():
        raise ProviderError(f"the key file {key_file} named by GOOGLE_APPLICATION_CREDENTIALS "
                            "does not exist", ADC_HINT)
    try:
        credentials, _ = google.auth.default(scopes=SCOPES)
    except DefaultCredentialsError as exc:
        raise ProviderError("no Google Cloud application-default credentials found "
                            f"({_first_line(str(exc))})", ADC_HINT) from None
    return credentials


def default_project(environ: dict[str, str]) -> str | None:
    """The project the environment names, the way gcloud and the client libraries find it."""
    for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GCLOUD_PROJECT"):
        if environ.get(name):
            return environ[name]
    try:
        import google.auth

        _credentials, project = google.auth.default(scopes=SCOPES)
    except Exception:  # no credentials, no project: the caller says what to pass instead
        return None
    return project


# -- retries and errors ------------------------------------------------------------------------


def retry_policy(*, reads: bool, initial: float, deadline: float) -> Any:
    """A ``google.api_core`` Retry for transient failures, with exponential backoff and jitter.

    Vertex AI's create, get and cancel have no default retry or timeout in the generated client,
    so every call gets one explicitly. Reads also retry on rate limiting (429 /
    RESOURCE_EXHAUSTED); a create does not, because there it usually means a quota ran out
    (GPUs in the region), which waiting two minutes does not fix.
    """
    import requests
    from google.api_core import exceptions as gexc
    from google.api_core.retry import Retry, if_exception_type

    transient: tuple[type[BaseException], ...] = (
        gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.InternalServerError,
        requests.exceptions.ConnectionError, requests.exceptions.Timeout,
    )
    if reads:
        transient += (gexc.TooManyRequests, gexc.ResourceExhausted)
    return Retry(predicate=if_exception_type(*transient), initial=initial,
                 maximum=max(initial, 10.0), multiplier=2.0, timeout=deadline)


def provider_error(exc: BaseException, doing: str) -> ProviderError:
    """One line for the user: what failed, Google's own words, and what to do about it."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    if isinstance(exc, gexc.RetryError):
        cause = exc.cause if exc.cause is not None else exc
        return ProviderError(f"{doing}: gave up retrying: {_message(cause)}",
                             "Google Cloud did not answer; check the network and "
                             "https://status.cloud.google.com, then run again")
    if isinstance(exc, (auth_exc.GoogleAuthError, gexc.Unauthenticated, gexc.Unauthorized)):
        return ProviderError(f"{doing}: the credentials were refused: {_message(exc)}", ADC_HINT)
    hints: list[tuple[type[BaseException] | tuple[type[BaseException], ...], str]] = [
        ((gexc.PermissionDenied, gexc.Forbidden),
         "the account needs Vertex AI User (roles/aiplatform.user) on the project, Storage Object "
         "Admin on the bucket, Logs Viewer to read logs, and the Vertex AI API enabled"),
        ((gexc.ResourceExhausted, gexc.TooManyRequests),
         "a quota ran out: see IAM & Admin > Quotas for the region (custom training GPUs are "
         "counted per region and per GPU type)"),
        (gexc.NotFound, "check --project and --region"),
        ((gexc.InvalidArgument, gexc.BadRequest),
         "Vertex AI refused the request as sent; `launch plan --provider vertex --json` shows it"),
    ]
    for kinds, hint in hints:
        if isinstance(exc, kinds):
            return ProviderError(f"{doing}: {_message(exc)}", hint)
    return ProviderError(f"{doing}: {_message(exc)}")


@contextlib.contextmanager
def translating(doing: str) -> Iterator[None]:
    """Turn what the Google client libraries raise into one ProviderError line (exit 6)."""
    import requests
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    try:
        yield
    except LaunchError:
        raise
    except (gexc.GoogleAPICallError, gexc.RetryError, auth_exc.GoogleAuthError) as exc:
        raise provider_error(exc, doing) from None
    except requests.exceptions.RequestException as exc:
        raise ProviderError(f"{doing}: {_message(exc)}",
                            "Google Cloud could not be reached; check the network") from None


def _message(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return _first_line(str(text))


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


# -- labels ------------------------------------------------------------------------------------


def label_value(text: str) -> str:
    """A Google Cloud label value: lowercase letters, digits, ``_`` and ``-``, at most 63
    characters. A value that had to be cut keeps a hash of the whole, so two long run ids never
    share a label (the label is how a retried create finds the job it may already have made)."""
    clean = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "-"
                    for c in text.lower())
    if len(clean) <= 63 and clean == text:
        return clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{clean[:54]}-{digest}" if len(clean) > 54 else f"{clean}-{digest}"


# -- staging code to Cloud Storage -------------------------------------------------------------

@dataclass(frozen=True)
class Member:
    """One file of an archive: its name in the archive, and where its bytes come from."""

    name: str
    sha256: str
    size: int
    executable: bool = False
    path: str | None = None   # a file on disk ...
    text: str | None = None   # ... or text rendered by the launcher


@dataclass(frozen=True)
class StagedArchive:
    """A gzipped tar in Cloud Storage, named by the hash of its content: staged at most once."""

    uri: str
    sha256: str
    members: tuple[Member, ...] = field(repr=False)
    source: str = ""  # what it holds, for a person reading the request

    @property
    def size(self) -> int:
        return sum(m.size for m in self.members)

    def to_dict(self) -> dict[str, Any]:
        return {"uri": self.uri, "sha256": self.sha256, "source": self.source,
                "files": len(self.members), "bytes": self.size}


def content_hash(members: Iterable[Member]) -> str:
    """The hash of names, modes and contents, not of the tar bytes: the same files always give
    the same name, whatever their timestamps or owners."""
    digest = hashlib.sha256()
    for m in sorted(members, key=lambda m: m.name):
        digest.update(f"{m.name}\0{'x' if m.executable else '-'}\0{m.sha256}\n".encode())
    return digest.hexdigest()


def code_members(selection: Selection, prefix: str) -> list[Member]:
    """The files :func:`launcher.packaging.select` chose, as archive members under ``prefix/``
    (what is uploaded is decided there, for both cloud providers)."""
    return [Member(name=f"{prefix}/{f.name}", sha256=f.sha256, size=f.size,
                   executable=f.executable, path=str(f.path)) for f in selection.files]


def text_members(files: dict[str, str]) -> list[Member]:
    members = []
    for name, text in sorted(files.items()):
        data = text.encode("utf-8")
        members.append(Member(name=name, sha256=hashlib.sha256(data).hexdigest(),
                              size=len(data), text=text))
    return members


def write_archive(archive: StagedArchive, out: Any) -> None:
    """Write the archive as a reproducible .tar.gz (no timestamps, owners or gzip mtime).

    A file that changed since the dry run hashed it is refused: the request names its content
    hash, and an archive under that name with other content would be a lie.
    """
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in sorted(archive.members, key=lambda m: m.name):
            data = m.text.encode("utf-8") if m.text is not None else Path(m.path or "").read_bytes()
            if hashlib.sha256(data).hexdigest() != m.sha256:
                raise UsageError(f"{m.path or m.name} changed while the job was being submitted",
                                 "run the launch again")
            info = tarfile.TarInfo(m.name)
            info.size, info.mtime, info.mode = len(data), 0, 0o755 if m.executable else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))


def split_gs_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("gs://"):
        raise ValueError(f"not a gs:// URI: {uri}")
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    return bucket, name


def stage(client: Any, archive: StagedArchive, timeout: float) -> bool:
    """Upload ``archive`` unless an object of that name (so of that content) is there already.

    Returns whether it uploaded. ``if_generation_match=0`` makes the upload a create-only write:
    two launches racing to stage the same code cannot overwrite each other, and the storage
    library retries such conditional uploads on transient errors by itself.
    """
    from google.api_core import exceptions as gexc

    bucket_name, name = split_gs_uri(archive.uri)
    blob = client.bucket(bucket_name).blob(name)
    if blob.exists(timeout=timeout):
        return False
    with tempfile.SpooledTemporaryFile(max_size=32 * 2**20) as handle:
        write_archive(archive, handle)
        handle.seek(0)
        try:
            blob.upload_from_file(handle, content_type="application/gzip", if_generation_match=0,
                                  timeout=timeout)
        except gexc.PreconditionFailed:
            return False  # someone staged the same content first
    return True


# -- Cloud Logging -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LogRecord:
    """One log entry, reduced to what following a job needs."""

    insert_id: str
    timestamp: datetime
    task: str  # the replica that printed it ("workerpool0-0"), "" for Vertex AI's own entries
    text: str


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def _task_of(labels: Any, resource_labels: Any) -> str:
    labels = dict(labels or {})
    task = labels.get("ml.googleapis.com/task_name") or dict(resource_labels or {}).get(
        "task_name", "")
    return "" if task == "service" else str(task)


def _text_of(payload: Any) -> str:
    if isinstance(payload, str):
        return payload
    if isinstance(payload, dict):
        message = payload.get("message")
        return message if isinstance(message, str) else json.dumps(payload, sort_keys=True)
    return "" if payload is None else str(payload)


class LogReader:
    """Reads ``entries.list`` through the GAPIC gRPC client (production, and ``grpc://`` test
    endpoints), or through ``google.cloud.logging.Client`` in REST mode (``http://`` endpoints).

    Both paths end in :class:`LogRecord`; the read as a whole is retried on transient errors,
    which is safe because the follower de-duplicates what it has seen.
    """

    def __init__(self, project: str, endpoint: Endpoint, credentials: Any, retry: Any,
                 timeout: float):
        self.project = project
        self.endpoint = endpoint
        self.credentials = credentials
        self.retry = retry
        self.timeout = timeout
        self._client: Any = None

    def read(self, filter_: str, limit: int, page_size: int = 1000) -> list[LogRecord]:
        def once() -> list[LogRecord]:
            records = []
            for record in self._entries(filter_, min(page_size, limit)):
                records.append(record)
                if len(records) >= limit:
                    break
            return records

        return self.retry(once)()

    def _entries(self, filter_: str, page_size: int) -> Iterator[LogRecord]:
        if self.endpoint.kind == "rest":
            yield from self._rest_entries(filter_, page_size)
        else:
            yield from self._gapic_entries(filter_, page_size)

    def _gapic_entries(self, filter_: str, page_size: int) -> Iterator[LogRecord]:
        from google.cloud.logging_v2.types import ListLogEntriesRequest, LogEntry
        from google.protobuf import json_format

        if self._client is None:
            from google.cloud.logging_v2.services.logging_service_v2 import (
                LoggingServiceV2Client,
            )

            if self.endpoint.kind == "grpc":
                import grpc
                from google.cloud.logging_v2.services.logging_service_v2.transports import (
                    LoggingServiceV2GrpcTransport,
                )

                channel = grpc.insecure_channel(self.endpoint.address)
                self._client = LoggingServiceV2Client(
                    transport=LoggingServiceV2GrpcTransport(channel=channel))
            else:
                options = {"api_endpoint": self.endpoint.address} if self.endpoint.address else {}
                self._client = LoggingServiceV2Client(credentials=self.credentials,
                                                      client_options=options or None)
        request = ListLogEntriesRequest(resource_names=[f"projects/{self.project}"],
                                        filter=filter_, order_by="timestamp asc",
                                        page_size=page_size)
        pager = self._client.list_log_entries(request=request, retry=None, timeout=self.timeout)
        for entry in pager:
            pb = LogEntry.pb(entry)
            which = pb.WhichOneof("payload")
            if which == "json_payload":
                payload: Any = json_format.MessageToDict(pb.json_payload)
            elif which == "proto_payload":
                payload = json_format.MessageToDict(pb.proto_payload)
            else:
                payload = pb.text_payload
            yield LogRecord(insert_id=entry.insert_id, timestamp=_utc(entry.timestamp),
                            task=_task_of(entry.labels, entry.resource.labels),
                            text=_text_of(payload))

    def _rest_entries(self, filter_: str, page_size: int) -> Iterator[LogRecord]:
        if self._client is None:
            import google.cloud.logging as cloud_logging

            self._client = cloud_logging.Client(
                project=self.project, credentials=self.credentials, _use_grpc=False,
                client_options={"api_endpoint": self.endpoint.address})
        from google.cloud.logging import ASCENDING

        for entry in self._client.list_entries(resource_names=[f"projects/{self.project}"],
                                               filter_=filter_, order_by=ASCENDING,
                                               page_size=page_size):
            resource = getattr(entry, "resource", None)
            yield LogRecord(insert_id=entry.insert_id or "", timestamp=_utc(entry.timestamp),
                            task=_task_of(entry.labels, getattr(resource, "labels", None)),
                            text=_text_of(entry.payload))


def _utc(moment: datetime | None) -> datetime:
    if moment is None:
        return datetime.now(UTC)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


@dataclass
class LogCursor:
    """Where a follower is in a job's log, as plain JSON (``launch logs`` may resume it later).

    ``since`` is the newest entry timestamp read; ``seen`` the insertIds read whose timestamp is
    within ``overlap`` of it. Each read starts ``overlap`` seconds before ``since``, so an entry
    that Cloud Logging makes visible after a newer one was already read (ingestion is not in
    timestamp order) is still found, and ``seen`` keeps the re-read ones from being repeated.
    An entry that turns up later than ``overlap`` behind the newest is missed: the window is the
    trade-off between that and re-reading entries on every poll.
    """

    since: str | None = None
    seen: dict[str, str] = field(default_factory=dict)  # insertId -> timestamp
    state: str | None = None      # the last job state shown as a progress line
    finished: bool = False        # the job's end (and its error) has been shown
    behind: bool = False          # the last read was cut at the limit: more to read at once

    @classmethod
    def load(cls, data: Any) -> LogCursor:
        if not data:
            return cls()
        if isinstance(data, str):
            data = json.loads(data)
        return cls(since=data.get("since"), seen=dict(data.get("seen") or {}),
                   state=data.get("state"), finished=bool(data.get("finished")),
                   behind=bool(data.get("behind")))

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "seen": dict(self.seen), "state": self.state,
                "finished": self.finished, "behind": self.behind}

    def lower_bound(self, start: datetime, overlap_s: float) -> datetime:
        """Where the next read starts: the overlap before the newest entry read, or ``start``
        (the job's creation) on the first read. Right after a read cut at the limit it starts at
        the newest entry itself, so a window holding more than the limit cannot stall it."""
        if self.since is None:
            return start
        newest = parse_rfc3339(self.since)
        return newest if self.behind else newest - timedelta(seconds=overlap_s)

    def accept(self, records: list[LogRecord], overlap_s: float, cut: bool) -> list[LogRecord]:
        """The records not seen before, in the order read; the cursor moves past all of them."""
        fresh = [r for r in records if r.insert_id not in self.seen]
        for record in fresh:
            self.seen[record.insert_id] = rfc3339(record.timestamp)
        if records:
            newest = max(r.timestamp for r in records)
            if self.since is None or newest > parse_rfc3339(self.since):
                self.since = rfc3339(newest)
        if self.since is not None:
            keep_from = parse_rfc3339(self.since) - timedelta(seconds=overlap_s)
            self.seen = {i: t for i, t in self.seen.items() if parse_rfc3339(t) >= keep_from}
        self.behind = cut
        return fresh


def record_lines(record: LogRecord) -> list[str]:
    """The lines of one entry, each prefixed by the replica that printed it.

    ``workerpool1-0: [rank9]:...`` reads as host then rank to ``launcher.failures`` (the same
    shape as a pdsh line), so a failure is pinned to its rank; Vertex AI's own entries get
    ``[vertex]``. One entry may hold several lines (a traceback logged at once).
    """
    prefix = f"{record.task}: " if record.task else "[vertex] "
    text = record.text.rstrip("\n")
    return [prefix + line.rstrip("\r") for line in text.split("\n")] if text else []


def call_with(retry: Any, fn: Callable[[], Any]) -> Any:
    """``fn()`` under ``retry`` (a google.api_core Retry)."""
    return retry(fn)()
