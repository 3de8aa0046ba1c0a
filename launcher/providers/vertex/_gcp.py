"""Google Cloud plumbing for the Vertex AI provider: endpoints, credentials, retries, errors,
code staging to Cloud Storage and reading a job's entries from Cloud Logging.

Kept apart from ``provider.py`` so that the provider reads as "what is sent and when", and this
module as "how one talks to Google Cloud and survives it". Over 600 lines on purpose: every part
(endpoints, credentials, retry policy, error translation, staging archives, the read quota and
backoff, the log reader and its cursor) is a small piece of that one job, each used by the
others; split, they would import each other in a circle. Every SDK import happens inside the
function that needs it: importing this module costs nothing, and `launch --help` stays instant.

Endpoints can be pointed elsewhere (tests run the real client libraries against servers on
127.0.0.1): ``http://host:port`` means the REST transport over plain HTTP, ``grpc://host:port``
gRPC over an insecure channel, both with anonymous credentials; a bare ``host[:port]`` is a
production-style endpoint (a private service connect address, say) used with real credentials.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import io
import json
import secrets
import tarfile
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
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


def transient_errors(*, reads: bool) -> tuple[type[BaseException], ...]:
    """What is worth trying again: an unavailable or overloaded service, a dropped connection;
    for reads also rate limiting (429 / RESOURCE_EXHAUSTED). A create is not retried on the
    latter, because there it usually means a quota ran out (GPUs in the region), which waiting
    two minutes does not fix. One list for the blocking retries and the followers' backoff."""
    import requests
    from google.api_core import exceptions as gexc

    transient: tuple[type[BaseException], ...] = (
        gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.InternalServerError,
        requests.exceptions.ConnectionError, requests.exceptions.Timeout,
    )
    if reads:
        transient += (gexc.TooManyRequests, gexc.ResourceExhausted)
    return transient


def retry_policy(*, reads: bool, initial: float, deadline: float) -> Any:
    """A ``google.api_core`` Retry for transient failures, with exponential backoff and jitter.

    Vertex AI's create, get and cancel have no default retry or timeout in the generated client,
    so every call gets one explicitly (:func:`transient_errors` says which failures).
    """
    from google.api_core.retry import Retry, if_exception_type

    return Retry(predicate=if_exception_type(*transient_errors(reads=reads)), initial=initial,
                 maximum=max(initial, 10.0), multiplier=2.0, timeout=deadline)


class Backoff:
    """``google.api_core``'s truncated exponential backoff, spread over a follower's polls
    instead of slept in one call: the supervisor reads the event channel before the log each
    poll, so a log read that hit RESOURCE_EXHAUSTED must not hold the next event read back.

    ``failed`` takes what a read raised: a transient error (:func:`transient_errors`) sets when
    the next try may go; anything else is raised again, as is a transient error that has gone on
    for ``deadline`` seconds (as a RetryError, like the blocking retry). Rate limiting is waited
    out however long it lasts (at most ``maximum`` between tries): another reader of the
    project's logs using up the quota is no reason to stop following a job.
    """

    def __init__(self, initial: float, deadline: float, maximum: float = 60.0):
        self.initial = max(initial, 0.001)
        self.deadline = deadline
        self.maximum = max(maximum, self.initial)
        self._delays: Iterator[float] | None = None
        self._since: float | None = None
        self._next = 0.0
        self.failures = 0

    def wait_s(self, now: float | None = None) -> float:
        """Seconds until the next try may go (0: now)."""
        return max(0.0, self._next - (time.monotonic() if now is None else now))

    def failed(self, exc: BaseException) -> None:
        from google.api_core import exceptions as gexc
        from google.api_core.retry import exponential_sleep_generator

        if not isinstance(exc, transient_errors(reads=True)):
            raise exc
        now = time.monotonic()
        if self._delays is None or self._since is None:
            self._delays = exponential_sleep_generator(self.initial, self.maximum)
            self._since = now
        limited = isinstance(exc, (gexc.TooManyRequests, gexc.ResourceExhausted))
        if not limited and now - self._since > self.deadline:
            raise gexc.RetryError(f"gave up after {now - self._since:.0f} s of {exc}",
                                  exc) from exc
        self.failures += 1
        # Full jitter as api-core draws it, but never less than half the first delay: a refused
        # read tried again a millisecond later is refused again.
        self._next = now + max(self.initial / 2, next(self._delays))

    def succeeded(self) -> None:
        self._delays, self._since, self._next = None, None, 0.0


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
    #: The name it was staged under instead of ``uri``, an object launch did not write holding
    #: that one (see :func:`stage`); "" when staged at its own name.
    instead_of: str = ""

    @property
    def size(self) -> int:
        return sum(m.size for m in self.members)

    def to_dict(self) -> dict[str, Any]:
        data = {"uri": self.uri, "sha256": self.sha256, "source": self.source,
                "files": len(self.members), "bytes": self.size}
        if self.instead_of:
            data["instead_of"] = self.instead_of
        return data


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


def md5_base64(handle: Any) -> tuple[str, int]:
    """The MD5 of a file's bytes as Cloud Storage gives it (``md5Hash``: base64), and its size."""
    digest = hashlib.md5()  # noqa: S324 (Cloud Storage's own hash, not a security choice)
    size = 0
    handle.seek(0)
    while chunk := handle.read(2**20):
        digest.update(chunk)
        size += len(chunk)
    handle.seek(0)
    return base64.b64encode(digest.digest()).decode("ascii"), size


def stage(client: Any, archive: StagedArchive, timeout: float) -> StagedArchive:
    """Put ``archive`` in the bucket unless an object holding its very bytes is there; return it
    as staged: at its own name, or at a fresh one (``instead_of`` says which it replaces).

    The name carries the hash of the archive's files, but whoever can write the bucket (every job
    of the project can) can put other bytes under it, and every job staging that code would then
    fail the bootstrap's check. So an object is reused only when Cloud Storage's own hash of the
    bytes it holds (``md5Hash``, which it computes on upload: a writer cannot set it) and its size
    are those of the archive written here. Every object launch writes has an ``md5Hash``; a
    composite one has none and is never reused (its ``crc32c`` alone is no proof: CRCs are easy
    to forge). Otherwise the archive goes to ``<name>/<random>-<hash>.tar.gz`` (the bootstrap reads
    the hash at the end of the name): a name nobody can have taken before. Every upload is
    create-only (``if_generation_match=0``), so an object launch did not write is never
    overwritten, and two launches racing to stage the same code cannot overwrite each other.
    """
    from google.api_core import exceptions as gexc

    bucket_name, name = split_gs_uri(archive.uri)
    bucket = client.bucket(bucket_name)
    with tempfile.SpooledTemporaryFile(max_size=32 * 2**20) as handle:
        write_archive(archive, handle)
        md5, size = md5_base64(handle)

        def holds_it(blob: Any) -> bool:
            return blob.md5_hash == md5 and blob.size == size

        def create(blob: Any) -> bool:
            handle.seek(0)
            try:
                blob.upload_from_file(handle, content_type="application/gzip",
                                      if_generation_match=0, timeout=timeout)
            except gexc.PreconditionFailed:
                return False  # someone created it first
            return True

        for _ in range(3):  # absent: create it; created meanwhile by someone: look at it
            existing = bucket.get_blob(name, timeout=timeout)
            if existing is not None:
                break
            if create(bucket.blob(name)):
                return archive
        if existing is not None and holds_it(existing):
            return archive
        stem = name.removesuffix(".tar.gz")
        for _ in range(3):  # a taken name of 64 random bits was guessed: draw again
            fresh = f"{stem}/{secrets.token_hex(8)}-{archive.sha256[:32]}.tar.gz"
            if create(bucket.blob(fresh)):
                return replace(archive, uri=f"gs://{bucket_name}/{fresh}",
                               instead_of=archive.uri)
    raise ProviderError(f"could not stage {archive.uri}: every name tried was taken",
                        "someone is writing objects under staging/ in the bucket as fast as "
                        "launch: check who can write to it")


# -- Cloud Logging -----------------------------------------------------------------------------

#: Cloud Logging refuses a query longer than this (the Logging query language's limit).
FILTER_MAX_CHARS = 20_000
#: entries.list answers at most this many entries a request (a larger pageSize is refused).
MAX_PAGE_SIZE = 1000
#: Cloud Logging's default read quota: entries.list requests per minute per project, shared by
#: everyone reading logs in it (the console, gcloud, another launcher).
READS_PER_MINUTE = 60.0
#: The quota's window is a minute; the launcher counts a second more, so that a request sent at
#: the edge of the window is never counted by Google in the minute before.
QUOTA_MARGIN_S = 1.0


@dataclass(frozen=True)
class LogRecord:
    """One log entry, reduced to what following a job needs."""

    insert_id: str
    timestamp: datetime
    task: str  # the replica that printed it ("workerpool0-0"), "" for Vertex AI's own entries
    text: str


def rfc3339(moment: datetime) -> str:
    """A fixed-width UTC timestamp (microseconds, ``Z``): such strings sort as their moments do,
    which lets a cursor compare them without parsing."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def quote(value: str) -> str:
    r"""``value`` as a Logging query language string: in double quotes, with ``\`` and ``"``
    escaped by a backslash. A control character (a tab) is refused rather than guessed at."""
    if any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise ValueError(f"{value!r} holds a control character")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def has_any(fields: Iterable[str], needles: Iterable[str]) -> str:
    """A parenthesised query matching an entry whose ``fields`` contain any of ``needles``:
    ``(textPayload:"a" OR jsonPayload.message:"a" OR ...)``. The ``:`` operator is a substring
    test and, like all string comparisons of the query language, ignores case."""
    fields = list(fields)
    terms = [f"{name}:{quote(needle)}" for needle in needles for name in fields]
    if not terms:
        raise ValueError("no needles")
    return "(" + " OR ".join(terms) + ")"


class ReadQuota:
    """The entries.list requests this process sends in one project, kept under Cloud Logging's
    read quota (``per_minute`` requests in any minute, by default 60).

    Two channels share it. ``events``, a job's filtered event channel, is read first and
    at most every ``events_every_s`` seconds per job (never more than half the quota); the
    full stream (``log``) gets the rest, spread evenly (``60 / (per_minute - events' share)``
    seconds apart) rather than in a burst that would leave it nothing for the rest of the
    minute. An event channel that has not been read for three of its intervals (its job ended)
    gives its share back. Over all, no more than ``per_minute`` requests go in any
    ``60 + QUOTA_MARGIN_S`` seconds, so the quota is not exceeded by this process alone; when
    others use it up, the answer is RESOURCE_EXHAUSTED and :class:`Backoff` waits.
    """

    def __init__(self, per_minute: float = READS_PER_MINUTE, events_every_s: float = 2.0,
                 window_s: float = 60.0):
        self.per_minute = max(2, int(per_minute))
        self.events_every_s = max(events_every_s, 120.0 / self.per_minute)
        self.window_s = window_s + QUOTA_MARGIN_S
        self._sent: deque[float] = deque()
        self._log_last = float("-inf")
        self._events: dict[str, float] = {}  # job -> when its event channel was last read
        self._lock = threading.Lock()

    def _log_share(self, now: float) -> float:
        """Requests a minute the full stream may send now (under the lock)."""
        active = sum(1 for t in self._events.values() if now - t < 3 * self.events_every_s)
        reserve = min(self.per_minute / 2, active * 60.0 / self.events_every_s)
        return self.per_minute - reserve

    def wait_s(self, channel: str, job: str = "", now: float | None = None) -> float:
        """Seconds until a request of ``channel`` (``events`` for ``job``, or ``log``) may go."""
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._sent and self._sent[0] <= now - self.window_s:
                self._sent.popleft()
            wait = 0.0
            over = len(self._sent) - self.per_minute
            if over >= 0:  # full: wait until enough of the window's requests have left it
                wait = self._sent[over] + self.window_s - now
            if channel == "events":
                last = self._events.get(job, float("-inf"))
                wait = max(wait, last + self.events_every_s - now)
            else:
                wait = max(wait, self._log_last + 60.0 / self._log_share(now) - now)
            return max(0.0, wait)

    def spend(self, channel: str, job: str = "") -> None:
        """Count a request that is being sent."""
        now = time.monotonic()
        with self._lock:
            self._sent.append(now)
            if channel == "events":
                self._events[job] = now
            else:
                self._log_last = now

    def acquire(self, channel: str, job: str = "") -> None:
        """Wait for the channel's turn, then count the request (a reader that may block: after
        the job's end, or for ``launch logs``)."""
        while (wait := self.wait_s(channel, job)) > 0:
            time.sleep(min(wait, 1.0))
        self.spend(channel, job)

    def forget(self, job: str) -> None:
        """The job's event channel is closed: its share goes back to the stream at once."""
        with self._lock:
            self._events.pop(job, None)


_QUOTAS: dict[tuple[Any, ...], ReadQuota] = {}
_QUOTAS_LOCK = threading.Lock()


def read_quota(project: str, endpoint: Endpoint, per_minute: float, events_every_s: float
               ) -> ReadQuota:
    """The process's one :class:`ReadQuota` for a project (at an endpoint): every provider object
    reading that project's logs in this process shares it, as they share Google's quota."""
    key = (project, endpoint.kind, endpoint.address, per_minute, events_every_s)
    with _QUOTAS_LOCK:
        quota = _QUOTAS.get(key)
        if quota is None:
            quota = _QUOTAS[key] = ReadQuota(per_minute, events_every_s)
        return quota


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
    endpoints), or through ``google.cloud.logging.Client``'s REST connection (``http://``
    endpoints), one request (one page) at a time.

    One page a call, and not the libraries' iterators, because every request counts against the
    project's read quota: an iterator fetches the next page by itself, also after a short page
    that Cloud Logging ends with a ``nextPageToken`` ("more may match"). Both paths end in
    :class:`LogRecord`; a try is safe to repeat because the cursor de-duplicates by insertId.
    """

    def __init__(self, project: str, endpoint: Endpoint, credentials: Any, retry: Any,
                 timeout: float):
        self.project = project
        self.endpoint = endpoint
        self.credentials = credentials
        self.retry = retry
        self.timeout = timeout
        self._client: Any = None

    def page(self, filter_: str, page_size: int = MAX_PAGE_SIZE, *,
             before: Callable[[], None] | None = None, retry: Any = None
             ) -> tuple[list[LogRecord], bool]:
        """The first page of entries matching ``filter_``, oldest first, and whether more match
        (a full page, or a ``nextPageToken``). ``before`` runs before each request (the quota's
        count, or its wait); ``retry`` (a google.api_core Retry) repeats failed tries, each a
        request of its own."""
        if len(filter_) > FILTER_MAX_CHARS:
            raise ValueError(f"a Cloud Logging query of {len(filter_)} characters is longer "
                             f"than the {FILTER_MAX_CHARS} allowed")
        page_size = min(page_size, MAX_PAGE_SIZE)

        def once() -> tuple[list[LogRecord], bool]:
            if before is not None:
                before()
            response = (self._rest_page(filter_, page_size) if self.endpoint.kind == "rest"
                        else self._gapic_page(filter_, page_size))
            records = _records(response)
            return records, bool(response.next_page_token) or len(records) >= page_size

        return retry(once)() if retry is not None else once()

    def read(self, filter_: str, limit: int, page_size: int = MAX_PAGE_SIZE) -> list[LogRecord]:
        """At most ``limit`` entries matching ``filter_`` (up to a page: one request), retried
        on transient errors (``launch doctor``'s check that Cloud Logging answers)."""
        records, _more = self.page(filter_, min(limit, page_size), retry=self.retry)
        return records[:limit]

    def _gapic_page(self, filter_: str, page_size: int) -> Any:
        from google.cloud.logging_v2.types import ListLogEntriesRequest, ListLogEntriesResponse

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
        # The pager holds the first response; asking it for more would send a request.
        return ListLogEntriesResponse.pb(next(iter(pager.pages)))

    def _rest_page(self, filter_: str, page_size: int) -> Any:
        from google.cloud.logging_v2.types import ListLogEntriesResponse
        from google.protobuf import json_format

        if self._client is None:
            import google.cloud.logging as cloud_logging

            self._client = cloud_logging.Client(
                project=self.project, credentials=self.credentials, _use_grpc=False,
                client_options={"api_endpoint": self.endpoint.address})
        # The client's authorised JSON connection, as its own list_entries uses it, for one
        # request (its list_entries is a generator that hides the page token).
        body = {"resourceNames": [f"projects/{self.project}"], "filter": filter_,
                "orderBy": "timestamp asc", "pageSize": page_size}
        data = self._client._connection.api_request(method="POST", path="/entries:list",
                                                    data=body, timeout=self.timeout)
        response = ListLogEntriesResponse.pb()()
        json_format.ParseDict(data or {}, response, ignore_unknown_fields=True)
        return response


def _records(response: Any) -> list[LogRecord]:
    """A ListLogEntriesResponse (the protobuf message) as LogRecords."""
    from google.protobuf import json_format

    records = []
    for pb in response.entries:
        which = pb.WhichOneof("payload")
        if which == "json_payload":
            payload: Any = json_format.MessageToDict(pb.json_payload)
        elif which == "proto_payload":
            payload = json_format.MessageToDict(pb.proto_payload)
        else:
            payload = pb.text_payload
        moment = (pb.timestamp.ToDatetime(tzinfo=UTC) if pb.HasField("timestamp")
                  else datetime.now(UTC))
        records.append(LogRecord(insert_id=pb.insert_id, timestamp=moment,
                                 task=_task_of(pb.labels, pb.resource.labels),
                                 text=_text_of(payload)))
    return records


@dataclass
class LogCursor:
    """Where a follower is in a job's log (or its event channel), as plain JSON (``launch logs``
    may resume it later).

    ``since`` is the newest entry timestamp read; ``seen`` the insertIds read whose timestamp is
    within ``overlap`` of it. Each read starts ``overlap`` seconds before ``since``, so an entry
    that Cloud Logging makes visible after a newer one was already read (ingestion is not in
    timestamp order) is still found, and ``seen`` keeps the re-read ones from being repeated.
    An entry that turns up later than ``overlap`` behind the newest is missed: the window is the
    trade-off between that and re-reading entries on every poll. ``scanned`` (the event channel
    only, whose matches may be minutes apart) is this machine's time when the last read that
    found everything was sent: the next read need not start before it either.
    """

    since: str | None = None
    seen: dict[str, str] = field(default_factory=dict)  # insertId -> timestamp
    state: str | None = None      # the last job state shown as a progress line
    finished: bool = False        # the job's end (and its error) has been shown
    behind: bool = False          # the last read was a full page: more to read at once
    scanned: str | None = None    # when the last complete read was sent (rfc3339)

    @classmethod
    def load(cls, data: Any) -> LogCursor:
        if not data:
            return cls()
        if isinstance(data, str):
            data = json.loads(data)
        return cls(since=data.get("since"), seen=dict(data.get("seen") or {}),
                   state=data.get("state"), finished=bool(data.get("finished")),
                   behind=bool(data.get("behind")), scanned=data.get("scanned"))

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "seen": dict(self.seen), "state": self.state,
                "finished": self.finished, "behind": self.behind, "scanned": self.scanned}

    def lower_bound(self, start: datetime, overlap_s: float) -> datetime:
        """Where the next read starts: the overlap before the newest entry read (or the last
        complete read), or ``start`` (the job's creation) on the first read. Right after a full
        page it starts at the newest entry itself, so a window holding more than a page cannot
        stall it."""
        marks = [parse_rfc3339(m) for m in (self.since, self.scanned) if m]
        if not marks:
            return start
        if self.behind and self.since is not None:
            return parse_rfc3339(self.since)
        return max(max(marks) - timedelta(seconds=overlap_s), start)

    def accept(self, records: list[LogRecord], overlap_s: float, cut: bool,
               sent_at: datetime | None = None) -> list[LogRecord]:
        """The records not seen before, in the order read; the cursor moves past all of them.
        ``sent_at``: when the read was sent, recorded as ``scanned`` if it found everything."""
        fresh = [r for r in records if r.insert_id not in self.seen]
        for record in fresh:
            self.seen[record.insert_id] = rfc3339(record.timestamp)
        if records:
            newest = rfc3339(max(r.timestamp for r in records))
            if self.since is None or newest > self.since:
                self.since = newest
        if self.since is not None:  # fixed-width timestamps: compared as strings
            keep_from = rfc3339(parse_rfc3339(self.since) - timedelta(seconds=overlap_s))
            self.seen = {i: t for i, t in self.seen.items() if t >= keep_from}
        self.behind = cut
        if sent_at is not None and not cut:
            self.scanned = rfc3339(sent_at)
        return fresh

    def lag_s(self, now: datetime | None = None) -> float | None:
        """Seconds between now and the newest entry read, while more is waiting (the last read
        was a full page); None once a read found the end."""
        if not self.behind or self.since is None:
            return None
        return max(0.0, ((now or datetime.now(UTC)) - parse_rfc3339(self.since)).total_seconds())


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
