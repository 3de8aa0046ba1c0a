"""What every provider does, the same way: one contract, run against each provider in the
registry (local with real torchrun processes, Vertex AI and SageMaker against their loopback fakes
driven by the real clients) and against a toy provider registered by the test
(tests/providers/toy/), which shows that a new provider is a package and one registry entry.

The contract: ``dryrun`` is pure and its request is what ``schedule`` takes (``submit`` is
``schedule(dryrun(job))``); a job is followed to its end with ``poll`` and ``logs`` (a JSON
cursor), by this provider or another one built from the same settings; ``stop`` cancels a
running job and does nothing to an ended one; ``doctor_checks`` returns the checks `launch doctor`
prints; ``lost_capacity`` knows the platform's own words for "no machines".
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from launcher import providers
from launcher.doctor import doctor_providers, run_doctor
from launcher.plan.plan import Plan
from launcher.providers.base import Job, Provider
from launcher.providers.checks import Check
from launcher.render import RenderedJob
from launcher.spec import check_options
from launcher.status import UsageError
from tests.providers.toy import ENTRY as TOY
from tests.providers.toy import ToyCloud, ToyProvider

PROVIDERS = ("local", "vertex", "sagemaker", "toy")


@dataclass
class Harness:
    """One provider under the contract: how to build it (through the registry), make a job, and
    make the next job succeed or run until stopped."""

    name: str
    settings: dict[str, Any]
    environ: dict[str, str] | None
    job: Callable[[int], Job]
    succeed: Callable[[], None]
    hang: Callable[[], None]
    doctor_settings: dict[str, Any] = field(default_factory=dict)

    def provider(self) -> Provider:
        return providers.get_provider(self.name, dict(self.settings), self.environ)


def follow(provider: Provider, job_id: str, cursor: Any = None, lines: list[str] | None = None,
           timeout: float = 90.0) -> tuple[list[str], Any, Any]:
    """The supervisor's loop: poll, read, end at the first empty read after a terminal state."""
    lines = [] if lines is None else lines
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = provider.poll(job_id)
        new, cursor = provider.logs(job_id, cursor)
        json.dumps(cursor)  # a cursor is plain JSON: `launch attach` carries on from it
        lines += new
        if status.terminal and not new:
            return lines, status, cursor
        if not new:
            time.sleep(0.02)
    raise AssertionError(f"{job_id} did not end; read so far: {lines[-20:]}")


def running(provider: Provider, job_id: str, timeout: float = 90.0) -> tuple[list[str], Any]:
    """Poll and read until the job runs and has said something: (lines, cursor)."""
    lines: list[str] = []
    cursor = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = provider.poll(job_id)
        assert not status.terminal, (status, lines)
        new, cursor = provider.logs(job_id, cursor)
        lines += new
        if status.state == "running" and lines:
            return lines, cursor
        time.sleep(0.02)
    raise AssertionError(f"{job_id} did not start; read so far: {lines[-20:]}")


# -- the providers -------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def toy_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy's one registry entry, for the test only."""
    monkeypatch.setitem(providers.REGISTRY, "toy", TOY)


@pytest.fixture
def local_harness(tmp_path: Path) -> Harness:
    scripts = {"source": ""}
    ok = 'print("hello from the local job", flush=True)\n'
    hang = 'import time\nprint("started", flush=True)\ntime.sleep(600)\n'

    def job(attempt: int) -> Job:
        code = tmp_path / "code"
        code.mkdir(exist_ok=True)
        (code / "script.py").write_text(textwrap.dedent(scripts["source"] or ok))
        run = tmp_path / "run"
        attempt_dir = run / f"attempt-{attempt}"
        (attempt_dir / "job").mkdir(parents=True, exist_ok=True)
        plan = Plan(strategy="single", machine="local-cpu", nodes=1, gpus_per_node=1,
                    micro_batch_size=2, grad_accum_steps=1, global_batch_size=2,
                    precision="fp32", optimizer="adamw", activation_checkpointing=False,
                    steps=1, lr=0.1)
        rendered = RenderedJob(files={}, entrypoint="script.py", env={"LAUNCH_STEPS": "1"})
        return Job(run_id="contract", attempt=attempt, plan=plan, rendered=rendered,
                   job_dir=attempt_dir / "job", attempt_dir=attempt_dir,
                   checkpoint_dir=run / "checkpoints", code_dir=code)

    return Harness("local", {"python": sys.executable}, None, job,
                   succeed=lambda: scripts.update(source=ok),
                   hang=lambda: scripts.update(source=hang))


@pytest.fixture(scope="module")
def storage_emulator() -> Any:
    pytest.importorskip("google.cloud.aiplatform_v1")
    pytest.importorskip("gcp_storage_emulator")
    from gcp_storage_emulator.server import create_server

    from tests.providers.test_vertex import _free_port

    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def vertex_harness(storage_emulator: str, tmp_path: Path) -> Any:
    import uuid

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    from tests.fakes.vertex_server import FakeVertex, finish, log, state, wait_cancel
    from tests.providers.test_vertex import PROJECT, REGION, make_job, vertex_env

    bucket = f"launch-contract-{uuid.uuid4().hex[:8]}"
    gcs.Client(project=PROJECT, credentials=AnonymousCredentials(),
               client_options={"api_endpoint": storage_emulator}).create_bucket(bucket)
    with FakeVertex(project=PROJECT, storage_host=storage_emulator,
                    mount_root=tmp_path / "gcs-mount", read_quota=None) as fake:
        yield Harness(
            "vertex", {"project": PROJECT, "region": REGION, "bucket": bucket},
            vertex_env(fake, storage_emulator),
            lambda attempt: make_job(tmp_path, attempt=attempt),
            succeed=lambda: fake.script(
                state("JOB_STATE_RUNNING", 0.05), log("workerpool0-0", "hello from vertex"),
                finish("JOB_STATE_SUCCEEDED", delay=0.05)),
            hang=lambda: fake.script(state("JOB_STATE_RUNNING"),
                                     wait_cancel(60, "not cancelled")),
            doctor_settings={"project": PROJECT, "region": REGION, "bucket": bucket})


@pytest.fixture(scope="module")
def moto() -> Any:
    pytest.importorskip("boto3")
    pytest.importorskip("moto")
    from tests.fakes.sagemaker_server import moto_client, start_moto
    from tests.providers.test_sagemaker import BUCKET

    # moto's servers in one process share their state: what another module's server made is
    # here already, and what this one makes is reset when it is done.
    server, endpoint = start_moto()
    s3, iam = moto_client("s3", endpoint), moto_client("iam", endpoint)
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=BUCKET)
    with contextlib.suppress(iam.exceptions.EntityAlreadyExistsException):
        iam.create_role(RoleName="SageMakerRole", AssumeRolePolicyDocument="{}")
    yield endpoint
    import requests

    requests.post(f"{endpoint}/moto-api/reset", timeout=30)
    server.stop()


@pytest.fixture
def sagemaker_harness(moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from tests.fakes.sagemaker_server import (
        CloudWatchProxy,
        FakeSageMaker,
        isolated_aws_env,
        runs_until_stopped,
        success,
    )
    from tests.providers.test_sagemaker import BUCKET, ROLE, make_job

    (tmp_path / "fake").mkdir()
    fake = FakeSageMaker(moto, tmp_path / "fake")
    fake.start()
    cloudwatch = CloudWatchProxy(moto)
    environ = isolated_aws_env(
        monkeypatch, tmp_path, AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing-secret-value", AWS_ENDPOINT_URL=moto,
        AWS_ENDPOINT_URL_SAGEMAKER=fake.url, AWS_ENDPOINT_URL_LOGS=cloudwatch.url)
    settings = {"bucket": BUCKET, "role": ROLE, "region": "us-east-1", "api_interval_s": 0,
                "log_settle_s": 0.05, "aws_max_attempts": 4}
    yield Harness("sagemaker", settings, environ,
                  lambda attempt: make_job(tmp_path, attempt=attempt),
                  succeed=lambda: fake.push(success(steps=1)),
                  hang=lambda: fake.push(runs_until_stopped(60)),
                  doctor_settings={"bucket": BUCKET, "role": ROLE, "region": "us-east-1"})
    cloudwatch.close()
    fake.close()


@pytest.fixture
def toy_harness(tmp_path: Path) -> Harness:
    root = tmp_path / "toybox"
    cloud = ToyCloud(root)
    cloud.push()  # the box exists, empty

    def job(attempt: int) -> Job:
        plan = Plan(strategy="ddp", machine="toy-2", nodes=1, gpus_per_node=2,
                    micro_batch_size=2, grad_accum_steps=1, global_batch_size=4,
                    precision="fp32", optimizer="adamw", activation_checkpointing=False,
                    steps=1, lr=0.1)
        attempt_dir = tmp_path / "run" / f"attempt-{attempt}"
        rendered = RenderedJob(files={"launch_train.py": "print()\n"},
                               entrypoint="launch_train.py", env={"LAUNCH_STEPS": "1"})
        return Job(run_id="contract", attempt=attempt, plan=plan, rendered=rendered,
                   job_dir=attempt_dir / "job", attempt_dir=attempt_dir,
                   checkpoint_dir=tmp_path / "run" / "checkpoints", code_dir=tmp_path)

    return Harness("toy", {"toy_root": str(root)}, {}, job,
                   succeed=lambda: cloud.push("success"), hang=lambda: cloud.push("hang"),
                   doctor_settings={"toy_root": str(root)})


@pytest.fixture(params=PROVIDERS)
def harness(request: pytest.FixtureRequest) -> Harness:
    found: Harness = request.getfixturevalue(f"{request.param}_harness")
    return found


# -- the contract ----------------------------------------------------------------------------------


def test_the_registry_builds_it_by_name(harness: Harness) -> None:
    cls = providers.provider_class(harness.name)
    assert issubclass(cls, Provider) and cls.name == harness.name
    assert type(harness.provider()) is cls
    check_options({"provider": harness.name})  # `--provider NAME` is accepted: one list


def test_dryrun_is_pure_and_submit_sends_exactly_it(harness: Harness,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    provider = harness.provider()
    job = harness.job(1)
    first, second = provider.dryrun(job), provider.dryrun(job)
    shown = json.dumps(first.to_dict(), sort_keys=True)  # what `launch plan --json` shows
    assert shown == json.dumps(second.to_dict(), sort_keys=True)
    sent: list[Any] = []
    monkeypatch.setattr(provider, "schedule", lambda request: sent.append(request) or "job-1")
    request, job_id = provider.submit(job)
    assert sent == [request] and job_id == "job-1"
    assert json.dumps(request.to_dict(), sort_keys=True) == shown


def test_a_scheduled_dry_run_is_followed_to_its_end(harness: Harness) -> None:
    harness.succeed()
    provider = harness.provider()
    job_id = provider.schedule(provider.dryrun(harness.job(1)))
    assert isinstance(job_id, str) and job_id
    lines, status, _cursor = follow(provider, job_id)
    assert status.state == "succeeded" and status.terminal
    assert lines
    provider.stop(job_id)  # an ended job: nothing to do
    again = harness.provider()  # `launch status` builds it again from the run's settings
    assert again.poll(job_id).state == "succeeded"
    assert again.residue(job_id) == []
    assert isinstance(again.events(job_id)[0], list)


def test_stop_cancels_a_running_job_and_stopping_again_does_nothing(harness: Harness) -> None:
    harness.hang()
    provider = harness.provider()
    _request, job_id = provider.submit(harness.job(1))
    lines, cursor = running(provider, job_id)
    provider.stop(job_id)
    _lines, status, _cursor = follow(provider, job_id, cursor, lines)
    assert status.state == "cancelled"
    provider.stop(job_id)
    assert provider.poll(job_id).state == "cancelled"


def test_doctor_checks_are_the_doctors_report(harness: Harness) -> None:
    cls = providers.provider_class(harness.name)
    checks = cls.doctor_checks(harness.doctor_settings, harness.environ or {})
    assert isinstance(checks, list) and all(isinstance(c, Check) for c in checks)
    if not cls.has_doctor:
        assert checks == [] and harness.name not in doctor_providers()
        with pytest.raises(UsageError):
            run_doctor(harness.name, harness.doctor_settings, harness.environ or {})
        return
    assert checks and all(c.status in ("ok", "warn", "fail", "skip") for c in checks)
    assert len({c.name for c in checks}) == len(checks)
    report = run_doctor(harness.name, harness.doctor_settings, harness.environ or {})
    assert [c.name for c in report.checks] == [c.name for c in checks]


def test_lost_capacity_is_the_platforms_own_words(harness: Harness) -> None:
    provider = harness.provider()
    for words in type(provider).capacity_patterns:
        assert provider.lost_capacity(f"job failed: {words.upper()} (try later)")
    assert not provider.lost_capacity("exit code: 1")
    assert not provider.lost_capacity("")


# -- what the providers own ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "message", "lost"), [
    ("sagemaker", "CapacityError: Unable to provision requested ML compute capacity", True),
    ("sagemaker", "InsufficientInstanceCapacity: We currently do not have sufficient capacity",
     True),
    ("sagemaker", "AlgorithmError: ExecuteUserScriptError: exit code: 1", False),
    ("vertex", "The zone does not have enough resources available to fulfill the request", True),
    ("vertex", "ZONE_RESOURCE_POOL_EXHAUSTED", True),
    ("vertex", "Resources are insufficient in region us-central1", True),
    ("vertex", "a GPU stockout in us-central1-a", True),
    ("vertex", "The replica workerpool0-0 exited with a non-zero status of 1", False),
    ("local", "CapacityError", False),
])
def test_each_cloud_names_its_own_capacity_errors(name: str, message: str, lost: bool) -> None:
    """The supervisor's "machines were taken away" test, in each provider's words."""
    cls = providers.provider_class(name)
    assert any(p.lower() in message.lower() for p in cls.capacity_patterns) is lost


def test_one_registry_for_run_plan_and_doctor() -> None:
    assert providers.names()[:3] == ("local", "vertex", "sagemaker")
    assert doctor_providers() == ["vertex", "sagemaker", "toy"]
    with pytest.raises(UsageError) as caught:
        check_options({"provider": "nope"})
    assert caught.value.hint == "choose one of local, vertex, sagemaker, toy"
    with pytest.raises(UsageError) as unknown:
        run_doctor("local", {}, {})
    assert unknown.value.hint == ("pass --provider vertex or --provider sagemaker or "
                                  "--provider toy")
    assert isinstance(providers.get_provider("toy", {"toy_root": "/nowhere"}), ToyProvider)


def test_the_registry_imports_no_provider_and_the_bootstraps_are_package_data() -> None:
    """The options, the config keys and the doctor's list read each provider's settings class
    and catalog, never its provider class: no client code, no SDK (`launch --help` waits on
    this)."""
    code = textwrap.dedent("""
        import sys
        import launcher.cli, launcher.doctor, launcher.providers, launcher.spec
        settings = {"launcher.providers.vertex", "launcher.providers.vertex.settings",
                    "launcher.providers.sagemaker", "launcher.providers.sagemaker.settings"}
        loaded = [m for m in sys.modules if m.startswith(("launcher.providers.vertex",
                  "launcher.providers.sagemaker", "launcher.providers.local", "google.cloud.",
                  "google.api_core", "grpc", "boto3", "botocore")) and m not in settings]
        assert not loaded, loaded
        assert settings <= set(sys.modules)  # the flags come from them
        from importlib import resources
        for package in ("launcher.providers.vertex", "launcher.providers.sagemaker"):
            assert resources.files(package).joinpath("bootstrap.py").is_file()
            assert resources.files(package).joinpath("catalog.json").is_file()
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_supervisor_resubmits_on_the_providers_own_no_capacity_words(
        toy_harness: Harness, tmp_path: Path) -> None:
    """The supervisor knows no cloud's error strings: the toy's "no toys left" is a lost machine
    because the toy says so (``capacity_patterns``), and the same plan runs again."""
    from launcher.runs import Run
    from launcher.spec import Spec
    from launcher.supervisor import Supervisor
    from tests.conftest import TINY_RECIPE

    ToyCloud(Path(toy_harness.settings["toy_root"])).push("no-capacity", "success")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent(TINY_RECIPE))
    spec = Spec(script=code / "train.py", mode="recipe", provider="toy", max_attempts=2)
    run = Run.create(tmp_path / "state", "train", {"provider": "toy", "spec": spec.to_dict()})
    notes: list[str] = []
    supervisor = Supervisor(toy_harness.provider(), run, on_line=lambda line: None,
                            on_note=notes.append, replan=None, poll_interval_s=0.0)
    plan = toy_harness.job(1).plan
    outcome = supervisor.launch(spec, plan)
    assert [a.outcome for a in outcome.attempts][-1] == "success", (outcome.message, notes)
    assert len(outcome.attempts) == 2
    assert any("the machine was taken away" in note for note in notes)


#: Modules outside the provider packages that name a cloud, and why: none (SMP v2 runs only
#: where a provider's catalog offers it: ``Strategy.vendor``).
CLOUD_NAMES_LEFT: dict[str, int] = {}


def test_cloud_names_appear_only_in_their_provider_packages_and_the_listed_few():
    """A cloud's name as a literal outside ``launcher/providers/`` (a catalog's JSON is data, and
    says its provider's title and aliases itself): only where ``CLOUD_NAMES_LEFT`` says, so
    a new one fails here and the list only shrinks."""
    import ast

    package = Path(providers.__file__).resolve().parents[1]
    clouds = {name for name in providers.names() if name != "local"}
    found: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        if "providers" in path.relative_to(package).parts:
            continue
        hits = sum(isinstance(node, ast.Constant) and isinstance(node.value, str)
                   and node.value.lower() in clouds
                   for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))
        if hits:
            found[str(path.relative_to(package))] = hits
    assert found == CLOUD_NAMES_LEFT


def test_every_provider_rebases_the_script_into_the_code_folder_one_way(tmp_path):
    """``in_code_folder`` is the one rebasing of a script or recipe path into the job's code
    folder (Vertex's entry point and plan.json, SageMaker's package): relative paths are the
    code folder's, a path that leaves it (absolute, or by ``..``, or through a link) is refused
    before anything is sent, naming both."""
    from launcher.providers.base import in_code_folder
    from launcher.status import UsageError

    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "train.py").write_text("")
    (tmp_path / "elsewhere.py").write_text("")
    (code / "link.py").symlink_to(tmp_path / "elsewhere.py")
    assert in_code_folder("pkg/train.py", code) == "pkg/train.py"
    assert in_code_folder(code / "pkg" / "train.py", code) == "pkg/train.py"
    assert in_code_folder("pkg/../pkg/train.py", code) == "pkg/train.py"
    for outside in (tmp_path / "elsewhere.py", "../elsewhere.py", "link.py"):
        with pytest.raises(UsageError) as refused:
            in_code_folder(outside, code, "recipe")
        assert str(refused.value.message).startswith(f"the recipe {outside} is outside")
        assert str(code) in refused.value.message


@pytest.mark.parametrize("name", providers.names())
def test_a_provider_s_platform_words_are_found_by_their_needles(name):
    """A managed platform names itself in its logs (``platform_pattern``); the classifier looks
    for its ``platform_needles`` first, so every match of the pattern must hold one of them, and
    a log explained under the provider's name (or an alias) is read as the platform's."""
    import re

    from launcher.failures._rules import managed_platform, names_platform

    cls = providers.provider_class(name)
    assert managed_platform(name) == bool(cls.platform_pattern)
    if not cls.platform_pattern:
        return
    for alias in cls.platform_aliases:
        assert managed_platform(alias.upper())
    pattern = re.compile(cls.platform_pattern)
    for alternative in cls.platform_pattern.split("|"):
        sample = (alternative.replace("\\d+", "12").replace("\\d", "3").replace("\\b", "")
                  .replace("\\.", ".").replace("[Ss]", "S").replace("[Mm]", "m"))
        assert pattern.search(f"x {sample} y"), alternative
        assert any(n in sample.lower() for n in cls.platform_needles), alternative
        assert names_platform(f"x {sample} y"), alternative


def test_contributings_recipe_on_the_toy_one_package_and_one_registry_line(tmp_path):
    """CONTRIBUTING's "Add a provider", checked on the toy in a fresh process with nothing but
    its registry line added: its settings class's flag is an option of plan, run and doctor
    (with its title from its catalog), its setting a config key, its catalog is the one
    `launch machines` lists and the planner searches, its images are the image table's, and the
    plan's request is the toy's own dry run."""
    from tests.conftest import TINY_RECIPE

    repo = Path(__file__).resolve().parents[2]
    entry = textwrap.dedent("""
        import sys
        from tests.providers.toy import register
        register()
        from launcher.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    box = tmp_path / "box"
    box.mkdir()
    (tmp_path / "train.py").write_text(textwrap.dedent(TINY_RECIPE))
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(repo),
               "LAUNCH_NO_TRACE": "1", "LAUNCH_STATE_DIR": str(tmp_path / "state")}

    def launch(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", entry, *args], cwd=tmp_path, env=environ,
                              capture_output=True, text=True, timeout=300)

    for command in ("plan", "run", "doctor"):
        shown = launch(command, "--help")
        assert shown.returncode == 0, shown.stderr
        assert "--toy-root" in shown.stdout and "(Toy Box)" in shown.stdout, (command, shown.stdout)
    listed = launch("machines", "--provider", "toy", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [m["name"] for m in json.loads(listed.stdout)["machines"]] == ["toy-2", "toy-8"]

    (tmp_path / "launch.toml").write_text(f'provider = "toy"\ntoy_root = "{box}"\n')
    planned = launch("plan", "train.py", "--json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["chosen"]["machine"] == "toy-2", plan["chosen"]  # the cheaper of its two
    assert plan["request"]["command"][0] == "toyrun", plan["request"]
    checked = launch("doctor", "--json")
    assert json.loads(checked.stdout)["checks"][0] == {
        **json.loads(checked.stdout)["checks"][0], "name": "box", "status": "ok"}

    (tmp_path / "launch.toml").write_text(f'provider = "toy"\ntoy_rot = "{box}"\n')
    misspelt = launch("plan", "train.py")
    assert misspelt.returncode == 2 and "toy_root" in misspelt.stderr, misspelt.stderr
    image = subprocess.run(
        [sys.executable, "-c", "from tests.providers.toy import register; register(); "
         "from launcher.providers.images import default_image; "
         "print(default_image('toy', 'fsdp').shown)"],
        cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120)
    assert image.stdout.strip() == "toys/pytorch:2.8.0", image.stderr


def test_no_two_options_of_a_command_share_a_flag() -> None:
    """A provider's settings class declares its own flags: one that takes a name the commands
    already have (``--image``, ``--region``) must fail here, not as click's error at every
    `launch` start."""
    from launcher.options import CONFIG_COMMANDS

    for command, options in CONFIG_COMMANDS.items():
        names = [name for o in options for name in o.flag.split("/")]
        assert len(names) == len(set(names)), (command, sorted(n for n in names
                                                                if names.count(n) > 1))
        keys = [o.key for o in options]
        assert len(keys) == len(set(keys)), command
