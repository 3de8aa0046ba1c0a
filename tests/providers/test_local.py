"""The local provider against real torchrun processes: request, logs, stop, memory cap."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launcher.plan.plan import Plan
from launcher.providers.base import Job
from launcher.providers.local import LocalProvider
from launcher.render import RenderedJob

#: The script's own arguments, as a shell would mangle them if one were in between.
SCRIPT_ARGS = ["--train_file", "data with spaces.txt", "--lr=3e-4", "$HOME", "it's"]


def _plan(procs: int = 1) -> Plan:
    return Plan(strategy="single" if procs == 1 else "ddp", machine="local-cpu", nodes=1,
                gpus_per_node=procs, micro_batch_size=2, grad_accum_steps=1,
                global_batch_size=2 * procs, precision="fp32", optimizer="adamw",
                activation_checkpointing=False, steps=1, lr=0.1)


def _job(tmp_path: Path, source: str, procs: int = 1, memory_limit: int | None = None,
         args: tuple[str, ...] = ()) -> Job:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "script.py").write_text(textwrap.dedent(source))
    attempt = tmp_path / "run" / "attempt-1"
    (attempt / "job").mkdir(parents=True)
    rendered = RenderedJob(files={}, entrypoint="script.py",
                           env={"LAUNCH_MICRO_BATCH_SIZE": "2"}, args=args)
    return Job(run_id="r", attempt=1, plan=_plan(procs), rendered=rendered,
               job_dir=attempt / "job", attempt_dir=attempt,
               checkpoint_dir=tmp_path / "run" / "checkpoints", code_dir=code,
               memory_limit=memory_limit)


def _wait(provider: LocalProvider, job_id: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = provider.poll(job_id)
        if status.terminal:
            return status
        time.sleep(0.1)
    raise AssertionError("job did not end")


def _all_lines(provider: LocalProvider, job_id: str) -> list[str]:
    lines, cursor = [], None
    while True:
        new, cursor = provider.logs(job_id, cursor)
        if not new:
            return lines
        lines += new


def test_request_carries_plan_env_but_no_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret")
    request = LocalProvider(sys.executable).dryrun(_job(tmp_path, "pass", procs=2))
    assert request.argv[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert request.argv[request.argv.index("--nproc_per_node") + 1] == "2"
    assert request.env["LAUNCH_MICRO_BATCH_SIZE"] == "2"
    assert request.env["LAUNCH_CHECKPOINT_DIR"].endswith("checkpoints")
    assert "very-secret" not in repr(request.to_dict())


def test_two_ranks_stream_with_prefixes_and_no_line_twice(tmp_path):
    """... and each rank's script gets its own arguments through torchrun, as they are."""
    provider = LocalProvider(sys.executable)
    job = _job(tmp_path, """
        import json, os, sys
        print("argv " + json.dumps(sys.argv[1:]))
        for i in range(50):
            print(f"line {i} from {os.environ['RANK']} mb={os.environ['LAUNCH_MICRO_BATCH_SIZE']}")
        """, procs=2, args=tuple(SCRIPT_ARGS))
    _request, job_id = provider.submit(job)
    status = _wait(provider, job_id)
    assert status.state == "succeeded" and status.exit_code == 0
    lines = _all_lines(provider, job_id)
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[rank{rank}]:line ")]
        assert [line.split()[1] for line in mine] == [str(i) for i in range(50)]
        assert all(line.endswith("mb=2") for line in mine)
        argv = [line for line in lines if line.startswith(f"[rank{rank}]:argv ")]
        assert [json.loads(line.split(" ", 1)[1]) for line in argv] == [SCRIPT_ARGS]


ARGPARSE_PLAIN = """
import argparse, json, sys
parser = argparse.ArgumentParser()
parser.add_argument("--train_file")
parser.add_argument("--lr", type=float)
parser.add_argument("rest", nargs="*")
args = parser.parse_args()
print("argv " + json.dumps(sys.argv[1:]), flush=True)
print("parsed " + json.dumps(vars(args)), flush=True)
"""


def test_a_plain_script_gets_its_own_arguments_exactly(cli, tmp_path):
    """`launch train.py -- ARGS`: the script's argv is ARGS, element by element (no shell
    splits, expands or unquotes them), the run records them, the request shows them."""
    script = tmp_path / "train.py"
    script.write_text(ARGPARSE_PLAIN)
    result = cli(str(script), "--params", "1M", "--json", "--", *SCRIPT_ARGS)
    assert result.status == 0, result.stderr
    run = tmp_path / "state" / "runs" / result.json()["run_id"]
    log = (run / "attempt-1" / "output.log").read_text().splitlines()
    assert [json.loads(line[5:]) for line in log if line.startswith("argv ")] == [SCRIPT_ARGS]
    assert [json.loads(line[7:]) for line in log if line.startswith("parsed ")] == [
        {"train_file": "data with spaces.txt", "lr": 3e-4, "rest": ["$HOME", "it's"]}]
    assert json.loads((run / "run.json").read_text())["spec"]["script_args"] == SCRIPT_ARGS
    request = json.loads((run / "attempt-1" / "request.json").read_text())
    assert request["argv"][-6:] == [str(script), *SCRIPT_ARGS]


def test_stop_ends_workers_promptly(tmp_path):
    provider = LocalProvider(sys.executable)
    pidfile = tmp_path / "worker.pid"
    job = _job(tmp_path, f"""
        import os, time
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        print("started", flush=True)
        time.sleep(600)
        """)
    _request, job_id = provider.submit(job)
    deadline = time.monotonic() + 60
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = int(pidfile.read_text())
    start = time.monotonic()
    provider.stop(job_id)
    status = _wait(provider, job_id, timeout=30)
    assert status.state == "cancelled"
    assert time.monotonic() - start < 10
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)
    provider.stop(job_id)  # stopping a finished job is a no-op


def test_memory_limit_produces_a_real_cpu_oom(tmp_path):
    provider = LocalProvider(sys.executable)
    job = _job(tmp_path, """
        import torch
        x = torch.ones(8 * 1024**3, dtype=torch.uint8)  # 8 GiB, over the cap
        print("allocated", x.sum())
        """, memory_limit=4 * 1024**3)
    _request, job_id = provider.submit(job)
    status = _wait(provider, job_id)
    assert status.state == "failed"
    text = "\n".join(_all_lines(provider, job_id))
    assert "DefaultCPUAllocator: can't allocate memory" in text


# -- nothing leaks, nothing is orphaned ---------------------------------------------------------

from launcher import processes  # noqa: E402
from launcher.providers.local import job_token  # noqa: E402
from launcher.status import UsageError  # noqa: E402

SLEEPER = """
    import os, sys, time
    pidfile = os.path.join({folder!r}, f"worker-{{os.environ.get('RANK', 0)}}.pid")
    open(pidfile, "w").write(str(os.getpid()))
    print("env", "AWS_SECRET_ACCESS_KEY" in os.environ, os.environ.get("AWS_REGION"), flush=True)
    time.sleep(600)
"""


def _sleeping_job(tmp_path: Path, provider: LocalProvider, procs: int = 2):
    job = _job(tmp_path, SLEEPER.format(folder=str(tmp_path)), procs=procs)
    _request, job_id = provider.submit(job)
    deadline = time.monotonic() + 60
    pidfiles = [tmp_path / f"worker-{rank}.pid" for rank in range(procs)]
    while not all(p.exists() and p.read_text() for p in pidfiles):
        assert time.monotonic() < deadline, "the workers never started"
        time.sleep(0.05)
    workers = [int(p.read_text()) for p in pidfiles]
    runner = json.loads((Path(job_id) / "runner.json").read_text())["pid"]
    torchrun = [pid for pid in processes.descendants(runner)
                if b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    # One process of a plain script runs as `python SCRIPT` would: no torchrun between.
    assert len(torchrun) == (1 if procs > 1 else 0)
    assert set(workers) <= set(processes.tagged(job_token(Path(job_id))))
    return job_id, runner, (torchrun or [None])[0], workers


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(processes.alive(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("victim", ["runner", "torchrun", "worker"])
def test_kill_9_of_any_process_of_the_tree_leaves_no_process(tmp_path, victim):
    provider = LocalProvider(sys.executable)
    job_id, runner, torchrun, workers = _sleeping_job(tmp_path, provider)
    target = {"runner": runner, "torchrun": torchrun, "worker": workers[1]}[victim]
    os.kill(target, signal.SIGKILL)
    # Nobody has to look: the tree takes itself down (the kernel's parent-death signal, the
    # runner as subreaper, torchrun stopping the other rank).
    assert _gone_within([runner, torchrun, *workers], 40), processes.tagged(job_token(Path(job_id)))
    status = provider.poll(job_id)
    assert status.state == "failed"
    if victim == "runner":
        assert "runner died" in status.message
    if victim == "torchrun":
        assert "SIGKILL" in status.message
    assert provider.residue(job_id) == []


def test_a_dead_runner_with_live_workers_is_stopped_and_recorded(tmp_path):
    """Belt and braces: even with workers the kernel did not take down (here: stopped from
    exiting by SIGSTOP), the first poll after the runner's death kills what carries the token."""
    provider = LocalProvider(sys.executable)
    job_id, runner, torchrun, workers = _sleeping_job(tmp_path, provider)
    processes.signal_all([torchrun, *workers], signal.SIGSTOP)
    os.kill(runner, signal.SIGKILL)
    assert _gone_within([runner], 10)
    status = provider.poll(job_id)
    assert status.state == "failed" and "runner died" in status.message
    assert _gone_within([torchrun, *workers], 10)
    assert provider.poll(job_id).state == "failed"  # recorded: exit.json now exists
    assert json.loads((Path(job_id) / "exit.json").read_text())["state"] == "failed"


def test_job_sees_no_cloud_credentials_unless_asked(tmp_path):
    environ = {**os.environ, "AWS_SECRET_ACCESS_KEY": "very-secret", "AWS_REGION": "eu-west-1"}
    provider = LocalProvider(sys.executable, environ=environ)
    job_id, *_ = _sleeping_job(tmp_path, provider, procs=1)
    provider.stop(job_id)
    _wait(provider, job_id)
    text = "\n".join(_all_lines(provider, job_id))
    assert "env False eu-west-1" in text
    assert "very-secret" not in (Path(job_id) / "request.json").read_text()

    asked = LocalProvider(sys.executable, environ={**environ, "LAUNCH_LOCAL_PASS_CREDENTIALS": "1"})
    other = tmp_path / "asked"
    other.mkdir()
    job_id, *_ = _sleeping_job(other, asked, procs=1)
    asked.stop(job_id)
    _wait(asked, job_id)
    assert "env True eu-west-1" in "\n".join(_all_lines(asked, job_id))


def test_job_logs_are_private(tmp_path):
    provider = LocalProvider(sys.executable)
    _request, job_id = provider.submit(_job(tmp_path, "print('hello')"))
    _wait(provider, job_id)
    for name in ("output.log", "runner.err"):
        assert (Path(job_id) / name).stat().st_mode & 0o077 == 0, name


def test_a_job_whose_runner_never_started_is_failed_not_pending_forever(tmp_path):
    provider = LocalProvider(sys.executable)
    job = _job(tmp_path, "pass")
    request = provider.dryrun(job)
    job_dir = Path(request.job_dir)
    (job_dir / "request.json").write_text(json.dumps(request.to_dict()))
    assert provider.poll(str(job_dir)).state == "pending"  # just written: it may yet start
    old = time.time() - 120
    os.utime(job_dir / "request.json", (old, old))
    status = provider.poll(str(job_dir))
    assert status.state == "failed" and "never started" in status.message


@pytest.mark.parametrize("name", ["exit.json", "runner.json"])
def test_a_corrupt_job_file_is_a_usage_error_naming_it(tmp_path, name):
    provider = LocalProvider(sys.executable)
    _request, job_id = provider.submit(_job(tmp_path, "pass"))
    _wait(provider, job_id)
    if name == "runner.json":
        (Path(job_id) / "exit.json").unlink()
    (Path(job_id) / name).write_text('{"state": ')
    with pytest.raises(UsageError, match=name):
        provider.poll(job_id)


# -- issue 30: a full disk, a huge line ----------------------------------------------------------


def _small_tmpfs(path: Path, size: str = "2m") -> bool:
    """Mount a small tmpfs at ``path`` where this machine allows it (root, no container rule
    against it): a real full disk. Elsewhere the caller uses the fault point instead."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True)
    return done.returncode == 0


@pytest.mark.parametrize("how", ["tmpfs", "fault"])
def test_a_full_disk_at_the_job_s_end_is_recorded_once_space_returns(tmp_path, monkeypatch, how):
    """The job ends while its folder's disk is full: the runner cannot write exit.json. It
    keeps trying, the job reads as running (never as "the runner died"), and once space
    returns the true end is recorded. ``tmpfs``: a real 2 MiB tmpfs filled to the last byte,
    where mount is allowed (here and in CI, as root; elsewhere it falls back to the fault);
    ``fault``: the runner's ``runner.record`` fault point raises the same ENOSPC, three times."""
    disk = tmp_path / "disk"
    real = how == "tmpfs" and _small_tmpfs(disk)
    if not real:
        monkeypatch.setenv("LAUNCH_FAULT", "runner.record*3:enospc")  # 3 tries fail: 6 s
    try:
        go = tmp_path / "go"
        source = f"""
            import pathlib, time
            print('waiting', flush=True)
            while not pathlib.Path({str(go)!r}).exists():
                time.sleep(0.05)
            print('done', flush=True)
        """
        job = _job(disk if real else tmp_path, source)
        provider = LocalProvider(sys.executable)
        _request, job_id = provider.submit(job)
        deadline = time.monotonic() + 60
        while "waiting" not in "\n".join(_all_lines(provider, job_id)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        filler = disk / "filler"
        if real:  # fill the disk to the last byte
            with open(filler, "wb") as handle, contextlib.suppress(OSError):
                while True:
                    handle.write(b"\0" * 65536)
                    handle.flush()
        go.write_text("1")
        while "done" not in "\n".join(_all_lines(provider, job_id)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1)  # the job has ended; its end cannot be written
        status = provider.poll(job_id)
        assert status.state == "running", status
        assert not (Path(job_id) / "exit.json").exists()
        if real:
            filler.unlink()
        final = _wait(provider, job_id, timeout=30)
        assert final.state == "succeeded", final
        if not real:  # on the full disk the runner's note could not be written either
            errors = (Path(job_id) / "runner.err").read_text()
            assert "cannot record the job's end yet (No space left on device)" in errors
    finally:
        if real:
            subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_line_longer_than_a_read_is_split_not_lost(tmp_path):
    """A log line over the 8 MiB read blinded the follower for the rest of the job (`logs`
    printed 0 of 9.4 MB). It comes in pieces now, and the lines after it too."""
    from launcher.providers.local import _read_lines

    log = tmp_path / "output.log"
    long = "é" * (5 << 20)  # 10 MiB of two-byte characters: no piece may cut one in two
    log.write_text(f"before\n{long}\nafter\n", encoding="utf-8")
    lines, cursor = [], None
    while True:
        new, cursor = _read_lines(log, cursor)
        if not new:
            break
        lines += new
    assert lines[0] == "before" and lines[-1] == "after"
    assert "".join(lines[1:-1]) == long and "\ufffd" not in "".join(lines)
    assert cursor == log.stat().st_size
