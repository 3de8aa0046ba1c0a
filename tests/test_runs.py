"""The run folder: atomic state, attempts recorded one line each, runs found by id."""

import json

import pytest

from launcher.runs import Attempt, Run, atomic_write
from launcher.status import UsageError


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
