"""AWS plumbing for the SageMaker provider: sessions, clients, credentials, errors. (The training
image URIs are the SDK's: ``sdk.py``.)

Kept apart from ``provider.py`` so that the provider reads as SageMaker logic, and so that boto3
(about half a second to import) is imported only inside these functions: `launch --help` and
`launch plan` must not pay for it.

The rules that this module enforces for the AWS calls the launcher makes:

* **Endpoints come from the standard variables.** boto3 reads ``AWS_ENDPOINT_URL`` and
  ``AWS_ENDPOINT_URL_<SERVICE>`` itself; we also read them from the ``environ`` the CLI was given
  (tests and embedding callers pass their own), so the two cannot disagree.
* **Retries and timeouts are explicit.** botocore's ``standard`` (or ``adaptive``) retry mode
  retries throttling, 5xx and connection errors with jittered backoff; connect and read timeouts
  are bounded, so a dead endpoint fails instead of hanging the supervisor. Read-only status
  calls (describe, log reads: :meth:`Aws.read`) get short timeouts, two attempts and a hard
  deadline (``status_deadline_s``), so `launch status` against an endpoint that accepts the
  connection and never answers fails in seconds, not after six one-minute read timeouts.
* **Reads that a job's volume drives are paced.** The full-log reader of a chatty job would spend
  CloudWatch Logs' per-account read quota in throttled calls and botocore's backoff sleeps;
  :meth:`Aws.read` with a :class:`Pacer` makes one attempt within a client-side rate and backs
  off itself after a throttle, without sleeping in the caller.
* **Missing credentials fail fast.** The default credential chain ends with the EC2 instance
  metadata service; off EC2 that lookup can wait on an unroutable address. The chain is resolved
  with a one-second metadata timeout, one attempt, and an overall deadline, so `launch` says what
  to set within two seconds instead of hanging.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.status import ProviderError, UsageError

#: The credential chain gets this long, all of it, before "no AWS credentials found".
CREDENTIALS_DEADLINE_S = 1.5

NO_CREDENTIALS = "no AWS credentials found"
NO_CREDENTIALS_HINT = (
    "set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run `aws sso login`"
)

#: What AWS answers when a call passes the account's rate quota for its API.
THROTTLING_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "ProvisionedThroughputExceededException", "RequestLimitExceeded",
    "SlowDown",
})
#: Errors worth a describe-before-giving-up: the request may have reached the service.
TRANSIENT_CODES = THROTTLING_CODES | frozenset({
    "RequestTimeout", "RequestTimeoutException", "InternalFailure", "InternalServerError",
    "ServiceUnavailable", "InternalError",
})

#: us-east-1, us-gov-west-1, cn-north-1, us-isob-east-1, eusc-de-east-1: what may become part
#: of a host name (sagemaker.<region>.amazonaws.com), nothing else.
_REGION = re.compile(r"[a-z]{2,4}(?:-[a-z]+)+-[0-9]{1,2}")
REGION_SHAPE = ("lowercase words and a number joined by hyphens, like us-east-1, us-gov-west-1 "
                "or cn-north-1")
UNANSWERED_HINT = ("check the network, the region and any AWS_ENDPOINT_URL variables; "
                   "the job itself is not affected")
#: A read-only status call, retries included, ends within this many seconds by default.
STATUS_DEADLINE_S = 12.0
#: Attempts of a read-only status call (botocore counts the first).
STATUS_ATTEMPTS = 2


@dataclass(frozen=True)
class ClientSettings:
    """How every client is built: retry mode and attempts, and timeouts in seconds."""

    retry_mode: str = "standard"        # "standard" or "adaptive" (client-side rate limiting)
    max_attempts: int = 6               # botocore counts the first call as an attempt
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    #: The most one read-only status call (:meth:`Aws.read`) may take, its retries included.
    status_deadline_s: float = STATUS_DEADLINE_S

    def __post_init__(self) -> None:
        if self.retry_mode not in ("standard", "adaptive"):
            raise UsageError(f"unknown AWS retry mode {self.retry_mode!r}",
                             "use standard or adaptive")
        if self.max_attempts < 1:
            raise UsageError(f"AWS max attempts must be at least 1, not {self.max_attempts}")
        if not 0 < self.status_deadline_s <= 600:
            raise UsageError(f"the AWS status deadline must be between 0 and 600 seconds, not "
                             f"{self.status_deadline_s}")

    def for_status(self) -> ClientSettings:
        """The settings of the clients that read status: at most two attempts, each with a
        third of the deadline to connect and a third to read, so that botocore itself usually
        gives up before the deadline does (the deadline in :meth:`Aws.read` is the guarantee)."""
        share = self.status_deadline_s / 3
        return ClientSettings(retry_mode=self.retry_mode,
                              max_attempts=min(self.max_attempts, STATUS_ATTEMPTS),
                              connect_timeout_s=min(self.connect_timeout_s, share),
                              read_timeout_s=min(self.read_timeout_s, share),
                              status_deadline_s=self.status_deadline_s)


class Unanswered(ProviderError):
    """A read-only call that got no answer within its deadline. Transient: the caller may stand
    in the last answer it has, or report it (exit 6)."""


class Aws:
    """One boto3 session for one region, its clients, and a fast credentials check.

    Built lazily by the provider: nothing here runs for a dry run.
    """

    def __init__(self, region: str, environ: Mapping[str, str], settings: ClientSettings):
        try:
            import boto3
            import botocore.session
        except ImportError:
            from launcher.providers.sagemaker.sdk import INSTALL_HINT

            raise UsageError("the SageMaker provider needs the sagemaker extra (boto3)",
                             INSTALL_HINT) from None

        self.region = check_region(region)  # it becomes part of every endpoint's host name
        self.environ = dict(environ)
        self.settings = settings
        core = botocore.session.Session()
        # Where the injected environment names config files, use them (botocore would read
        # os.environ only).
        for variable, name in (("AWS_CONFIG_FILE", "config_file"),
                               ("AWS_SHARED_CREDENTIALS_FILE", "credentials_file")):
            if environ.get(variable):
                core.set_config_variable(name, environ[variable])
        # The instance metadata service: one attempt, one second (the smallest botocore
        # accepts: it converts the timeout to an int).
        core.set_config_variable("metadata_service_timeout", 1)
        core.set_config_variable("metadata_service_num_attempts", 1)
        if environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT"):
            core.set_config_variable("ec2_metadata_service_endpoint",
                                     environ["AWS_EC2_METADATA_SERVICE_ENDPOINT"])
        kwargs: dict[str, Any] = {"botocore_session": core, "region_name": region}
        if environ.get("AWS_ACCESS_KEY_ID") and environ.get("AWS_SECRET_ACCESS_KEY"):
            kwargs.update(aws_access_key_id=environ["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=environ["AWS_SECRET_ACCESS_KEY"],
                          aws_session_token=environ.get("AWS_SESSION_TOKEN") or None)
        elif environ.get("AWS_PROFILE"):
            kwargs["profile_name"] = environ["AWS_PROFILE"]
        try:
            self.session = boto3.Session(**kwargs)
        except Exception as exc:  # ProfileNotFound and friends
            raise ProviderError(f"AWS configuration: {exc}", NO_CREDENTIALS_HINT) from None
        self._clients: dict[str, Any] = {}
        self._pacers: dict[str, Pacer] = {}
        self._lock = threading.Lock()
        self._credentials_ok = False

    def client(self, service: str, status: bool = False, attempts: int | None = None) -> Any:
        """A cached client with the retry and timeout settings, at the endpoint configured for
        ``service`` in the environment (``AWS_ENDPOINT_URL_<SERVICE>`` / ``AWS_ENDPOINT_URL``).
        ``status``: the short-timeout client of read-only status calls (see :meth:`read`);
        ``attempts``: fewer attempts than the settings give (a paced reader backs off itself)."""
        key = f"{service}:status" if status else service
        if attempts is not None:
            key += f":{attempts}"
        with self._lock:
            if key not in self._clients:
                from botocore.config import Config

                settings = self.settings.for_status() if status else self.settings
                if attempts is not None:
                    settings = dataclasses.replace(
                        settings, max_attempts=max(1, min(attempts, settings.max_attempts)))
                config = Config(
                    # total_max_attempts counts the first call; botocore's "max_attempts" here
                    # would count only the retries (seven calls for 6).
                    retries={"mode": settings.retry_mode,
                             "total_max_attempts": settings.max_attempts},
                    connect_timeout=settings.connect_timeout_s,
                    read_timeout=settings.read_timeout_s,
                    tcp_keepalive=True,
                )
                endpoint = endpoint_url(service, self.environ)
                self._clients[key] = self.session.client(
                    service, region_name=self.region, config=config, endpoint_url=endpoint)
            return self._clients[key]

    def read(self, service: str, operation: str, *, pacer: Pacer | None = None,
             **kwargs: Any) -> Any:
        """A read-only status call (``read("sagemaker", "describe_training_job", ...)``): short
        timeouts, two attempts, and the whole call, retries included, within
        ``status_deadline_s``, else :class:`Unanswered`. The call runs in a daemon thread, so an
        endpoint that accepts the connection and never answers (or trickles) cannot hold
        `launch status` or the supervisor's poll past the deadline; the thread it leaves ends
        at its own read timeout. Uploads and creates keep the long timeouts of :meth:`client`.

        With a ``pacer`` (see :class:`Pacer`): :class:`Paced`, nothing sent, while the pacer
        has no call to spare; else one attempt, a throttling answer backing the pacer off and
        raised as is. Not botocore's retry there: its backoff sleeps in the caller, and the
        caller is a follower that has an event channel to read in the meantime."""
        if pacer is not None:
            wait = pacer.take()
            if wait > 0:
                raise Paced(wait)
        client = self.client(service, status=True, attempts=1 if pacer is not None else None)
        method: Callable[..., Any] = getattr(client, operation)
        try:
            result = call_within(self.settings.status_deadline_s,
                                 lambda: method(**kwargs), client.meta.endpoint_url)
        except Exception as exc:
            if pacer is not None and error_code(exc) in THROTTLING_CODES:
                pacer.throttled()
            raise
        if pacer is not None:
            pacer.succeeded()
        return result

    def pacer(self, name: str, rate_per_s: float) -> Pacer:
        """The pacer named ``name`` (``"logs:read"``: GetLogEvents and DescribeLogStreams),
        shared by every reader of this session: an account's read quota is per API, not per
        job or stream."""
        with self._lock:
            if name not in self._pacers:
                self._pacers[name] = Pacer(rate_per_s)
            return self._pacers[name]

    def check_credentials(self) -> None:
        """Raise ProviderError (exit 6) within ``CREDENTIALS_DEADLINE_S`` when the chain finds
        nothing. The lookup runs in a daemon thread: a metadata service that neither answers
        nor refuses cannot hold the launcher past the deadline."""
        if self._credentials_ok:
            return
        found: list[Any] = []
        failed: list[BaseException] = []

        def resolve() -> None:
            try:
                credentials = self.session.get_credentials()
                found.append(None if credentials is None else credentials.get_frozen_credentials())
            except Exception as exc:  # a broken profile, an SSO token that expired ...
                failed.append(exc)

        thread = threading.Thread(target=resolve, name="aws-credentials", daemon=True)
        thread.start()
        thread.join(CREDENTIALS_DEADLINE_S)
        if failed:
            raise ProviderError(f"AWS credentials: {_one_line(failed[0])}",
                                NO_CREDENTIALS_HINT) from None
        if not found or found[0] is None or not found[0].access_key:
            raise ProviderError(NO_CREDENTIALS, NO_CREDENTIALS_HINT)
        self._credentials_ok = True


class Paced(Exception):
    """Not an error: the pacer has no call to spare for ``wait_s`` seconds; nothing was sent."""

    def __init__(self, wait_s: float):
        super().__init__(f"paced: next call in {wait_s:.2f} s")
        self.wait_s = wait_s


class Pacer:
    """Client-side pacing of one API: at most ``rate_per_s`` calls a second on average (a token
    bucket holding ``burst`` calls), and after a throttling answer none until a backoff has
    passed, doubled on each throttle in a row (with jitter, at most ``max_backoff_s``) and
    cleared by the next success.

    CloudWatch Logs' read quotas are per account and region (GetLogEvents and
    DescribeLogStreams 25 calls a second, FilterLogEvents 5, by default); a job that writes
    faster than its follower may read would otherwise have the follower spend the quota in
    throttled calls. ``take`` never sleeps: it says how long to wait, so the caller decides
    whether to wait or to come back later."""

    def __init__(self, rate_per_s: float, burst: float | None = None,
                 max_backoff_s: float = 16.0, clock: Callable[[], float] | None = None):
        if rate_per_s <= 0:
            raise UsageError(f"a call rate must be positive, not {rate_per_s}")
        import time

        self.rate = float(rate_per_s)
        self.burst = max(1.0, float(burst if burst is not None else rate_per_s / 2))
        self.max_backoff_s = max_backoff_s
        self._clock = clock or time.monotonic
        self._tokens = self.burst
        self._at = self._clock()
        self._blocked_until = 0.0
        self._backoff = 0.0
        self._lock = threading.Lock()
        self.throttles = 0  # throttling answers seen (for the tests and the docs' numbers)

    def take(self) -> float:
        """0 and one call spent, or the seconds until one may be made (nothing spent)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if now < self._blocked_until:
                return self._blocked_until - now
            if self._tokens >= 1:
                self._tokens -= 1
                return 0.0
            return (1 - self._tokens) / self.rate

    def throttled(self) -> None:
        """The service said slow down: no call before the (doubled, jittered) backoff."""
        import random

        with self._lock:
            self.throttles += 1
            self._backoff = min(self.max_backoff_s,
                                max(1.0 / self.rate, self._backoff * 2 or 0.25))
            self._blocked_until = self._clock() + self._backoff * random.uniform(0.5, 1.0)
            self._tokens = 0.0

    def succeeded(self) -> None:
        with self._lock:
            self._backoff = 0.0


def call_within(deadline_s: float, fn: Callable[[], Any], where: str) -> Any:
    """``fn()``, or :class:`Unanswered` when it has not returned within ``deadline_s``."""
    done: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(fn())
        except BaseException as exc:  # handed to the caller's thread as is
            failed.append(exc)

    thread = threading.Thread(target=run, name="aws-status-call", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if failed:
        raise failed[0]
    if not done:
        raise Unanswered(f"{where} did not answer within {deadline_s:g} s", UNANSWERED_HINT)
    return done[0]


def endpoint_url(service: str, environ: Mapping[str, str]) -> str | None:
    """The endpoint the standard variables name for ``service`` (None: boto3's own choice).

    The service part of the variable is the client name upper-cased, dashes to underscores
    (``AWS_ENDPOINT_URL_SAGEMAKER``, ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL_LOGS``)."""
    specific = environ.get("AWS_ENDPOINT_URL_" + service.upper().replace("-", "_"))
    return specific or environ.get("AWS_ENDPOINT_URL") or None


def check_region(region: Any, source: str = "") -> str:
    """``region`` when it is shaped like an AWS region (else exit 2, naming it): a region becomes
    part of host names and ARNs."""
    from launcher.providers.base import checked_region

    return checked_region(region, _REGION, 32, "an AWS region name", REGION_SHAPE, source)


def resolve_region(explicit: str | None, environ: Mapping[str, str]) -> str:
    """--region, else AWS_REGION / AWS_DEFAULT_REGION, else the profile's region; checked."""
    for source, value in (("--region or LAUNCH_REGION", explicit),
                          ("AWS_REGION", environ.get("AWS_REGION")),
                          ("AWS_DEFAULT_REGION", environ.get("AWS_DEFAULT_REGION"))):
        if value:
            return check_region(value, source)
    try:
        import botocore.session

        core = botocore.session.Session(profile=environ.get("AWS_PROFILE") or None)
        if environ.get("AWS_CONFIG_FILE"):
            core.set_config_variable("config_file", environ["AWS_CONFIG_FILE"])
        region = core.get_config_variable("region")
    except Exception:
        region = None
    if not region:
        raise UsageError("no AWS region for SageMaker",
                         "pass --region us-east-1 (or set AWS_REGION / LAUNCH_REGION)")
    return check_region(region, "the AWS profile")


def error_code(exc: BaseException) -> str:
    """The service's error code of a botocore ClientError ("" for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        message = response.get("Error", {}).get("Message")
        if message:
            return str(message)
    return _one_line(exc)


def is_transient(exc: BaseException) -> bool:
    """Throttling, a 5xx, or the connection: what botocore already retried, and what may have
    happened after the request reached the service."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError, ReadTimeoutError

    if isinstance(exc, (BotoConnectionError, HTTPClientError, ReadTimeoutError, Unanswered)):
        return True
    if error_code(exc) in TRANSIENT_CODES:
        return True
    response = getattr(exc, "response", None)
    status = (response or {}).get("ResponseMetadata", {}).get("HTTPStatusCode") \
        if isinstance(response, dict) else None
    return isinstance(status, int) and status >= 500


def provider_error(exc: BaseException, doing: str) -> ProviderError:
    """One line for a failed AWS call: what we were doing, what AWS said, what to do."""
    from botocore.exceptions import (
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
        ReadTimeoutError,
    )

    if isinstance(exc, Unanswered):
        return ProviderError(f"{doing}: {exc.message}", exc.hint)
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return ProviderError(NO_CREDENTIALS, NO_CREDENTIALS_HINT)
    if isinstance(exc, NoRegionError):
        return ProviderError("no AWS region", "pass --region or set AWS_REGION")
    if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError)):
        from urllib.parse import urlsplit

        url = urlsplit(str(getattr(exc, "kwargs", {}).get("endpoint_url", "")))
        where = f"{url.scheme}://{url.netloc}" if url.netloc else "AWS"
        return ProviderError(f"{doing}: {where} did not answer", UNANSWERED_HINT)
    if isinstance(exc, EndpointConnectionError):
        where = getattr(exc, "kwargs", {}).get("endpoint_url", "AWS")
        return ProviderError(f"{doing}: cannot reach {where}",
                             "check the network, the region and any AWS_ENDPOINT_URL variables")
    code = error_code(exc)
    message = error_message(exc)
    if code in ("ExpiredToken", "ExpiredTokenException", "RequestExpired"):
        return ProviderError(f"{doing}: the AWS credentials have expired",
                             "refresh them (`aws sso login`, or new keys)")
    if code in ("UnrecognizedClientException", "InvalidClientTokenId", "InvalidAccessKeyId",
                "SignatureDoesNotMatch"):
        return ProviderError(f"{doing}: AWS does not accept these credentials ({message})",
                             NO_CREDENTIALS_HINT)
    if code in ("AccessDenied", "AccessDeniedException"):
        return ProviderError(f"{doing}: access denied ({message})",
                             "the identity needs sagemaker:*TrainingJob*, s3:GetObject/PutObject "
                             "on the bucket, logs:GetLogEvents/DescribeLogStreams/"
                             "FilterLogEvents and "
                             "iam:PassRole on the role")
    if code == "ResourceLimitExceeded":
        return ProviderError(f"{doing}: SageMaker quota reached ({message})",
                             "request more in Service Quotas (training job usage of the "
                             "instance type) or choose another --machine")
    if code in TRANSIENT_CODES:
        return ProviderError(f"{doing}: AWS kept answering {code} after retries ({message})",
                             "try again in a minute; aws_retry_mode = \"adaptive\" paces the calls")
    if code:
        return ProviderError(f"{doing}: {code}: {message}")
    return ProviderError(f"{doing}: {_one_line(exc)}")


def _one_line(exc: BaseException) -> str:
    """The exception's text on one line (botocore's parameter errors span several)."""
    text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    return (text or type(exc).__name__)[:500]
