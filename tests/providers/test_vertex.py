"""The Vertex AI provider against wire-level fakes on 127.0.0.1, driven by the real clients.

``tests/fakes/vertex_server.py`` serves JobService and LoggingServiceV2 over gRPC and REST; Cloud
Storage is gcp-storage-emulator. Nothing here reaches Google: every endpoint is overridden through
the environment variables the provider documents (LAUNCH_VERTEX_ENDPOINT, LAUNCH_LOGGING_ENDPOINT,
STORAGE_EMULATOR_HOST), and the timing knobs are set near zero so a poll loop takes milliseconds.
"""

from __future__ import annotations

import io
import json
import socket
import tarfile
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.cloud.aiplatform_v1")
pytest.importorskip("google.cloud.logging")
pytest.importorskip("gcp_storage_emulator")

from launcher.plan.plan import Plan  # noqa: E402
from launcher.providers import vertex  # noqa: E402
from launcher.providers.base import Job  # noqa: E402
from launcher.providers.vertex import VertexProvider  # noqa: E402
from launcher.render import TrainSettings, render  # noqa: E402
from launcher.status import ExitStatus, ProviderError, UsageError  # noqa: E402
from tests.conftest import TINY_RECIPE  # noqa: E402
from tests.fakes.record import record  # noqa: E402
from tests.fakes.vertex_server import (  # noqa: E402
    FakeVertex,
    execute,
    finish,
    flood,
    log,
    sleep,
    state,
    wait_cancel,
    wait_read,
)
from tests.test_packaging import (  # noqa: E402
    AWS_KEY_ID,
    AWS_SECRET,
    PLANTED_KEPT,
    PLANTED_SKIPPED,
    plant_secrets,
)

PROJECT = "launch-test"
REGION = "us-central1"
RUN_ID = "train-20260801-120000-ab12"


# -- fixtures ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def storage_emulator():
    from gcp_storage_emulator.server import create_server

    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def storage(storage_emulator):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    return gcs.Client(project=PROJECT, credentials=AnonymousCredentials(),
                      client_options={"api_endpoint": storage_emulator})


@pytest.fixture
def bucket(storage) -> str:
    name = f"launch-test-{uuid.uuid4().hex[:8]}"
    storage.create_bucket(name)
    return name


@pytest.fixture
def fake(storage_emulator, tmp_path):
    """The fake without Cloud Logging's read quota: these tests poll every few milliseconds (the
    timings are set near zero). The tests of a flooding job keep the quota on."""
    with FakeVertex(project=PROJECT, storage_host=storage_emulator,
                    mount_root=tmp_path / "gcs-mount", read_quota=None) as server:
        yield server


def vertex_env(fake: FakeVertex, storage_emulator: str, transport: str = "rest",
               **extra: str) -> dict[str, str]:
    endpoint = fake.grpc_endpoint if transport == "grpc" else fake.rest_endpoint
    return {
        "LAUNCH_VERTEX_ENDPOINT": endpoint, "LAUNCH_LOGGING_ENDPOINT": endpoint,
        "STORAGE_EMULATOR_HOST": storage_emulator,
        "LAUNCH_VERTEX_POLL_S": "0", "LAUNCH_VERTEX_LOG_POLL_S": "0",
        "LAUNCH_VERTEX_EVENT_POLL_S": "0", "LAUNCH_VERTEX_LOG_READS_PER_MIN": "100000",
        "LAUNCH_VERTEX_LOG_SETTLE_S": "0.3", "LAUNCH_VERTEX_RETRY_INITIAL_S": "0.05",
        "LAUNCH_VERTEX_RPC_TIMEOUT_S": "20", **extra,
    }


def provider_for(fake: FakeVertex, storage_emulator: str, bucket: str = "launch-bucket",
                 transport: str = "rest", **settings: Any) -> VertexProvider:
    return VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION, "bucket": bucket, **settings},
        vertex_env(fake, storage_emulator, transport))


def make_plan(**changes: Any) -> Plan:
    plan = Plan(strategy="ddp", machine="a2-highgpu-2g", nodes=1, gpus_per_node=2,
                micro_batch_size=4, grad_accum_steps=1, global_batch_size=8, precision="bf16_mixed",
                optimizer="adamw", activation_checkpointing=False, steps=4, lr=0.01)
    return plan.replace(**changes)


def make_job(tmp_path: Path, plan: Plan | None = None, *, attempt: int = 1, mode: str = "recipe",
             recipe: str = TINY_RECIPE, run_id: str = RUN_ID) -> Job:
    plan = plan or make_plan()
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    script = code / "train.py"
    if not script.exists() or script.read_text() != textwrap.dedent(recipe):
        script.write_text(textwrap.dedent(recipe))
    run = tmp_path / "state" / "runs" / run_id
    settings = TrainSettings(recipe_file=str(script), mode=mode, run_id=run_id, attempt=attempt,  # type: ignore[arg-type]
                             checkpoint_dir=str(run / "checkpoints"))
    rendered = render(plan, settings)
    attempt_dir = run / f"attempt-{attempt}"
    rendered.write(attempt_dir / "job")
    return Job(run_id=run_id, attempt=attempt, plan=plan, rendered=rendered,
               job_dir=attempt_dir / "job", attempt_dir=attempt_dir,
               checkpoint_dir=run / "checkpoints", code_dir=code)


def follow(provider: VertexProvider, job_id: str, timeout: float = 60.0,
           cursor: Any = None) -> tuple[list[str], Any, Any]:
    """The supervisor's loop: poll, read, stop at the first empty read after a terminal state."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = provider.poll(job_id)
        new, cursor = provider.logs(job_id, cursor)
        json.dumps(cursor)  # the cursor is plain JSON, always
        lines += new
        if status.terminal and not new:
            return lines, status, cursor
        if not new:
            time.sleep(0.02)
    raise AssertionError(f"job did not end; lines so far: {lines}")


def output(lines: list[str]) -> list[str]:
    """The replicas' lines, without the provider's own [vertex] progress lines."""
    return [line for line in lines if not line.startswith("[vertex]")]


def metrics(rank: int, step: int) -> str:
    return (f'[rank{rank}]:{{"launch": "metrics", "rank": {rank}, "step": {step}, "loss": 1.5, '
            f'"device": "cuda"}}')


def parse_job(custom_job: dict[str, Any]) -> Any:
    from google.cloud.aiplatform_v1.types import CustomJob
    from google.protobuf import json_format

    message = CustomJob()
    json_format.ParseDict(custom_job, CustomJob.pb(message))  # strict: unknown fields raise
    return message


def env_of(custom_job: dict[str, Any], pool: int = 0) -> dict[str, str]:
    container = custom_job["jobSpec"]["workerPoolSpecs"][pool]["containerSpec"]
    return {e["name"]: e["value"] for e in container["env"]}


def read_archive(storage: Any, uri: str) -> dict[str, bytes]:
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    data = storage.bucket(bucket).blob(name).download_as_bytes()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


# -- the request ---------------------------------------------------------------------------------


def test_request_is_a_customjob_built_without_side_effects(tmp_path):
    # Endpoints that nothing listens on: a dry run that tried to connect would fail.
    dead = f"http://127.0.0.1:{_free_port()}"
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION, "bucket": "gs://launch-bucket/team-a"},
        {"LAUNCH_VERTEX_ENDPOINT": dead, "LAUNCH_LOGGING_ENDPOINT": dead,
         "STORAGE_EMULATOR_HOST": dead})
    job = make_job(tmp_path)
    request = provider.dryrun(job)
    data = request.to_dict()
    assert data["parent"] == f"projects/{PROJECT}/locations/{REGION}"
    custom_job = data["customJob"]

    # Canonical proto3 JSON of a CustomJob: it parses strictly and prints back unchanged.
    from google.cloud.aiplatform_v1.types import CustomJob
    from google.protobuf import json_format

    assert json_format.MessageToDict(CustomJob.pb(parse_job(custom_job))) == custom_job

    assert custom_job["displayName"] == f"launch-{RUN_ID}-attempt-1"
    assert custom_job["labels"] == {"launch_run_id": RUN_ID, "launch_attempt": "1",
                                    "launched_by": "launch"}
    spec = custom_job["jobSpec"]
    assert spec["baseOutputDirectory"] == {
        "outputUriPrefix": f"gs://launch-bucket/team-a/runs/{RUN_ID}"}
    assert spec["scheduling"] == {"timeout": "604800s", "disableRetries": True}
    assert "serviceAccount" not in spec
    (pool,) = spec["workerPoolSpecs"]
    assert pool["replicaCount"] == "1"
    assert pool["machineSpec"] == {"machineType": "a2-highgpu-2g",
                                   "acceleratorType": "NVIDIA_TESLA_A100", "acceleratorCount": 2}
    container = pool["containerSpec"]
    assert container["imageUri"] == (
        "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest")
    assert container["command"] == ["python3", "-c", vertex.BOOTSTRAP]
    assert container["args"] == ["--nproc_per_node", "2", "--tee", "3", "launch_train.py"]
    env = env_of(custom_job)
    assert env["LAUNCH_CHECKPOINT_DIR"] == f"/gcs/launch-bucket/team-a/runs/{RUN_ID}/checkpoints"
    assert env["LAUNCH_MICRO_BATCH_SIZE"] == "4" and env["LAUNCH_PLAN"] == "plan.json"
    assert env["LAUNCH_RUN_ID"] == RUN_ID and env["LAUNCH_ATTEMPT"] == "1"
    assert env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]:"
    code_uri, job_uri = env["LAUNCH_STAGED"].split()
    assert code_uri.startswith("gs://launch-bucket/team-a/staging/code-")
    assert job_uri.startswith("gs://launch-bucket/team-a/staging/job-")
    assert [s["uri"] for s in data["staging"]] == [code_uri, job_uri]
    # Nothing local leaks into what runs on Vertex AI.
    assert str(tmp_path) not in json.dumps(custom_job)
    # plan.json, as staged: the recipe under code/, checkpoints in the bucket.
    staged_plan = next(m for m in request.staging[1].members if m.name == "plan.json")
    document = json.loads(staged_plan.text or "")
    assert document["recipe_file"] == "code/train.py"
    assert document["checkpoint_dir"] == env["LAUNCH_CHECKPOINT_DIR"]
    # Nothing was written but the local job files the supervisor had already rendered.
    assert not (job.attempt_dir / "request.json").exists()


def test_multi_node_spot_account_image_and_timeout(tmp_path):
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": "europe-west4", "bucket": "launch-bucket", "spot": True,
         "service_account": "trainer@launch-test.iam.gserviceaccount.com", "timeout": "90m",
         "image": "europe-docker.pkg.dev/team/images/trainer:7"},
        {"LAUNCH_VERTEX_ENDPOINT": "http://127.0.0.1:9"})
    plan = make_plan(machine="a3-highgpu-8g", nodes=3, gpus_per_node=8, global_batch_size=96)
    custom_job = provider.dryrun(make_job(tmp_path, plan)).to_dict()["customJob"]
    parse_job(custom_job)
    spec = custom_job["jobSpec"]
    primary, workers = spec["workerPoolSpecs"]
    assert primary["replicaCount"] == "1" and workers["replicaCount"] == "2"
    assert primary["machineSpec"] == workers["machineSpec"] == {
        "machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
        "acceleratorCount": 8}
    assert primary["containerSpec"] == workers["containerSpec"]
    assert primary["containerSpec"]["imageUri"] == "europe-docker.pkg.dev/team/images/trainer:7"
    assert spec["scheduling"] == {"timeout": "5400s", "disableRetries": True, "strategy": "SPOT"}
    assert spec["serviceAccount"] == "trainer@launch-test.iam.gserviceaccount.com"
    assert provider.parent == f"projects/{PROJECT}/locations/europe-west4"


def test_plain_script_runs_from_the_staged_code_folder(tmp_path):
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION, "bucket": "launch-bucket"},
        {"LAUNCH_VERTEX_ENDPOINT": "http://127.0.0.1:9"})
    request = provider.dryrun(make_job(tmp_path, mode="script", recipe="print('hi')\n"))
    args = request.custom_job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"]
    assert args[-1] == "code/train.py"
    assert [m.name for m in request.staging[1].members] == ["plan.json"]
    assert [m.name for m in request.staging[0].members] == ["code/train.py"]


def test_content_hashes_name_what_changed_only(tmp_path):
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION, "bucket": "launch-bucket"},
        {"LAUNCH_VERTEX_ENDPOINT": "http://127.0.0.1:9"})
    (tmp_path / "code" / "__pycache__").mkdir(parents=True)
    (tmp_path / "code" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"junk")
    (tmp_path / "code" / ".git").mkdir()
    (tmp_path / "code" / ".git" / "HEAD").write_text("ref: main")
    (tmp_path / "code" / "model.py").write_text("WIDTH = 16\n")
    first = provider.dryrun(make_job(tmp_path))
    again = provider.dryrun(make_job(tmp_path))
    assert [a.uri for a in first.staging] == [a.uri for a in again.staging]
    assert sorted(m.name for m in first.staging[0].members) == ["code/model.py", "code/train.py"]
    # A replanned attempt: new plan.json, same code.
    replanned = provider.dryrun(make_job(tmp_path, make_plan(micro_batch_size=2,
                                                             grad_accum_steps=2), attempt=2))
    assert replanned.staging[0].uri == first.staging[0].uri
    assert replanned.staging[1].uri != first.staging[1].uri
    # Edited code: a new code archive.
    (tmp_path / "code" / "model.py").write_text("WIDTH = 32\n")
    edited = provider.dryrun(make_job(tmp_path))
    assert edited.staging[0].uri != first.staging[0].uri
    assert edited.staging[1].uri == first.staging[1].uri


# -- what is uploaded (launcher/packaging.py) -----------------------------------------------------


def test_the_staged_code_archive_holds_no_secrets_and_honours_ignore_files(tmp_path):
    job = make_job(tmp_path)
    gac = plant_secrets(job.code_dir, tmp_path / "home")
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION, "bucket": "launch-bucket"},
        {"LAUNCH_VERTEX_ENDPOINT": "http://127.0.0.1:9",
         "GOOGLE_APPLICATION_CREDENTIALS": str(gac)})
    request = provider.dryrun(job)

    # The very bytes `stage` uploads.
    buffer = io.BytesIO()
    vertex._gcp.write_archive(request.staging[0], buffer)
    with tarfile.open(fileobj=io.BytesIO(buffer.getvalue()), mode="r:gz") as tar:
        members = tar.getmembers()
        contents = b"".join(tar.extractfile(m).read() for m in members)
    expected = sorted(("train.py", *PLANTED_KEPT))
    assert [m.name for m in members] == [f"code/{name}" for name in expected]
    assert all(m.isfile() for m in members)  # no links in the archive
    assert b"aws_access_key_id" not in contents and b"private_key" not in contents

    # `launch plan --json` shows exactly that, and what was left out and why.
    upload = request.to_dict()["upload"]
    assert upload["root"] == str(job.code_dir.resolve())
    assert [f["name"] for f in upload["files"]] == expected
    assert upload["bytes"] == sum(m.size for m in members)
    skipped = {s["path"]: s["reason"] for s in upload["skipped"]}
    assert {path: skipped.get(path) for path in PLANTED_SKIPPED} == PLANTED_SKIPPED
    assert skipped["aws-link"].startswith("symlink to outside the folder")


def test_a_script_that_gitignore_leaves_out_is_refused_not_staged_without_it(tmp_path):
    job = make_job(tmp_path)
    (job.code_dir / ".gitignore").write_text("train.py\n")
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION, "bucket": "launch-bucket"},
        {"LAUNCH_VERTEX_ENDPOINT": "http://127.0.0.1:9"})
    with pytest.raises(UsageError, match=r"the script train.py is left out of the upload "
                                         r"\(listed in .gitignore\)"):
        provider.dryrun(job)


def _plan_vertex(cli: Any, script: Path) -> Any:
    return cli("plan", str(script), "--provider", "vertex", "--machine", "g2-standard-4",
               "--project", PROJECT, "--region", REGION, "--bucket", "launch-bucket", "--json",
               environ={"LAUNCH_VERTEX_ENDPOINT": f"http://127.0.0.1:{_free_port()}"})


def test_plan_shows_the_upload_and_refuses_a_key_in_the_script(cli, write_script):
    script = write_script(TINY_RECIPE)
    result = _plan_vertex(cli, script)
    assert result.status == 0, result.stderr
    assert [f["name"] for f in result.json()["request"]["upload"]["files"]] == ["train.py"]

    text = TINY_RECIPE + f'\nBACKUP_KEY = "{AWS_KEY_ID}"  # "just for now"\n'
    write_script(text)
    result = _plan_vertex(cli, script)
    assert result.status == ExitStatus.USAGE, result.stdout
    line = text.splitlines().index(f'BACKUP_KEY = "{AWS_KEY_ID}"  # "just for now"') + 1
    assert result.stderr.startswith(
        f"launch: error: refusing to upload train.py: line {line} looks like an AWS access key id")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert ".launchignore" in result.stderr
    assert result.json()["exit_status"] == ExitStatus.USAGE


def test_plan_refuses_a_secret_in_a_config_beside_the_script(cli, write_script):
    script = write_script(TINY_RECIPE)
    write_script(f"region: us-east-1\naws_secret_access_key: {AWS_SECRET}\n", "configs/prod.yaml")
    result = _plan_vertex(cli, script)
    assert result.status == ExitStatus.USAGE, result.stdout
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert ("refusing to upload configs/prod.yaml: line 2 looks like an AWS secret access key"
            in result.stderr)


@pytest.mark.parametrize(("machine", "gpus", "words"), [
    ("a2-highgpu-1g+l4x1", 1, "cannot take 1 x NVIDIA_L4; it comes with 1 x NVIDIA_TESLA_A100"),
    ("n1-standard-8+a100x1", 1, "machine type n1-standard-8 cannot take NVIDIA_TESLA_A100"),
    ("n2-standard-8+t4x1", 1, "machine type n2-standard-8 cannot take NVIDIA_TESLA_T4"),
    ("n1-standard-8+t4x3", 1, "3 GPUs cannot attach to an N1 machine"),
    ("n1-standard-8+tpux1", 1, "unknown accelerator type 'TPU'"),
    ("g2-standard-4", 2, "g2-standard-4 has 1 GPU(s), the plan runs 2 processes per node"),
])
def test_accelerators_a_machine_cannot_take_are_refused_in_one_line(machine, gpus, words):
    with pytest.raises(UsageError) as caught:
        vertex.machine_spec(machine, gpus)
    assert words in str(caught.value)
    assert "\n" not in str(caught.value) and caught.value.status == ExitStatus.USAGE


def test_machines_outside_the_catalog_that_fit_are_accepted():
    spec = vertex.machine_spec("n1-highmem-16+v100x4", 4)
    assert spec.to_dict() == {"machineType": "n1-highmem-16", "acceleratorType":
                              "NVIDIA_TESLA_V100", "acceleratorCount": 4}
    assert vertex.machine_spec("n1-standard-8+t4x1", 1).accelerator_type == "NVIDIA_TESLA_T4"


def test_label_values_follow_google_clouds_rules():
    assert vertex._gcp.label_value(RUN_ID) == RUN_ID
    long_id = "a-very-long-script-name-that-goes-on-20260801-120000-ab12-and-on"
    cut = vertex._gcp.label_value(long_id)
    assert len(cut) <= 63 and cut != vertex._gcp.label_value(long_id + "x")
    changed = vertex._gcp.label_value("Train.v2")  # changed characters: a hash keeps it unique
    assert changed.startswith("train-v2-") and len(changed) == len("train-v2-") + 8


# -- bad input: one line each --------------------------------------------------------------------


def test_no_region_no_project_no_bucket(tmp_path, monkeypatch):
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    def no_adc(**_kwargs: Any) -> Any:
        raise DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_adc)
    with pytest.raises(UsageError, match="no region") as caught:
        VertexProvider.from_settings({"project": PROJECT}, {})
    assert "--region" in caught.value.hint
    with pytest.raises(UsageError, match="no Google Cloud project") as caught:
        VertexProvider.from_settings({"region": REGION}, {})
    assert "--project" in caught.value.hint
    provider = VertexProvider.from_settings({"project": PROJECT, "region": REGION}, {})
    with pytest.raises(UsageError, match="no bucket") as caught:
        provider.dryrun(make_job(tmp_path))
    assert "--bucket" in caught.value.hint
    with pytest.raises(UsageError, match="not an email"):
        VertexProvider.from_settings({"project": PROJECT, "region": REGION,
                                      "service_account": "trainer"}, {})
    with pytest.raises(UsageError, match="not a Cloud Storage bucket name"):
        VertexProvider.from_settings({"project": PROJECT, "region": REGION,
                                      "bucket": "Not_A_Bucket!"}, {})


def test_no_application_default_credentials_is_exit_6_with_the_gcloud_hint(monkeypatch):
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    def no_adc(**_kwargs: Any) -> Any:
        raise DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_adc)
    provider = VertexProvider.from_settings({"project": PROJECT, "region": REGION}, {})
    with pytest.raises(ProviderError) as caught:
        provider.poll(f"projects/{PROJECT}/locations/{REGION}/customJobs/1")
    error = caught.value
    assert error.status == ExitStatus.PROVIDER_ERROR == 6
    assert "application-default credentials" in error.message
    assert "gcloud auth application-default login" in error.hint
    assert "service-account key" in error.hint
    assert "\n" not in str(error)


def test_a_key_file_that_does_not_load_is_named(tmp_path):
    missing = tmp_path / "key.json"
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION},
        {"GOOGLE_APPLICATION_CREDENTIALS": str(missing)})
    with pytest.raises(ProviderError) as caught:
        provider.stop(f"projects/{PROJECT}/locations/{REGION}/customJobs/1")
    assert str(missing) in caught.value.message
    assert "gcloud auth application-default login" in caught.value.hint


def test_a_missing_bucket_is_one_line_before_anything_is_created(fake, storage_emulator,
                                                                 tmp_path):
    provider = provider_for(fake, storage_emulator, bucket="no-such-bucket-here")
    with pytest.raises(ProviderError) as caught:
        provider.submit(make_job(tmp_path))
    assert caught.value.message == "the bucket gs://no-such-bucket-here does not exist"
    assert "gcloud storage buckets create gs://no-such-bucket-here" in caught.value.hint
    assert caught.value.status == 6
    assert not fake.calls_to("CreateCustomJob")


def test_vertex_refusing_the_request_is_a_provider_error(fake, storage_emulator, bucket,
                                                         tmp_path):
    fake.fail_next("CreateCustomJob", "PERMISSION_DENIED")
    provider = provider_for(fake, storage_emulator, bucket)
    with pytest.raises(ProviderError) as caught:
        provider.submit(make_job(tmp_path))
    assert caught.value.message.startswith("creating the Vertex AI custom job:")
    assert "roles/aiplatform.user" in caught.value.hint
    assert len(fake.calls_to("CreateCustomJob")) == 1  # not retried


# -- sending -------------------------------------------------------------------------------------


def test_submit_stages_once_per_hash_and_creates_the_job_as_requested(
        fake, storage_emulator, storage, bucket, tmp_path):
    provider = provider_for(fake, storage_emulator, bucket)
    request, job_id = provider.submit(make_job(tmp_path))
    assert job_id.startswith("projects/424242/locations/us-central1/customJobs/")
    (created,) = fake.calls_to("CreateCustomJob")
    from google.cloud.aiplatform_v1.types import CustomJob
    from google.protobuf import json_format

    assert json_format.MessageToDict(CustomJob.pb(created.request.custom_job)) == \
        request.custom_job
    code_uri, job_uri = (a.uri for a in request.staging)
    code = read_archive(storage, code_uri)
    assert code == {"code/train.py": textwrap.dedent(TINY_RECIPE).encode()}
    files = read_archive(storage, job_uri)
    assert set(files) == {"launch_train.py", "launch_runtime.py", "plan.json"}
    assert json.loads(files["plan.json"])["recipe_file"] == "code/train.py"
    recorded = json.loads((tmp_path / "state" / "runs" / RUN_ID / "attempt-1" /
                           "request.json").read_text())
    assert recorded == json.loads(json.dumps(request.to_dict()))

    code_blob = storage.bucket(bucket).get_blob(code_uri.split("/", 3)[3])
    request2, _job2 = provider.submit(make_job(tmp_path, make_plan(micro_batch_size=2,
                                                                   grad_accum_steps=2),
                                               attempt=2))
    assert request2.staging[0].uri == code_uri
    again = storage.bucket(bucket).get_blob(code_uri.split("/", 3)[3])
    assert again.generation == code_blob.generation  # not uploaded a second time
    names = sorted(b.name for b in storage.list_blobs(bucket))
    assert sum(n.split("/")[-1].startswith("code-") for n in names) == 1
    assert sum(n.split("/")[-1].startswith("job-") for n in names) == 2
    assert len(fake.jobs) == 2


def test_an_object_planted_under_the_staged_name_is_neither_used_nor_overwritten(
        fake, storage_emulator, storage, bucket, tmp_path):
    """Jobs can write the bucket, so something else may sit under an archive's name: same size,
    other bytes. It is not reused (Cloud Storage's md5Hash of it is not the archive's) nor
    overwritten (uploads are create-only): the archive goes to a fresh name, which the job is
    created with, request.json records, and the job's first log lines say."""
    from launcher.providers.vertex import _gcp

    provider = provider_for(fake, storage_emulator, bucket)
    job = make_job(tmp_path)
    code = provider.dryrun(job).staging[0]
    true_bytes = io.BytesIO()
    _gcp.write_archive(code, true_bytes)
    planted_bytes = bytes(b ^ 0xFF for b in true_bytes.getvalue())  # the same size
    planted = storage.bucket(bucket).blob(code.uri.split("/", 3)[3])
    planted.upload_from_string(planted_bytes, content_type="application/gzip")
    planted.reload()

    _request, job_id = provider.submit(job)
    (created,) = fake.calls_to("CreateCustomJob")
    env = {e.name: e.value for e in created.request.custom_job.job_spec.worker_pool_specs[0]
           .container_spec.env}
    code_uri = env["LAUNCH_STAGED"].split()[0]
    stem = code.uri.removesuffix(".tar.gz")
    assert code_uri.startswith(stem + "/") and code_uri.endswith(f"-{code.sha256[:32]}.tar.gz")
    assert read_archive(storage, code_uri) == {
        "code/train.py": textwrap.dedent(TINY_RECIPE).encode()}
    again = storage.bucket(bucket).get_blob(planted.name)
    assert again.generation == planted.generation
    assert again.download_as_bytes() == planted_bytes

    recorded = json.loads((job.attempt_dir / "request.json").read_text())
    assert recorded["staging"][0]["uri"] == code_uri
    assert recorded["staging"][0]["instead_of"] == code.uri
    lines, _cursor = provider.logs(job_id)
    assert any(line.startswith(f"[vertex] {code.uri} holds other bytes") and code_uri in line
               for line in lines), lines


@pytest.mark.parametrize("transport", ["rest", "grpc"])
@pytest.mark.parametrize("after", [True, False], ids=["job-made", "job-not-made"])
def test_unavailable_on_create_never_makes_a_second_job(fake, storage_emulator, bucket, tmp_path,
                                                        transport, after):
    fake.fail_next("CreateCustomJob", "UNAVAILABLE", after=after)
    provider = provider_for(fake, storage_emulator, bucket, transport)
    _request, job_id = provider.submit(make_job(tmp_path))
    assert len(fake.jobs) == 1
    assert job_id == next(iter(fake.jobs.values())).job.name
    assert len(fake.calls_to("CreateCustomJob")) == (1 if after else 2)
    (lookup,) = fake.calls_to("ListCustomJobs")
    assert lookup.request.filter == (f'labels.launch_run_id="{RUN_ID}" AND '
                                     'labels.launch_attempt="1"')
    assert {c.transport for c in fake.calls} == {transport}


# -- following -----------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_a_successful_job_is_followed_to_the_end(fake, storage_emulator, bucket, tmp_path,
                                                 transport):
    fake.script(
        state("JOB_STATE_PENDING", 0.05), state("JOB_STATE_RUNNING", 0.05),
        log("workerpool0-0", "launch: node 0 of 2"),
        log("workerpool1-0", "launch: node 1 of 2", as_json=True),
        log("workerpool0-0", metrics(0, 1) + "\n" + metrics(1, 1)),
        log("workerpool1-0", metrics(2, 1), as_json=True),
        sleep(0.1),
        log("workerpool0-0", '[rank0]:{"launch": "done", "rank": 0, "step": 4}'),
        finish("JOB_STATE_SUCCEEDED", delay=0.05),
    )
    provider = provider_for(fake, storage_emulator, bucket, transport)
    _request, job_id = provider.submit(make_job(tmp_path, make_plan(nodes=2,
                                                                    global_batch_size=16)))
    lines, status, _cursor = follow(provider, job_id)
    assert status.state == "succeeded" and status.message == ""
    assert output(lines) == [
        "workerpool0-0: launch: node 0 of 2", "workerpool1-0: launch: node 1 of 2",
        f"workerpool0-0: {metrics(0, 1)}", f"workerpool0-0: {metrics(1, 1)}",
        f"workerpool1-0: {metrics(2, 1)}",
        'workerpool0-0: [rank0]:{"launch": "done", "rank": 0, "step": 4}',
    ]
    progress = [line for line in lines if line.startswith("[vertex]")]
    number = job_id.rsplit("/", 1)[1]
    assert progress[0].startswith(f"[vertex] job {number}: JOB_STATE_")
    # How many states a follower sees depends on when it polls; the end it always sees.
    assert progress[-2].endswith(" -> JOB_STATE_SUCCEEDED")
    assert progress[-1] == f"[vertex] job {number} ended: JOB_STATE_SUCCEEDED"
    (read,) = {c.request.filter.rsplit(" AND ", 1)[0] for c in fake.calls_to("ListLogEntries")}
    assert read == f'resource.type="ml_job" AND resource.labels.job_id="{number}"'


def test_late_entries_are_neither_lost_nor_repeated(fake, storage_emulator, bucket, tmp_path):
    fake.script(
        state("JOB_STATE_RUNNING"),
        log("workerpool0-0", "A", insert_id="a"), log("workerpool0-0", "B", insert_id="b"),
        wait_read("b"),
        # Ingested late: older than B, which the follower has already read.
        log("workerpool1-0", "C (late)", insert_id="c", backdate_s=2.0),
        log("workerpool0-0", "D", insert_id="d"),
        wait_read("d"),
        log("workerpool1-0", "E (late, after the end)", insert_id="e", backdate_s=1.0),
        finish("JOB_STATE_SUCCEEDED"),
        sleep(0.1),
        log("workerpool0-0", "F (ingested after the job ended)", insert_id="f", backdate_s=0.5),
    )
    provider = provider_for(fake, storage_emulator, bucket, "grpc")
    _request, job_id = provider.submit(make_job(tmp_path))
    lines, status, _cursor = follow(provider, job_id)
    assert status.state == "succeeded"
    assert output(lines) == ["workerpool0-0: A", "workerpool0-0: B", "workerpool1-0: C (late)",
                             "workerpool0-0: D", "workerpool1-0: E (late, after the end)",
                             "workerpool0-0: F (ingested after the job ended)"]
    # The reads overlapped (C was found by re-reading behind B), and still nothing repeated.
    assert len(fake.calls_to("ListLogEntries")) >= 3


def test_a_cursor_is_json_and_another_process_carries_on_from_it(fake, storage_emulator,
                                                                  bucket, tmp_path):
    fake.script(state("JOB_STATE_RUNNING"),
                *[log(f"workerpool0-{i % 2}", f"line {i}") for i in range(5)],
                wait_read("e0000005"), *[log("workerpool0-0", f"line {i}") for i in range(5, 9)],
                finish("JOB_STATE_SUCCEEDED"))
    first = provider_for(fake, storage_emulator, bucket)
    _request, job_id = first.submit(make_job(tmp_path))
    fake.wait_for(lambda: len(fake.entries) >= 5)
    seen, cursor = first.logs(job_id)
    saved = json.dumps(cursor)
    assert [line.split(": ", 1)[1] for line in output(seen)] == [f"line {i}" for i in range(5)]
    # `launch logs` in a new process: a new provider, the cursor from JSON.
    second = provider_for(fake, storage_emulator, bucket)
    rest, status, _ = follow(second, job_id, cursor=json.loads(saved))
    assert status.state == "succeeded"
    assert [line.split(": ", 1)[1] for line in output(rest)] == [f"line {i}"
                                                                for i in range(5, 9)]


def test_a_read_cut_at_the_limit_carries_on_where_it_stopped(fake, storage_emulator, bucket,
                                                            tmp_path, monkeypatch):
    from launcher.providers.vertex import logs as vertex_logs

    monkeypatch.setattr(vertex_logs, "LOG_PAGE_SIZE", 3)
    fake.script(state("JOB_STATE_RUNNING"), *[log("workerpool0-0", f"n{i}") for i in range(10)],
                finish("JOB_STATE_SUCCEEDED", delay=0.05))
    provider = provider_for(fake, storage_emulator, bucket)
    _request, job_id = provider.submit(make_job(tmp_path))
    lines, status, _cursor = follow(provider, job_id)
    assert [line.split(": ", 1)[1] for line in output(lines)] == [f"n{i}" for i in range(10)]


def test_reads_are_spaced_out_while_the_job_runs(fake, storage_emulator, bucket, tmp_path):
    fake.script(state("JOB_STATE_RUNNING"), log("workerpool0-0", "x"),
                wait_cancel(30, "not cancelled"))
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION, "bucket": bucket},
        vertex_env(fake, storage_emulator, LAUNCH_VERTEX_POLL_S="60",
                   LAUNCH_VERTEX_LOG_POLL_S="60"))
    _request, job_id = provider.submit(make_job(tmp_path))
    fake.wait_for(lambda: fake.entries)
    for _ in range(20):
        provider.poll(job_id)
        provider.logs(job_id, None)
    assert len(fake.calls_to("GetCustomJob")) <= 1
    assert len(fake.calls_to("ListLogEntries")) == 1
    provider.stop(job_id)


# -- out of memory -------------------------------------------------------------------------------


OOM = ('[rank3]:{"launch": "oom", "rank": 3, "phase": "forward", "step": 3, "micro_step": 1, '
       '"micro_batch_size": 4, "grad_accum_steps": 1, "device": "cuda", "message": "CUDA out of '
       'memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 39.39 GiB"}')


def test_cuda_oom_on_one_rank_of_a_multi_node_job_cancels_it_and_resubmits(
        fake, storage_emulator, bucket, tmp_path):
    from launcher.remedies import replan
    from launcher.runs import Run
    from launcher.spec import Spec
    from launcher.supervisor import Supervisor

    # Attempt 1: rank 3 (node 1) runs out of memory; the other ranks then hang in a collective
    # until an NCCL timeout, unless the job is cancelled.
    fake.script(
        state("JOB_STATE_PENDING"), state("JOB_STATE_RUNNING", 0.05),
        *[log(f"workerpool{r // 2}-0", metrics(r, 2)) for r in range(4)],
        log("workerpool1-0", OOM, insert_id="oom"),
        log("workerpool1-0", "[rank3]:Traceback (most recent call last):"),
        log("workerpool0-0", "[rank0]:still waiting on the all-reduce"),
        wait_cancel(60, "NCCL watchdog timeout"),
    )
    # Attempt 2: the smaller micro-batch fits.
    fake.script(
        state("JOB_STATE_RUNNING"),
        log("workerpool0-0", '[rank0]:{"launch": "resume", "rank": 0, "step": 2}'),
        *[log(f"workerpool{r // 2}-0", f'[rank{r}]:{{"launch": "done", "rank": {r}, "step": 4}}')
          for r in range(4)],
        finish("JOB_STATE_SUCCEEDED"),
    )
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent(TINY_RECIPE))
    spec = Spec(script=code / "train.py", mode="recipe", provider="vertex", max_attempts=3,
                region=REGION, bucket=bucket)
    run = Run.create(tmp_path / "state", "train", {"provider": "vertex", "spec": spec.to_dict()})
    provider = provider_for(fake, storage_emulator, bucket, "grpc")
    lines: list[str] = []
    notes: list[str] = []
    supervisor = Supervisor(provider, run, on_line=lines.append, on_note=notes.append,
                            replan=lambda plan, failure: replan(plan, failure),
                            poll_interval_s=0.01)
    plan = make_plan(nodes=2, gpus_per_node=2, global_batch_size=16)
    outcome = supervisor.launch(spec, plan)

    assert outcome.status == ExitStatus.SUCCESS, (outcome.message, notes)
    first, second = outcome.attempts
    assert first.outcome == "oom" and first.diagnosis.diagnosis.rank == 3
    assert second.outcome == "success"
    job1, job2 = fake.jobs.values()
    # Cancelled once, at once: the NCCL timeout never came.
    assert [c.request.name for c in fake.calls_to("CancelCustomJob")] == [job1.job.name]
    assert job1.state == "JOB_STATE_CANCELLED"
    assert job1.cancelled_at is not None
    assert job1.cancelled_at - fake.served["oom"] < 2.0  # cancelled as soon as it was read
    assert any("out of memory on rank 3" in note for note in notes)
    # The resubmission: attempt 2's labels, the halved micro-batch, the same output folder.
    body1, body2 = (c.request.custom_job for c in fake.calls_to("CreateCustomJob"))
    assert body2.labels["launch_attempt"] == "2"
    assert body2.labels["launch_run_id"] == body1.labels["launch_run_id"]
    assert (body2.job_spec.base_output_directory.output_uri_prefix ==
            body1.job_spec.base_output_directory.output_uri_prefix)
    env2 = {e.name: e.value for e in body2.job_spec.worker_pool_specs[0].container_spec.env}
    assert env2["LAUNCH_MICRO_BATCH_SIZE"] == "2" and env2["LAUNCH_GRAD_ACCUM_STEPS"] == "2"
    assert len(body2.job_spec.worker_pool_specs) == 2


def rendered_traceback(rank: int, last_frames: list[str]) -> list[str]:
    """A rank's traceback out of the rendered script's loop, as its ``[rankN]:`` lines: main ->
    train -> optimizer_step (the whole step) -> ``last_frames``."""
    script = "/tmp/workerpool1-0-x/launch-y/launch_train.py"
    return [f"[rank{rank}]:{text}" for text in [
        "Traceback (most recent call last):",
        f'  File "{script}", line 124, in main',
        "    train(plan, runtime, progress)",
        f'  File "{script}", line 176, in train',
        "    step_loss = optimizer_step(model, optimizer, batches, recipe, plan, runtime, "
        "progress)",
        "                " + "^" * 74,
        *last_frames,
    ]]


FORWARD_OOM_FRAMES = [
    '  File "/tmp/workerpool1-0-x/launch-y/launch_train.py", line 246, in optimizer_step',
    "    micro_loss = recipe.training_step(model, batch)",
    '  File "/tmp/workerpool1-0-x/launch-y/code/train.py", line 32, in training_step',
    "    logits = model(batch['x'])",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
    "capacity of 39.39 GiB of which 1.20 GiB is free.",
]


def test_a_forward_oom_whose_templates_line_the_stop_cut_off_is_still_read_as_activations(
        fake, storage_emulator, bucket, tmp_path):
    """The rendered script prints the traceback first and its ``{"launch": "oom"}`` line only
    after freeing memory; a slow log pipeline (torchrun's --tee tailing, a loaded machine) shows
    the traceback more than STOP_GRACE_S before that line, and the stop kills the process before
    it is printed. The diagnosis then rests on the traceback alone, and must still say forward /
    activations, the same as the templates' line would: the frame of the rendered script's own
    ``optimizer_step(...)`` (the whole step) is not an optimizer-phase frame."""
    from launcher.remedies import replan
    from launcher.runs import Run
    from launcher.spec import Spec
    from launcher.supervisor import STOP_GRACE_S, Supervisor

    fake.script(
        state("JOB_STATE_PENDING"), state("JOB_STATE_RUNNING", 0.05),
        *[log(f"workerpool{r // 2}-0", metrics(r, 2)) for r in range(4)],
        *[log("workerpool1-0", line) for line in rendered_traceback(3, FORWARD_OOM_FRAMES)],
        # The templates' line would come now, after the stop: never written.
        sleep(20 * STOP_GRACE_S),
        log("workerpool1-0", OOM, insert_id="oom"),
        wait_cancel(60, "NCCL watchdog timeout"),
    )
    fake.script(
        state("JOB_STATE_RUNNING"),
        log("workerpool0-0", '[rank0]:{"launch": "resume", "rank": 0, "step": 2}'),
        *[log(f"workerpool{r // 2}-0", f'[rank{r}]:{{"launch": "done", "rank": {r}, "step": 4}}')
          for r in range(4)],
        finish("JOB_STATE_SUCCEEDED"),
    )
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent(TINY_RECIPE))
    spec = Spec(script=code / "train.py", mode="recipe", provider="vertex", max_attempts=2,
                region=REGION, bucket=bucket)
    run = Run.create(tmp_path / "state", "train", {"provider": "vertex", "spec": spec.to_dict()})
    provider = provider_for(fake, storage_emulator, bucket, "grpc")
    notes: list[str] = []
    supervisor = Supervisor(provider, run, on_line=lambda line: None, on_note=notes.append,
                            replan=lambda plan, failure: replan(plan, failure),
                            poll_interval_s=0.01)
    outcome = supervisor.launch(spec, make_plan(nodes=2, gpus_per_node=2, global_batch_size=16))

    assert outcome.status == ExitStatus.SUCCESS, (outcome.message, notes)
    first, second = outcome.attempts
    assert "oom" not in fake.written  # stopped on the traceback, before the templates' line
    assert first.outcome == "oom" and first.diagnosis.diagnosis.signature != "launch_oom_event"
    assert first.diagnosis.diagnosis.phase == "forward"
    assert first.diagnosis.diagnosis.cause == "activations"
    assert first.diagnosis.diagnosis.rank == 3, first.diagnosis
    body2 = fake.calls_to("CreateCustomJob")[1].request.custom_job
    env2 = {e.name: e.value for e in body2.job_spec.worker_pool_specs[0].container_spec.env}
    assert env2["LAUNCH_MICRO_BATCH_SIZE"] == "2" and env2["LAUNCH_GRAD_ACCUM_STEPS"] == "2"


@pytest.mark.parametrize("last_frames, phase", [
    (FORWARD_OOM_FRAMES, "forward"),
    (['  File "/tmp/launch_train.py", line 252, in optimizer_step',
      "    (micro_loss / accum).backward()",
      '  File "/usr/lib/python3/site-packages/torch/autograd/__init__.py", line 347, in backward',
      "    _engine_run_backward(",
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."], "backward"),
    (['  File "/tmp/launch_train.py", line 260, in optimizer_step',
      "    optimizer.step()",
      '  File "/usr/lib/python3/site-packages/torch/optim/adamw.py", line 220, in step',
      "    exp_avg_sq = torch.zeros_like(p)",
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."], "optimizer"),
], ids=["forward", "backward", "optimizer"])
def test_the_phase_of_a_rendered_scripts_traceback_is_where_inside_the_step_it_failed(
        last_frames, phase):
    """Without the templates' line, the phase comes from the traceback: the innermost frames of
    the step, not the name of the rendered script's ``optimizer_step`` every traceback passes."""
    from launcher.failures import LogWatcher

    watcher = LogWatcher(platform="vertex")
    for line in rendered_traceback(1, last_frames):
        watcher.feed(f"workerpool0-0: {line}")
    assert watcher.result().phase == phase


@pytest.mark.parametrize("with_entry", [True, False], ids=["service-entry", "error-only"])
def test_a_host_oom_kill_is_read_from_vertex_ai_itself(fake, storage_emulator, bucket, tmp_path,
                                                       with_entry):
    from launcher.failures import explain_lines

    message = ("The replica workerpool0-0 ran out-of-memory and exited with a non-zero status "
               "of 9(SIGKILL). To find out more about why your job exited please check the "
               "logs: https://console.cloud.google.com/logs/viewer?project=launch-test")
    steps = [state("JOB_STATE_RUNNING"), log("workerpool0-0", metrics(0, 1)),
             log("workerpool0-0", "[rank0]:loading the next shard")]
    if with_entry:
        steps.append(log(None, message))
    fake.script(*steps, finish("JOB_STATE_FAILED", message, delay=0.05))
    provider = provider_for(fake, storage_emulator, bucket)
    _request, job_id = provider.submit(make_job(tmp_path, make_plan(gpus_per_node=1,
                                                                    machine="a2-highgpu-1g",
                                                                    global_batch_size=4)))
    lines, status, _cursor = follow(provider, job_id)
    assert status.state == "failed" and status.message == message
    number = job_id.rsplit("/", 1)[1]
    assert lines[-1] == f"[vertex] job {number} error: {message}"
    assert (f"[vertex] {message}" in lines) == with_entry
    diagnosis = explain_lines(lines, platform="vertex")
    assert diagnosis.failure == "host_oom"


def test_stop_cancels_and_stopping_an_ended_job_does_nothing(fake, storage_emulator, bucket,
                                                             tmp_path):
    fake.script(state("JOB_STATE_RUNNING"), wait_cancel(30, "not cancelled"))
    provider = provider_for(fake, storage_emulator, bucket, "grpc")
    _request, job_id = provider.submit(make_job(tmp_path))
    fake.wait_for(lambda: next(iter(fake.jobs.values())).state == "JOB_STATE_RUNNING")
    provider.stop(job_id)
    lines, status, _ = follow(provider, job_id)
    assert status.state == "cancelled"
    assert lines[-1].endswith("ended: JOB_STATE_CANCELLED")
    fake.wait_for(lambda: next(iter(fake.jobs.values())).state == "JOB_STATE_CANCELLED")
    provider.stop(job_id)  # Vertex AI answers FAILED_PRECONDITION; nothing to do
    assert len(fake.calls_to("CancelCustomJob")) == 2


# -- a job that writes faster than Cloud Logging can be read ---------------------------------------

FLOOD_LINES_PER_S = 5000  # all replicas together: five times what the read quota can carry
FLOOD_RANKS = 16


@pytest.fixture
def quota_fake(storage_emulator, tmp_path):
    """The fake holding reads to Cloud Logging's default quota: 60 entries.list a minute."""
    with FakeVertex(project=PROJECT, storage_host=storage_emulator,
                    mount_root=tmp_path / "gcs-mount") as server:
        assert server.read_quota == 60 and server.quota_window_s == 60
        yield server


def flood_env(fake: FakeVertex, storage_emulator: str, **extra: str) -> dict[str, str]:
    """Reads paced as in production (the event channel every 2 s, 60 reads a minute in all);
    the job's state read at once and a short settling time, so the test ends soon."""
    return vertex_env(fake, storage_emulator, "grpc", LAUNCH_VERTEX_EVENT_POLL_S="2",
                      LAUNCH_VERTEX_LOG_READS_PER_MIN="60", LAUNCH_VERTEX_LOG_POLL_S="3",
                      LAUNCH_VERTEX_LOG_SETTLE_S="1", **extra)


def entry_lines(fake: FakeVertex, number: str) -> Counter[str]:
    """Every line of job ``number``'s entries, prefixed as a follower shows them."""
    lines: Counter[str] = Counter()
    for entry in list(fake.entries):
        if entry.resource.labels["job_id"] != number:
            continue
        task = entry.labels.get("ml.googleapis.com/task_name")
        pb = type(entry).pb(entry)
        text = pb.text_payload if pb.HasField("text_payload") else entry.json_payload["message"]
        lines.update(f"{task}: {line}" if task else f"[vertex] {line}"
                     for line in text.split("\n"))
    return lines


def flood_run(tmp_path: Path, bucket: str) -> tuple[Any, Any]:
    from launcher.runs import Run
    from launcher.spec import Spec

    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(textwrap.dedent(TINY_RECIPE))
    spec = Spec(script=code / "train.py", mode="recipe", provider="vertex", max_attempts=1,
                region=REGION, bucket=bucket)
    run = Run.create(tmp_path / "state", "train", {"provider": "vertex", "spec": spec.to_dict()})
    return spec, run


#: When the flood's rank runs out of memory: just after an event read (they go every 2 s from
#: the job's start), the least favourable moment (measured: cancelled 1.5 to 1.9 s after it).
OOM_AT_S = 4.5
#: 16 ranks: four nodes of four GPUs, four replicas writing.
FLOOD_PLAN = {"machine": "a2-highgpu-4g", "nodes": 4, "gpus_per_node": 4,
              "global_batch_size": 64}


@pytest.mark.timing
def test_a_16_rank_job_flooding_its_log_is_stopped_within_a_poll_of_its_oom(
        quota_fake, storage_emulator, bucket, tmp_path):
    """5,000 lines a second against a quota that reads 1,000 at most: the full stream falls
    further behind while the job runs, the event channel does not. The job is cancelled within
    one event poll (and 2 s) of the OOM's entry; afterwards the stream is read to its end within
    the quota, every line exactly once, and the supervisor said how far behind it was."""
    from launcher.supervisor import BEHIND_NOTE_S, Supervisor

    fake = quota_fake
    fake.script(state("JOB_STATE_RUNNING"),
                flood(FLOOD_LINES_PER_S, FLOOD_RANKS, oom_at_s=OOM_AT_S, oom_rank=5))
    spec, run = flood_run(tmp_path, bucket)
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION, "bucket": bucket},
        flood_env(fake, storage_emulator))
    lines: list[str] = []
    notes: list[str] = []
    supervisor = Supervisor(provider, run, on_line=lines.append, on_note=notes.append,
                            poll_interval_s=0.05)
    started = time.monotonic()
    outcome = supervisor.launch(spec, make_plan(**FLOOD_PLAN))
    took = time.monotonic() - started

    assert outcome.status == ExitStatus.OUT_OF_MEMORY, (outcome.message, notes)
    attempt = outcome.last
    assert attempt.outcome == "oom" and attempt.diagnosis.diagnosis.rank == 5, attempt.diagnosis
    (job,) = fake.jobs.values()
    assert job.state == "JOB_STATE_CANCELLED" and job.cancelled_at is not None
    oom_written = min(fake.written["oom-message"], fake.written["oom"])
    latency = job.cancelled_at - oom_written
    # Through the event channel, not the log: its note names no cause, and the stop came sooner
    # than the trailing log could have shown the OOM (how soon: bench/bench_cloud_stop.py).
    oom_notes = [n for n in notes if n.startswith("out of memory")]
    assert len(oom_notes) == 1 and "cause" not in oom_notes[0], notes
    assert 0 < latency < attempt.summary.log_behind_s, (latency, notes)
    record("vertex_16_ranks_5000_lines_per_s", stop_after_oom_s=round(latency, 3),
           event_poll_s=provider.timing.event_poll_s,
           log_behind_s=attempt.summary.log_behind_s)
    # Within the quota throughout: the provider paced itself, nothing was refused.
    assert fake.quota_refusals == 0
    reads = [c.at for c in fake.calls_to("ListLogEntries")]
    assert all(sum(1 for t in reads if at <= t < at + 60) <= 60 for at in reads)
    # The event channel asked Cloud Logging for a few lines, not for the flood.
    event_reads = [c for c in fake.calls_to("ListLogEntries")
                   if 'textPayload:"{\\"launch\\":"' in c.request.filter]
    assert event_reads and sum(c.answered or 0 for c in event_reads) <= 10
    # Every line of the job exactly once, in the full stream: the flood's 22,500 and the OOM's.
    shown = Counter(output(lines))
    written = entry_lines(fake, job.number)
    assert sum(written.values()) >= 0.9 * OOM_AT_S * FLOOD_LINES_PER_S
    assert max(shown.values()) == 1 and shown == written
    # The stream trailed the job by more than the note's threshold, and the supervisor said so.
    behind = [note for note in notes if "behind the job" in note]
    # (Before or after the OOM's note: a host busy enough to slow the reader puts the log 10 s
    # behind before the event channel's poll sees the OOM; CI did once.)
    assert behind and attempt.summary.log_behind_s >= BEHIND_NOTE_S, notes
    assert took < 60, took


@pytest.mark.timing
def test_behind_reports_how_far_the_stream_trails_a_flood_and_none_once_caught_up(
        quota_fake, storage_emulator, bucket, tmp_path):
    """``behind``: the seconds of log still unread, from the paging state (a full page, more
    waiting); checked against what the fake holds and the reader has not yet had."""
    fake = quota_fake
    # 3.5 s of flood: reads are paced at one a second, and a slow host (a 2-core VM, 2026-12-05)
    # got one page in while a 2 s flood ran, where two are needed to see the lag grow.
    fake.script(state("JOB_STATE_RUNNING"),
                flood(FLOOD_LINES_PER_S, FLOOD_RANKS, oom_at_s=None, hang_s=3.5))
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION, "bucket": bucket},
        flood_env(fake, storage_emulator))
    _request, job_id = provider.submit(make_job(tmp_path, make_plan(**FLOOD_PLAN)))
    (job,) = fake.jobs.values()
    fake.wait_for(lambda: len(fake.entries) >= 3000)
    cursor: Any = None
    shown: list[str] = []
    lags: list[tuple[float, float]] = []  # (behind, unread seconds by the fake's count)
    while provider.poll(job_id).state == "running":
        new, cursor = provider.logs(job_id, cursor)
        shown += output(new)
        lag = provider.behind(job_id, cursor)
        if new and lag is not None:
            unread = sum(entry_lines(fake, job.number).values()) - len(shown)
            lags.append((lag, unread / FLOOD_LINES_PER_S))
        time.sleep(0.05)
    assert len(lags) >= 2, lags
    for lag, unread_s in lags:
        assert lag == pytest.approx(unread_s, abs=1.0), lags
    assert lags[-1][0] > lags[0][0] > 0.2  # further behind with each page while it floods
    rest, status, cursor = follow(provider, job_id, cursor=cursor)
    assert status.state == "failed"
    assert provider.behind(job_id, cursor) is None  # read to the end
    shown += output(rest)
    assert Counter(shown) == entry_lines(fake, job.number) and len(set(shown)) == len(shown)
    assert fake.quota_refusals == 0


def test_resource_exhausted_backs_off_without_holding_the_follower(fake, storage_emulator,
                                                                  bucket, tmp_path):
    """While the job runs, a read refused for the quota is one request and an empty answer
    (the event channel's next read is not held up), and the next read waits for the backoff;
    after the job's end a refused read is retried within the call."""
    fake.script(state("JOB_STATE_RUNNING"), log("workerpool0-0", "first", insert_id="first"),
                wait_read("first"), log("workerpool0-0", "second"),
                wait_cancel(30, "not cancelled"))
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION, "bucket": bucket},
        vertex_env(fake, storage_emulator, LAUNCH_VERTEX_RETRY_INITIAL_S="2"))
    _request, job_id = provider.submit(make_job(tmp_path))
    fake.wait_for(lambda: fake.entries)
    fake.wait_for(lambda: provider.poll(job_id).state == "running")
    reads = len(fake.calls_to("ListLogEntries"))
    fake.fail_next("ListLogEntries", "RESOURCE_EXHAUSTED")
    lines, cursor = provider.logs(job_id)
    assert output(lines) == [] and len(fake.calls_to("ListLogEntries")) == reads + 1
    lines, cursor = provider.logs(job_id, cursor)  # backing off (1 to 2 s): nothing sent
    assert output(lines) == [] and len(fake.calls_to("ListLogEntries")) == reads + 1
    deadline = time.monotonic() + 8
    while not output(lines) and time.monotonic() < deadline:
        time.sleep(0.05)
        lines, cursor = provider.logs(job_id, cursor)
    assert output(lines) == ["workerpool0-0: first"]
    fake.wait_for(lambda: len(fake.entries) >= 2)
    provider.stop(job_id)
    fake.wait_for(lambda: provider.poll(job_id).terminal)
    fake.fail_next("ListLogEntries", "RESOURCE_EXHAUSTED")
    before = len(fake.calls_to("ListLogEntries"))
    lines, cursor = provider.logs(job_id, cursor)  # ended: retried here
    assert output(lines) == ["workerpool0-0: second"]
    assert len(fake.calls_to("ListLogEntries")) == before + 2


@pytest.mark.parametrize("transport", ["grpc", "rest"])
def test_a_follower_over_a_quota_others_use_up_still_shows_every_line_once(
        storage_emulator, bucket, tmp_path, transport):
    """Someone else reads the project's logs too: the provider counts only its own reads, so
    Cloud Logging refuses some (RESOURCE_EXHAUSTED, HTTP 429 over REST); the supervisor backs
    off and carries on, and every line is still shown once."""
    from launcher.supervisor import Supervisor

    with FakeVertex(project=PROJECT, storage_host=storage_emulator,
                    mount_root=tmp_path / "gcs-mount", read_quota=3,
                    quota_window_s=0.5) as fake:
        fake.script(state("JOB_STATE_RUNNING"),
                    *[log(f"workerpool0-{i % 2}", f"[rank{i % 2}]:line {i}", delay=0.02)
                      for i in range(40)],
                    log("workerpool0-0", metrics(0, 1)), sleep(0.5),
                    finish("JOB_STATE_SUCCEEDED"))
        spec, run = flood_run(tmp_path, bucket)
        provider = VertexProvider.from_settings(
            {"project": PROJECT, "region": REGION, "bucket": bucket},
            vertex_env(fake, storage_emulator, transport,
                       LAUNCH_VERTEX_LOG_SETTLE_S="1"))
        lines: list[str] = []
        supervisor = Supervisor(provider, run, on_line=lines.append, on_note=lambda _: None,
                                poll_interval_s=0.01)
        outcome = supervisor.launch(spec, make_plan(nodes=2, global_batch_size=16))
        assert outcome.status == ExitStatus.SUCCESS, outcome.message
        assert fake.quota_refusals > 0
        (job,) = fake.jobs.values()
        assert Counter(output(lines)) == entry_lines(fake, job.number)
        assert len(output(lines)) == 41 and outcome.last.summary.steps == 1


def test_the_event_channel_is_a_filtered_query_built_from_the_failure_classifier(
        fake, storage_emulator, bucket, tmp_path):
    """What the event channel asks Cloud Logging for: the templates' lines and every needle of
    the classifier's memory failures (their one home), on both payload fields, within Cloud
    Logging's 20,000 characters; the fake answers it as Google would: substrings, any case."""
    from datetime import UTC, datetime

    from launcher.events import MARKER
    from launcher.failures._anchors import needles_for
    from launcher.providers.vertex import _gcp

    query = vertex.event_query("7001", datetime(2026, 8, 1, tzinfo=UTC))
    assert len(query) <= _gcp.FILTER_MAX_CHARS
    for needle in (MARKER, *needles_for(vertex.EVENT_CATEGORIES).needles):
        if needle.isprintable():
            for name in vertex.EVENT_FIELDS:
                assert f"{name}:{_gcp.quote(needle)}" in query
    assert _gcp.quote('a "b" \\c') == '"a \\"b\\" \\\\c"'
    with pytest.raises(ValueError):
        _gcp.quote("\toom")

    wanted = [
        f"workerpool1-0: {metrics(3, 7)}",
        "workerpool1-0: [rank3]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "2.00 GiB",
        "workerpool0-0: [rank0]:RuntimeError: cuda OUT OF MEMORY (a hand-made message)",
        "workerpool0-0: [rank1]:Killed",
        "[vertex] The replica workerpool1-0 ran out-of-memory and exited with a non-zero status "
        "of 9(SIGKILL).",
    ]
    fake.script(state("JOB_STATE_RUNNING"),
                log("workerpool0-0", "[rank0]:step 1 loss 2.31"),
                log("workerpool1-0", wanted[0].split(": ", 1)[1]),
                log("workerpool0-0", "[rank0]:zoom into the room, 12 GB of RAM"),
                log("workerpool1-0", wanted[1].split(": ", 1)[1]),
                log("workerpool0-0", wanted[2].split(": ", 1)[1], as_json=True),
                log("workerpool0-0", wanted[3].split(": ", 1)[1]),
                log(None, wanted[4].removeprefix("[vertex] ")),
                log("workerpool0-0", "[rank0]:NCCL error: unhandled system error", insert_id="z"),
                wait_cancel(30, "not cancelled"))
    provider = provider_for(fake, storage_emulator, bucket, "rest")
    _request, job_id = provider.submit(make_job(tmp_path))
    fake.wait_for(lambda: "z" in fake.written)
    fake.wait_for(lambda: provider.poll(job_id).state == "running")
    got, cursor = provider.events(job_id)
    assert got == wanted
    again, cursor = provider.events(job_id, cursor)
    assert again == []  # read again from before the newest (late entries): nothing twice
    provider.stop(job_id)


def test_a_plain_scripts_oom_is_stopped_from_the_event_channel_alone(
        fake, storage_emulator, bucket, tmp_path):
    """No templates' line, and a full stream that will not be read again for a minute: the
    allocator's message comes through the event channel and the supervisor stops the job."""
    from launcher.supervisor import Supervisor

    message = "[rank1]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    fake.script(state("JOB_STATE_RUNNING"), log("workerpool0-0", "[rank0]:step 1", insert_id="a"),
                wait_read("a"), sleep(0.2), log("workerpool0-0", message, insert_id="oom"),
                wait_cancel(30, "NCCL watchdog timeout"))
    spec, run = flood_run(tmp_path, bucket)
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION, "bucket": bucket},
        vertex_env(fake, storage_emulator, "grpc", LAUNCH_VERTEX_LOG_POLL_S="60"))
    lines: list[str] = []
    notes: list[str] = []
    supervisor = Supervisor(provider, run, on_line=lines.append, on_note=notes.append,
                            poll_interval_s=0.01)
    outcome = supervisor.launch(spec, make_plan())
    (job,) = fake.jobs.values()
    assert outcome.last.outcome == "oom" and job.state == "JOB_STATE_CANCELLED"
    assert job.cancelled_at > fake.written["oom"]
    assert "oom" not in fake.served or fake.served["oom"] <= job.cancelled_at
    stream = [c for c in fake.calls_to("ListLogEntries") if "textPayload:" not in c.request.filter]
    assert not [c for c in stream if fake.written["oom"] <= c.at < job.cancelled_at]
    assert any(note.startswith("out of memory on rank 1") for note in notes), notes
    assert f"workerpool0-0: {message}" in lines  # the full stream still shows it, once
    assert lines.count(f"workerpool0-0: {message}") == 1


def test_an_event_query_cloud_logging_refuses_leaves_the_full_stream(fake, storage_emulator,
                                                                     bucket, tmp_path):
    fake.script(state("JOB_STATE_RUNNING"), log("workerpool0-0", metrics(0, 1)),
                wait_cancel(30, "not cancelled"))
    provider = provider_for(fake, storage_emulator, bucket)
    _request, job_id = provider.submit(make_job(tmp_path))
    fake.wait_for(lambda: fake.entries)
    fake.wait_for(lambda: provider.poll(job_id).state == "running")
    fake.fail_next("ListLogEntries", "INVALID_ARGUMENT")
    assert provider.events(job_id) == ([], None)
    calls = len(fake.calls_to("ListLogEntries"))
    assert provider.events(job_id) == ([], None)  # off for this job: nothing more is sent
    assert len(fake.calls_to("ListLogEntries")) == calls
    lines, _cursor = provider.logs(job_id)
    assert any("event channel's query was refused" in line for line in lines)
    assert f"workerpool0-0: {metrics(0, 1)}" in lines
    provider.stop(job_id)


def test_the_fakes_query_language_refuses_what_it_does_not_know():
    """Cloud Logging's precedence (NOT, then OR, then AND), escapes and case; and anything
    outside the subset is INVALID_ARGUMENT, never a filter that matches everything."""
    from datetime import UTC, datetime

    from tests.fakes.vertex_server import FakeError, LogQuery, _Row

    def row(text: str, task: str = "workerpool0-0") -> _Row:
        return _Row(key=(datetime(2026, 8, 1, 0, 0, 1, tzinfo=UTC), 1), insert_id="i",
                    resource_type="ml_job", resource_labels={"job_id": "7"},
                    labels={"ml.googleapis.com/task_name": task}, severity="INFO",
                    log_name="l", text=text, message=None, pb=None)

    ids: dict[str, int] = {}

    def matches(query: str, text: str) -> bool:
        return LogQuery('timestamp>="2026-08-01T00:00:00Z" AND ' + query,
                        lambda t: ids.setdefault(t, len(ids))).match(row(text))

    assert matches('textPayload:"cuda OUT of"', "CUDA out of memory")
    assert not matches('textPayload:"cuda out of"', "HIP out of memory")
    assert matches('textPayload:"{\\"launch\\":"', '[rank0]:{"launch": "oom"}')
    assert matches('textPayload:"a\\\\b"', "a\\b")
    # AND binds least: a AND b OR c is a AND (b OR c).
    assert matches('resource.labels.job_id="7" AND textPayload:"x" OR textPayload:"y"', "y")
    assert not matches('resource.labels.job_id="8" AND textPayload:"x" OR textPayload:"y"', "y")
    assert matches('NOT textPayload:"x" AND labels."ml.googleapis.com/task_name"='
                   '"WORKERPOOL0-0"', "y")
    for bad in ('textPayload:x', 'textPayload:"x" textPayload:"y"', 'textPayload:"x" or '
                'textPayload:"y"', '"x"', 'textPayload=~"x"', 'SEARCH("x")',
                'textPayload:"\\t"', 'httpRequest.status="500"', 'resource.type:"ml"',
                '(textPayload:"x"', 'textPayload:"x")', 'severity>="ERROR"'):
        with pytest.raises(FakeError) as caught:
            matches(bad, "x")
        assert caught.value.code == "INVALID_ARGUMENT", bad
    with pytest.raises(FakeError, match="timestamp bound"):
        LogQuery('textPayload:"x"', lambda t: 0)


def test_the_read_quota_gives_the_event_channel_its_turn_and_the_stream_the_rest():
    """60 reads a minute: the event channel every 2 s per job, the stream evenly spread over
    the rest (every 2 s while a job's events are read, every second once they stop), and never
    more than 60 in any 61 s."""
    from launcher.providers.vertex._gcp import QUOTA_MARGIN_S, ReadQuota

    quota = ReadQuota(per_minute=60, events_every_s=2.0)
    assert quota.wait_s("log") == 0 and quota.wait_s("events", "job") == 0
    quota.spend("events", "job")
    quota.spend("log")
    sent = time.monotonic()
    assert quota.wait_s("events", "job", now=sent + 1.0) == pytest.approx(1.0, abs=0.05)
    assert quota.wait_s("events", "other", now=sent) == 0  # per job
    assert quota.wait_s("log", now=sent + 1.0) == pytest.approx(1.0, abs=0.05)  # 30 a minute
    quota.forget("job")  # its job ended: the stream gets the whole quota
    assert quota.wait_s("log", now=sent + 0.5) == pytest.approx(0.5, abs=0.05)
    for _ in range(58):
        quota.spend("events", "third")
    full = time.monotonic()
    # 60 in the window: the next waits until the oldest has left it, whatever the channel.
    for channel in ("log", "events"):
        wait = quota.wait_s(channel, "fourth", now=full + 5)
        assert wait == pytest.approx(sent + 60 + QUOTA_MARGIN_S - full - 5, abs=0.05)
    # An event interval shorter than the quota allows is stretched: at most half the quota.
    assert ReadQuota(per_minute=60, events_every_s=0.1).events_every_s == 2.0


# -- launch status | logs | cancel ---------------------------------------------------------------


def test_status_logs_and_cancel_commands_on_a_vertex_run(fake, storage_emulator, bucket,
                                                         tmp_path, cli, monkeypatch):
    from launcher.runs import Attempt, Run

    fake.script(state("JOB_STATE_RUNNING"), log("workerpool0-0", metrics(0, 1)),
                log("workerpool0-0", metrics(0, 2)), wait_cancel(60, "not cancelled"))
    environ = vertex_env(fake, storage_emulator)
    provider = VertexProvider.from_settings(
        {"project": PROJECT, "region": REGION, "bucket": bucket}, environ)
    job = make_job(tmp_path)
    _request, job_id = provider.submit(job)
    run = Run.create(tmp_path / "state", "train", {
        "script": str(job.code_dir / "train.py"), "provider": "vertex",
        "spec": {"project": PROJECT, "region": REGION, "bucket": bucket}})
    run.save_attempt(Attempt(number=1, plan=job.plan, job_id=job_id, state="running"))
    fake.wait_for(lambda: len(fake.entries) >= 2)

    status = cli("status", run.id, "--json", environ=environ)
    assert status.status == 0, status.stderr
    assert status.json()["attempts"][0]["live_state"] == "running"
    logs = cli("logs", run.id, "--raw", environ=environ)
    assert logs.status == 0, logs.stderr
    assert f"workerpool0-0: {metrics(0, 2)}" in logs.stdout.splitlines()
    cancel = cli("cancel", run.id, environ=environ)
    assert cancel.status == 0, cancel.stderr
    assert "cancelled attempt 1" in cancel.stdout
    assert len(fake.calls_to("CancelCustomJob")) == 1
    assert run.attempts()[0].state == "cancelled"


# -- end to end: the fake runs the submitted job for real ------------------------------------------

OOM_AT_MICRO_BATCH_4 = TINY_RECIPE.replace(
    "def training_step(model, batch):\n",
    "CALLS = 0\n\n\n"
    "def training_step(model, batch):\n"
    "    global CALLS\n"
    "    CALLS += 1\n"
    "    if batch['x'].shape[0] >= 4 and CALLS >= 3:\n"
    "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB '\n"
    "                                     '(raised by the test recipe)')\n",
)


def test_end_to_end_the_staged_job_runs_on_two_nodes_ooms_and_resumes(
        fake, storage_emulator, storage, bucket, tmp_path):
    """The fake takes the code from the storage emulator, runs each worker pool's own command
    (the bootstrap, then torchrun on the CPU) as two nodes, and serves their real output as log
    entries: the request, the staging and the templates fit together, OOM and resume included."""
    from launcher.remedies import replan
    from launcher.runs import Run
    from launcher.spec import Spec
    from launcher.supervisor import Supervisor

    fake.script(state("JOB_STATE_PENDING"), execute())
    fake.script(state("JOB_STATE_PENDING"), execute())
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent(OOM_AT_MICRO_BATCH_4))
    spec = Spec(script=code / "train.py", mode="recipe", provider="vertex", max_attempts=2,
                checkpoint_every=1, region=REGION, bucket=bucket)
    run = Run.create(tmp_path / "state", "train", {"provider": "vertex", "spec": spec.to_dict()})
    provider = provider_for(fake, storage_emulator, bucket, "grpc")
    lines: list[str] = []
    notes: list[str] = []
    supervisor = Supervisor(provider, run, on_line=lines.append, on_note=notes.append,
                            replan=lambda plan, failure: replan(plan, failure),
                            poll_interval_s=0.05)
    plan = Plan(strategy="ddp", machine="g2-standard-4", nodes=2, gpus_per_node=1,
                micro_batch_size=4, grad_accum_steps=1, global_batch_size=8, precision="fp32",
                optimizer="adamw", activation_checkpointing=False, steps=4, lr=0.01)
    outcome = supervisor.launch(spec, plan)
    text = "\n".join(lines)
    assert outcome.status == ExitStatus.SUCCESS, (outcome.message, notes, text[-3000:])

    first, second = outcome.attempts
    # Stopped on the allocator's message or on the template's line, whichever came first.
    assert first.outcome == "oom" and first.diagnosis.diagnosis.phase == "forward", first
    assert second.outcome == "success" and second.summary.resumed_from_step == 2
    assert second.summary.steps == 4
    # Real output of both nodes, each rank prefixed by its global rank.
    for node, rank in (("workerpool0-0", 0), ("workerpool1-0", 1)):
        assert any(line.startswith(f"{node}: [rank{rank}]:") and '"launch": "metrics"' in line
                   for line in lines), text[-3000:]
    assert any(line.startswith("workerpool1-0: launch: node 1 of 2") for line in lines)
    # Checkpoints went to the bucket's folder through the stand-in for /gcs, shared by attempts.
    checkpoints = fake.mount_root / bucket / "launch" / "runs" / run.id / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*.pt"))[-1] == "step_00000004.pt"
    # The code was staged once, the job files once per attempt.
    names = [b.name.rsplit("/", 1)[-1] for b in storage.list_blobs(bucket)]
    assert sum(n.startswith("code-") for n in names) == 1
    assert sum(n.startswith("job-") for n in names) == 2


# -- status against an endpoint that never answers; regions ----------------------------------------


def _silent_environ(address: str, **extra: str) -> dict[str, str]:
    return {"LAUNCH_VERTEX_ENDPOINT": address, "LAUNCH_LOGGING_ENDPOINT": address,
            "LAUNCH_VERTEX_STATUS_TIMEOUT_S": "0.5", "LAUNCH_VERTEX_STATUS_DEADLINE_S": "1",
            "LAUNCH_VERTEX_RETRY_INITIAL_S": "0.05", "LAUNCH_VERTEX_POLL_S": "0", **extra}


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_status_against_an_endpoint_that_never_answers_ends_within_the_deadline(
        tmp_path, cli, scheme):
    """The endpoint takes the connection and never answers (REST: no HTTP response; gRPC: no
    HTTP/2 settings). `launch status` fails in one line, exit 6, once the status deadline has
    passed (about 12 s by default; 1 s here to keep the test short), not after 120 s of
    retrying 30 s calls."""
    from launcher.runs import Attempt, Run
    from tests.fakes.silent import silent_endpoint

    job_id = f"projects/{PROJECT}/locations/{REGION}/customJobs/7"
    run = Run.create(tmp_path / "state", "train", {"provider": "vertex", "spec": {
        "project": PROJECT, "region": REGION}})
    run.save_attempt(Attempt(number=1, plan=make_plan(), job_id=job_id, state="running"))
    with silent_endpoint() as (host, port):
        start = time.monotonic()
        result = cli("status", run.id, environ=_silent_environ(f"{scheme}://{host}:{port}"))
        elapsed = time.monotonic() - start
    assert result.status == ExitStatus.PROVIDER_ERROR == 6, result.stderr
    assert elapsed < 15
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("launch: error: ")
    assert f"reading the Vertex AI job {job_id}: " in result.stderr
    assert "did not answer" in result.stderr and "Traceback" not in result.stderr


def test_a_follower_keeps_the_last_state_through_a_short_silence():
    from google.cloud.aiplatform_v1.types import CustomJob, JobState

    from tests.fakes.silent import silent_endpoint

    job_id = f"projects/{PROJECT}/locations/{REGION}/customJobs/8"
    with silent_endpoint() as (host, port):
        provider = VertexProvider.from_settings(
            {"project": PROJECT, "region": REGION},
            _silent_environ(f"http://{host}:{port}", LAUNCH_VERTEX_RETRY_DEADLINE_S="60"))
        running = CustomJob(name=job_id, state=JobState.JOB_STATE_RUNNING)
        provider._jobs[job_id] = (time.monotonic() - 30, running)
        start = time.monotonic()
        assert provider.poll(job_id).state == "running"  # answered 30 s ago: it stands in
        provider._jobs[job_id] = (time.monotonic() - 90, running)
        with pytest.raises(ProviderError, match="did not answer") as caught:
            provider.poll(job_id)  # silent for longer than retry_deadline_s: say so
        assert caught.value.status == ExitStatus.PROVIDER_ERROR
        assert time.monotonic() - start < 15
    timing = vertex.Timing()
    assert timing.status_deadline_s + timing.status_timeout_s < 15


@pytest.mark.parametrize("bad", ["evil.example.com:443#", "us-central1.evil.example.com",
                                 "evil.example.com/", "US-CENTRAL1", "us-central1\n",
                                 "us-central1@evil", "global", ""])
def test_a_region_that_is_no_region_never_reaches_a_host_name(bad):
    with pytest.raises(UsageError, match="is not a Google Cloud region") as caught:
        VertexProvider(project=PROJECT, region=bad)
    assert "us-central1" in caught.value.hint and "\n" not in str(caught.value)
    with pytest.raises(UsageError, match="is not a Google Cloud region"):
        VertexProvider.from_settings({"project": PROJECT},
                                     {"LAUNCH_REGION": "", "CLOUDSDK_AI_REGION": bad or "x"})
    # A recorded job name is read back by `launch status`: its location is a host name too.
    with pytest.raises(UsageError, match="is not a Vertex AI custom job name"):
        vertex.parse_job_name(f"projects/{PROJECT}/locations/{bad}/customJobs/1")
    for good in ("us-central1", "europe-west4", "northamerica-northeast1", "me-central2"):
        assert VertexProvider(project=PROJECT, region=good).region == good


def test_an_unrecorded_attempt_is_adopted_by_its_labels(fake, storage_emulator, bucket,
                                                        tmp_path):
    """What `launch status` does after a launcher died between the create and its record."""
    provider = provider_for(fake, storage_emulator, bucket)
    job = make_job(tmp_path)
    _request, job_id = provider.submit(job)
    assert provider.adopt(RUN_ID, 1, job.attempt_dir) == job_id
    assert provider.adopt(RUN_ID, 2, job.attempt_dir) is None
    assert len(fake.jobs) == 1


def test_the_bootstrap_refuses_an_archive_changed_in_the_bucket(tmp_path, monkeypatch):
    """Jobs can write to the staging bucket; each node checks an archive against the hash in its
    name before extracting it (the bootstrap's own unpack, fed the bytes write_archive makes)."""
    import io

    from launcher.providers import vertex as vertex_module
    from launcher.providers.vertex import _gcp

    request = VertexProvider(project="p", region="us-central1", bucket="b").dryrun(
        make_job(tmp_path))
    archive = request.staging[0]
    data = io.BytesIO()
    _gcp.write_archive(archive, data)
    namespace: dict[str, Any] = {}
    exec(compile(vertex_module.BOOTSTRAP.split("# -- run --")[0], "bootstrap", "exec"), namespace)
    monkeypatch.chdir(tmp_path)
    namespace["unpack"](archive.uri, data.getvalue())
    assert (tmp_path / "code" / "train.py").is_file()

    other = _gcp.StagedArchive(uri=archive.uri, sha256=archive.sha256, members=tuple(
        _gcp.text_members({"code/train.py": "import os; os.system('curl evil')"})))
    planted = io.BytesIO()
    _gcp.write_archive(other, planted)
    with pytest.raises(SystemExit, match="not the archive this job was created with"):
        namespace["unpack"](archive.uri, planted.getvalue())


SCRIPT_ARGS = ["--train_file", "data with spaces.txt", "--lr=3e-4", "$HOME", "it's"]


def test_the_script_s_own_arguments_follow_it_in_the_container_args(cli, write_script):
    """`launch plan --provider vertex SCRIPT -- ARGS`: each argument one element of the
    container's args after the script (the bootstrap hands its argv to torchrun, no shell), on
    every worker pool; what torchrun itself would misread is refused before any request."""
    script = write_script("print('hi')\n")
    settings = ["--params", "1M", "--provider", "vertex", "--project", PROJECT, "--region",
                REGION, "--bucket", "launch-bucket", "--machine", "a2-highgpu-1g", "--nodes",
                "2", "--json"]
    environ = {"LAUNCH_VERTEX_ENDPOINT": "http://127.0.0.1:9"}
    result = cli("plan", str(script), *settings, "--", *SCRIPT_ARGS, environ=environ)
    assert result.status == 0, result.stderr
    custom_job = result.json()["request"]["customJob"]
    parse_job(custom_job)
    for pool in custom_job["jobSpec"]["workerPoolSpecs"]:
        assert pool["containerSpec"]["args"] == [
            "--nproc_per_node", "1", "--tee", "3", "code/train.py", *SCRIPT_ARGS]
    refused = cli("plan", str(script), *settings, "--", "--max", "3", environ=environ)
    assert refused.status == ExitStatus.USAGE and refused.stderr.count("\n") == 1
    assert ("the script's argument '--max' abbreviates torchrun's own --max-restarts, "
            "--max_restarts") in refused.stderr
