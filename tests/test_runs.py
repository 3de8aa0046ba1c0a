"""The run folder: atomic state, attempts recorded one line each, runs found by id."""

import json

import pytest

from launcher.runs import Attempt, Outcome, Run
from launcher.statefiles import atomic_write
from launcher.status import JobState, UsageError


def test_attempts_are_one_line_each_and_updated_in_place(tmp_path):
    run = Run.create(tmp_path, "tinygpt", {"provider": "local"})
    run.save_attempt(Attempt(number=1, plan={"micro_batch_size": 8}, state="running"))
    run.save_attempt(Attempt(number=2, plan={"micro_batch_size": 4}, state="running"))
    first = run.attempts()[0]
    first.state, first.outcome = "failed", "oom"
    run.save_attempt(first)
    lines = (run.path / "attempts.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert [json.loads(line)["outcome"] for line in lines] == ["oom", None]
    assert Run.open(tmp_path, run.id).attempts()[1].plan == {"micro_batch_size": 4}


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
            mine.save_attempt(Attempt(number=number, plan={}, summary={"step": step}))

    threads = [threading.Thread(target=writer, args=(n,)) for n in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {a.number: a.summary["step"] for a in run.attempts()} == {1: 59, 2: 59, 3: 59}


def test_states_and_outcomes_are_read_as_members_and_written_as_before(tmp_path):
    """A state file holds plain strings; read back, they are the enums' members, and written
    again the file is byte for byte what it was."""
    run = Run.create(tmp_path, "old", {"provider": "local"})
    line = json.dumps({"change": "", "cost_usd": None, "diagnosis": None, "ended_at": 2.0,
                       "exit_code": 1, "job_id": "j", "number": 1, "outcome": "oom",
                       "plan": {}, "started_at": 1.0, "state": "cancelled",
                       "summary": {"message": "x"}}, sort_keys=True) + "\n"
    (run.path / "attempts.jsonl").write_text(line)
    attempt = run.attempts()[0]
    assert attempt.state is JobState.CANCELLED and attempt.outcome is Outcome.OOM
    run.save_attempt(attempt)
    assert (run.path / "attempts.jsonl").read_text() == line
    updated = run.update_attempt(1, state="failed", outcome="failed")
    assert updated.state is JobState.FAILED and updated.outcome is Outcome.FAILED
    with pytest.raises(ValueError):
        Attempt(number=2, plan={}, state="lost")


@pytest.mark.parametrize("content", ['{"number": 1, "plan": {}, "state": "lost"}',
                                     '{"number": 1, "plan": {}, "outcome": "detached"}'])
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
            run.save_attempt(Attempt(number=1, plan={}))
        finally:
            os.replace = real_replace
            os._exit(1)
    _pid, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert list(run.path.glob(".attempts.jsonl.*.tmp"))  # what the dead writer left
    run.save_attempt(Attempt(number=1, plan={"micro_batch_size": 2}))
    assert not list(run.path.glob(".attempts.jsonl.*.tmp"))
    assert run.attempts()[0].plan == {"micro_batch_size": 2}
