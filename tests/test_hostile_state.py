"""Hostile state files: every field of every state file a run leaves (wrong type, negative, huge,
missing, a real process's pid), through `status`, `logs`, `cancel` and `attach` (issue 30).

A state file is data, not orders: whatever it says, `launch` signals no process it did not start
(a sentinel process, and this test process, stay alive), never fails with an internal error, and
exits 0 or 2 (or the job's true outcome for `attach`: 1 for a job recorded as failed). One real
job is run once; every case edits a fresh copy of its state folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from launcher import processes
from launcher.status import ExitStatus

#: Values a hostile or damaged record may hold where a number, text or table belongs.
HOSTILE: list[Any] = [None, "abc", "", 1.5, -1, 0, 1, 2**63, 99999999999999, True, [], {},
                      {"a": 1}, "../../etc/passwd", "x" * 5000]
#: Marker: the field is removed.
MISSING = object()


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished local run (a plain script: no trace, one torchrun): its state folder."""
    from tests.conftest import TINY_RECIPE

    root = tmp_path_factory.mktemp("hostile")
    code = root / "code"
    code.mkdir()
    (code / "train.py").write_text(TINY_RECIPE)
    state = root / "state"
    env = {**os.environ, "LAUNCH_STATE_DIR": str(state), "LAUNCH_NO_TRACE": "1"}
    done = subprocess.run([sys.executable, "-m", "launcher.cli", str(code / "train.py"),
                           "--json"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=code)
    assert done.returncode == 0, done.stderr
    return state


@pytest.fixture(scope="module")
def sentinel():
    """A process no run started: nothing a state file says may signal it."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def _cases(sentinel_pid: int, sentinel_ticks: int) -> list[tuple[str, str, Any]]:
    """(file, field, value) for every field of every state file."""
    pids = [sentinel_pid, os.getpid(), os.getppid(), -1, 0, 1, 1.5, -sentinel_pid]
    cases: list[tuple[str, str, Any]] = []
    for field in ("pid", "start_ticks", "started_at"):
        for value in [*HOSTILE, *pids, MISSING]:
            cases.append(("runner.json", field, value))
    # The sentinel with its true start time: only the job token can tell it apart.
    cases.append(("runner.json", "pid+ticks", (sentinel_pid, sentinel_ticks)))
    cases.append(("runner.json", "pid+ticks", (os.getpid(), processes.start_ticks(os.getpid()))))
    for field in ("state", "returncode", "message", "ended_at"):
        for value in [*HOSTILE, "zero", "running", MISSING]:
            cases.append(("exit.json", field, value))
    for field in ("number", "plan", "change", "job_id", "state", "outcome", "diagnosis",
                  "started_at", "ended_at", "exit_code", "summary", "cost_usd"):
        for value in [*HOSTILE, float("nan"), MISSING]:
            cases.append(("attempts.jsonl", field, value))
    for field in ("id", "created_at", "script", "provider", "spec", "settings", "plan"):
        for value in [*HOSTILE, MISSING]:
            cases.append(("run.json", field, value))
    for value in [*HOSTILE, "0" * 24, MISSING]:
        cases.append(("request.json", "token", value))
    for whole in ("", "\n", "{", "[]", "null", "[" * 5000 + "]" * 5000):
        cases.append(("attempts.jsonl", "(whole)", whole))
        cases.append(("runner.json", "(whole)", whole))
    return cases


def _apply(run_dir: Path, name: str, field: str, value: Any) -> None:
    """Edit one field of one state file of a copied run. The run is first made to look live
    (attempt recorded running, no exit.json) where the field is one a live job is read by."""
    attempt = run_dir / "attempt-1"
    if name in ("runner.json", "request.json"):
        (attempt / "exit.json").unlink()
        lines = (run_dir / "attempts.jsonl").read_text().replace('"succeeded"', '"running"')
        (run_dir / "attempts.jsonl").write_text(lines)
    path = {"attempts.jsonl": run_dir / "attempts.jsonl", "run.json": run_dir / "run.json"
            }.get(name, attempt / name)
    if field == "(whole)":
        path.write_text(value)
        return
    if name == "attempts.jsonl":
        data = json.loads(path.read_text().splitlines()[0])
    else:
        data = json.loads(path.read_text())
    if field == "pid+ticks":
        data["pid"], data["start_ticks"] = value
    elif name == "request.json":
        if value is MISSING:
            data["env"].pop(processes.TOKEN_VAR)
        else:
            data["env"][processes.TOKEN_VAR] = value
    elif value is MISSING:
        data.pop(field, None)
    else:
        data[field] = value
    path.write_text(json.dumps(data) + "\n")
    old = time.time() - 3600  # not "just written": a missing runner is not waited on
    for file in attempt.glob("*.json"):
        os.utime(file, (old, old))


def test_hostile_state_never_signals_a_stranger_nor_fails_internally(cli, finished, sentinel,
                                                                      tmp_path):
    run_id = next((finished / "runs").iterdir()).name
    ticks = processes.start_ticks(sentinel.pid)
    assert ticks is not None
    cases = _cases(sentinel.pid, ticks)
    state = tmp_path / "state"
    seen: dict[int, int] = {}
    for name, field, value in cases:
        shutil.rmtree(state, ignore_errors=True)
        shutil.copytree(finished, state)
        _apply(state / "runs" / run_id, name, field, value)
        for command in ("status", "logs", "cancel", "attach"):
            out = cli(command, run_id)
            what = (name, field, str(value)[:40], command)
            assert "internal error" not in out.stderr and "Traceback" not in out.stderr, (
                what, out.stderr)
            allowed = {ExitStatus.SUCCESS, ExitStatus.USAGE}
            if command == "attach":  # the job's true outcome, as recorded
                allowed |= {ExitStatus.JOB_FAILED, ExitStatus.OUT_OF_MEMORY}
            assert out.status in allowed, (what, out.status, out.stderr)
            if out.status == ExitStatus.USAGE:
                assert out.stderr.count("\n") == 1, (what, out.stderr)
            seen[out.status] = seen.get(out.status, 0) + 1
            assert sentinel.poll() is None, ("the sentinel was signalled", what)
    # The harness reaches both kinds of answer (it is not all refusals, nor all passes).
    assert seen.get(ExitStatus.USAGE, 0) > 50 and seen.get(ExitStatus.SUCCESS, 0) > 50, seen


def test_a_runner_record_naming_a_stranger_is_not_signalled_and_says_so(cli, finished,
                                                                         sentinel, tmp_path):
    """The reviewer's case: exit.json removed, runner.json naming an unrelated process with no
    start time. Before: `cancel` killed it and printed "cancelled"."""
    run_id = next((finished / "runs").iterdir()).name
    state = tmp_path / "state"
    shutil.copytree(finished, state)
    _apply(state / "runs" / run_id, "runner.json", "start_ticks", MISSING)
    record = state / "runs" / run_id / "attempt-1" / "runner.json"
    record.write_text(json.dumps({"pid": sentinel.pid}))
    out = cli("cancel", run_id)
    assert out.status == ExitStatus.USAGE, out.stderr
    assert "cannot verify" in out.stderr and "runner.json" in out.stderr
    assert sentinel.poll() is None


def test_an_emptied_attempts_file_beside_a_submitted_job_is_corrupt_not_nothing(cli, finished,
                                                                                tmp_path):
    run_id = next((finished / "runs").iterdir()).name
    state = tmp_path / "state"
    shutil.copytree(finished, state)
    (state / "runs" / run_id / "attempts.jsonl").write_text("")
    for command in ("status", "cancel"):
        out = cli(command, run_id)
        assert out.status == ExitStatus.USAGE, out.stderr
        assert "attempts.jsonl" in out.stderr and "attempt-1 was submitted" in out.stderr


def test_a_full_disk_is_exit_2_naming_the_folder(cli, finished, tmp_path, monkeypatch):
    """The state write fails as a full disk fails it (ENOSPC, from the ``state.write`` fault
    point: the same OSError a real full disk raises; the real one is in tests/providers)."""
    run_id = next((finished / "runs").iterdir()).name
    state = tmp_path / "state"
    shutil.copytree(finished, state)
    run_dir = state / "runs" / run_id
    lines = (run_dir / "attempts.jsonl").read_text().replace('"succeeded"', '"running"')
    (run_dir / "attempts.jsonl").write_text(lines)
    monkeypatch.setenv("LAUNCH_FAULT", "state.write:enospc")
    from launcher import faults

    faults._hits.clear()
    out = cli("attach", run_id)  # follows the (ended) job, then records it: the write fails
    assert out.status == ExitStatus.USAGE, out.stderr
    assert f"cannot write the state folder {run_dir}" in out.stderr
    assert "No space left on device" in out.stderr and out.stderr.count("\n") == 1
    assert not list(run_dir.glob(".*.tmp"))
    monkeypatch.delenv("LAUNCH_FAULT")
    again = cli("attach", run_id, "--json")  # space is back: the record is corrected
    assert again.status == 0, again.stderr
    assert json.loads((run_dir / "attempts.jsonl").read_text())["state"] == "succeeded"


def test_the_newest_run_is_the_one_created_last_not_the_one_touched_last(cli, finished,
                                                                         tmp_path):
    state = tmp_path / "state"
    shutil.copytree(finished, state)
    old = next((state / "runs").iterdir())
    new = state / "runs" / "newer-20991231-000000-0000abcd"
    shutil.copytree(old, new)
    info = json.loads((new / "run.json").read_text())
    (new / "run.json").write_text(json.dumps({**info, "created_at": info["created_at"] + 60}))
    future = time.time() + 10 * 365 * 86400
    os.utime(old, (future, future))  # a clock that jumped, a touch, a copy
    out = cli("status", "--json")
    assert out.status == 0, out.stderr
    assert out.json()["run_id"] == new.name


@pytest.mark.parametrize("run_id", ["", " "])
def test_an_empty_run_id_matches_no_run(cli, finished, tmp_path, run_id):
    state = tmp_path / "state"
    shutil.copytree(finished, state)
    out = cli("cancel", run_id)
    assert out.status == ExitStatus.USAGE and "empty run id" in out.stderr


def test_signals_never_reach_a_pid_that_is_no_valid_pid(sentinel):
    """``signal_all`` is the one place launch signals from: 0, 1, -1, negative groups, floats
    and bools are skipped, never sent."""
    for value in (0, 1, -1, -sentinel.pid, 1.5, True, 2**40, "12"):
        processes.signal_all([value], signal.SIGCONT)  # harmless if it were sent
        assert processes.valid_pid(value) is None
    assert processes.valid_pid(sentinel.pid) == sentinel.pid
    assert not processes.owned(sentinel.pid, processes.start_ticks(sentinel.pid), "0" * 24)


def test_a_read_only_state_folder_is_exit_2_naming_it(cli, finished, tmp_path):
    """A read-only state folder (a real read-only bind mount where mount is allowed, as here
    and in CI as root; else a folder without write permission, the same refusal for a user
    that is not root). Reading commands work; one that must record says which folder. Before:
    `attach` failed with an internal error (EROFS on the lock)."""
    run_id = next((finished / "runs").iterdir()).name
    state = tmp_path / "state"
    shutil.copytree(finished, state)
    run_dir = state / "runs" / run_id
    lines = (run_dir / "attempts.jsonl").read_text().replace('"succeeded"', '"running"')
    (run_dir / "attempts.jsonl").write_text(lines)  # attach will have to record the end
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(state), str(state)],
                             capture_output=True).returncode == 0
    if not mounted:
        for folder in (state, *state.rglob("*")):
            if folder.is_dir():
                folder.chmod(0o500)
    try:
        assert cli("status", run_id).status == 0
        assert cli("logs", run_id).status == 0
        out = cli("attach", run_id)
        assert out.status == ExitStatus.USAGE, out.stderr
        assert "cannot write the state folder" in out.stderr and str(run_dir) in out.stderr
        assert out.stderr.count("\n") == 1 and "internal error" not in out.stderr
    finally:
        if mounted:
            subprocess.run(["umount", str(state)], check=False)
        else:
            for folder in (state, *state.rglob("*")):
                if folder.is_dir():
                    folder.chmod(0o700)
