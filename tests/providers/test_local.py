"""The local provider against real torchrun processes: request, logs, stop, memory cap."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launcher.plan.plan import Plan
from launcher.providers.base import Job
from launcher.providers.local import LocalProvider
from launcher.render import RenderedJob


def _plan(procs: int = 1) -> Plan:
    return Plan(strategy="single" if procs == 1 else "ddp", machine="local-cpu", nodes=1,
                gpus_per_node=procs, micro_batch_size=2, grad_accum_steps=1,
                global_batch_size=2 * procs, precision="fp32", optimizer="adamw",
                activation_checkpointing=False, steps=1, lr=0.1)


def _job(tmp_path: Path, source: str, procs: int = 1, memory_limit: int | None = None) -> Job:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "script.py").write_text(textwrap.dedent(source))
    attempt = tmp_path / "run" / "attempt-1"
    (attempt / "job").mkdir(parents=True)
    rendered = RenderedJob(files={}, entrypoint="script.py",
                           env={"LAUNCH_MICRO_BATCH_SIZE": "2"})
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
    provider = LocalProvider(sys.executable)
    job = _job(tmp_path, """
        import os
        for i in range(50):
            print(f"line {i} from {os.environ['RANK']} mb={os.environ['LAUNCH_MICRO_BATCH_SIZE']}")
        """, procs=2)
    _request, job_id = provider.submit(job)
    status = _wait(provider, job_id)
    assert status.state == "succeeded" and status.exit_code == 0
    lines = _all_lines(provider, job_id)
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[rank{rank}]:line ")]
        assert [line.split()[1] for line in mine] == [str(i) for i in range(50)]
        assert all(line.endswith("mb=2") for line in mine)


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
