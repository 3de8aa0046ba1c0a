"""The SageMaker provider: one attempt is one SageMaker training job.

``dryrun`` builds the exact ``CreateTrainingJob`` payload and the code package (nothing is sent,
nothing is written: `launch plan --provider sagemaker --json` prints it); ``schedule`` uploads the
package to S3 (once per content hash) and creates the job, adopting it when a retried create finds
that the first one got through; ``poll`` reads ``DescribeTrainingJob``; ``logs`` reads every
CloudWatch Logs stream of the job, paced within the account's read quota, and ``behind`` says how
far that read trails; ``events`` is a channel of its own for the templates' event lines and the
failure lines (``FilterLogEvents``, filtered by CloudWatch), so an out-of-memory error is seen in
seconds however much the job logs; ``stop`` is ``StopTrainingJob``.

How the job runs (why a custom entrypoint instead of the SageMaker training toolkit)
-----------------------------------------------------------------------------------
The image is the AWS PyTorch training container (the SMP v2 image for ``smp_v2`` plans), but the
command is ours, in ``AlgorithmSpecification.ContainerEntrypoint``/``ContainerArguments``::

    /bin/sh -c 'set -e; mkdir -p "$2"; tar -xzf "$1" -C "$2"; cd "$2"; shift 2; exec "$@"' launch \
        /opt/ml/input/data/code/sourcedir.tar.gz /opt/ml/code \
        python3 launch_sagemaker.py --nproc-per-node 8 \
        --resource-config /opt/ml/input/config/resourceconfig.json launch_train.py

SageMaker downloads the ``code`` channel (our ``sourcedir.tar.gz``) to ``/opt/ml/input/data/code``;
the shell unpacks it and ``launch_sagemaker.py`` (shipped in the package) reads SageMaker's
``resourceconfig.json`` (the hosts and this host's name) and execs ``torchrun`` with the node rank
and the first host as rendezvous master: the same torchrun line the local provider runs, plus
``--nnodes/--node_rank/--master_addr``. The script's own arguments (``launch SCRIPT -- ARGS``)
follow it, one element each (``_script_arguments`` says why there). Compared with the toolkit
route (``sagemaker_program`` and ``sagemaker_torch_distributed_enabled`` hyperparameters), the
request holds the whole command, so `launch plan` shows what will run and the tests run that
very command; the toolkit's conversion of hyperparameters into script arguments and its own
failure-file handling stay out of the way; and the SMP v2 image is driven the same way (SMP v2
runs under plain torchrun). Each ContainerEntrypoint/ContainerArguments element is limited to 256
characters, which is why the multi-node logic lives in a shipped file, not a ``sh -c`` one-liner.

Checkpoints: ``CheckpointConfig`` maps ``/opt/ml/checkpoints`` to ``s3://<bucket>/<prefix>/<run>/
checkpoints``, shared by every attempt of a run, and ``LAUNCH_CHECKPOINT_DIR`` points the template
there, so a resubmitted attempt starts from the newest checkpoint of the one that ran out of memory;
``LAUNCH_FAILURE_FILE``, at SageMaker's failure file, where its out-of-memory report goes. Nothing
from the launcher's environment goes into the request: no credentials in the hyperparameters, the
environment or the tags (the job gets the role's credentials).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from launcher import strategies
from launcher.plan.plan import Plan
from launcher.providers.base import Job, JobStatus, Provider, torchrun_script_args
from launcher.providers.checks import Check
from launcher.providers.sagemaker.logs import SageMakerLogs
from launcher.providers.sagemaker.package import (
    BOOTSTRAP_NAME,
    CHECKPOINT_LOCAL,
    CODE_ARCHIVE,
    CODE_CHANNEL,
    CODE_DIR,
    FAILURE_FILE,
    RESOURCE_CONFIG,
    CodePackage,
    build_package,
)
from launcher.providers.sagemaker.settings import (
    DEFAULT_VOLUME_GB,
    SageMakerSettings,
    job_name,
    status_of,
)
from launcher.status import BadValue, LaunchError, ProviderError, UsageError

#: Check the code channel's archive against the hash the job was created with (jobs can write to
#: the bucket), unpack it and run the rest of the arguments there. "$1" archive, "$2" folder,
#: "$3" its sha256.
ENTRY_SHELL = ('set -e; echo "$3  $1" | sha256sum -c --status || { echo "launch: $1 is not '
               'the archive this job was created with" >&2; exit 1; }; mkdir -p "$2"; '
               'tar -xzf "$1" -C "$2"; cd "$2"; shift 3; exec "$@"')
MASTER_PORT = 29500
#: CreateTrainingJob's limits on ContainerArguments: 100 elements of at most 256 characters,
#: each matching ``.*`` (no line break).
MAX_ARGUMENTS, MAX_ARGUMENT = 100, 256
_LINE_BREAKS = ("\n", "\r", "\x85", "\u2028", "\u2029")
#: SageMaker's ways of saying it had no machines to give (its CapacityError, EC2's
#: InsufficientInstanceCapacity), or took them away: the same plan is worth another attempt
#: (:meth:`SageMakerProvider.lost_capacity`).
CAPACITY_PATTERNS = ("CapacityError", "InsufficientInstanceCapacity", "insufficient capacity")
#: "ml.m5.xlarge" and friends: real instance types, without a GPU.
NO_GPU_FAMILY = re.compile(r"^ml\.(?:[mcrtz]\d|trn\d|inf\d|x\d)")


@dataclass(frozen=True)
class SageMakerRequest:
    """What ``schedule`` sends: ``kwargs`` is passed as is to ``create_training_job``."""

    region: str
    kwargs: dict[str, Any]
    package: CodePackage
    run_id: str
    attempt: int
    record_dir: str | None = field(default=None, compare=False)  # where request.json is kept
    #: Where the training image came from: the SDK call that named it, or the image setting.
    image_source: dict[str, str] | None = None

    @property
    def job_name(self) -> str:
        return self.kwargs["TrainingJobName"]

    def to_dict(self) -> dict[str, Any]:
        return {"api": "sagemaker:CreateTrainingJob", "region": self.region,
                "create_training_job": json.loads(json.dumps(self.kwargs)),
                **({"training_image": self.image_source} if self.image_source else {}),
                "code_package": self.package.to_dict(),
                **({"upload": self.package.upload.to_dict()} if self.package.upload else {})}


def _repackaged(request: SageMakerRequest, package: CodePackage) -> SageMakerRequest:
    """``request`` with the code channel reading ``package`` (uploaded under another key)."""
    kwargs = json.loads(json.dumps(request.kwargs))
    for channel in kwargs["InputDataConfig"]:
        if channel["ChannelName"] == CODE_CHANNEL:
            channel["DataSource"]["S3DataSource"]["S3Uri"] = package.channel_uri
    return replace(request, kwargs=kwargs, package=package)


def _metric_definitions() -> list[dict[str, str]]:
    """Rank 0's numbers from the templates' metrics lines, as SageMaker metrics (console graphs
    and CloudWatch), read from the JSON the template prints."""
    head = r'"launch": "metrics", "rank": 0, '
    number = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
    return [
        {"Name": "train:loss", "Regex": head + r'"step": \d+, "loss": ' + number},
        {"Name": "train:samples_per_s", "Regex": head + r'.*"samples_per_s": ' + number},
        {"Name": "gpu:peak_allocated_bytes", "Regex": head + r'.*"peak_allocated_bytes": (\d+)'},
    ]


def _script_arguments(args: tuple[str, ...], taken: int) -> list[str]:
    """The script's own arguments, for after it in ContainerArguments.

    Why there: the entry shell ends in ``exec "$@"``, quoted, so each element reaches the
    bootstrap as one argv element, unexpanded (``$HOME`` and ``it's`` arrive as written), and
    the bootstrap hands what follows the script to torchrun, which hands it to the script (the
    framework shim, to the script it runs). The request shows the whole command, as it runs.
    HyperParameters would not do: with our own entrypoint SageMaker passes them to nothing but
    a file, as ``--key value`` pairs of strings; an environment variable holds 512 characters
    in all. What CreateTrainingJob would refuse (an element over 256 characters, more than 100
    in all, a line break) and what torchrun would misread is refused here, in one line."""
    for arg in args:
        shown = arg if len(arg) <= 40 else arg[:37] + "..."
        if len(arg) > MAX_ARGUMENT:
            raise BadValue(f"the script's argument {shown!r} is {len(arg)} characters; "
                             f"SageMaker allows {MAX_ARGUMENT} in a container argument",
                             "pass a file holding the long value instead")
        if any(brk in arg for brk in _LINE_BREAKS):
            raise BadValue(f"the script's argument {shown!r} holds a line break, which "
                             "SageMaker refuses in a container argument")
    if taken + len(args) > MAX_ARGUMENTS:
        raise BadValue(f"{len(args)} script arguments are too many for SageMaker: with "
                         f"launch's own {taken}, the container's arguments may be "
                         f"{MAX_ARGUMENTS}", "pass some of them in a file instead")
    return torchrun_script_args(args)


def _volume_gb(plan: Plan, configured: int | None) -> int:
    """The training volume holds the checkpoints (kept ones, the one being written, and those
    downloaded on resume): three copies of the model and optimizer states, plus 30 GB of room;
    SageMaker's 30 GB when the plan does not know its state sizes."""
    if configured is not None:
        return configured
    memory = plan.memory
    if memory.parameters is None or memory.optimizer is None:
        return DEFAULT_VOLUME_GB
    shards = plan.world_size if strategies.get(plan.strategy).sharded else 1
    states = (memory.parameters + memory.optimizer) * shards
    return max(DEFAULT_VOLUME_GB, math.ceil(3 * states / 2**30) + DEFAULT_VOLUME_GB)


# -- the provider ------------------------------------------------------------------------------


class SageMakerProvider(SageMakerLogs, Provider):
    """One attempt = one training job; the job id is the training job's name.

    Reads of one job (describe, log streams) happen at most once per ``api_interval_s``: the
    supervisor asks several times a second, SageMaker's and CloudWatch's read quotas are a few
    calls a second per account.
    """

    name = "sagemaker"
    has_doctor: ClassVar[bool] = True
    capacity_patterns: ClassVar[tuple[str, ...]] = CAPACITY_PATTERNS
    # Its name, the container's /opt/ml/ tree, the training toolkit's error names, its hosts.
    platform_pattern: ClassVar[str] = (
        r"[Ss]age[Mm]aker|/opt/ml/|AlgorithmError|ExecuteUserScriptError|\balgo-\d+\b")
    platform_needles: ClassVar[tuple[str, ...]] = (
        "sagemaker", "/opt/ml/", "algorithmerror", "executeuserscripterror", "algo-")

    def __init__(self, settings: SageMakerSettings, environ: Mapping[str, str] | None = None):
        self.settings = settings
        self.environ = dict(os.environ if environ is None else environ)
        self._region: str | None = None
        if (settings.region or self.environ.get("AWS_REGION")
                or self.environ.get("AWS_DEFAULT_REGION")):
            # Checked now, so a malformed region stops even `launch plan` (exit 2); only the
            # profile's region waits for first use (finding it imports botocore).
            from launcher.providers.sagemaker._aws import resolve_region

            self._region = resolve_region(settings.region, self.environ)
        self._aws_handle: Any = None
        self._described: dict[str, tuple[float, dict[str, Any]]] = {}
        self._fetched: dict[str, float] = {}
        self._queried: dict[str, float] = {}  # job -> when its event channel was last asked
        self._listed: dict[str, float] = {}   # job -> when its log streams were last listed
        self._no_events = False  # FilterLogEvents was denied: the full log only
        self._notes: dict[str, list[str]] = {}  # job -> launch's own lines for the next logs()

    @classmethod
    def from_settings(cls, settings: dict[str, Any], environ: dict[str, str] | None = None
                      ) -> SageMakerProvider:
        return cls(SageMakerSettings.from_mapping(settings), environ)

    @classmethod
    def doctor_checks(cls, settings: Mapping[str, Any], environ: Mapping[str, str]
                      ) -> list[Check]:
        """Region, credentials, identity, image, bucket, bucket write, role, permissions and
        quota (launcher/providers/sagemaker/doctor.py), through this provider's own plumbing."""
        from launcher.providers.sagemaker.doctor import doctor_checks

        return doctor_checks(settings, environ)

    # -- configuration ---------------------------------------------------------------------

    @property
    def region(self) -> str:
        if self._region is None:
            from launcher.providers.sagemaker._aws import resolve_region

            self._region = resolve_region(self.settings.region, self.environ)
        return self._region

    def _aws(self) -> Any:
        """The AWS session and clients, credentials checked (fast) on first use."""
        if self._aws_handle is None:
            from launcher.providers.sagemaker._aws import Aws, ClientSettings

            s = self.settings
            self._aws_handle = Aws(self.region, self.environ, ClientSettings(
                retry_mode=s.aws_retry_mode, max_attempts=s.aws_max_attempts,
                connect_timeout_s=s.aws_connect_timeout_s, read_timeout_s=s.aws_read_timeout_s,
                status_deadline_s=s.aws_status_deadline_s))
        self._aws_handle.check_credentials()
        return self._aws_handle

    def check_settings(self) -> tuple[str, str]:
        """(role, bucket), or the one line that says which is missing and how to give it. The
        dry run calls it; a caller that wants to fail before planning may call it first."""
        role, bucket = self.settings.role, self.settings.bucket_name
        if not role:
            raise UsageError("SageMaker needs an execution role for the job",
                             "pass --role arn:aws:iam::<account>:role/<name> (or LAUNCH_ROLE, or "
                             "role in launch.toml)")
        if not bucket:
            raise UsageError("SageMaker needs an S3 bucket for the code, checkpoints and output",
                             "pass --bucket NAME (or LAUNCH_BUCKET, or bucket in launch.toml)")
        return role, bucket

    # -- dry run ---------------------------------------------------------------------------

    def machine(self, plan: Plan) -> Any:
        """The catalog entry of the plan's instance type; one line when it is not a GPU
        training instance SageMaker offers."""
        from launcher.plan.catalog import UnknownMachine, load_catalog

        catalog = load_catalog("sagemaker")
        name = plan.machine
        try:
            machine = catalog.get(name)
        except UnknownMachine as exc:
            if NO_GPU_FAMILY.match(name.strip().lower()):
                raise UsageError(f"{name} has no GPU; launch plans GPU training jobs",
                                 "run `launch machines --provider sagemaker` for the GPU "
                                 "instance types") from None
            raise UsageError(exc.message, "run `launch machines --provider sagemaker`") from None
        if plan.gpus_per_node > machine.gpu_count:
            raise UsageError(f"{machine.name} has {machine.gpu_count} GPU(s), not "
                             f"{plan.gpus_per_node}", "lower --gpus-per-node or pick a larger "
                             "machine")
        if plan.nodes < 1:
            raise UsageError(f"a SageMaker job needs at least one instance, not {plan.nodes}")
        return machine

    def dryrun(self, job: Job) -> SageMakerRequest:
        """The exact CreateTrainingJob call and code package for ``job``. Reads the code folder;
        sends and writes nothing, needs no credentials."""
        from launcher.providers.images import check_image
        from launcher.providers.sagemaker.sdk import request_image

        role, bucket = self.check_settings()
        s = self.settings
        plan = job.plan
        machine = self.machine(plan)
        region = self.region
        image_source = request_image(s.image, s.torch_version, s.py_version, region, plan,
                                     machine.name)
        image = image_source["uri"]
        check_image(image, plan.strategy, plan.optimizer, self.name)  # its torch: images.py
        name = job_name(job.run_id, job.attempt, s.job_prefix)
        package = build_package(job, bucket, s.prefix, self.environ)
        run_root = "/".join(p for p in (s.prefix, job.run_id) if p)

        environment = {
            **job.rendered.env,
            "LAUNCH_CHECKPOINT_DIR": CHECKPOINT_LOCAL,
            "LAUNCH_FAILURE_FILE": FAILURE_FILE,
            "LAUNCH_PLAN": "plan.json",
            "LAUNCH_RUN_ID": job.run_id,
            "LAUNCH_ATTEMPT": str(job.attempt),
            "LAUNCH_PROVIDER": "sagemaker",
            "PYTHONUNBUFFERED": "1",  # lines reach CloudWatch as they are printed
        }
        for key, value in environment.items():
            if len(value) > 512:
                raise UsageError(f"environment variable {key} is {len(value)} characters; "
                                 "SageMaker allows 512")
        hyperparameters = {
            "strategy": plan.strategy, "micro_batch_size": str(plan.micro_batch_size),
            "grad_accum_steps": str(plan.grad_accum_steps),
            "global_batch_size": str(plan.global_batch_size), "precision": plan.precision,
            "optimizer": plan.optimizer,
            "activation_checkpointing": str(plan.activation_checkpointing).lower(),
            "lr": repr(float(plan.lr)), "nodes": str(plan.nodes),
            "gpus_per_node": str(plan.gpus_per_node), "launch_run_id": job.run_id,
            "launch_attempt": str(job.attempt),
        }
        if plan.steps is not None:  # None: a framework script's own length, not "None"
            hyperparameters["steps"] = str(plan.steps)
        max_run = s.max_run_s
        if s.budget is not None and plan.cost_per_hour_usd:
            # A hard stop from SageMaker itself: no attempt runs longer than the whole budget
            # pays for, even when the launcher that follows it is gone.
            max_run = min(max_run, max(1, int(s.budget / plan.cost_per_hour_usd * 3600)))
        stopping: dict[str, int] = {"MaxRuntimeInSeconds": max_run}
        if s.spot:
            stopping["MaxWaitTimeInSeconds"] = max(s.max_wait_s or 2 * max_run, max_run)
        arguments = [
            CODE_ARCHIVE, CODE_DIR, package.sha256,
            "python3", BOOTSTRAP_NAME, "--nproc-per-node", str(plan.gpus_per_node),
            "--resource-config", RESOURCE_CONFIG, "--master-port", str(MASTER_PORT),
            package.entrypoint,
        ]
        for argument in arguments:
            if len(argument) > MAX_ARGUMENT:
                raise UsageError(f"the script path {argument[:60]}... is longer than the 256 "
                                 "characters SageMaker allows in a container argument")
        arguments += _script_arguments(job.rendered.args, len(arguments))
        kwargs: dict[str, Any] = {
            "TrainingJobName": name,
            "RoleArn": role,
            "AlgorithmSpecification": {
                "TrainingImage": image,
                "TrainingInputMode": "File",
                "ContainerEntrypoint": ["/bin/sh", "-c", ENTRY_SHELL, "launch"],
                "ContainerArguments": arguments,
                "MetricDefinitions": _metric_definitions(),
            },
            "HyperParameters": hyperparameters,
            "Environment": environment,
            "InputDataConfig": [{
                "ChannelName": CODE_CHANNEL,
                "DataSource": {"S3DataSource": {
                    "S3DataType": "S3Prefix", "S3Uri": package.channel_uri,
                    "S3DataDistributionType": "FullyReplicated"}},
                "InputMode": "File",
                "CompressionType": "None",
            }],
            "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/{run_root}/output"},
            "ResourceConfig": {"InstanceType": machine.name, "InstanceCount": plan.nodes,
                               "VolumeSizeInGB": _volume_gb(plan, s.volume_size_gb)},
            "StoppingCondition": stopping,
            "CheckpointConfig": {"S3Uri": f"s3://{bucket}/{run_root}/checkpoints",
                                 "LocalPath": CHECKPOINT_LOCAL},
            "EnableManagedSpotTraining": bool(s.spot),
            "Tags": [
                {"Key": "launch:run-id", "Value": job.run_id},
                {"Key": "launch:attempt", "Value": str(job.attempt)},
                {"Key": "launch:strategy", "Value": plan.strategy},
                {"Key": "launch:code-sha256", "Value": package.sha256[:24]},
            ],
        }
        return SageMakerRequest(region=region, kwargs=kwargs, package=package,
                                run_id=job.run_id, attempt=job.attempt,
                                record_dir=str(job.attempt_dir), image_source=image_source)

    # -- submission ------------------------------------------------------------------------

    def schedule(self, request: SageMakerRequest) -> str:  # type: ignore[override]
        """Upload the package (unless that hash is there), then create the job. Idempotent: the
        name is fixed per run and attempt, and a create that AWS may have executed before the
        connection broke or the call was throttled is followed by a describe that adopts it."""
        from launcher.statefiles import write_json

        aws = self._aws()
        if request.record_dir:
            write_json(Path(request.record_dir) / "request.json", request.to_dict())
        self._check_role(aws, request.kwargs["RoleArn"])
        package = self._upload(aws, request.package)
        if package != request.package:  # another object held its key: see _upload
            request = _repackaged(request, package)
            if request.record_dir:
                write_json(Path(request.record_dir) / "request.json", request.to_dict())
            self._notes.setdefault(request.job_name, []).append(
                f"[sagemaker] {package.instead_of} holds other bytes than launch uploaded there "
                f"(someone who can write the bucket put them); the job reads {package.s3_uri} "
                "instead. Delete that object so that later launches reuse one upload")
        name = request.job_name
        sagemaker = aws.client("sagemaker")
        try:
            sagemaker.create_training_job(**request.kwargs)
        except Exception as exc:
            from launcher.providers.sagemaker._aws import error_code, error_message, is_transient

            code = error_code(exc)
            exists = code == "ResourceInUse" or (
                code == "ValidationException" and "already exists" in error_message(exc))
            if not exists and not is_transient(exc):
                raise self._error(exc, f"creating training job {name}") from None
            adopted = self._adopt(request.job_name, request.run_id, request.attempt)
            if adopted is None:
                raise self._error(exc, f"creating training job {name}") from None
        self._described.pop(name, None)
        return name

    def adopt(self, run_id: str, attempt: int, attempt_dir: Path) -> str | None:
        """An attempt's job, by the deterministic name its dry run gave it."""
        return self._adopt(job_name(run_id, attempt, self.settings.job_prefix), run_id, attempt)

    def _adopt(self, name: str, run_id: str, attempt: int) -> str | None:
        """The job of this name, when it is this run's attempt (its environment says so)."""
        try:
            description = self._aws().read("sagemaker", "describe_training_job",
                                           TrainingJobName=name)
        except LaunchError:
            raise
        except Exception as exc:
            from launcher.providers.sagemaker._aws import error_code

            if error_code(exc) == "ValidationException":  # "Requested resource not found"
                return None
            raise self._error(exc, f"describing training job {name}") from None
        environment = description.get("Environment") or {}
        if (environment.get("LAUNCH_RUN_ID") == run_id
                and environment.get("LAUNCH_ATTEMPT") == str(attempt)):
            return name
        raise ProviderError(f"a SageMaker training job named {name} already exists and is not "
                            f"attempt {attempt} of run {run_id}",
                            "job names are unique per account and region; set another "
                            "job_prefix")

    def _check_role(self, aws: Any, role: str) -> None:
        """A role that does not exist is one clear line here instead of a ValidationException
        later; without iam:GetRole permission the check is skipped (CreateTrainingJob checks)."""
        from launcher.providers.sagemaker._aws import error_code

        role_name = role.rsplit("/", 1)[-1]
        try:
            aws.client("iam").get_role(RoleName=role_name)
        except Exception as exc:
            if error_code(exc) == "NoSuchEntity":
                raise ProviderError(f"the IAM role {role} does not exist",
                                    "create a SageMaker execution role or pass another --role"
                                    ) from None
            return

    def _upload(self, aws: Any, package: CodePackage) -> CodePackage:
        """Put the archive at its content-addressed key unless an object with its very bytes is
        there; return the package as uploaded: at its own key, or at a fresh one.

        Whoever can write the bucket (every job's role can) can put other bytes under the key,
        with the size and the ``x-amz-meta-sha256`` of ours: metadata is the writer's word. What
        S3 vouches for is the ``ChecksumSHA256`` it verified on upload (launch uploads with one):
        an object is reused when that is the package's SHA-256; one without a SHA-256 checksum
        (an upload by an older launch) when it has the package's size and, downloaded, its
        bytes. Otherwise the package goes to ``code/<hash>-<random>/``, a key nobody can have
        taken before. Every upload is create-only (``If-None-Match: *``): an object launch did
        not write is never overwritten, and two launches racing for a key cannot overwrite each
        other."""
        import secrets

        from launcher.providers.sagemaker._aws import error_code

        s3 = aws.client("s3")

        def holds_it(key: str) -> bool | None:
            """Whether ``key`` holds the package's bytes; None when there is no such object."""
            try:
                head = s3.head_object(Bucket=package.bucket, Key=key, ChecksumMode="ENABLED")
            except Exception as exc:
                if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise self._error(exc, f"reading s3://{package.bucket}/{key}") from None
            if head.get("ContentLength") != package.size_bytes:
                return False
            if head.get("ChecksumSHA256"):
                return head["ChecksumSHA256"] == package.sha256_base64
            try:
                body = s3.get_object(Bucket=package.bucket, Key=key)["Body"].read()
            except Exception as exc:
                raise self._error(exc, f"reading s3://{package.bucket}/{key}") from None
            return hashlib.sha256(body).hexdigest() == package.sha256

        def create(target: CodePackage) -> bool:
            try:
                s3.put_object(Bucket=target.bucket, Key=target.key, Body=target.data,
                              ContentType="application/gzip", Metadata={"sha256": target.sha256},
                              ChecksumAlgorithm="SHA256", ChecksumSHA256=target.sha256_base64,
                              IfNoneMatch="*")
            except Exception as exc:
                if error_code(exc) in ("PreconditionFailed", "ConditionalRequestConflict"):
                    return False  # someone created it first
                if error_code(exc) == "NoSuchBucket":
                    raise ProviderError(f"the S3 bucket {target.bucket} does not exist",
                                        f"create it in {self.region} or pass another --bucket"
                                        ) from None
                raise self._error(exc, f"uploading the code to {target.s3_uri}") from None
            return True

        for _ in range(3):  # absent: create it; created meanwhile by someone: look at it
            found = holds_it(package.key)
            if found is not None:
                break
            if create(package):
                return package
        if found:
            return package
        for _ in range(3):  # a taken key of 64 random bits was guessed: draw again
            fresh = package.elsewhere(secrets.token_hex(8))
            if create(fresh):
                return fresh
        raise ProviderError(f"could not upload the code next to {package.s3_uri}: every key "
                            "tried was taken",
                            "someone is writing objects under code/ in the bucket as fast as "
                            "launch: check who can write to it")

    # -- following -------------------------------------------------------------------------

    def _describe(self, job_id: str, max_age: float | None = None) -> dict[str, Any]:
        """DescribeTrainingJob, at most once per ``api_interval_s`` per job, within
        ``aws_status_deadline_s`` (an endpoint that never answers is one line, exit 6, in
        seconds). After retries fail on throttling or the connection, the last answer stands in
        (the job has not moved backwards), so a blip does not end the watch."""
        from launcher.providers.sagemaker._aws import error_code, is_transient

        age = self.settings.api_interval_s if max_age is None else max_age
        cached = self._described.get(job_id)
        now = time.monotonic()
        if cached is not None and now - cached[0] < age:
            return cached[1]
        try:
            description = self._aws().read("sagemaker", "describe_training_job",
                                           TrainingJobName=job_id)
        except Exception as exc:
            if cached is not None and is_transient(exc):
                return cached[1]
            if error_code(exc) == "ValidationException":
                raise ProviderError(f"no SageMaker training job named {job_id} in {self.region}",
                                    "check --region (or AWS_REGION)") from None
            raise self._error(exc, f"describing training job {job_id}") from None
        self._described[job_id] = (now, description)
        return description

    def poll(self, job_id: str) -> JobStatus:
        return status_of(self._describe(job_id))
    def stop(self, job_id: str) -> None:
        """StopTrainingJob; a job that is stopping or has ended already is left alone."""
        from launcher.providers.sagemaker._aws import error_code

        try:
            self._aws().client("sagemaker").stop_training_job(TrainingJobName=job_id)
        except Exception as exc:
            if error_code(exc) != "ValidationException":
                raise self._error(exc, f"stopping training job {job_id}") from None
            status = self._describe(job_id, max_age=0).get("TrainingJobStatus")
            if status not in ("Stopping", "Stopped", "Completed", "Failed"):
                raise self._error(exc, f"stopping training job {job_id}") from None
        self._described.pop(job_id, None)

    def _error(self, exc: BaseException, doing: str) -> ProviderError:
        from launcher.providers.sagemaker._aws import provider_error

        return provider_error(exc, doing)

