"""What the user's script starts while the preflight loads it: never a stall, never a leftover.

A script may start processes at import (a metrics helper, a data server, a daemon in a session
of its own). The preflight waits for its own child's answer, not for those processes (which
hold its pipes), and kills them all once it is done; its temporary folders go with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher import processes

#: Each script's background process sleeps for a duration no other process on this machine
#: would: its command line (``sleep 121.5``) or its recorded pid names it as this test's.
SLEEP_S = "121.5"

POPEN_AT_IMPORT = f'''
"""Regression on a toy dataset; a metrics sidecar runs next to training."""
import argparse
import subprocess

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--width", type=int, default=32)
parser.add_argument("--lr", type=float, default=1e-3)
args, _ = parser.parse_known_args()

# the sidecar: started when the module is loaded, as many scripts do
sidecar = subprocess.Popen(["sleep", "{SLEEP_S}"])

LAUNCH = {{"global_batch_size": 8, "steps": 10, "lr": args.lr}}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(),
                                  nn.Linear(args.width, 1))

    def forward(self, x):
        return self.body(x)


def build_model():
    return Net()


def example_batch(batch_size):
    x = torch.randn(batch_size, args.width)
    return x, x.sum(dim=1, keepdim=True)


def training_step(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)
'''

DAEMON_AT_IMPORT = '''
"""Classifier training; a heartbeat daemon reports liveness while it runs."""
import os
import time

import torch
from torch import nn

PIDS = {pids!r}


def start_heartbeat():
    pid = os.fork()
    if pid == 0:  # the daemon: its own session, out of our process group
        os.setsid()
        time.sleep({sleep})
        os._exit(0)
    with open(PIDS, "a") as out:  # its pid file
        out.write(f"{{pid}}\\n")


start_heartbeat()

LAUNCH = {{"global_batch_size": 8, "steps": 10}}


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def example_batch(batch_size):
    return torch.randn(batch_size, 16), torch.randint(0, 4, (batch_size,))


def training_step(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
'''

NO_RETURN = '''
import torch
from torch import nn

LAUNCH = {"global_batch_size": 8}


def build_model():
    return nn.Linear(8, 1)


def example_batch(batch_size):
    return torch.randn(batch_size, 8), torch.randn(batch_size, 1)


def training_step(model, batch):
    x, y = batch
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward  # meant to return it
'''


def _sleepers() -> set[tuple[int, int | None]]:
    """The sleeps of this test's scripts that run: processes whose command line is
    ``sleep 121.5``, each with when it started (a pid alone may be reused)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(entry.name)
        if cmdline[:2] == [b"sleep", SLEEP_S.encode()] and processes.alive(pid):
            found.add((pid, processes.start_ticks(pid)))
    return found


def _alive_of(pids_file: Path) -> list[int]:
    """The daemons whose pids the script wrote to ``pids_file`` that still run."""
    pids = [int(line) for line in pids_file.read_text().split()]
    return [pid for pid in pids if processes.alive(pid)]


@pytest.fixture
def new_sleepers():
    """The sleeps started since the test began (one left by an earlier test is not its own)."""
    before = _sleepers()
    return lambda: sorted(pid for pid, started in _sleepers() - before)


@pytest.mark.parametrize("trace", ["0", "1"], ids=["traced", "probe_only"])
def test_a_process_started_at_import_neither_stalls_the_plan_nor_outlives_it(
        cli, write_script, new_sleepers, trace: str) -> None:
    script = write_script(POPEN_AT_IMPORT, "sidecar.py")
    started = time.monotonic()
    result = cli("plan", str(script), "--provider", "local", "--json",
                 environ={"LAUNCH_NO_TRACE": trace})
    elapsed = time.monotonic() - started
    assert result.status == 0, result.stderr
    assert result.json()["chosen"] is not None
    assert elapsed < 60, f"the plan took {elapsed:.0f} s: it waited for the sidecar"
    assert not new_sleepers(), "the sidecar outlived the preflight"


@pytest.mark.parametrize("trace", ["0", "1"], ids=["traced", "probe_only"])
def test_a_daemon_in_its_own_session_neither_stalls_the_plan_nor_outlives_it(
        cli, write_script, tmp_path: Path, trace: str) -> None:
    pids = tmp_path / "daemons.txt"
    script = write_script(DAEMON_AT_IMPORT.format(pids=str(pids), sleep=SLEEP_S), "daemon.py")
    started = time.monotonic()
    result = cli("plan", str(script), "--provider", "local", "--json",
                 environ={"LAUNCH_NO_TRACE": trace})
    elapsed = time.monotonic() - started
    assert result.status == 0, result.stderr
    assert elapsed < 60, f"the plan took {elapsed:.0f} s: it waited for the daemon"
    assert pids.exists(), "the script never started its daemon"
    assert not _alive_of(pids), "the daemon outlived the preflight"


STALLS_IN_STEP = '''
import time

import torch

LAUNCH = {"global_batch_size": 4}


def build_model():
    return torch.nn.Linear(4, 4)


def example_batch(batch_size):
    return torch.randn(batch_size, 4)


def training_step(model, batch):
    time.sleep(600)
    return model(batch).sum()
'''

SLOW_IMPORT = '''
import time

import torch

time.sleep(600)  # "downloads the dataset"


def build_model():
    return torch.nn.Linear(4, 4)


def example_batch(batch_size):
    return torch.randn(batch_size, 4)


def training_step(model, batch):
    return model(batch).sum()
'''


@pytest.mark.parametrize(("name", "source", "env", "status"), [
    ("sidecar", POPEN_AT_IMPORT, {}, 0),
    ("no_return", NO_RETURN, {}, 2),  # the trace fails: the error path
    ("stalls", STALLS_IN_STEP, {"LAUNCH_TRACE_TIMEOUT": "5"}, 0),  # the trace times out
    ("slow_import", SLOW_IMPORT, {"LAUNCH_PROBE_TIMEOUT": "5"}, 2),  # the probe times out
])
def test_no_temporary_folder_is_left_behind(tmp_path: Path, new_sleepers, name: str,
                                            source: str, env: dict[str, str], status: int,
                                            ) -> None:
    """``launch plan`` as a user runs it, with its own TMPDIR: the preflight's children put
    their temporary files there (the rendered scripts the trace imports among them), and none
    is left when it ends, whether the plan succeeds, fails or times out."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "code" / f"{name}.py"
    script.parent.mkdir()
    script.write_text(source)
    launch = Path(sys.executable).parent / "launch"
    environ = {**os.environ, "TMPDIR": str(tmp), "LAUNCH_STATE_DIR": str(tmp_path / "state"),
               **env}
    environ.pop("LAUNCH_NO_TRACE", None)
    started = time.monotonic()
    proc = subprocess.run([str(launch), "plan", str(script), "--provider", "local"],
                          cwd=tmp_path, env=environ, capture_output=True, text=True,
                          timeout=180, check=False)
    assert proc.returncode == status, proc.stderr
    assert time.monotonic() - started < 60
    left = [p.relative_to(tmp) for p in tmp.rglob("launch-*")]
    assert not left, f"left in TMPDIR: {left}"
    assert not new_sleepers()


def test_a_training_step_that_returns_no_loss_is_one_line_naming_it(cli, write_script) -> None:
    script = write_script(NO_RETURN, "regress.py")
    for trace in ("0", "1"):  # the trace finds it; so does the probe when nothing is traced
        result = cli("plan", str(script), "--provider", "local",
                     environ={"LAUNCH_NO_TRACE": trace})
        assert result.status == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "training_step returned None: it must return the loss tensor" in lines[0]
        line = NO_RETURN.splitlines().index("def training_step(model, batch):") + 1
        assert f"regress.py:{line}" in lines[0]  # where training_step is defined
        assert "unsupported operand" not in lines[0]
