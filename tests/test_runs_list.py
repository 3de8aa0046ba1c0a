"""`launch runs` and the index of every run; readable `status`, `logs` and `explain` (issue 29).

Runs here are written as launch writes them (``Run.create``, ``save_attempt``, ``register``)
except in the one end-to-end test, which runs a real local job and reads it back from another
folder. The index lives in the test's own LAUNCH_HOME (the ``cli`` fixture's ``tmp/home``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from launcher.context import Environment
from launcher.report import format_age, format_attempt, format_log_line
from launcher.run_index import INDEX_NAME, index_run, list_runs, register, state_home
from launcher.runner import Runner
from launcher.runs import Attempt, Run, Summary
from launcher.status import ExitStatus
from tests.conftest import a_plan


def _run(state: Path, home: Path | None, stem: str = "tinygpt", provider: str = "local",
         created_at: float | None = None, attempts: tuple[dict, ...] = ()) -> Run:
    run = Run.create(state, stem, {"provider": provider, "script": f"/code/{stem}.py"})
    if created_at is not None:
        info = json.loads((run.path / "run.json").read_text())
        (run.path / "run.json").write_text(json.dumps({**info, "created_at": created_at}))
    for number, fields in enumerate(attempts, 1):
        if "summary" in fields:
            fields = {**fields, "summary": Summary(**fields["summary"])}
        run.save_attempt(Attempt(number=number, plan=a_plan(), **fields))
    if home is not None:
        register(home, run)
    return run


def _clean(out) -> None:
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr, out.stderr


# -- the index ---------------------------------------------------------------------------------


def test_state_home_follows_launch_home_then_xdg_then_home():
    assert state_home({"LAUNCH_HOME": "/a/b", "XDG_STATE_HOME": "/x"}) == Path("/a/b")
    assert state_home({"LAUNCH_HOME": "rel"}, Path("/cwd")) == Path("/cwd/rel")
    assert state_home({"XDG_STATE_HOME": "/x", "HOME": "/h"}) == Path("/x/launch")
    # A relative XDG_STATE_HOME is invalid (the XDG rule): ignored.
    assert state_home({"XDG_STATE_HOME": "x", "HOME": "/h"}) == Path("/h/.local/state/launch")
    assert state_home({"HOME": "/h"}) == Path("/h/.local/state/launch")


def test_runs_lists_every_run_from_any_folder_newest_first(cli, tmp_path):
    home = tmp_path / "home"
    now = time.time()
    old = _run(tmp_path / "project-a" / ".launch", home, "old", created_at=now - 3 * 3600,
               attempts=({"state": "failed", "outcome": "oom", "cost_usd": 1.5},
                         {"state": "succeeded", "outcome": "success", "cost_usd": 0.25}))
    new = _run(tmp_path / "project-b" / ".launch", home, "new", provider="vertex",
               created_at=now - 190, attempts=({"state": "running"},))
    bare = _run(tmp_path / "state", None, "here", created_at=now - 60)  # this folder's, unindexed
    out = cli("runs", "--json", cwd=tmp_path / "elsewhere")
    assert out.status == 0, out.stderr
    assert out.stderr == ""
    rows = out.json()
    assert [r["run_id"] for r in rows] == [bare.id, new.id, old.id]
    by_id = {r["run_id"]: r for r in rows}
    assert by_id[old.id] | {"created_at": None} == {
        "run_id": old.id, "script": "/code/old.py", "provider": "local", "state": "succeeded",
        "outcome": "success", "attempts": 2, "cost_usd": 1.75, "created_at": None,
        "path": str(old.path), "state_dir": str(tmp_path / "project-a" / ".launch")}
    assert by_id[new.id]["cost_usd"] is None and by_id[new.id]["state"] == "running"
    assert by_id[bare.id]["attempts"] == 0 and by_id[bare.id]["state"] is None
    text = cli("runs", cwd=tmp_path / "elsewhere")
    assert text.status == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["RUN", "SCRIPT", "PROVIDER", "STATE", "ATTEMPTS", "COST", "AGE",
                                "FOLDER"]
    assert lines[1].split()[:7] == [bare.id, "here.py", "local", "-", "0", "-", "1"]
    assert "3 min ago" in lines[2] and "vertex" in lines[2] and " - " in lines[2]
    assert "3 h ago" in lines[3] and "$1.75" in lines[3] and "succeeded" in lines[3]
    assert lines[3].rstrip().endswith(str(tmp_path / "project-a"))
    assert "None" not in text.stdout


def test_a_recorded_script_cannot_write_escapes_to_the_terminal(cli, tmp_path):
    run = Run.create(tmp_path / "state", "esc", {"provider": "local\x1b[2J",
                                                 "script": "/x/\x1b]0;pwned\x07\ntrain.py"})
    out = cli("runs")
    assert out.status == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert len(out.stdout.splitlines()) == 2 and run.id in out.stdout


def test_runs_here_lists_only_this_folders_state_folder(cli, tmp_path):
    home = tmp_path / "home"
    _run(tmp_path / "other" / ".launch", home, "elsewhere")
    mine = _run(tmp_path / "state", home, "mine", attempts=({"state": "succeeded"},))
    out = cli("runs", "--here", "--json")
    assert out.status == 0, out.stderr
    assert [r["run_id"] for r in out.json()] == [mine.id]
    assert len(cli("runs", "--json").json()) == 2
    empty = cli("runs", "--here", environ={"LAUNCH_STATE_DIR": str(tmp_path / "nothing")})
    assert empty.status == 0 and empty.stdout.startswith("no runs")
    # A state folder whose own path goes through a symlink is this folder's all the same; a
    # run folder in it that is a symlink is not listed.
    (tmp_path / "via").symlink_to(tmp_path / "state")
    (tmp_path / "state" / "runs" / "stranger-1").symlink_to(tmp_path / "other" / ".launch")
    linked = cli("runs", "--here", "--json", environ={"LAUNCH_STATE_DIR": str(tmp_path / "via")})
    assert linked.status == 0 and [r["run_id"] for r in linked.json()] == [mine.id]
    assert "stranger-1 is a symlink: skipped" in linked.stderr


def test_a_real_run_is_indexed_and_found_from_another_folder(cli, tiny_recipe, tmp_path):
    """`launch train.py` in one folder; `runs`, `status RUN` and `logs RUN` from another, whose
    state folder holds nothing: the local job is read from the run's own state folder."""
    project = tmp_path / "project"
    project.mkdir()
    environ = {"LAUNCH_STATE_DIR": ""}  # ./.launch of the working folder, as a user has it
    done = cli(str(tiny_recipe), "--json", cwd=project, environ=environ)
    assert done.status == 0, done.stderr
    run_id = done.json()["run_id"]
    index = [json.loads(line) for line in (tmp_path / "home" / INDEX_NAME).read_text()
             .splitlines()]
    assert index == [{"id": run_id, "path": str(project / ".launch" / "runs" / run_id),
                      "created_at": index[0]["created_at"]}]
    away = tmp_path / "away"
    away.mkdir()
    listed = cli("runs", "--json", cwd=away, environ=environ)
    assert [(r["run_id"], r["state"], r["attempts"]) for r in listed.json()] == [
        (run_id, "succeeded", 1)]
    status = cli("status", run_id[:12], cwd=away, environ=environ)
    assert status.status == 0, status.stderr
    assert status.stdout.startswith(f"run {run_id}  local  ")
    assert "None" not in status.stdout and "step=4" in status.stdout
    loss = done.json()["summary"]["loss"]
    assert f"loss={loss:.4g} " in status.stdout + " "
    logs = cli("logs", run_id, cwd=away, environ=environ)
    assert logs.status == 0, logs.stderr
    assert "[rank0] step 1  loss " in logs.stdout and '"launch": "metrics"' not in logs.stdout
    raw = cli("logs", run_id, "--raw", cwd=away, environ=environ)
    assert '"launch": "metrics"' in raw.stdout
    assert cli("logs", run_id, "--json", cwd=away, environ=environ).stdout == raw.stdout
    # `launch status` with no id is still this folder's newest run: here, none.
    assert cli("status", cwd=away, environ=environ).status == ExitStatus.USAGE


def test_an_unknown_run_id_points_at_launch_runs(cli, tmp_path):
    _run(tmp_path / "state", None, "some")
    out = cli("status", "nope")
    assert out.status == ExitStatus.USAGE
    assert "no run matches 'nope'" in out.stderr and "see `launch runs` for run ids" in out.stderr
    assert out.stderr.count("\n") == 1


def test_an_id_that_two_indexed_runs_start_with_is_ambiguous(cli, tmp_path):
    home = tmp_path / "home"
    _run(tmp_path / "a" / ".launch", home, "twin")
    _run(tmp_path / "b" / ".launch", home, "twin")
    out = cli("status", "twin")
    assert out.status == ExitStatus.USAGE and "more than one run matches" in out.stderr
    _clean(out)


def _hostile_index(tmp_path: Path, home: Path) -> tuple[Run, list[str]]:
    """A good run, and index lines each of which must be skipped with a note."""
    good = _run(tmp_path / "good" / ".launch", home, "good", attempts=({"state": "succeeded"},))
    real = _run(tmp_path / "real" / ".launch", None, "real")
    link_parent = tmp_path / "linked"
    link_parent.symlink_to(tmp_path / "real")
    link_runs = tmp_path / "sym" / ".launch" / "runs"
    link_runs.mkdir(parents=True)
    (link_runs / real.id).symlink_to(real.path)
    empty = tmp_path / "empty" / ".launch" / "runs" / "empty-1"
    empty.mkdir(parents=True)
    bad_json = _run(tmp_path / "badjson" / ".launch", None, "badjson")
    (bad_json.path / "run.json").write_text("{")
    huge = _run(tmp_path / "huge" / ".launch", None, "huge")
    with open(huge.path / "attempts.jsonl", "wb") as handle:
        handle.truncate(64 << 20)  # sparse: a 64 MiB record is not read
    fifo = _run(tmp_path / "fifo" / ".launch", None, "fifo")
    (fifo.path / "run.json").unlink()
    os.mkfifo(fifo.path / "run.json")  # never opened: reading it would block forever
    gone = _run(tmp_path / "gone" / ".launch", None, "gone")

    def entry(path: Path, run_id: str | None = None) -> str:
        return json.dumps({"id": run_id or path.name, "path": str(path)})

    lines = [
        "this is not json",
        "[" * 4000 + "]" * 4000,  # nested too deep for the parser, short enough to be parsed
        json.dumps(["a", "list"]),
        json.dumps({"id": "x", "path": "relative/runs/x"}),
        json.dumps({"id": "passwd", "path": "/etc/passwd"}),
        entry(link_runs / real.id),                                # a symlinked run folder
        entry(link_parent / ".launch" / "runs" / real.id),         # through a symlinked parent
        entry(empty),                                              # a folder without run.json
        entry(bad_json.path), entry(huge.path), entry(fifo.path),
        '{"id": "' + "x" * 10000 + '"}',
        entry(gone.path),
    ]
    import shutil

    shutil.rmtree(gone.path)
    with open(home / INDEX_NAME, "a") as handle:
        handle.write("\n".join(lines) + "\n")
    return good, lines


def test_a_hostile_index_is_skipped_line_by_line_with_notes(cli, tmp_path):
    home = tmp_path / "home"
    good, lines = _hostile_index(tmp_path, home)
    for args in (("runs",), ("runs", "--json")):
        out = cli(*args, environ={"LAUNCH_STATE_DIR": str(tmp_path / "nothing")})
        assert out.status == 0, out.stderr
        _clean(out)
        notes = out.stderr.splitlines()
        assert all(n.startswith("launch: note: ") for n in notes), notes
        assert len(notes) == 10 + 1  # ten, then how many more
        assert notes[-1] == f"launch: note: and {len(lines) - 10} more skipped"
        assert good.id in out.stdout
    listed = list_runs(tmp_path / "nothing", home)
    notes = listed.notes
    assert [r.run_id for r in listed.runs] == [good.id]
    assert len(notes) == len(lines) and all("\n" not in n for n in notes), notes
    text = "\n".join(notes)
    for words in ("line 2 is not JSON", "line 3 is not JSON", "line 4 is not a run's entry",
                  "line 5 names no absolute path", "/etc/passwd, which is no run folder",
                  "is a symlink: skipped", "reached through a symlink", "run.json is corrupt "
                  "(missing)", "run.json is corrupt (not JSON", "larger than 16 MiB",
                  "run.json is corrupt (not a regular file)", "longer than 8192 characters",
                  "1 indexed run no longer exists"):
        assert words in text, (words, text)
    # status RUN passes over what it cannot use, and finds what it can.
    assert cli("status", good.id).status == 0
    for run_id in ("real-", "empty-1", "passwd", "fifo-"):
        out = cli("status", run_id)
        assert out.status == ExitStatus.USAGE, (run_id, out.stderr)
        _clean(out)
        assert out.stderr.count("\n") == 1


@pytest.mark.parametrize("kind", ["folder", "fifo", "unreadable"])
def test_an_index_that_is_no_file_is_a_note(cli, tmp_path, kind):
    home = tmp_path / "home"
    home.mkdir()
    index = home / INDEX_NAME
    if kind == "folder":
        index.mkdir()
    elif kind == "fifo":
        os.mkfifo(index)
    else:
        index.write_text("{}\n")
        index.chmod(0)
    out = cli("runs")
    assert out.status == 0, out.stderr
    _clean(out)
    if kind != "unreadable" or os.geteuid() != 0:  # root reads a 000 file
        assert out.stderr.count("\n") == 1 and "index of runs" in out.stderr


def test_a_torn_index_line_does_not_swallow_the_next(tmp_path):
    home = tmp_path / "home"
    first = _run(tmp_path / "a", home, "first")
    with open(home / INDEX_NAME, "a") as handle:
        handle.write('{"id": "cut", "pa')  # a writer killed mid-line
    second = _run(tmp_path / "b", home, "second")
    listed = list_runs(tmp_path / "none", home)
    assert {r.run_id for r in listed.runs} == {first.id, second.id}
    assert listed.notes == ["index line 2 is not JSON: skipped"]


def test_runs_registered_at_once_are_all_kept(tmp_path):
    home = tmp_path / "home"
    runs = [Run.create(tmp_path / "s", f"r{n}", {"provider": "local"}) for n in range(8)]

    def add(run: Run) -> None:
        for _ in range(25):
            register(home, run)

    threads = [threading.Thread(target=add, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = (home / INDEX_NAME).read_text().splitlines()
    assert len(lines) == 200 and all(json.loads(line)["id"] for line in lines)
    listed = list_runs(tmp_path / "none", home)
    assert len(listed.runs) == 8 and listed.notes == []  # once each


def test_a_home_that_cannot_be_written_costs_the_run_a_note_only(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = Environment(cwd=tmp_path, environ={"LAUNCH_HOME": str(blocker / "home")})
    run = Run.create(tmp_path / "state", "r", {"provider": "local"})
    note = index_run(Runner(env).home, run)
    assert note is not None and "not in the index of runs" in note and "\n" not in note
    assert "launch runs --here" in note


# -- readable output ---------------------------------------------------------------------------


def test_status_prints_only_known_fields_and_a_rounded_loss(cli, tmp_path):
    run = _run(tmp_path / "state", None, "readable", attempts=(
        {"state": "failed", "outcome": "oom", "summary": {"steps": 3,
                                                         "loss": 3.2831974029541016}},
        {"state": "running", "change": "micro-batch 8 -> 4"}))
    run.update_attempt(2, job_id=None)
    out = cli("status", run.id)
    assert out.status == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"run {run.id}  local  /code/readable.py",
        "  attempt 1: failed     outcome=oom step=3 loss=3.283",
        "  attempt 2: running     micro-batch 8 -> 4"]
    data = cli("status", run.id, "--json").json()  # the contract: unchanged
    assert data["attempts"][0]["summary"]["loss"] == 3.2831974029541016
    assert data["attempts"][1]["outcome"] is None


def test_format_attempt_and_age():
    attempt = Attempt(number=1, plan=a_plan(), state="succeeded", outcome="success",
                      cost_usd=2.5, summary=Summary(steps=10, loss=0.000123456, message="x"))
    assert format_attempt(attempt, attempt.state) == (
        "attempt 1: succeeded  outcome=success step=10 loss=0.0001235 cost=$2.50")
    nothing = Attempt(number=2, plan=a_plan(), summary=Summary(loss=float("nan")))
    assert format_attempt(nothing, "pending") == "attempt 2: pending    loss=nan"
    assert format_attempt(Attempt(number=3, plan=a_plan()), "pending") == "attempt 3: pending"
    assert [format_age(s) for s in (2, 42, 190, 7300, 86400, 3 * 86400, float("nan"))] == [
        "just now", "42 s ago", "3 min ago", "2 h ago", "1 day ago", "3 days ago", "-"]


@pytest.mark.parametrize("line", [
    '{"launch": "metrics", "step": 1, "loss": 2.0, "samples_per_s": "fast"}',
    '{"launch": "metrics", "step": 1, "loss": 2.0, "peak_allocated_bytes": "lots"}',
    '{"launch": "metrics", "x": ' + "[" * 5000 + "]" * 5000 + "}",
    '{"launch": ' + "[" * 5000 + "]" * 5000 + "}",
])
def test_a_line_that_only_looks_like_an_event_is_shown_as_written(line):
    assert format_log_line(line) == line


def test_explain_of_a_failure_without_a_cause_prints_no_none(cli, tmp_path):
    log = tmp_path / "job.log"
    log.write_text('Traceback (most recent call last):\n  File "x.py", line 1\n'
                   "ValueError: boom\n")
    out = cli("explain", str(log))
    assert out.status == 0, out.stderr
    assert out.stdout.splitlines()[0] == "failure: other (line 3)"
    assert "None" not in out.stdout
    assert cli("explain", str(log), "--json").json()["cause"] is None  # the contract
    done = tmp_path / "done.log"
    done.write_text('{"launch": "done", "rank": 0, "step": 4}\n')
    assert cli("explain", str(done)).stdout.startswith("no failure found in the log")
