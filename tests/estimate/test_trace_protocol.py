"""The trace child's protocol: a probe that is waiting when the child is ready loads beside the
warm-up, not after it.

Proved by a rendezvous, not a clock: the probe's worker waits for the warm-up's mark, and the
warm-up for the worker's; run one after the other, the first would wait in vain and say so.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.estimate.child import _trace_protocol, _workers


def _wait_for(path: Path, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def stdin_with(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Give ``sys.stdin`` the lines the CLI has already sent; fork-safe from here."""
    monkeypatch.setattr(_workers._State, "baseline", _workers._thread_count())

    def give(*lines: dict[str, Any]) -> None:
        read, write = os.pipe()
        os.write(write, "".join(json.dumps(line) + "\n" for line in lines).encode())
        os.close(write)
        monkeypatch.setattr(sys, "stdin", os.fdopen(read))

    return give


def test_a_waiting_probe_loads_while_the_child_warms_up(tmp_path: Path, stdin_with: Any) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    stdin_with({"action": "probe", "script": str(script), "count_flops": False})
    loading, warming = tmp_path / "loading", tmp_path / "warming"

    def work(request: dict[str, Any]) -> dict[str, Any]:  # the probe, in its forked worker
        loading.touch()
        return {"action": request["action"], "saw_warm_up": _wait_for(warming)}

    def warm() -> None:  # in the child, while the worker runs
        warming.touch()
        assert _wait_for(loading), "the probe's worker did not start before the warm-up"

    first = _trace_protocol._warm_beside_probe(work, warm)
    assert first is not None
    assert first() == {"action": "probe", "saw_warm_up": True}


def test_a_child_asked_nothing_yet_only_warms_up(stdin_with: Any) -> None:
    stdin_with()
    warmed: list[bool] = []
    assert _trace_protocol._warm_beside_probe(lambda r: {}, lambda: warmed.append(True)) is None
    assert warmed == [True]


def test_a_first_request_that_is_not_a_probe_is_answered_after_the_warm_up(
        tmp_path: Path, stdin_with: Any) -> None:
    order: list[str] = []
    request = {"action": "measure", "recipe_file": str(tmp_path / "missing.py")}
    stdin_with(request)

    def work(request: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "action": request["action"]}

    first = _trace_protocol._warm_beside_probe(work, lambda: order.append("warm"))
    assert order == ["warm"]
    assert first is not None
    assert json.loads(_trace_protocol.encode(first())) == {"ok": True, "action": "measure"}


def test_a_ranks_workers_are_forked_with_the_sharding_machinery_imported(tmp_path: Path) -> None:
    """FSDP2, DTensor and the fake process group are imported by the child before it forks a
    rank's workers (each of them would import it again, at every rank traced), and only for a
    rank: a single device's workers are forked without them."""
    import subprocess

    recipe = tmp_path / "train.py"
    recipe.write_text("")
    code = f"""
import json, sys
from launcher.estimate.child import _trace_protocol, _workers
_workers.prepare()
def work(request):
    return {{"ok": True, "fsdp": "torch.distributed.fsdp" in sys.modules}}
plain = _trace_protocol.handle({{"recipe_file": {str(recipe)!r}}}, work)
rank = _trace_protocol.handle({{"recipe_file": {str(recipe)!r},
                                "strategy": {{"name": "fsdp", "world_size": 8}}}}, work)
print(_trace_protocol.encode([plain, rank]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    plain, rank = json.loads(out.stdout.strip().splitlines()[-1])
    assert plain == {"ok": True, "fsdp": False}
    assert rank == {"ok": True, "fsdp": True}


def test_a_batchs_parts_run_two_at_a_time_longest_first_and_answer_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two configurations split by depth are four jobs in one queue: never more than two
    workers at once, the deeper halves (and the configuration with more sizes) started first,
    each next one as soon as a slot is free, and the answers back in the request's shape."""
    monkeypatch.setattr(_workers._State, "baseline", _workers._thread_count())
    log = tmp_path / "log"

    def work(request: dict[str, Any]) -> dict[str, Any]:  # in a forked worker
        me = f"{request['name']}-{request.get('depth_part')}"
        with log.open("a") as f:
            f.write(f"start {me}\n")
        time.sleep(0.3 if request.get("depth_part") else 0.1)
        with log.open("a") as f:
            f.write(f"end {me}\n")
        return {"ok": True, "job": me}

    requests = [{"name": "plain", "micro_batch_sizes": [1], "fork_depths": True},
                {"name": "ckpt", "micro_batch_sizes": [1, 2], "fork_depths": True},
                {"name": "whole", "micro_batch_sizes": [1, 2, 4]}]
    answers = json.loads(_trace_protocol.encode(_trace_protocol.answer_all(requests, work)))
    assert answers == [
        {"ok": True, "depths": [{"ok": True, "job": "plain-0"}, {"ok": True, "job": "plain-1"}]},
        {"ok": True, "depths": [{"ok": True, "job": "ckpt-0"}, {"ok": True, "job": "ckpt-1"}]},
        {"ok": True, "job": "whole-None"}]
    events = log.read_text().split("\n")[:-1]
    running, most = 0, 0
    for event in events:
        running += 1 if event.startswith("start") else -1
        most = max(most, running)
    assert most == 2
    starts = [e.split()[1] for e in events if e.startswith("start")]
    assert starts[:2] == ["ckpt-1", "plain-1"]  # the deeper halves, more sizes first
    assert len(starts) == 5


def test_an_answer_is_sent_with_the_workers_text_spliced_in() -> None:
    """The child passes each worker's answer on as the worker wrote it; what it says itself is
    JSON around it, and the line parses as the whole answer."""
    worker = _workers.Raw('{"ok": true, "timeline": [1, 2.5, null]}')
    line = _trace_protocol.encode({"ok": True, "batch": [{"ok": True, "depths": [worker, worker]},
                                                         worker, {"note": "a \"quoted\"\nline"}]})
    assert "\n" not in line
    assert json.loads(line) == {"ok": True, "batch": [
        {"ok": True, "depths": [{"ok": True, "timeline": [1, 2.5, None]}] * 2},
        {"ok": True, "timeline": [1, 2.5, None]}, {"note": "a \"quoted\"\nline"}]}


def test_a_worker_that_wrote_no_whole_answer_is_a_crash_on_the_wire(tmp_path: Path) -> None:
    torn = tmp_path / "answer.json"
    torn.write_text('{"ok": true, "timel')
    for path in (torn, tmp_path / "missing.json"):
        answer = json.loads(_trace_protocol.encode(_workers.read_raw(path, -9)))
        assert answer["ok"] is False and answer["error"]["kind"] == "crash"
        assert "SIGKILL" in answer["error"]["message"]
