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
"""

from __future__ import annotations

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
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import grpc
from google.api import monitored_resource_pb2
from google.cloud.aiplatform_v1.types import CustomJob, JobState
from google.cloud.aiplatform_v1.types import job_service as js
from google.cloud.logging_v2.types import ListLogEntriesRequest, ListLogEntriesResponse, LogEntry
from google.protobuf import empty_pb2, json_format, struct_pb2

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
                 storage_host: str | None = None, mount_root: Path | None = None):
        self.project = project
        self.project_number = project_number
        self.storage_host = storage_host
        self.mount_root = Path(mount_root or tempfile.mkdtemp(prefix="fake-gcs-"))
        self.jobs: dict[str, FakeJob] = {}
        self.entries: list[LogEntry] = []
        self.served: dict[str, float] = {}  # insertId -> when a ListLogEntries answer first had it
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
            if insert_id is None:
                insert_id = f"e{self._next_entry:07d}"
                self._next_entry += 1
            name = task or f"ml.googleapis.com%2F{job.number}"
            entry = LogEntry(
                log_name=f"projects/{self.project}/logs/{name}",
                insert_id=insert_id,
                timestamp=datetime.now(UTC) - timedelta(seconds=backdate_s),
                receive_timestamp=datetime.now(UTC),
                severity="ERROR" if task is None else "INFO",
                resource=monitored_resource_pb2.MonitoredResource(
                    type="ml_job", labels={"job_id": job.number, "project_id": self.project,
                                           "task_name": task or "service"}),
            )
            if task is not None:
                entry.labels = {"ml.googleapis.com/task_name": task,
                                "ml.googleapis.com/trial_id": ""}
            if as_json or task is None:
                payload = struct_pb2.Struct()
                payload.update({"message": text, "levelname": "ERROR" if task is None else "INFO"})
                entry.json_payload = payload
            else:
                entry.text_payload = text
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
        self._record("ListLogEntries", transport, request)
        self._raise_fault("ListLogEntries")
        allowed = {f"projects/{self.project}", f"projects/{self.project_number}"}
        if not request.resource_names or not set(request.resource_names) <= allowed:
            raise FakeError("PERMISSION_DENIED",
                            f"resource names {list(request.resource_names)} are not readable")
        if request.order_by != "timestamp asc":
            raise FakeError("INVALID_ARGUMENT", "the launcher reads in ascending order")
        clauses = _parse_log_filter(request.filter)
        with self.lock:
            matching = [e for e in self.entries if all(_entry_matches(e, c) for c in clauses)]
        matching.sort(key=lambda e: e.timestamp)  # stable: equal timestamps keep arrival order
        start = int(request.page_token or 0)
        size = min(request.page_size or 50, 1000)
        page = matching[start:start + size]
        with self.lock:
            now = time.monotonic()
            for entry in page:
                self.served.setdefault(entry.insert_id, now)
        token = str(start + size) if start + size < len(matching) else ""
        return ListLogEntriesResponse(entries=page, next_page_token=token)

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

    def _record(self, method: str, transport: str, request: Any) -> None:
        with self.lock:
            self.calls.append(Call(method, transport, request))

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


_LOG_CLAUSE = re.compile(r'(resource\.type|resource\.labels\.\w+|labels\."[^"]+"|timestamp|'
                         r'severity|logName)\s*(>=|<=|=|>|<)\s*"([^"]*)"')


def _parse_log_filter(text: str) -> list[tuple[str, str, str]]:
    clauses = []
    for part in filter(None, (p.strip() for p in re.split(r"\s+AND\s+", text or ""))):
        match = _LOG_CLAUSE.fullmatch(part)
        if match is None:
            raise FakeError("INVALID_ARGUMENT", f"unsupported filter clause {part!r}")
        clauses.append((match.group(1), match.group(2), match.group(3)))
    if not any(key == "timestamp" for key, _op, _value in clauses):
        raise FakeError("INVALID_ARGUMENT", "a read without a timestamp bound scans everything")
    return clauses


def _entry_matches(entry: LogEntry, clause: tuple[str, str, str]) -> bool:
    key, op, value = clause
    if key == "timestamp":
        have: Any = entry.timestamp
        want: Any = datetime.fromisoformat(value.replace("Z", "+00:00"))
    else:
        if key == "resource.type":
            have = entry.resource.type
        elif key.startswith("resource.labels."):
            have = entry.resource.labels.get(key.removeprefix("resource.labels."), "")
        elif key.startswith("labels."):
            have = entry.labels.get(key.removeprefix("labels.").strip('"'), "")
        elif key == "severity":
            have = entry.severity.name
        else:
            have = entry.log_name
        want = value
    return {"=": have == want, ">=": have >= want, "<=": have <= want, ">": have > want,
            "<": have < want}[op]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
