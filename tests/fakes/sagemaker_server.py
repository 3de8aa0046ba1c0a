"""A fake of SageMaker's training-job API on 127.0.0.1, plus the loopback plumbing around moto.

moto's server serves S3, CloudWatch Logs and IAM well, but its training jobs complete the moment
they are created and it has no StopTrainingJob, so the job lifecycle is served here at the wire
level: the SageMaker JSON 1.1 protocol (``POST /`` with ``X-Amz-Target: SageMaker.<Operation>``)
for CreateTrainingJob, DescribeTrainingJob, StopTrainingJob and ListTrainingJobs. The real boto3
client talks to it through ``AWS_ENDPOINT_URL_SAGEMAKER``; the rest of boto3 talks to moto.

What each created job does is scripted: a *scenario* (a function of a :class:`JobContext`) runs on
a thread and moves the job through SageMaker's secondary statuses, writes log lines into moto's
CloudWatch Logs group ``/aws/sagemaker/TrainingJobs`` (stream ``<job>/algo-N-<epoch>``, as
SageMaker names them), fails with a FailureReason, or waits to be stopped. :func:`execute` runs
the job for real: it downloads the job's input channels and checkpoints from moto's S3, runs the
job's own ``ContainerEntrypoint + ContainerArguments`` (without the container: ``/opt/ml`` paths
in the command and the environment point into a folder of the fake), writes every output line to
CloudWatch Logs and syncs the checkpoint folder back to S3.

Faults: :meth:`FakeSageMaker.throttle` answers ThrottlingException to the next N calls of an
operation; :meth:`FakeSageMaker.lose_response` executes the next N calls and then drops the
connection without answering (a create that made the job, whose response never arrived).
:class:`FlakyProxy` sits between a client and moto and drops connections on demand.

CloudWatch Logs' read quotas: :class:`CloudWatchProxy` sits between boto3 and moto's CloudWatch
Logs, counts the calls of each operation (``X-Amz-Target: Logs_20140328.GetLogEvents``) and
answers ThrottlingException to those past a configurable number a second, as AWS does. It serves
FilterLogEvents itself, over moto's stored events: moto's own takes no ``?"a" ?"b"`` OR of terms
(it matches every event then), ignores ``logStreamNamePrefix`` and scans the whole group on every
call. :func:`flood` is a job whose 16 ranks write 5,000 lines a second until one runs out of
memory.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
ACCOUNT = "123456789012"
JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
ROLE_ARN = re.compile(r"^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$")
HOST_OOM_REASON = ("OutOfMemoryError: Please use an instance type with more memory, or reduce "
                   "the size of job data processed on an instance.")


class ApiError(Exception):
    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


class _Stopped(Exception):
    """Raised inside a scenario when StopTrainingJob arrived."""


def start_moto() -> tuple[Any, str]:
    """moto's server on a free loopback port: (server, endpoint URL)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def isolated_aws_env(monkeypatch: Any, tmp_path: Path, **values: str) -> dict[str, str]:
    """Set ``values`` (dummy credentials, loopback endpoints) in the environment, with no profile,
    session token or default region left over and no config files read from the home folder.
    Returns the variables set."""
    values = {"AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
              "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
              "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"), **values}
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key, raising=False)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def no_aws_credentials(monkeypatch: Any, tmp_path: Path, metadata_port: int) -> dict[str, str]:
    """An environment with no AWS credentials anywhere, and an instance-metadata endpoint at
    ``metadata_port`` (one that never answers is the worst case). Returns the variables set."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_EC2_METADATA_DISABLED", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(key, raising=False)
    (tmp_path / "empty").write_text("")
    environ = {"HOME": str(tmp_path), "AWS_CONFIG_FILE": str(tmp_path / "empty"),
               "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "empty"),
               "AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://127.0.0.1:{metadata_port}"}
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    return environ


def moto_client(service: str, endpoint: str, region: str = "us-east-1") -> Any:
    return boto3.client(service, endpoint_url=endpoint, region_name=region,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@dataclass
class FakeJob:
    name: str
    arn: str
    request: dict[str, Any]
    created: float
    status: str = "InProgress"
    secondary: str = "Starting"
    modified: float = 0.0
    end_time: float | None = None
    transitions: list[dict[str, Any]] = field(default_factory=list)
    failure_reason: str | None = None
    stop_requested: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    streams: dict[str, str] = field(default_factory=dict)   # host -> stream name
    written: dict[str, list[str]] = field(default_factory=dict)  # host -> lines written
    stamps: dict[str, list[int]] = field(default_factory=dict)   # host -> their timestamps (ms)
    oom_logged_at: float | None = None  # time.monotonic() once the OOM lines were put
    flood_rate: float | None = None     # lines a second a flood() job wrote, measured
    stop_calls: int = 0
    first_stop_at: float | None = None
    process: subprocess.Popen[bytes] | None = None
    sandbox: Path | None = None

    def describe(self) -> dict[str, Any]:
        r = self.request
        out: dict[str, Any] = {
            "TrainingJobName": self.name, "TrainingJobArn": self.arn,
            "TrainingJobStatus": self.status, "SecondaryStatus": self.secondary,
            "SecondaryStatusTransitions": [dict(t) for t in self.transitions],
            "CreationTime": self.created, "LastModifiedTime": self.modified or self.created,
            "RoleArn": r["RoleArn"], "AlgorithmSpecification": r["AlgorithmSpecification"],
            "ResourceConfig": r.get("ResourceConfig"),
            "StoppingCondition": r.get("StoppingCondition"),
            "OutputDataConfig": r.get("OutputDataConfig"),
            "HyperParameters": r.get("HyperParameters", {}),
            "Environment": r.get("Environment", {}),
            "InputDataConfig": r.get("InputDataConfig", []),
            "CheckpointConfig": r.get("CheckpointConfig"),
            "EnableManagedSpotTraining": r.get("EnableManagedSpotTraining", False),
        }
        if self.failure_reason:
            out["FailureReason"] = self.failure_reason
        if self.end_time is not None:
            out["TrainingEndTime"] = self.end_time
        return out


class JobContext:
    """What a scenario can do to its job."""

    def __init__(self, fake: FakeSageMaker, job: FakeJob):
        self.fake, self.job = fake, job
        self._last_ts: dict[str, int] = {}

    @property
    def hosts(self) -> list[str]:
        count = int(self.job.request["ResourceConfig"]["InstanceCount"])
        return [f"algo-{i}" for i in range(1, count + 1)]

    def status(self, secondary: str, message: str, status: str | None = None) -> None:
        with self.fake.lock:
            now = time.time()
            if self.job.transitions:
                self.job.transitions[-1].setdefault("EndTime", now)
            self.job.transitions.append({"Status": secondary, "StartTime": now,
                                         "StatusMessage": message})
            self.job.secondary = secondary
            self.job.modified = now
            if status:
                self.job.status = status
                if status in ("Completed", "Failed", "Stopped"):
                    self.job.end_time = now

    def log(self, host: str, lines: list[str] | str, direct: bool = False) -> None:
        """Write lines to ``host``'s stream; one event per line, timestamps never decreasing.
        ``direct``: PutLogEvents into moto's backend in this process instead of over HTTP (moto
        runs in the tests' process, so a flood's thousands of lines a second over boto3 and
        HTTP would take the interpreter from the follower being measured)."""
        if isinstance(lines, str):
            lines = [lines]
        lines = [line for line in lines if line]  # CloudWatch takes no empty events
        if not lines:
            return
        logs = self.fake.logs
        stream = self.job.streams.get(host)
        if stream is None:
            stream = f"{self.job.name}/{host}-{int(self.job.created)}"
            try:
                logs.create_log_group(logGroupName=LOG_GROUP)
            except logs.exceptions.ResourceAlreadyExistsException:
                pass
            logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
            self.job.streams[host] = stream
        now = max(int(time.time() * 1000), self._last_ts.get(host, 0))
        self._last_ts[host] = now
        events = [{"timestamp": now, "message": line} for line in lines]
        for start in range(0, len(events), 1000):
            if direct:
                from moto.logs.models import logs_backends

                logs_backends[ACCOUNT][self.fake.region].put_log_events(
                    LOG_GROUP, stream, events[start:start + 1000])
            else:
                logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream,
                                    logEvents=events[start:start + 1000])
        self.job.written.setdefault(host, []).extend(lines)
        self.job.stamps.setdefault(host, []).extend([now] * len(lines))

    def sleep(self, seconds: float) -> None:
        if self.job.stop_requested.wait(seconds):
            raise _Stopped

    def wait_for_stop(self, timeout: float = 60.0) -> bool:
        """Hang like ranks blocked in a collective; True when the stop came."""
        return self.job.stop_requested.wait(timeout)

    def start(self) -> None:
        """Starting -> Downloading -> Training, as SageMaker reports them."""
        self.status("Starting", "Launching requested ML instances")
        self.sleep(self.fake.step_s)
        self.status("Starting", "Preparing the instances for training")
        self.sleep(self.fake.step_s)
        self.status("Downloading", "Downloading the training image")
        self.sleep(self.fake.step_s)
        self.status("Training", "Training image download completed. Training in progress.")

    def complete(self) -> None:
        self.status("Uploading", "Uploading generated training model")
        self.status("Completed", "Training job completed", status="Completed")

    def fail(self, reason: str) -> None:
        with self.fake.lock:
            self.job.failure_reason = reason
        self.status("Failed", "Training job failed", status="Failed")


Scenario = Callable[[JobContext], None]


class FakeSageMaker:
    """The fake service. ``push(scenario)`` scripts the next created job."""

    def __init__(self, moto_endpoint: str, workdir: Path, region: str = "us-east-1",
                 step_s: float = 0.02, stop_delay_s: float = 0.2):
        self.moto_endpoint = moto_endpoint
        self.workdir = Path(workdir)
        self.region = region
        self.step_s = step_s
        self.stop_delay_s = stop_delay_s
        self.lock = threading.RLock()
        self.jobs: dict[str, FakeJob] = {}
        self.calls: list[tuple[str, str | None]] = []
        self.scenarios: deque[Scenario] = deque()
        self.default_scenario: Scenario = success()
        self._throttle: dict[str, int] = {}
        self._lose: dict[str, int] = {}
        self.logs = moto_client("logs", moto_endpoint, region)
        self.s3 = moto_client("s3", moto_endpoint, region)
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    # -- scripting ------------------------------------------------------------------------

    def push(self, *scenarios: Scenario) -> None:
        self.scenarios.extend(scenarios)

    def throttle(self, operation: str, times: int) -> None:
        self._throttle[operation] = times

    def lose_response(self, operation: str, times: int = 1) -> None:
        self._lose[operation] = times

    def count(self, operation: str) -> int:
        return sum(1 for op, _ in self.calls if op == operation)

    def wait_ended(self, name: str, timeout: float = 60.0) -> FakeJob:
        job = self.jobs[name]
        assert job.ended.wait(timeout), f"{name} did not end in {timeout}s"
        return job

    # -- server ---------------------------------------------------------------------------

    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                target = self.headers.get("X-Amz-Target", "")
                operation = target.split(".", 1)[-1]
                status, payload, drop = fake.handle(operation, body)
                if drop:
                    self.close_connection = True
                    return
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("x-amzn-RequestId", "fake-" + str(len(fake.calls)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def close(self) -> None:
        for job in list(self.jobs.values()):
            job.stop_requested.set()
            if job.process is not None and job.process.poll() is None:
                _kill_group(job.process, signal.SIGKILL)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def handle(self, operation: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], bool]:
        """(HTTP status, JSON body, drop the connection instead of answering)."""
        with self.lock:
            self.calls.append((operation, body.get("TrainingJobName")))
            if self._throttle.get(operation, 0) > 0:
                self._throttle[operation] -= 1
                return 400, {"__type": "ThrottlingException", "message": "Rate exceeded"}, False
            lose = self._lose.get(operation, 0) > 0
            if lose:
                self._lose[operation] -= 1
        try:
            method = getattr(self, "_" + re.sub(r"(?<!^)([A-Z])", r"_\1", operation).lower())
        except AttributeError:
            return 400, {"__type": "UnknownOperationException", "message": operation}, False
        try:
            result = method(body)
        except ApiError as exc:
            return exc.status, {"__type": exc.code, "message": exc.message}, False
        return 200, result, lose

    # -- operations -----------------------------------------------------------------------

    def _create_training_job(self, body: dict[str, Any]) -> dict[str, Any]:
        _validate_create(body)
        name = body["TrainingJobName"]
        arn = f"arn:aws:sagemaker:{self.region}:{ACCOUNT}:training-job/{name.lower()}"
        with self.lock:
            if name in self.jobs:
                raise ApiError("ResourceInUse", "Training job names must be unique within an AWS "
                               "account and region, and a training job with this name already "
                               f"exists ({arn})")
            job = FakeJob(name=name, arn=arn, request=body, created=time.time())
            self.jobs[name] = job
            scenario = self.scenarios.popleft() if self.scenarios else self.default_scenario
        context = JobContext(self, job)
        context.status("Starting", "Starting the training job")
        threading.Thread(target=self._run, args=(context, scenario), daemon=True,
                         name=f"fake-{name}").start()
        return {"TrainingJobArn": arn}

    def _run(self, context: JobContext, scenario: Scenario) -> None:
        job = context.job
        try:
            scenario(context)
            if job.status == "InProgress":
                context.complete()
        except _Stopped:
            pass
        except Exception as exc:  # a broken scenario fails its job, visibly
            context.fail(f"fake scenario error: {exc!r}")
        if job.stop_requested.is_set() and job.status == "Stopping":
            time.sleep(self.stop_delay_s)
            context.status("Stopped", "Training job stopped", status="Stopped")
        job.ended.set()

    def _describe_training_job(self, body: dict[str, Any]) -> dict[str, Any]:
        job = self.jobs.get(body.get("TrainingJobName", ""))
        if job is None:
            raise ApiError("ValidationException", "Requested resource not found.")
        with self.lock:
            return job.describe()

    def _stop_training_job(self, body: dict[str, Any]) -> dict[str, Any]:
        job = self.jobs.get(body.get("TrainingJobName", ""))
        if job is None:
            raise ApiError("ValidationException", "Requested resource not found.")
        with self.lock:
            job.stop_calls += 1
            if job.status != "InProgress":
                raise ApiError("ValidationException", "The request was rejected because the "
                               f"training job is in status {job.status}.")
            job.first_stop_at = job.first_stop_at or time.monotonic()
            job.status = "Stopping"
        JobContext(self, job).status("Stopping", "Stopping the training job")
        job.stop_requested.set()
        return {}

    def _list_training_jobs(self, body: dict[str, Any]) -> dict[str, Any]:
        contains = body.get("NameContains", "")
        with self.lock:
            jobs = [j for j in self.jobs.values() if contains in j.name]
            return {"TrainingJobSummaries": [
                {"TrainingJobName": j.name, "TrainingJobArn": j.arn, "CreationTime": j.created,
                 "TrainingJobStatus": j.status, "SecondaryStatus": j.secondary}
                for j in sorted(jobs, key=lambda j: j.created, reverse=True)]}


def _validate_create(body: dict[str, Any]) -> None:
    """The rules SageMaker checks on the server (botocore checks only types and requireds)."""
    def bad(message: str) -> None:
        raise ApiError("ValidationException", message)

    name = body.get("TrainingJobName", "")
    if not JOB_NAME.match(name):
        bad(f"1 validation error detected: Value '{name}' at 'trainingJobName' failed to satisfy "
            "constraint: Member must satisfy regular expression pattern: "
            "^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
    if not ROLE_ARN.match(body.get("RoleArn", "")):
        bad("Value at 'roleArn' failed to satisfy constraint")
    spec = body.get("AlgorithmSpecification", {})
    if not spec.get("TrainingImage"):
        bad("TrainingImage is required")
    for key in ("ContainerEntrypoint", "ContainerArguments"):
        for item in spec.get(key, []):
            if len(item) > 256:
                bad(f"Member of {key} must have length less than or equal to 256")
        if len(spec.get(key, [])) > 100:
            bad(f"{key} must have at most 100 members")
    for key, value in body.get("Environment", {}).items():
        if not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", key) or len(key) > 512 or len(value) > 512:
            bad(f"Environment entry {key} is invalid")
    if len(body.get("Environment", {})) > 100 or len(body.get("HyperParameters", {})) > 100:
        bad("At most 100 environment variables and 100 hyperparameters")
    for key, value in body.get("HyperParameters", {}).items():
        if len(key) > 256 or len(value) > 2500:
            bad(f"HyperParameter {key} is too long")
    if len(body.get("Tags", [])) > 50:
        bad("At most 50 tags")
    stopping = body.get("StoppingCondition", {})
    if body.get("EnableManagedSpotTraining"):
        if "MaxWaitTimeInSeconds" not in stopping:
            bad("MaxWaitTimeInSeconds is required for managed spot training")
        if stopping["MaxWaitTimeInSeconds"] < stopping.get("MaxRuntimeInSeconds", 86400):
            bad("MaxWaitTimeInSeconds must be greater than or equal to MaxRuntimeInSeconds")
    checkpoint = body.get("CheckpointConfig")
    if checkpoint and not str(checkpoint.get("S3Uri", "")).startswith("s3://"):
        bad("CheckpointConfig.S3Uri must be an s3:// URI")
    if not str(body.get("OutputDataConfig", {}).get("S3OutputPath", "")).startswith("s3://"):
        bad("OutputDataConfig.S3OutputPath must be an s3:// URI")


# -- scenarios -----------------------------------------------------------------------------------


def metrics_line(rank: int, step: int, loss: float = 1.0, local: int | None = None,
                 role: str = "rank") -> str:
    event = {"launch": "metrics", "rank": rank, "step": step, "loss": loss,
             "samples_per_s": 10.0, "peak_allocated_bytes": 40 * 2**30,
             "peak_reserved_bytes": 44 * 2**30, "rss_bytes": 8 * 2**30, "device": "cuda",
             "micro_batch_size": 4, "grad_accum_steps": 1}
    return f"[{role}{rank if local is None else local}]:{json.dumps(event)}"


def oom_event(rank: int, step: int = 3, phase: str = "forward", micro_batch_size: int = 4
              ) -> dict[str, Any]:
    message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of "
               "79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process "
               "has 78.08 GiB memory in use. Of the allocated memory 74.12 GiB is allocated by "
               "PyTorch, and 2.31 GiB is reserved by PyTorch but unallocated.")
    return {"launch": "oom", "rank": rank, "phase": phase, "step": step, "micro_step": 1,
            "micro_batch_size": micro_batch_size, "grad_accum_steps": 1, "device": "cuda",
            "message": message, "requested_bytes": 2 * 2**30,
            "allocated_bytes": int(74.12 * 2**30), "reserved_bytes": int(76.43 * 2**30),
            "max_allocated_bytes": int(76 * 2**30), "capacity_bytes": int(79.15 * 2**30),
            "free_bytes": int(1.06 * 2**30)}


def success(steps: int = 3, gpus: int = 1, extra: list[str] | None = None) -> Scenario:
    """Every rank of every host reports ``steps`` metrics and done; the job completes."""
    def scenario(ctx: JobContext) -> None:
        ctx.start()
        hosts = ctx.hosts
        role = "rank" if len(hosts) == 1 else "local_rank"
        for index, host in enumerate(hosts):
            ctx.log(host, f"launch: {host}, node {index} of {len(hosts)}: torchrun ...")
        if extra:
            ctx.log(hosts[0], extra)
        for step in range(1, steps + 1):
            for index, host in enumerate(hosts):
                ctx.log(host, [metrics_line(index * gpus + g, step, 1.0 / step, g, role)
                               for g in range(gpus)])
            ctx.sleep(ctx.fake.step_s)
        for index, host in enumerate(hosts):
            ctx.log(host, [f"[{role}{g}]:" + json.dumps(
                {"launch": "done", "rank": index * gpus + g, "step": steps,
                 "loss": 1.0 / steps, "checkpoint": f"/opt/ml/checkpoints/step_{steps:08d}.pt"})
                for g in range(gpus)])
    return scenario


def cuda_oom(gpus: int = 8, oom_rank: int = 11, at_step: int = 3, hang_s: float = 60.0
             ) -> Scenario:
    """``oom_rank`` runs out of GPU memory in the forward pass of ``at_step``; every other rank
    then blocks in the next all-reduce, printing nothing, until the job is stopped (or, after
    ``hang_s``, NCCL's watchdog would end it: the job fails)."""
    def scenario(ctx: JobContext) -> None:
        ctx.start()
        hosts = ctx.hosts
        role = "rank" if len(hosts) == 1 else "local_rank"
        for step in range(1, at_step):
            for index, host in enumerate(hosts):
                ctx.log(host, [metrics_line(index * gpus + g, step, 2.0 / step, g, role)
                               for g in range(gpus)])
            ctx.sleep(ctx.fake.step_s)
        host = hosts[oom_rank // gpus]
        local = oom_rank % gpus
        event = oom_event(oom_rank, at_step)
        prefix = f"[{role}{local}]:"
        ctx.log(host, [
            prefix + "Traceback (most recent call last):",
            prefix + '  File "/opt/ml/code/launch_train.py", line 612, in train',
            prefix + "    loss = training_step(model, batch)",
            prefix + "torch.OutOfMemoryError: " + event["message"],
            prefix + json.dumps(event),
        ])
        if not ctx.wait_for_stop(hang_s):
            ctx.log(host, "[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation "
                          "timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for 600000 ms")
            ctx.fail("AlgorithmError: ExecuteUserScriptError: exit code: 1")
        raise _Stopped
    return scenario


def runs_until_stopped(hang_s: float = 60.0) -> Scenario:
    """Every host says it runs, then waits to be stopped (after ``hang_s`` the job fails)."""
    def scenario(ctx: JobContext) -> None:
        ctx.start()
        for host in ctx.hosts:
            ctx.log(host, "[rank0]:running until stopped")
        if not ctx.wait_for_stop(hang_s):
            ctx.fail("AlgorithmError: ExecuteUserScriptError: exit code: 1")
        raise _Stopped
    return scenario


def host_oom(at_step: int = 2, exit_137: bool = False) -> Scenario:
    """The kernel's OOM killer ends the container: the log just stops; SageMaker says so in the
    FailureReason (or, when only a process died, reports its exit code 137)."""
    def scenario(ctx: JobContext) -> None:
        ctx.start()
        for step in range(1, at_step + 1):
            ctx.log("algo-1", [metrics_line(r, step, 1.0, r) for r in range(2)])
        if exit_137:
            ctx.log("algo-1", "torch.distributed.elastic.multiprocessing.api: failed "
                              "(exitcode: -9) local_rank: 0 (pid: 312) of binary: python3")
            ctx.fail("AlgorithmError: see the job's log, exit code: 137")
        else:
            ctx.fail(HOST_OOM_REASON)
    return scenario


def oom_only_in_failure_reason(rank: int = 0) -> Scenario:
    """The OOM line never reached CloudWatch (the instance died first); the template's report in
    /opt/ml/output/failure is all there is, as the FailureReason."""
    def scenario(ctx: JobContext) -> None:
        ctx.start()
        ctx.log("algo-1", metrics_line(rank, 1))
        ctx.fail("AlgorithmError: " + json.dumps(oom_event(rank, 2)) + ", exit code: 1")
    return scenario


def chatty(lines_per_host: int, hosts_lines: int = 2, pause_every: int = 50,
           release: threading.Event | None = None) -> Scenario:
    """Many numbered lines on every host, written in bursts (optionally waiting for ``release``
    half way), so a reader sees the streams grow while it reads them."""
    def scenario(ctx: JobContext) -> None:
        ctx.start()
        for start in range(0, lines_per_host, pause_every):
            if release is not None and start >= lines_per_host // 2:
                release.wait(30)
            for host in ctx.hosts:
                ctx.log(host, [f"{host} line {i}" for i in
                               range(start, min(start + pause_every, lines_per_host))])
            ctx.sleep(ctx.fake.step_s)
    return scenario


def flood(lines_per_s: float = 5000.0, oom_at_s: float = 3.0, oom_rank: int = 11,
          gpus: int = 1, batch_s: float = 0.5, hang_s: float = 60.0) -> Scenario:
    """Every rank prints progress lines, ``lines_per_s`` in all (PutLogEvents in batches of
    ``batch_s``, one per host); ``oom_at_s`` seconds in, ``oom_rank`` prints an out-of-memory
    traceback and the template's ``{"launch": "oom"}`` line, and every other rank hangs in its
    next collective, printing nothing, until the job is stopped. ``job.oom_logged_at`` is when
    the OOM lines were in CloudWatch Logs."""
    def scenario(ctx: JobContext) -> None:
        ctx.start()
        hosts = ctx.hosts
        ranks = len(hosts) * gpus
        role = "rank" if len(hosts) == 1 else "local_rank"
        began = time.monotonic()
        written = 0
        total = int(oom_at_s * lines_per_s)
        while written < total:
            due = min(total, int((time.monotonic() - began) * lines_per_s)) - written
            batches: dict[str, list[str]] = {}
            for n in range(written, written + due):
                rank, step = n % ranks, n // ranks
                batches.setdefault(hosts[rank // gpus], []).append(
                    f"[{role}{rank % gpus}]:train {step:6d}/100000 "
                    f"|{'#' * (step % 20):<20}| {step * 0.01:8.2f} tok/s lr=3.0e-04 "
                    f"rank={rank} line={n}")
            for host, lines in batches.items():
                ctx.log(host, lines, direct=True)
            written += due
            if written < total:  # the next batch, or the last one when it is due
                ctx.sleep(min(batch_s, max(0.0, began + oom_at_s - time.monotonic())))
        ctx.job.flood_rate = written / (time.monotonic() - began)
        host = hosts[oom_rank // gpus]
        prefix = f"[{role}{oom_rank % gpus}]:"
        event = oom_event(oom_rank)
        ctx.log(host, [
            prefix + "Traceback (most recent call last):",
            prefix + '  File "/opt/ml/code/launch_train.py", line 612, in train',
            prefix + "    loss = training_step(model, batch)",
            prefix + "torch.OutOfMemoryError: " + event["message"],
            prefix + json.dumps(event),
        ])
        ctx.job.oom_logged_at = time.monotonic()
        if not ctx.wait_for_stop(hang_s):
            ctx.fail("AlgorithmError: ExecuteUserScriptError: exit code: 1")
        raise _Stopped
    return scenario


def execute(python_bin: str | None = None, timeout_s: float = 240.0) -> Scenario:
    """Run the job for real, on this machine, without the container; see the module doc."""
    def scenario(ctx: JobContext) -> None:
        job, fake = ctx.job, ctx.fake
        request = job.request
        hosts = ctx.hosts
        assert len(hosts) == 1, "the fake executes single-instance jobs only"
        sandbox = Path(tempfile.mkdtemp(prefix=f"{job.name[:40]}-", dir=fake.workdir))
        job.sandbox = sandbox
        root = sandbox / "opt_ml"

        def here(text: str) -> str:
            return text.replace("/opt/ml", str(root))

        ctx.status("Starting", "Preparing the instances for training")
        config = root / "input" / "config"
        config.mkdir(parents=True)
        (config / "resourceconfig.json").write_text(json.dumps(
            {"current_host": hosts[0], "hosts": hosts, "network_interface_name": "lo"}))
        (config / "hyperparameters.json").write_text(json.dumps(request.get("HyperParameters",
                                                                            {})))
        ctx.status("Downloading", "Downloading input data")
        for channel in request.get("InputDataConfig", []):
            uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
            _download(fake.s3, uri, root / "input" / "data" / channel["ChannelName"])
        checkpoint = request.get("CheckpointConfig")
        local_checkpoints = Path(here(checkpoint["LocalPath"])) if checkpoint else None
        if checkpoint:
            _download(fake.s3, checkpoint["S3Uri"], local_checkpoints)
        ctx.status("Training", "Training image download completed. Training in progress.")
        spec = request["AlgorithmSpecification"]
        argv = [here(a) for a in [*spec.get("ContainerEntrypoint", []),
                                  *spec.get("ContainerArguments", [])]]
        bin_dir = python_bin or str(Path(sys.executable).parent)
        env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
               "HOME": str(sandbox), "LANG": "C.UTF-8", "TMPDIR": str(sandbox)}
        env.update({k: here(v) for k, v in request.get("Environment", {}).items()})
        process = subprocess.Popen(argv, cwd=sandbox, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        job.process = process
        reader = threading.Thread(target=_pump, args=(ctx, process, hosts[0]), daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout_s
        stopped = False
        while process.poll() is None:
            if job.stop_requested.wait(0.05):
                stopped = True
                _kill_group(process, signal.SIGTERM)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    _kill_group(process, signal.SIGKILL)
                break
            if time.monotonic() > deadline:
                _kill_group(process, signal.SIGKILL)
                break
        returncode = process.wait()
        reader.join(10)
        if checkpoint and local_checkpoints is not None and local_checkpoints.is_dir():
            _upload(fake.s3, local_checkpoints, checkpoint["S3Uri"])
        if stopped:
            raise _Stopped
        if returncode == 0:
            ctx.complete()
            return
        failure = root / "output" / "failure"
        detail = failure.read_text()[:900] if failure.exists() else "see the job's log"
        ctx.fail(f"AlgorithmError: {detail}, exit code: {returncode}")
    return scenario


def _pump(ctx: JobContext, process: subprocess.Popen[bytes], host: str) -> None:
    assert process.stdout is not None
    for raw in iter(process.stdout.readline, b""):
        ctx.log(host, raw.decode("utf-8", "replace").rstrip("\n"))


def _kill_group(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _download(s3: Any, uri: str, target: Path) -> None:
    """SageMaker's S3Prefix semantics: every object under the prefix, below ``target`` (an
    object whose key is the prefix itself lands under its own name)."""
    bucket, prefix = _split(uri)
    target.mkdir(parents=True, exist_ok=True)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix):].lstrip("/") or item["Key"].rsplit("/", 1)[-1]
            path = target / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, item["Key"], str(path))


def _upload(s3: Any, folder: Path, uri: str) -> None:
    bucket, prefix = _split(uri)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            key = f"{prefix.rstrip('/')}/{path.relative_to(folder).as_posix()}"
            s3.upload_file(str(path), bucket, key)


# -- CloudWatch Logs with its read quotas -------------------------------------------------------


class CloudWatchProxy:
    """CloudWatch Logs on 127.0.0.1 as a follower meets it: moto behind, AWS's throttling in front.

    ``limits`` maps an operation (``"GetLogEvents"``) to the calls a second it answers; a call
    past that within any one-second window gets HTTP 400 ``ThrottlingException`` ("Rate
    exceeded"), as CloudWatch answers calls past an account's quota, and does not count.
    ``calls``/``throttled`` count per operation. FilterLogEvents is served here from moto's
    stored events (the module doc says why), with CloudWatch's semantics for the patterns of
    unstructured terms: ``?"a" ?b`` any of the terms, ``"a" b`` all of them, each a
    case-sensitive substring; a pattern over 1,024 characters, or of another kind (JSON,
    space-delimited, ``%regex%``), is refused with InvalidParameterException. Everything else
    goes to moto unchanged."""

    def __init__(self, moto_endpoint: str, limits: dict[str, float] | None = None,
                 region: str = "us-east-1"):
        self.moto = moto_endpoint.removeprefix("http://")
        self.limits = dict(limits or {})
        self.region = region
        self.calls: dict[str, int] = {}
        self.throttled: dict[str, int] = {}
        self._admitted: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._matches: dict[tuple[int, str], tuple[int, list[int]]] = {}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                operation = self.headers.get("X-Amz-Target", "").rsplit(".", 1)[-1]
                if not proxy._admit(operation):
                    self._answer(400, {"__type": "ThrottlingException",
                                       "message": "Rate exceeded"})
                    return
                if operation == "FilterLogEvents":
                    try:
                        self._answer(200, proxy.filter_log_events(json.loads(body or b"{}")))
                    except ApiError as exc:
                        self._answer(exc.status, {"__type": exc.code, "message": exc.message})
                    return
                status, headers, data = proxy._forward(self.path, dict(self.headers), body)
                self.send_response(status)
                for key, value in headers:
                    if key.lower() not in ("content-length", "transfer-encoding", "connection",
                                           "server", "date"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _answer(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("x-amzn-RequestId", "proxy")
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _admit(self, operation: str) -> bool:
        now = time.monotonic()
        with self._lock:
            self.calls[operation] = self.calls.get(operation, 0) + 1
            limit = self.limits.get(operation)
            if limit is None:
                return True
            window = self._admitted.setdefault(operation, deque())
            while window and now - window[0] >= 1.0:
                window.popleft()
            if len(window) >= limit:
                self.throttled[operation] = self.throttled.get(operation, 0) + 1
                return False
            window.append(now)
            return True

    def _forward(self, path: str, headers: dict[str, str], body: bytes
                 ) -> tuple[int, list[tuple[str, str]], bytes]:
        import http.client

        host, _, port = self.moto.partition(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            connection.request("POST", path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()

    # -- FilterLogEvents ------------------------------------------------------------------

    def filter_log_events(self, body: dict[str, Any]) -> dict[str, Any]:
        from moto.logs.models import logs_backends

        pattern = body.get("filterPattern") or ""
        any_of, all_of = parse_filter_pattern(pattern)
        group = logs_backends[ACCOUNT][self.region].groups.get(body.get("logGroupName"))
        if group is None:
            raise ApiError("ResourceNotFoundException", "The specified log group does not exist.")
        names = body.get("logStreamNames")
        prefix = body.get("logStreamNamePrefix")
        if names and prefix:
            raise ApiError("InvalidParameterException",
                           "logStreamNames and logStreamNamePrefix are mutually exclusive")
        streams = [stream for name, stream in list(group.streams.items())
                   if (not names or name in names) and (not prefix or name.startswith(prefix))]
        start, end = body.get("startTime"), body.get("endTime")
        found: list[tuple[int, int, str, Any]] = []
        for stream in streams:
            events = stream.events
            for index in self._matching(stream, pattern, any_of, all_of):
                event = events[index]
                if (start is None or event.timestamp >= start) and (
                        end is None or event.timestamp <= end):
                    found.append((event.timestamp, event.event_id, stream.log_stream_name, event))
        found.sort(key=lambda f: (f[0], f[1]))
        token = body.get("nextToken")
        if token:
            after = tuple(int(x) for x in token.split(":"))
            found = [f for f in found if (f[0], f[1]) > after]
        limit = int(body.get("limit") or 10000)
        page, rest = found[:limit], found[limit:]
        answer: dict[str, Any] = {
            "events": [{"logStreamName": name, "timestamp": event.timestamp,
                        "message": event.message, "ingestionTime": event.ingestion_time,
                        "eventId": str(event.event_id)} for _, _, name, event in page],
            "searchedLogStreams": [{"logStreamName": s.log_stream_name,
                                    "searchedCompletely": True} for s in streams]}
        if rest:
            answer["nextToken"] = f"{page[-1][0]}:{page[-1][1]}"
        return answer

    def _matching(self, stream: Any, pattern: str, any_of: list[str], all_of: list[str]
                  ) -> list[int]:
        """Indexes of the stream's events that match, scanning only what came since the last
        call (a follower asks every second; the stream grows by thousands of lines)."""
        key = (id(stream), pattern)
        with self._lock:
            scanned, matches = self._matches.get(key, (0, []))
            events = stream.events
            upto = len(events)
            for index in range(scanned, upto):
                message = events[index].message
                if (not any_of or any(term in message for term in any_of)) and all(
                        term in message for term in all_of):
                    matches.append(index)
            self._matches[key] = (upto, matches)
            return list(matches)


_TERM = re.compile(r'\s*(\??)(?:"([^"]*)"|([^\s"]+))')


def parse_filter_pattern(pattern: str) -> tuple[list[str], list[str]]:
    """(any of, all of) the terms of an unstructured CloudWatch filter pattern."""
    if len(pattern) > 1024:
        raise ApiError("InvalidParameterException", "1 validation error detected: Value at "
                       "'filterPattern' failed to satisfy constraint: Member must have length "
                       "less than or equal to 1024")
    if pattern.lstrip()[:1] in ("{", "[", "%"):
        raise ApiError("InvalidParameterException",
                       "the fake serves unstructured term patterns only")
    any_of: list[str] = []
    all_of: list[str] = []
    position = 0
    while position < len(pattern.rstrip()):
        match = _TERM.match(pattern, position)
        if match is None or match.end() == position:
            raise ApiError("InvalidParameterException", f"Invalid filter pattern: {pattern!r}")
        term = match.group(2) if match.group(2) is not None else match.group(3)
        (any_of if match.group(1) else all_of).append(term)
        position = match.end()
    return any_of, all_of


# -- a TCP proxy that drops connections --------------------------------------------------------


class FlakyProxy:
    """Forwards 127.0.0.1:<port> to a target. ``drop_next(n)``: the next n connections are
    closed after their request arrives, unanswered; ``cut()``: every open connection is closed
    now (a network blip under pooled keep-alive connections)."""

    def __init__(self, target: str):
        host, _, port = target.removeprefix("http://").partition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._drop = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def drop_next(self, count: int) -> None:
        with self._lock:
            self._drop = count

    def cut(self) -> None:
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            _close(sock)

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self.listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            drop = self._drop > 0
            if drop:
                self._drop -= 1
                self.dropped += 1
        if drop:
            client.settimeout(5)
            try:
                client.recv(65536)
            except OSError:
                pass
            _close(client)
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _close(client)
            return
        with self._lock:
            self._open.update((client, upstream))
        pair = {client: upstream, upstream: client}
        try:
            while True:
                ready, _, _ = select.select(list(pair), [], [], 1.0)
                if self._closed:
                    break
                done = False
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        done = True
                        break
                    pair[sock].sendall(data)
                if done:
                    break
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                self._open.discard(client)
                self._open.discard(upstream)
            _close(client)
            _close(upstream)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
