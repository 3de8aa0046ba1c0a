"""A provider for the tests only: what it takes to add one (tests/providers/test_contract.py).

A provider is a package: its class with the :class:`~launcher.providers.base.Provider` methods
(here), its settings class (``settings.py``: its flag and config key) and its machine catalog
(``catalog.json``), and one registry entry (``launcher.providers.REGISTRY``: :data:`ENTRY`);
nothing else in the launcher names it. The tests register this one with ``monkeypatch.setitem``
(or, in a fresh process, as :func:`register` does).

Its "cloud" is a folder (:class:`ToyCloud`), so that a provider built again from the run's
settings (``launch status|logs|cancel``) sees the same jobs, as a cloud's would. A job is a JSON
file advanced one step on each ``poll``: pending, running (its lines written), then succeeded,
unless its scenario is ``hang`` (running until stopped) or ``no-capacity`` (failed: the machines
were not there). The scenario of the next job is pushed first, as the wire-level fakes do.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from launcher.providers import REGISTRY, Registered
from launcher.providers.base import Job, JobStatus, Provider
from launcher.providers.checks import Check, Checks
from launcher.status import ProviderError, UsageError
from tests.providers.toy.settings import ToySettings

#: The toy's one registry line.
ENTRY = Registered("tests.providers.toy", "ToyProvider", "ToySettings", "catalog.json")
__all__ = ["ENTRY", "ToyCloud", "ToyProvider", "ToySettings", "register"]


def register() -> None:
    """Add the toy to the registry of this process (before ``launcher.options`` is imported, for
    its flag to be one of the commands')."""
    REGISTRY["toy"] = ENTRY

#: Where the toy's cloud is, when the settings do not say (``toy_root``).
ROOT_VARIABLE = "LAUNCH_TOY_ROOT"
SCENARIOS = ("success", "hang", "no-capacity")
NO_CAPACITY = "ToyBoxEmpty: no toys left in the box"


class ToyCloud:
    """The toy's jobs, one JSON file each, and the queue of scenarios the next jobs play."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def push(self, *scenarios: str) -> None:
        for scenario in scenarios:
            if scenario not in SCENARIOS:
                raise ValueError(scenario)
        self.root.mkdir(parents=True, exist_ok=True)
        queue = self._queue()
        (self.root / "queue.json").write_text(json.dumps([*queue, *scenarios]))

    def pop(self) -> str:
        queue = self._queue()
        (self.root / "queue.json").write_text(json.dumps(queue[1:]))
        return queue[0] if queue else "success"

    def _queue(self) -> list[str]:
        path = self.root / "queue.json"
        return json.loads(path.read_text()) if path.exists() else []

    def jobs(self) -> list[str]:
        return sorted(p.stem for p in (self.root / "jobs").glob("*.json"))

    def load(self, job_id: str) -> dict[str, Any]:
        path = self.root / "jobs" / f"{job_id}.json"
        if not path.exists():
            raise ProviderError(f"the toy has no job {job_id!r}")
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def save(self, job: dict[str, Any]) -> None:
        folder = self.root / "jobs"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{job['id']}.json").write_text(json.dumps(job))


@dataclass(frozen=True)
class ToyRequest:
    """What the toy sends: a job name, the command and the lines the plan makes it print."""

    name: str
    run_id: str
    attempt: int
    command: list[str]
    env: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ToyProvider(Provider):
    name: ClassVar[str] = "toy"
    has_doctor: ClassVar[bool] = True
    capacity_patterns: ClassVar[tuple[str, ...]] = ("ToyBoxEmpty",)

    def __init__(self, root: Path):
        self.cloud = ToyCloud(root)

    @classmethod
    def from_settings(cls, settings: dict[str, Any], environ: dict[str, str] | None = None
                      ) -> ToyProvider:
        root = ToySettings(settings.get("toy_root")).toy_root or (environ or {}).get(ROOT_VARIABLE)
        if not root:
            raise UsageError("no toy box", f"pass --toy-root or set {ROOT_VARIABLE}")
        return cls(Path(root))

    @classmethod
    def doctor_checks(cls, settings: Any, environ: Any) -> list[Check]:
        doctor = Checks(dict(settings), dict(environ))
        root = settings.get("toy_root") or environ.get(ROOT_VARIABLE)
        if not root:
            doctor.add("box", "fail", "no toy box configured", f"set {ROOT_VARIABLE}")
            doctor.skip(("toys",), "needs the box")
        elif not Path(root).is_dir():
            doctor.add("box", "fail", f"{root} is not a folder", f"mkdir {root}")
            doctor.skip(("toys",), "needs the box")
        else:
            doctor.add("box", "ok", str(root))
            doctor.add("toys", "warn", f"{len(ToyCloud(Path(root)).jobs())} job(s) in the box",
                       "nothing to fix: a toy")
        return doctor.checks

    def dryrun(self, job: Job) -> ToyRequest:
        plan = job.plan
        env = {**job.rendered.env, "LAUNCH_RUN_ID": job.run_id, "LAUNCH_ATTEMPT": str(job.attempt)}
        return ToyRequest(name=f"toy-{job.run_id}-a{job.attempt}", run_id=job.run_id,
                          attempt=job.attempt,
                          command=["toyrun", "--procs", str(plan.world_size),
                                   job.rendered.entrypoint],
                          env=dict(sorted(env.items())))

    def schedule(self, request: ToyRequest) -> str:  # type: ignore[override]
        existing = self.adopt(request.run_id, request.attempt, Path("."))
        if existing is not None:
            return existing
        job = {"id": request.name, "run_id": request.run_id, "attempt": request.attempt,
               "scenario": self.cloud.pop(), "state": "pending", "lines": [], "message": "",
               "request": request.to_dict()}
        self.cloud.save(job)
        return request.name

    def poll(self, job_id: str) -> JobStatus:
        job = self.cloud.load(job_id)
        if job["state"] == "pending":
            job["state"] = "running"
            job["lines"].append(f"[toy] {job_id}: running {' '.join(job['request']['command'])}")
        elif job["state"] == "running" and job["scenario"] == "success":
            job["lines"] += ['[rank0]:{"launch": "metrics", "rank": 0, "step": 1, "loss": 1.0}',
                             '[rank0]:{"launch": "done", "rank": 0, "step": 1}']
            job["state"] = "succeeded"
        elif job["state"] == "running" and job["scenario"] == "no-capacity":
            job["state"], job["message"] = "failed", NO_CAPACITY
        self.cloud.save(job)
        exit_code = {"succeeded": 0, "failed": 1}.get(job["state"])
        return JobStatus(job["state"], exit_code=exit_code, message=job["message"])

    def logs(self, job_id: str, cursor: Any = None) -> tuple[list[str], Any]:
        lines = self.cloud.load(job_id)["lines"]
        start = int(cursor or 0)
        return lines[start:], len(lines)

    def stop(self, job_id: str) -> None:
        job = self.cloud.load(job_id)
        if job["state"] in ("pending", "running"):
            job["state"], job["message"] = "cancelled", "stopped"
            job["lines"].append(f"[toy] {job_id}: stopped")
            self.cloud.save(job)

    def adopt(self, run_id: str, attempt: int, attempt_dir: Path) -> str | None:
        for job_id in self.cloud.jobs():
            job = self.cloud.load(job_id)
            if job["run_id"] == run_id and job["attempt"] == attempt:
                return job_id
        return None
