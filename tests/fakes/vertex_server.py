"""A fake of Vertex AI's JobService and Cloud Logging's LoggingServiceV2, on 127.0.0.1.

There is no emulator for either, so this serves both APIs at the wire level, over gRPC (generic
handlers: ``/google.cloud.aiplatform.v1.JobService/CreateCustomJob`` ...) and over REST (the
``/v1/...customJobs`` and ``/v2/entries:list`` routes the REST transports call), with the client
libraries' own message types for every request and response. The real ``JobServiceClient`` and
the logging clients talk to it exactly as they would to Google: only the endpoint differs.

What each created job does is scripted per test: a list of steps (:func:`state`, :func:`log`,
:func:`wait_read`, :func:`wait_cancel`, :func:`finish`, :func:`execute` ...) run on a thread.
:func:`execute` runs the job for real: every replica of every worker pool runs the pool's own
container command (without the container) with the environment Vertex AI gives it
(``CLUSTER_SPEC``, ``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE``, ``AIP_*``), the staged code comes
from the storage emulator, ``/gcs/`` paths in the environment point at a local folder that stands
in for Cloud Storage FUSE (shared by all jobs of the fake, as a bucket is), and every line the
replicas print becomes a log entry.

Faults are injected per method (:meth:`FakeVertex.fail_next`): before the call takes effect, or
after it (the response is lost: a create that made the job and still answered UNAVAILABLE).

Cloud Logging's side is held to what Google enforces: a read quota on entries.list (by default 60
requests in any minute, answered RESOURCE_EXHAUSTED / HTTP 429 beyond it, as Google does), pages
of at most 1000 entries, and the part of the Logging query language the launcher sends, parsed
for real (comparisons, ``:`` substring tests on the payload, AND, OR, NOT, parentheses, quoted
strings with backslash escapes): anything else is INVALID_ARGUMENT, never "matches everything".
:func:`flood` makes a chatty job: many replicas writing thousands of lines a second, one rank
running out of memory at a given moment, the rest hanging until the job is cancelled.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import grpc
from google.cloud.aiplatform_v1.types import CustomJob, JobState
from google.cloud.aiplatform_v1.types import job_service as js
from google.cloud.logging_v2.types import ListLogEntriesRequest, ListLogEntriesResponse, LogEntry
from google.protobuf import empty_pb2, json_format

JOB_SERVICE = "google.cloud.aiplatform.v1.JobService"
LOGGING_SERVICE = "google.logging.v2.LoggingServiceV2"
TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "NOT_FOUND": 404, "ALREADY_EXISTS": 409,
    "RESOURCE_EXHAUSTED": 429, "INTERNAL": 500, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504,
}
LABEL = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
#: Cloud Logging's default read quota: entries.list requests per minute and project.
READ_QUOTA = 60
_ENTRY_PB = LogEntry.pb()


class FakeError(Exception):
    """An RPC error: a gRPC status code name and a message."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Call:
    method: str
    transport: str  # grpc | rest
    request: Any
    at: float = field(default_factory=time.monotonic)
    answered: int | None = None  # ListLogEntries: how many entries the answer held


@dataclass
class Fault:
    method: str
    code: str
    after: bool  # True: the call takes effect, then the answer is lost
    message: str = "the service is unavailable (injected)"


@dataclass
class FakeJob:
    job: CustomJob
    cancel: threading.Event = field(default_factory=threading.Event)
    script: list[Callable[[FakeVertex, FakeJob], None]] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)
    cancelled_at: float | None = None

    @property
    def number(self) -> str:
        return self.job.name.rsplit("/", 1)[-1]

    @property
    def state(self) -> str:
        return self.job.state.name


# -- the scripted steps --------------------------------------------------------------------------


def state(name: str, delay: float = 0.0) -> Callable[[FakeVertex, FakeJob], None]:
    """Move the job to ``name`` (a JobState name) after ``delay`` seconds."""
    def step(fake: FakeVertex, job: FakeJob) -> None:
        _pause(job, delay)
        fake.set_state(job, name)
    return step


def log(task: str | None, text: str, *, backdate_s: float = 0.0, insert_id: str | None = None,
        as_json: bool = False, delay: float = 0.0) -> Callable[[FakeVertex, FakeJob], None]:
    """One log entry from replica ``task`` (None: Vertex AI's own service entry), timestamped
    ``backdate_s`` seconds in the past (a late-arriving entry)."""
    def step(fake: FakeVertex, job: FakeJob) -> None:
        _pause(job, delay)
        fake.add_entry(job, task, text, backdate_s=backdate_s, insert_id=insert_id,
                       as_json=as_json)
    return step


def sleep(seconds: float) -> Callable[[FakeVertex, FakeJob], None]:
    def step(fake: FakeVertex, job: FakeJob) -> None:
        _pause(job, seconds)
    return step


def wait_read(insert_id: str, timeout: float = 20.0) -> Callable[[FakeVertex, FakeJob], None]:
    """Hold the script until a ListLogEntries answer has carried entry ``insert_id``."""
    def step(fake: FakeVertex, job: FakeJob) -> None:
        deadline = time.monotonic() + timeout
        while insert_id not in fake.served and time.monotonic() < deadline:
            if job.cancel.wait(0.01):
                return
    return step


def wait_cancel(timeout: float, message: str) -> Callable[[FakeVertex, FakeJob], None]:
    """The job hangs (the other ranks wait on a collective) until it is cancelled; if nobody
    cancels it within ``timeout``, it fails with ``message`` (an NCCL timeout, say)."""
    def step(fake: FakeVertex, job: FakeJob) -> None:
        if not job.cancel.wait(timeout):
            fake.finish(job, "JOB_STATE_FAILED", message)
    return step


def finish(name: str, error: str = "", delay: float = 0.0) -> Callable[[FakeVertex, FakeJob], None]:
    """End the job in state ``name`` with ``error`` as its error.message."""
    def step(fake: FakeVertex, job: FakeJob) -> None:
        _pause(job, delay)
        fake.finish(job, name, error)
    return step


def execute() -> Callable[[FakeVertex, FakeJob], None]:
    """Run every replica's container command for real (see the module docstring)."""
    def step(fake: FakeVertex, job: FakeJob) -> None:
        fake.execute(job)
    return step


def flood(lines_per_s: float, ranks: int, *, oom_at_s: float | None, oom_rank: int = 0,
          plain: bool = False, hang_s: float = 60.0) -> Callable[[FakeVertex, FakeJob], None]:
    """A chatty job: its replicas write ``lines_per_s`` lines a second in all, each line from one
    of ``ranks`` ranks spread evenly over the job's replicas (prefixed ``[rankN]:`` as torchrun's
    ``--tee`` does), every line different. At ``oom_at_s`` seconds rank ``oom_rank`` runs out of
    memory: its traceback, the allocator's message (entry ``oom-message``) and, unless
    ``plain`` (a script without the templates), the templates' ``{"launch": "oom"}`` line (entry
    ``oom``); ``fake.written`` has when each was written. Then every replica hangs (the others
    wait on a collective with the dead rank) until the job is cancelled, or fails after
    ``hang_s`` with an NCCL timeout. ``oom_at_s=None``: no OOM, lines until cancelled or
    ``hang_s`` has passed."""
    def step(fake: FakeVertex, job: FakeJob) -> None:
        tasks = [f"workerpool{p}-{i}" for p, pool in enumerate(job.job.job_spec.worker_pool_specs)
                 for i in range(pool.replica_count)]
        if ranks % len(tasks):
            raise ValueError(f"{ranks} ranks do not spread evenly over {len(tasks)} replicas")
        per_task = ranks // len(tasks)
        start = time.monotonic()
        end = start + (oom_at_s if oom_at_s is not None else hang_s)
        written = 0
        while not job.cancel.is_set():
            now = time.monotonic()
            due = int((min(now, end) - start) * lines_per_s)
            batch = []
            for i in range(written, due):
                rank = i % ranks
                batch.append((tasks[rank // per_task],
                              f"[rank{rank}]:step {i // ranks} micro-batch {i % 7} loss "
                              f"2.{i % 9973:04d} tokens/s 51234.5 line {i}"))
            fake.add_entries(job, batch)
            written = due
            if now >= end:
                break
            job.cancel.wait(0.005)
        if job.cancel.is_set():
            return
        if oom_at_s is None:
            fake.finish(job, "JOB_STATE_FAILED", "the flood ended without being cancelled")
            return
        task, r = tasks[oom_rank // per_task], oom_rank
        step_no = written // ranks
        for text in ("Traceback (most recent call last):",
                     '  File "launch_train.py", line 210, in train_step',
                     "    loss = model(**batch).loss"):
            fake.add_entry(job, task, f"[rank{r}]:{text}")
        fake.add_entry(job, task, f"[rank{r}]:torch.OutOfMemoryError: {OOM_MESSAGE}",
                       insert_id="oom-message")
        if not plain:
            event = {"launch": "oom", "rank": r, "phase": "forward", "step": step_no,
                     "micro_step": 0, "micro_batch_size": 8, "grad_accum_steps": 1,
                     "device": "cuda", "message": OOM_MESSAGE.split(". ")[0] + "."}
            fake.add_entry(job, task, f"[rank{r}]:" + json.dumps(event), insert_id="oom")
        if not job.cancel.wait(hang_s):
            fake.finish(job, "JOB_STATE_FAILED", "NCCL watchdog: collective operation timeout")
    return step


#: PyTorch 2.x's CUDA allocator message, as :func:`flood`'s rank prints it.
OOM_MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
               "79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process "
               "has 78.11 GiB memory in use. Of the allocated memory 75.50 GiB is allocated by "
               "PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated.")


def succeed_script() -> list[Callable[[FakeVertex, FakeJob], None]]:
    return [state("JOB_STATE_PENDING"), state("JOB_STATE_RUNNING"),
            log("workerpool0-0", "hello"), finish("JOB_STATE_SUCCEEDED")]


def _pause(job: FakeJob, seconds: float) -> None:
    if seconds > 0:
        job.cancel.wait(seconds)


# -- the fake ------------------------------------------------------------------------------------


class FakeVertex:
    """JobService and LoggingServiceV2 on 127.0.0.1 over gRPC and REST, sharing one state."""

    def __init__(self, *, project: str = "launch-test", project_number: str = "424242",
                 storage_host: str | None = None, mount_root: Path | None = None,
                 read_quota: int | None = READ_QUOTA, quota_window_s: float = 60.0):
        self.project = project
        self.project_number = project_number
        self.storage_host = storage_host
        self.mount_root = Path(mount_root or tempfile.mkdtemp(prefix="fake-gcs-"))
        self.jobs: dict[str, FakeJob] = {}
        self.entries: list[LogEntry] = []  # in the order written
        self.served: dict[str, float] = {}  # insertId -> when a ListLogEntries answer first had it
        self.written: dict[str, float] = {}  # an insertId given by the script -> when written
        # Cloud Logging's read quota: entries.list requests per window (None: no quota).
        self.read_quota = read_quota
        self.quota_window_s = quota_window_s
        self.quota_refusals = 0
        self._reads: deque[float] = deque()
        # The entries as the filter reads them, in timestamp order (then order written).
        self._rows: list[_Row] = []
        self._keys: list[tuple[datetime, int]] = []
        self._memo_ids: dict[str, int] = {}
        self.calls: list[Call] = []
        self.scripts: list[list[Callable[[FakeVertex, FakeJob], None]]] = []
        self.faults: list[Fault] = []
        self.lock = threading.RLock()
        self._next_job = 7001
        self._next_entry = 1
        self._threads: list[threading.Thread] = []
        self._grpc: Any = None
        self._http: ThreadingHTTPServer | None = None
        self.grpc_endpoint = ""
        self.rest_endpoint = ""

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeVertex:
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        self._grpc.add_generic_rpc_handlers([self._job_handlers(), self._logging_handlers()])
        port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._grpc.start()
        self.grpc_endpoint = f"grpc://127.0.0.1:{port}"
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _rest_handler(self))
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        self.rest_endpoint = f"http://127.0.0.1:{self._http.server_port}"
        return self

    def stop(self) -> None:
        for job in list(self.jobs.values()):
            job.cancel.set()
            self._kill(job)
        for thread in self._threads:
            thread.join(timeout=10)
        if self._grpc is not None:
            self._grpc.stop(grace=None)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    def __enter__(self) -> FakeVertex:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- scripting -----------------------------------------------------------------------------

    def script(self, *steps: Callable[[FakeVertex, FakeJob], None]) -> None:
        """What the next created job does (in creation order; default: a short success)."""
        self.scripts.append(list(steps))

    def fail_next(self, method: str, code: str = "UNAVAILABLE", *, after: bool = False) -> None:
        self.faults.append(Fault(method, code, after))

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting on the fake")
            time.sleep(0.01)

    # -- job state, used by the steps ----------------------------------------------------------

    def set_state(self, job: FakeJob, name: str) -> None:
        with self.lock:
            if job.state in TERMINAL or (job.cancel.is_set() and name != "JOB_STATE_CANCELLED"):
                return
            job.job.state = JobState[name]
            now = datetime.now(UTC)
            job.job.update_time = now
            if name == "JOB_STATE_RUNNING" and not job.job.start_time:
                job.job.start_time = now
            if name in TERMINAL:
                job.job.end_time = now

    def finish(self, job: FakeJob, name: str, error: str = "") -> None:
        with self.lock:
            if job.state in TERMINAL:
                return
            if error:
                job.job.error.code = 13 if name == "JOB_STATE_FAILED" else 1
                job.job.error.message = error
            self.set_state(job, name)

    def add_entry(self, job: FakeJob, task: str | None, text: str, *, backdate_s: float = 0.0,
                  insert_id: str | None = None, as_json: bool = False) -> LogEntry:
        with self.lock:
            return self._add(job, task, text, backdate_s, insert_id, as_json)

    def add_entries(self, job: FakeJob, lines: list[tuple[str | None, str]]) -> None:
        """Several entries (replica, text) at once, as a logging agent batches them."""
        with self.lock:
            for task, text in lines:
                self._add(job, task, text, 0.0, None, False)

    def _add(self, job: FakeJob, task: str | None, text: str, backdate_s: float,
             insert_id: str | None, as_json: bool) -> LogEntry:
        if insert_id is None:
            insert_id = f"e{self._next_entry:07d}"
        else:
            self.written[insert_id] = time.monotonic()
        seq = self._next_entry
        self._next_entry += 1
        name = task or f"ml.googleapis.com%2F{job.number}"
        now = datetime.now(UTC)
        moment = now - timedelta(seconds=backdate_s)
        pb = _ENTRY_PB(log_name=f"projects/{self.project}/logs/{name}", insert_id=insert_id,
                       severity=500 if task is None else 200)  # ERROR, INFO
        pb.timestamp.FromDatetime(moment)
        pb.receive_timestamp.FromDatetime(now)
        resource_labels = {"job_id": job.number, "project_id": self.project,
                           "task_name": task or "service"}
        pb.resource.type = "ml_job"
        pb.resource.labels.update(resource_labels)
        labels = {}
        if task is not None:
            labels = {"ml.googleapis.com/task_name": task, "ml.googleapis.com/trial_id": ""}
            pb.labels.update(labels)
        message = None
        if as_json or task is None:
            message = text
            pb.json_payload.update({"message": text,
                                    "levelname": "ERROR" if task is None else "INFO"})
        else:
            pb.text_payload = text
        row = _Row(key=(moment, seq), insert_id=insert_id, resource_type="ml_job",
                   resource_labels=resource_labels, labels=labels,
                   severity="ERROR" if task is None else "INFO", log_name=pb.log_name,
                   text=None if message is not None else text, message=message, pb=pb)
        at = bisect.bisect_right(self._keys, row.key)
        self._keys.insert(at, row.key)
        self._rows.insert(at, row)
        entry = LogEntry.wrap(pb)
        self.entries.append(entry)
        return entry

    # -- JobService ------------------------------------------------------------------------------

    def create_custom_job(self, request: js.CreateCustomJobRequest, transport: str) -> CustomJob:
        self._record("CreateCustomJob", transport, request)
        fault = self._fault("CreateCustomJob")
        if fault and not fault.after:
            raise FakeError(fault.code, fault.message)
        location = self._location(request.parent)
        _validate(request.custom_job)
        with self.lock:
            number = str(self._next_job)
            self._next_job += 1
            job = CustomJob(request.custom_job)
            job.name = f"projects/{self.project_number}/locations/{location}/customJobs/{number}"
            job.state = JobState.JOB_STATE_QUEUED
            job.create_time = job.update_time = datetime.now(UTC)
            fake_job = FakeJob(job=job, script=self.scripts.pop(0) if self.scripts
                               else succeed_script())
            self.jobs[number] = fake_job
        thread = threading.Thread(target=self._run_script, args=(fake_job,), daemon=True)
        self._threads.append(thread)
        thread.start()
        if fault:
            raise FakeError(fault.code, fault.message)
        return CustomJob(job)

    def get_custom_job(self, request: js.GetCustomJobRequest, transport: str) -> CustomJob:
        self._record("GetCustomJob", transport, request)
        self._raise_fault("GetCustomJob")
        with self.lock:
            return CustomJob(self._job(request.name).job)

    def list_custom_jobs(self, request: js.ListCustomJobsRequest, transport: str
                         ) -> js.ListCustomJobsResponse:
        self._record("ListCustomJobs", transport, request)
        self._raise_fault("ListCustomJobs")
        self._location(request.parent)
        wanted = _parse_job_filter(request.filter)
        with self.lock:
            found = [CustomJob(j.job) for j in self.jobs.values()
                     if all(_job_field(j.job, key) == value for key, value in wanted)]
        start = int(request.page_token or 0)
        size = request.page_size or 100
        page = found[start:start + size]
        token = str(start + size) if start + size < len(found) else ""
        return js.ListCustomJobsResponse(custom_jobs=page, next_page_token=token)

    def cancel_custom_job(self, request: js.CancelCustomJobRequest, transport: str) -> None:
        self._record("CancelCustomJob", transport, request)
        self._raise_fault("CancelCustomJob")
        with self.lock:
            job = self._job(request.name)
            if job.state in TERMINAL:
                raise FakeError("FAILED_PRECONDITION",
                                f"Cannot cancel job {job.job.name} in state {job.state}.")
            if job.cancelled_at is None:
                job.cancelled_at = time.monotonic()
            job.cancel.set()
            job.job.state = JobState.JOB_STATE_CANCELLING
            job.job.update_time = datetime.now(UTC)
        threading.Thread(target=self._complete_cancel, args=(job,), daemon=True).start()

    def _complete_cancel(self, job: FakeJob) -> None:
        self._kill(job)
        time.sleep(0.05)
        with self.lock:
            if job.state == "JOB_STATE_CANCELLING":
                job.job.state = JobState.JOB_STATE_CANCELLED
                job.job.end_time = job.job.update_time = datetime.now(UTC)

    # -- LoggingServiceV2 --------------------------------------------------------------------

    def list_log_entries(self, request: ListLogEntriesRequest, transport: str
                         ) -> ListLogEntriesResponse:
        call = self._record("ListLogEntries", transport, request)
        self._raise_fault("ListLogEntries")
        allowed = {f"projects/{self.project}", f"projects/{self.project_number}"}
        if not request.resource_names or not set(request.resource_names) <= allowed:
            raise FakeError("PERMISSION_DENIED",
                            f"resource names {list(request.resource_names)} are not readable")
        self._charge_read()
        if request.order_by != "timestamp asc":
            raise FakeError("INVALID_ARGUMENT", "the launcher reads in ascending order")
        if not 0 <= request.page_size <= 1000:
            raise FakeError("INVALID_ARGUMENT", f"page_size {request.page_size} is outside "
                                                "[0, 1000]")
        size = request.page_size or 50
        query = LogQuery(request.filter, self._memo_id)
        with self.lock:
            if request.page_token:
                moment, _, seq = request.page_token.partition("|")
                try:
                    key = (datetime.fromisoformat(moment), int(seq))
                except ValueError:
                    raise FakeError("INVALID_ARGUMENT", "page_token is not one of ours") from None
                i = bisect.bisect_left(self._keys, key)
            else:
                i = query.first_index(self._keys)
            page: list[_Row] = []
            token = ""
            while i < len(self._rows):
                row = self._rows[i]
                i += 1
                if not query.match(row):
                    continue
                if len(page) == size:  # one more matches: say so, and where the next page starts
                    token = f"{row.key[0].isoformat()}|{row.key[1]}"
                    break
                page.append(row)
            now = time.monotonic()
            for row in page:
                self.served.setdefault(row.insert_id, now)
            response = ListLogEntriesResponse.pb()(next_page_token=token)
            response.entries.extend(row.pb for row in page)
            call.answered = len(page)
        return ListLogEntriesResponse.wrap(response)

    def _charge_read(self) -> None:
        """Cloud Logging's read quota: ``read_quota`` requests in any ``quota_window_s``; beyond
        it RESOURCE_EXHAUSTED (HTTP 429), and the refused request is not counted."""
        if self.read_quota is None:
            return
        with self.lock:
            now = time.monotonic()
            while self._reads and self._reads[0] <= now - self.quota_window_s:
                self._reads.popleft()
            if len(self._reads) >= self.read_quota:
                self.quota_refusals += 1
                raise FakeError(
                    "RESOURCE_EXHAUSTED",
                    "Quota exceeded for quota metric 'Read requests' and limit 'Read requests "
                    f"per minute' of service 'logging.googleapis.com' for consumer "
                    f"'project_number:{self.project_number}'.")
            self._reads.append(now)

    def _memo_id(self, text: str) -> int:
        with self.lock:
            return self._memo_ids.setdefault(text, len(self._memo_ids))

    # -- running scripts and jobs ----------------------------------------------------------------

    def _run_script(self, job: FakeJob) -> None:
        for step in job.script:
            if job.cancel.is_set():
                break
            step(self, job)  # steps after the end are entries Cloud Logging shows late
        if job.state not in TERMINAL and not job.cancel.is_set():
            self.finish(job, "JOB_STATE_FAILED", "the fake's script ended without an outcome")

    def execute(self, job: FakeJob) -> None:
        spec = job.job.job_spec
        replicas = [(p, i) for p, pool in enumerate(spec.worker_pool_specs)
                    for i in range(pool.replica_count)]
        master_port = _free_port()
        ports = [master_port] + [_free_port() for _ in replicas[1:]]
        cluster: dict[str, list[str]] = {}
        for (p, _i), port in zip(replicas, ports, strict=True):
            cluster.setdefault(f"workerpool{p}", []).append(f"127.0.0.1:{port}")
        base = spec.base_output_directory.output_uri_prefix.rstrip("/")
        self.set_state(job, "JOB_STATE_RUNNING")
        readers = []
        for rank, (p, i) in enumerate(replicas):
            container = spec.worker_pool_specs[p].container_spec
            task = f"workerpool{p}-{i}"
            scratch = Path(tempfile.mkdtemp(prefix=f"{task}-"))
            env = {
                # The container's own environment: this Python first on the PATH, as an image's.
                "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                         os.environ.get("PATH", "")]),
                "HOME": str(scratch), "TMPDIR": str(scratch), "LANG": "C.UTF-8",
            }
            env.update({e.name: self._mounted(e.value) for e in container.env})
            env.update({
                "CLUSTER_SPEC": json.dumps({"cluster": cluster, "environment": "cloud",
                                            "task": {"type": f"workerpool{p}", "index": i}}),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
                "WORLD_SIZE": str(len(replicas)), "RANK": str(rank),
                "CLOUD_ML_JOB_ID": job.number,
                "AIP_MODEL_DIR": f"{base}/model/", "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
                "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/",
                "OMP_NUM_THREADS": "1",
            })
            if self.storage_host:
                env["STORAGE_EMULATOR_HOST"] = self.storage_host
            process = subprocess.Popen(
                [*container.command, *container.args], env=env, cwd=scratch,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True)
            job.processes.append(process)
            # Two streams, two readers, as Vertex AI's logging agent keeps them apart.
            for stream in (process.stdout, process.stderr):
                reader = threading.Thread(target=self._pump, args=(job, task, stream),
                                          daemon=True)
                reader.start()
                readers.append(reader)
        failed: tuple[str, int] | None = None
        while not job.cancel.is_set():
            codes = [(f"workerpool{p}-{i}", proc.poll())
                     for (p, i), proc in zip(replicas, job.processes, strict=True)]
            failed = next(((t, c) for t, c in codes if c not in (None, 0)), None)
            if failed or all(c == 0 for _t, c in codes):
                break
            time.sleep(0.05)
        if failed:
            self._kill(job)  # Vertex AI tears the other replicas down with the job
        for reader in readers:
            reader.join(timeout=10)
        if job.cancel.is_set():
            return
        if failed:
            task, code = failed
            status = f"{code}" if code > 0 else f"{128 - code}"
            message = (f"The replica {task} exited with a non-zero status of {status}. To find "
                       f"out more about why your job exited please check the logs: "
                       f"https://console.cloud.google.com/logs/viewer?project={self.project}")
            self.add_entry(job, None, message)
            self.finish(job, "JOB_STATE_FAILED", message)
        else:
            self.add_entry(job, None, "Job completed successfully.")
            self.finish(job, "JOB_STATE_SUCCEEDED")

    def _pump(self, job: FakeJob, task: str, stream: Any) -> None:
        for raw in stream:
            self.add_entry(job, task, raw.decode("utf-8", "replace").rstrip("\n"))

    def _mounted(self, value: str) -> str:
        """Cloud Storage FUSE: /gcs/BUCKET/... is a folder of the fake, shared by its jobs."""
        if value.startswith("/gcs/"):
            return str(self.mount_root / value.removeprefix("/gcs/"))
        return value

    def _kill(self, job: FakeJob) -> None:
        for process in job.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for process in job.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    # -- helpers -------------------------------------------------------------------------------

    def _record(self, method: str, transport: str, request: Any) -> Call:
        call = Call(method, transport, request)
        with self.lock:
            self.calls.append(call)
        return call

    def _fault(self, method: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.method == method:
                    self.faults.remove(fault)
                    return fault
        return None

    def _raise_fault(self, method: str) -> None:
        fault = self._fault(method)
        if fault:
            raise FakeError(fault.code, fault.message)

    def _location(self, parent: str) -> str:
        match = re.fullmatch(r"projects/([^/]+)/locations/([^/]+)", parent)
        if not match or match.group(1) not in (self.project, self.project_number):
            raise FakeError("PERMISSION_DENIED", f"no access to {parent!r}")
        return match.group(2)

    def _job(self, name: str) -> FakeJob:
        match = re.fullmatch(r"projects/([^/]+)/locations/([^/]+)/customJobs/(\d+)", name)
        if not match or match.group(3) not in self.jobs:
            raise FakeError("NOT_FOUND", f"CustomJob {name} is not found.")
        return self.jobs[match.group(3)]

    # -- wiring ----------------------------------------------------------------------------------

    def _job_handlers(self) -> grpc.GenericRpcHandler:
        def unary(fn: Callable[[Any, str], Any], request_type: Any, response_type: Any) -> Any:
            def handle(request: Any, context: grpc.ServicerContext) -> Any:
                try:
                    result = fn(request, "grpc")
                except FakeError as err:
                    context.abort(getattr(grpc.StatusCode, err.code), err.message)
                return empty_pb2.Empty() if result is None else result
            serialize = (response_type.serialize if response_type is not empty_pb2.Empty
                         else empty_pb2.Empty.SerializeToString)
            return grpc.unary_unary_rpc_method_handler(
                handle, request_deserializer=request_type.deserialize,
                response_serializer=serialize)

        return grpc.method_handlers_generic_handler(JOB_SERVICE, {
            "CreateCustomJob": unary(self.create_custom_job, js.CreateCustomJobRequest,
                                     CustomJob),
            "GetCustomJob": unary(self.get_custom_job, js.GetCustomJobRequest, CustomJob),
            "ListCustomJobs": unary(self.list_custom_jobs, js.ListCustomJobsRequest,
                                    js.ListCustomJobsResponse),
            "CancelCustomJob": unary(self.cancel_custom_job, js.CancelCustomJobRequest,
                                     empty_pb2.Empty),
        })

    def _logging_handlers(self) -> grpc.GenericRpcHandler:
        def handle(request: ListLogEntriesRequest, context: grpc.ServicerContext) -> Any:
            try:
                return self.list_log_entries(request, "grpc")
            except FakeError as err:
                context.abort(getattr(grpc.StatusCode, err.code), err.message)

        return grpc.method_handlers_generic_handler(LOGGING_SERVICE, {
            "ListLogEntries": grpc.unary_unary_rpc_method_handler(
                handle, request_deserializer=ListLogEntriesRequest.deserialize,
                response_serializer=ListLogEntriesResponse.serialize),
        })


def _rest_handler(fake: FakeVertex) -> type[BaseHTTPRequestHandler]:
    jobs = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+)/customJobs$")
    one = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+/customJobs/\d+)(:cancel)?$")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def _serve(self, verb: str) -> None:
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                self._reply(200, self._route(verb, url.path, query, body))
            except FakeError as err:
                self._reply(HTTP_STATUS.get(err.code, 500), {"error": {
                    "code": HTTP_STATUS.get(err.code, 500), "message": err.message,
                    "status": err.code}})

        def _route(self, verb: str, path: str, query: dict[str, str], body: bytes) -> Any:
            if verb == "POST" and path == "/v2/entries:list":
                request = ListLogEntriesRequest.from_json(body or b"{}")
                return _to_json(fake.list_log_entries(request, "rest"))
            match = jobs.match(path)
            if match and verb == "POST":
                job = CustomJob.from_json(body)
                request = js.CreateCustomJobRequest(parent=match.group(1), custom_job=job)
                return _to_json(fake.create_custom_job(request, "rest"))
            if match and verb == "GET":
                request = js.ListCustomJobsRequest(
                    parent=match.group(1), filter=query.get("filter", ""),
                    page_size=int(query.get("pageSize") or 0),
                    page_token=query.get("pageToken", ""))
                return _to_json(fake.list_custom_jobs(request, "rest"))
            match = one.match(path)
            if match and verb == "GET" and not match.group(2):
                request = js.GetCustomJobRequest(name=match.group(1))
                return _to_json(fake.get_custom_job(request, "rest"))
            if match and verb == "POST" and match.group(2):
                fake.cancel_custom_job(js.CancelCustomJobRequest(name=match.group(1)), "rest")
                return {}
            raise FakeError("NOT_FOUND", f"no route for {verb} {path}")

        def _reply(self, status: int, data: Any) -> None:
            out = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    return Handler


def _to_json(message: Any) -> Any:
    """As Google's REST front end answers: proto3 JSON without default-valued fields (an empty
    ``nextPageToken`` would send the logging client's pager round forever)."""
    return json_format.MessageToDict(type(message).pb(message))


# -- validation and filters -----------------------------------------------------------------------


def _validate(job: CustomJob) -> None:
    """What Vertex AI refuses at create time, as far as the launcher's requests go."""
    problems = []
    if not job.display_name or len(job.display_name) > 128:
        problems.append("display_name must have 1 to 128 characters")
    for key, value in job.labels.items():
        if not LABEL.match(key) or not LABEL_VALUE.match(value):
            problems.append(f"label {key}={value!r} is not a valid label")
    pools = job.job_spec.worker_pool_specs
    if not pools:
        problems.append("job_spec.worker_pool_specs is empty")
    elif pools[0].replica_count != 1:
        problems.append("the primary worker pool must have exactly one replica")
    for n, pool in enumerate(pools):
        if not pool.machine_spec.machine_type:
            problems.append(f"worker_pool_specs[{n}].machine_spec.machine_type is empty")
        if not pool.container_spec.image_uri:
            problems.append(f"worker_pool_specs[{n}].container_spec.image_uri is empty")
    if job.job_spec.base_output_directory.output_uri_prefix and not (
            job.job_spec.base_output_directory.output_uri_prefix.startswith("gs://")):
        problems.append("base_output_directory must be a gs:// URI")
    if problems:
        raise FakeError("INVALID_ARGUMENT", "; ".join(problems))


def _parse_job_filter(text: str) -> list[tuple[str, str]]:
    clauses = []
    for part in filter(None, (p.strip() for p in re.split(r"\s+AND\s+", text or ""))):
        match = re.fullmatch(r'(labels\.[a-z][a-z0-9_-]*|display_name|state)\s*=\s*"([^"]*)"',
                             part)
        if match is None:
            raise FakeError("INVALID_ARGUMENT", f"unsupported filter clause {part!r}")
        clauses.append((match.group(1), match.group(2)))
    return clauses


def _job_field(job: CustomJob, key: str) -> str:
    if key.startswith("labels."):
        return job.labels.get(key.removeprefix("labels."), "\0")
    if key == "state":
        return job.state.name
    return job.display_name


# -- Cloud Logging's query language, the part the launcher sends -----------------------------------


@dataclass(slots=True)
class _Row:
    """One entry as a query reads it, with the protobuf message that is served."""

    key: tuple[datetime, int]  # (timestamp, order written): the index's order
    insert_id: str
    resource_type: str
    resource_labels: dict[str, str]
    labels: dict[str, str]
    severity: str
    log_name: str
    text: str | None     # textPayload
    message: str | None  # jsonPayload.message
    pb: Any
    text_low: str | None = None
    message_low: str | None = None
    memo: dict[int, bool] = field(default_factory=dict)  # a pure group's answer, by its text

    def __post_init__(self) -> None:
        self.text_low = None if self.text is None else self.text.lower()
        self.message_low = None if self.message is None else self.message.lower()


@dataclass
class _Node:
    kind: str  # cmp | and | or | not
    text: str  # canonical: the key of a group's remembered answers
    fn: Callable[[_Row], bool]
    pure: bool  # no timestamp inside: a row's answer never changes
    leaves: int
    parts: list[_Node] = field(default_factory=list)
    has: tuple[str, str] | None = None  # (payload field, lowered needle) of a ":" test
    bound: tuple[str, datetime] | None = None  # (operator, moment) of a timestamp comparison


_TOKEN = re.compile(r'\s*(?:(?P<paren>[()])|(?P<string>"(?:[^"\\]|\\.)*")|'
                    r'(?P<op>>=|<=|!=|=|>|<|:)|'
                    r'(?P<word>[A-Za-z_]\w*(?:\.(?:[A-Za-z_]\w*|"(?:[^"\\]|\\.)*"))*))')
_PAYLOAD = {"textPayload": "text_low", "jsonPayload.message": "message_low"}
_PLAIN = {"resource.type": "resource_type", "logName": "log_name", "severity": "severity",
          "insertId": "insert_id"}
_KEYWORDS = ("AND", "OR", "NOT")
#: A group of at least this many comparisons, with no timestamp in it, is worked out once a row.
_REMEMBERED = 4


class LogQuery:
    """A filter of ``entries.list`` in the Logging query language, parsed as Cloud Logging reads
    it, as far as the launcher writes it: comparisons ``FIELD OP "value"`` (``=``, ``!=``, and
    ``<`` ... ``>=`` on ``timestamp``; ``:``, a substring test, on ``textPayload`` and
    ``jsonPayload.message``), ``NOT`` (binding tightest), ``OR``, then ``AND`` (binding least:
    ``a AND b OR c`` is ``a AND (b OR c)``, as Google's reference says), parentheses, and strings
    in double quotes with ``\\"`` and ``\\\\`` escapes. String comparisons ignore case, as Cloud
    Logging's do. Anything else (a bare word, a global restriction, two terms without ``AND``,
    lower-case operators, regular expressions, functions, other escapes, other fields) is
    INVALID_ARGUMENT: the fake must never answer a filter it does not understand with entries.
    """

    def __init__(self, text: str, memo_id: Callable[[str], int]):
        if len(text) > 20_000:
            raise self._error(f"the filter has {len(text)} characters; at most 20000 are allowed")
        self._memo_id = memo_id
        self._tokens = self._lex(text)
        self._pos = 0
        node = self._conjunction()
        if self._pos < len(self._tokens):
            raise self._error(f"unexpected {self._tokens[self._pos][1]!r}")
        self.match = node.fn
        tops = node.parts if node.kind == "and" else [node]
        self.bounds = [part.bound for part in tops if part.bound and part.bound[0] in (">=", ">")]
        if not self.bounds:
            raise FakeError("INVALID_ARGUMENT", "a read without a timestamp bound scans "
                                                "everything")

    def first_index(self, keys: list[tuple[datetime, int]]) -> int:
        """Where in the index the lower timestamp bounds let the scan start."""
        start = 0
        for op, moment in self.bounds:
            at = (bisect.bisect_left(keys, (moment, -1)) if op == ">="
                  else bisect.bisect_right(keys, (moment, sys.maxsize)))
            start = max(start, at)
        return start

    # -- lexing and parsing ------------------------------------------------------------------

    @staticmethod
    def _error(message: str) -> FakeError:
        return FakeError("INVALID_ARGUMENT", f"unsupported filter: {message}")

    def _lex(self, text: str) -> list[tuple[str, str]]:
        tokens, pos = [], 0
        while pos < len(text):
            if not text[pos:].strip():
                break
            match = _TOKEN.match(text, pos)
            if match is None:
                raise self._error(f"cannot read {text[pos:pos + 20].strip()!r}")
            kind = match.lastgroup or ""
            tokens.append((kind, match.group(kind)))
            pos = match.end()
        return tokens

    def _peek(self) -> tuple[str, str] | None:
        return self._tokens[self._pos] if self._pos < len(self._tokens) else None

    def _take(self, kind: str, value: str | None = None) -> str:
        token = self._peek()
        if token is None or token[0] != kind or (value is not None and token[1] != value):
            shown = "the end" if token is None else repr(token[1])
            raise self._error(f"expected {value or kind}, found {shown}")
        self._pos += 1
        return token[1]

    def _conjunction(self) -> _Node:
        parts = [self._disjunction()]
        while self._peek() == ("word", "AND"):
            self._pos += 1
            parts.append(self._disjunction())
        token = self._peek()
        if token is not None and token != ("paren", ")"):
            raise self._error(f"{token[1]!r} follows a term without AND (the fake takes no "
                              "implicit AND)")
        return parts[0] if len(parts) == 1 else self._combine("and", parts)

    def _disjunction(self) -> _Node:
        parts = [self._unary()]
        while self._peek() == ("word", "OR"):
            self._pos += 1
            parts.append(self._unary())
        return parts[0] if len(parts) == 1 else self._combine("or", parts)

    def _unary(self) -> _Node:
        if self._peek() == ("word", "NOT"):
            self._pos += 1
            inner = self._unary()
            fn = inner.fn
            return _Node("not", f"NOT {inner.text}", lambda row: not fn(row), inner.pure,
                         inner.leaves)
        if self._peek() == ("paren", "("):
            self._pos += 1
            node = self._conjunction()
            self._take("paren", ")")
            return self._remembered(node)
        return self._comparison()

    def _comparison(self) -> _Node:
        name = self._take("word")
        if name in _KEYWORDS or name.lower() in ("and", "or", "not"):
            raise self._error(f"{name!r} where a field was expected")
        op = self._take("op")
        raw = self._take("string")
        value = self._unquote(raw)
        text = f"{name}{op}{raw}"
        if name == "timestamp":
            if op not in ("=", "<", "<=", ">", ">="):
                raise self._error(f"timestamp {op}")
            try:
                moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise self._error(f"{value!r} is not an RFC 3339 timestamp") from None
            if moment.tzinfo is None:
                raise self._error(f"{value!r} has no time zone")
            compare = {"=": lambda a: a == moment, "<": lambda a: a < moment,
                       "<=": lambda a: a <= moment, ">": lambda a: a > moment,
                       ">=": lambda a: a >= moment}[op]
            return _Node("cmp", text, lambda row: compare(row.key[0]), False, 1,
                         bound=(op, moment))
        low = value.lower()
        if name in _PAYLOAD:
            attr = _PAYLOAD[name]
            if op == ":":
                def has(row: _Row) -> bool:
                    have = getattr(row, attr)
                    return have is not None and low in have
                return _Node("cmp", text, has, True, 1, has=(attr, low))
            if op in ("=", "!="):
                want = op == "="
                return _Node("cmp", text, lambda row: (getattr(row, attr) == low) == want,
                             True, 1)
            raise self._error(f"{name} {op}")
        if op not in ("=", "!="):
            raise self._error(f"{name} {op} (the fake tests substrings of the payload only)")
        get = self._getter(name)
        want = op == "="
        return _Node("cmp", text, lambda row: (get(row).lower() == low) == want, True, 1)

    def _getter(self, name: str) -> Callable[[_Row], str]:
        if name in _PLAIN:
            attr = _PLAIN[name]
            return lambda row: getattr(row, attr)
        for prefix, attr in (("resource.labels.", "resource_labels"), ("labels.", "labels")):
            if name.startswith(prefix):
                key = name.removeprefix(prefix)
                if key.startswith('"'):
                    key = self._unquote(key)
                return lambda row: getattr(row, attr).get(key, "")
        raise self._error(f"the field {name!r}")

    def _unquote(self, raw: str) -> str:
        body, out, i = raw[1:-1], [], 0
        while i < len(body):
            char = body[i]
            if char == "\\":
                escaped = body[i + 1:i + 2]
                if escaped not in ('"', "\\"):
                    raise self._error(f"the escape \\{escaped} in {raw}")
                out.append(escaped)
                i += 2
                continue
            out.append(char)
            i += 1
        return "".join(out)

    def _combine(self, kind: str, parts: list[_Node]) -> _Node:
        text = f" {kind.upper()} ".join(part.text for part in parts)
        pure = all(part.pure for part in parts)
        leaves = sum(part.leaves for part in parts)
        if kind == "or" and all(part.has for part in parts):  # many needles: one pass each
            by_field: dict[str, list[str]] = {}
            for part in parts:
                assert part.has is not None
                by_field.setdefault(part.has[0], []).append(part.has[1])
            groups = [(attr, tuple(needles)) for attr, needles in by_field.items()]

            def any_needle(row: _Row) -> bool:
                for attr, needles in groups:
                    have = getattr(row, attr)
                    if have is not None:
                        for needle in needles:
                            if needle in have:
                                return True
                return False
            return _Node(kind, text, any_needle, pure, leaves, parts)
        fns = [part.fn for part in sorted(parts, key=lambda part: part.leaves)]
        if kind == "and":
            def every(row: _Row) -> bool:
                return all(fn(row) for fn in fns)
            return _Node(kind, text, every, pure, leaves, parts)

        def some(row: _Row) -> bool:
            return any(fn(row) for fn in fns)
        return _Node(kind, text, some, pure, leaves, parts)

    def _remembered(self, node: _Node) -> _Node:
        """A parenthesised group: as the node, its answer kept per row when it is worth it."""
        text = f"({node.text})"
        if not node.pure or node.leaves < _REMEMBERED:
            return _Node(node.kind, text, node.fn, node.pure, node.leaves, node.parts, node.has,
                         node.bound)
        key, fn = self._memo_id(text), node.fn

        def remembered(row: _Row) -> bool:
            answer = row.memo.get(key)
            if answer is None:
                answer = row.memo[key] = fn(row)
            return answer
        return _Node(node.kind, text, remembered, True, node.leaves, node.parts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
