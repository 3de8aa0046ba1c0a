"""The run folder: atomic state, attempts recorded one line each, runs found by id."""

import json

import pytest

from launcher.runs import Attempt, Diagnosed, Outcome, Run, Summary
from launcher.statefiles import atomic_write
from launcher.status import JobState, UsageError
from tests.conftest import a_plan

#: An attempt's plan as an older launch wrote it: a key this version dropped, one it added
#: missing. It reads, and an attempt read and not changed is written back to the byte.
OLD_PLAN = {**{k: v for k, v in a_plan().to_dict().items() if k != "reshard_after_forward"},
            "retired_field": 3}


def test_attempts_are_one_line_each_and_updated_in_place(tmp_path):
    run = Run.create(tmp_path, "tinygpt", {"provider": "local"})
    run.save_attempt(Attempt(number=1, plan=a_plan(micro_batch_size=8, global_batch_size=8),
                             state="running"))
    run.save_attempt(Attempt(number=2, plan=a_plan(), state="running"))
    first = run.attempts()[0]
    first.state, first.outcome = "failed", "oom"
    run.save_attempt(first)
    lines = (run.path / "attempts.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert [json.loads(line)["outcome"] for line in lines] == ["oom", None]
    assert Run.open(tmp_path, run.id).attempts()[1].plan == a_plan()  # a Plan, as written


def test_open_by_prefix_and_last(tmp_path):
    run = Run.create(tmp_path, "a", {"provider": "local"})
    assert Run.open(tmp_path, run.id[:4]).id == run.id
    assert Run.open(tmp_path, None).id == run.id
    with pytest.raises(UsageError):
        Run.open(tmp_path, "zzz")


def test_atomic_write_leaves_old_content_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "x.json"
    atomic_write(path, "old")

    def boom(*_args):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError):
        atomic_write(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temp file left behind


def test_run_folders_are_private_and_a_clashing_id_is_retried(tmp_path, monkeypatch):
    first = Run.create(tmp_path, "clash", {"provider": "local"})
    assert first.path.stat().st_mode & 0o077 == 0
    assert (tmp_path / "runs").stat().st_mode & 0o077 == 0
    suffix = first.id.rsplit("-", 1)[1]
    tokens = iter([suffix, suffix, "0badc0de"])
    monkeypatch.setattr("launcher.runs.secrets.token_hex", lambda n: next(tokens, "feedf00d"))
    monkeypatch.setattr("launcher.runs.time.strftime", lambda fmt: first.id.split("-", 1)[1]
                        .rsplit("-", 1)[0])
    second = Run.create(tmp_path, "clash", {"provider": "local"})
    assert second.id != first.id and second.id.endswith("0badc0de")


def test_concurrent_updates_of_different_attempts_are_all_kept(tmp_path):
    """Two launch processes (here: threads, each with its own lock file handle) updating the
    same run: without the lock, read-modify-write loses one side's lines."""
    import threading

    run = Run.create(tmp_path, "busy", {"provider": "local"})

    def writer(number: int) -> None:
        mine = Run.open(tmp_path, run.id)
        for step in range(60):
            mine.save_attempt(Attempt(number=number, plan=a_plan(), summary=Summary(steps=step)))

    threads = [threading.Thread(target=writer, args=(n,)) for n in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {a.number: a.summary.steps for a in run.attempts()} == {1: 59, 2: 59, 3: 59}


def test_states_and_outcomes_are_read_as_members_and_written_as_before(tmp_path):
    """A state file holds plain strings; read back, they are the enums' members, and written
    again the file is byte for byte what it was."""
    run = Run.create(tmp_path, "old", {"provider": "local"})
    line = json.dumps({"change": "", "cost_usd": None, "diagnosis": None, "ended_at": 2.0,
                       "exit_code": 1, "job_id": "j", "number": 1, "outcome": "oom",
                       "plan": OLD_PLAN, "started_at": 1.0, "state": "cancelled",
                       "summary": {"message": "x"}}, sort_keys=True) + "\n"
    (run.path / "attempts.jsonl").write_text(line)
    attempt = run.attempts()[0]
    assert attempt.state is JobState.CANCELLED and attempt.outcome is Outcome.OOM
    run.save_attempt(attempt)
    assert (run.path / "attempts.jsonl").read_text() == line
    updated = run.update_attempt(1, state="failed", outcome="failed")
    assert updated.state is JobState.FAILED and updated.outcome is Outcome.FAILED
    with pytest.raises(ValueError):
        Attempt(number=2, plan=a_plan(), state="lost")


_PLAN = a_plan().to_dict()


@pytest.mark.parametrize("content", [json.dumps({"number": 1, "plan": _PLAN, **f}) for f in (
    {"state": "lost"},
    {"outcome": "detached"},
    {"plan": {}},  # no plan launch would record
    {"plan": {"strategy": "ddp"}},
    # a plan whose fields are not what launch writes: each is refused where it is read
    {"plan": {**_PLAN, "nodes": "two"}},
    {"plan": {**_PLAN, "gpus_per_node": 0}},
    {"plan": {**_PLAN, "precision": "fp9"}},
    {"plan": {**_PLAN, "strategy": "zero9"}},
    {"plan": {**_PLAN, "lr": True}},
    {"plan": {**_PLAN, "memory": {**_PLAN["memory"], "total": "big"}}},
    {"plan": {**_PLAN, "memory": [1, 2]}},
    {"summary": {"steps": "many"}},
    {"diagnosis": {"failure": "gpu_oom"}},
    {"diagnosis": {"failure": 7, "cause": None}},
)])
def test_a_state_launch_never_writes_is_a_usage_error(tmp_path, content):
    run = Run.create(tmp_path, "bad", {"provider": "local"})
    (run.path / "attempts.jsonl").write_text(content)
    with pytest.raises(UsageError, match="attempts.jsonl"):
        run.attempts()


@pytest.mark.parametrize("content", ['{"number": 1, "plan"', "[1, 2]",
                                     '{"number": "one", "plan": {}}', "\xff\xfe"])
def test_corrupt_attempts_file_is_a_usage_error_naming_it(tmp_path, content):
    run = Run.create(tmp_path, "bad", {"provider": "local"})
    (run.path / "attempts.jsonl").write_text(content, encoding="latin-1")
    with pytest.raises(UsageError, match="attempts.jsonl"):
        run.attempts()


@pytest.mark.parametrize("content", ["", "{", '["not", "a", "table"]', '{"id": "x"}'])
def test_corrupt_run_file_is_a_usage_error_naming_it(tmp_path, content):
    run = Run.create(tmp_path, "bad", {"provider": "local"})
    (run.path / "run.json").write_text(content)
    with pytest.raises(UsageError, match="run.json"):
        _ = run.info


def test_a_writer_killed_mid_write_leaves_no_temporary_file_behind(tmp_path):
    """`kill -9` of a launch between mkstemp and the rename left `.attempts.jsonl.*.tmp` in the
    run folder (issue 30). Every writer of attempts.jsonl holds the run's lock, so a temporary
    file of it seen under the lock is a dead writer's: the next update removes it."""
    import os
    import signal

    run = Run.create(tmp_path, "killed", {"provider": "local"})
    pid = os.fork()
    if pid == 0:  # the writer: killed after its temporary file exists, before the rename
        real_replace = os.replace
        os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # type: ignore[assignment]
        try:
            run.save_attempt(Attempt(number=1, plan=a_plan()))
        finally:
            os.replace = real_replace
            os._exit(1)
    _pid, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert list(run.path.glob(".attempts.jsonl.*.tmp"))  # what the dead writer left
    run.save_attempt(Attempt(number=1, plan=a_plan(micro_batch_size=2, global_batch_size=2)))
    assert not list(run.path.glob(".attempts.jsonl.*.tmp"))
    assert run.attempts()[0].plan.micro_batch_size == 2


def test_an_attempt_holds_a_plan_a_failure_and_a_summary_and_keeps_its_bytes(tmp_path):
    """Typed records (issue 26): what the supervisor records of an out-of-memory attempt reads
    back as a Plan, a Diagnosed (whose ``failure`` is what the replanner reads, the event's
    figures over the log's) and a Summary; a line written today is written again to the byte."""
    from launcher.events import OomEvent, parse_event
    from launcher.failures import Diagnosis
    from launcher.remedies import Failure

    diagnosis = Diagnosis(failure="gpu_oom", cause="activations", requested_bytes=2 << 30,
                          rank=3, phase="backward", excerpt="CUDA out of memory.")
    event = OomEvent.from_event(parse_event(json.dumps(
        {"launch": "oom", "rank": 3, "phase": "forward", "step": 7, "micro_step": 2,
         "requested_bytes": 3 << 30, "reserved_bytes": 70 << 30,
         "batch_shapes": {"shape": [8, 1024], "dtype": "int64"}})))
    run = Run.create(tmp_path, "typed", {"provider": "local"})
    run.save_attempt(Attempt(number=1, plan=a_plan(), outcome="oom",
                             diagnosis=Diagnosed.of(diagnosis, event),
                             summary=Summary(steps=6, loss=2.5, stop_latency_s=0.4)))
    written = (run.path / "attempts.jsonl").read_text()
    attempt = run.attempts()[0]
    assert attempt.plan == a_plan() and attempt.summary.steps == 6
    assert attempt.diagnosis.diagnosis.phase == "forward"  # the event's, not the log's
    assert attempt.diagnosis.event["step"] == 7
    # what the replanner reads, as the dict path (Failure.of) made it before
    assert attempt.diagnosis.failure == Failure.of(diagnosis.to_dict(), event)
    assert attempt.diagnosis.failure.requested_bytes == 3 << 30
    assert attempt.diagnosis.failure.batch_shapes == {"shape": [8, 1024], "dtype": "int64"}
    run.save_attempt(attempt)
    assert (run.path / "attempts.jsonl").read_text() == written
    # a changed attempt is written from its fields, and reads back as changed
    attempt.summary.message = "stopped"
    run.save_attempt(attempt)
    assert run.attempts()[0].summary.message == "stopped"
    assert json.loads((run.path / "attempts.jsonl").read_text())["summary"]["steps"] == 6


def test_a_run_recorded_by_an_earlier_launch_reads_typed_and_is_written_back_to_the_byte(
        tmp_path, cli):
    """tests/fixtures/runs/: a real run (an OOM, then a smaller micro-batch) recorded by launch
    before its records were typed. Today's launch reads it (a Plan, the failure the replanner
    read, a Summary), shows it, and rewrites it unchanged."""
    import shutil
    from pathlib import Path

    fixture = next((Path(__file__).parent / "fixtures" / "runs").glob("code-*"))
    state = tmp_path / "state"
    shutil.copytree(fixture, state / "runs" / fixture.name)
    run = Run.open(state, fixture.name)
    first, second = run.attempts()
    assert first.outcome is Outcome.OOM and first.plan.micro_batch_size == 8
    assert first.diagnosis.failure.phase == "forward" and first.diagnosis.failure.activations
    assert first.diagnosis.event["step"] == 1
    assert second.plan.micro_batch_size == 4 and second.summary.steps == 4
    before = (run.path / "attempts.jsonl").read_bytes()
    for attempt in (first, second):
        run.save_attempt(attempt)
    assert (run.path / "attempts.jsonl").read_bytes() == before
    shown = cli("status", fixture.name, "--json", environ={"LAUNCH_STATE_DIR": str(state)})
    assert shown.status == 0, shown.stderr
    lines = [json.loads(line) for line in before.decode().splitlines()]
    assert [{k: v for k, v in a.items() if k != "live_state"} for a in shown.json()["attempts"]
            ] == lines

