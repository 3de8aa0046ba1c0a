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
    assert first is not None and first() == {"ok": True, "action": "measure"}


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
print(json.dumps([plain, rank]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    plain, rank = json.loads(out.stdout.strip().splitlines()[-1])
    assert plain == {"ok": True, "fsdp": False}
    assert rank == {"ok": True, "fsdp": True}
