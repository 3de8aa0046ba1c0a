"""`launch explain` through the CLI: files, stdin, JSON contract, bad input."""

from __future__ import annotations

import io
import json
import os
import sys

from launcher.cli import main
from launcher.context import Environment
from launcher.status import ExitStatus

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
       "total capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, "
       "this process has 78.12 GiB memory in use. Of the allocated memory 75.50 GiB is "
       "allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated.\n")


def test_explain_json_contract(cli, tmp_path):
    log = tmp_path / "job.log"
    log.write_text("step 1 loss 2.0\n" + OOM)
    result = cli("explain", str(log), "--json")
    assert result.status == 0, result.stderr
    data = result.json()
    for key in ("failure", "cause", "requested_bytes", "capacity_bytes", "allocated_bytes",
                "reserved_bytes", "free_bytes", "rank", "line", "excerpt", "advice"):
        assert key in data
    assert data["failure"] == "gpu_oom" and data["line"] == 2
    assert data["requested_bytes"] == 2 * 1024**3


def test_explain_stdin_and_human_output(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    env = Environment(stdout=out, stderr=err, stdin=io.StringIO(OOM), cwd=tmp_path,
                      environ=dict(os.environ), python=sys.executable)
    assert main(["explain", "-"], env) == 0
    text = out.getvalue()
    assert text.startswith("failure: gpu_oom") and "advice:" in text


def test_explain_clean_log_says_none(cli, tmp_path):
    log = tmp_path / "ok.log"
    log.write_text("step 1 loss 2.0\nstep 2 loss 1.9\n")
    result = cli("explain", str(log), "--json")
    assert result.status == 0 and result.json()["failure"] == "none"
    assert cli("explain", str(log)).stdout == "no failure found in the log\n"


def test_explain_empty_and_binary_files(cli, tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    binary = tmp_path / "bin.log"
    binary.write_bytes(bytes(range(256)) * 100)
    for path in (empty, binary):
        result = cli("explain", str(path), "--json")
        assert result.status == 0, result.stderr
        assert json.loads(result.stdout)["failure"] == "none"


def test_explain_missing_file(cli):
    result = cli("explain", "nope.log")
    assert result.status == ExitStatus.USAGE
    assert "log not found: nope.log" in result.stderr and "Traceback" not in result.stderr


def test_explain_reads_the_old_cpu_allocator_message_as_host_memory(cli, tmp_path):
    """PyTorch 1.0's "posix_memalign(...) == 0. 12 vs 0" (errno 12 is ENOMEM) is host memory."""
    log = tmp_path / "cpu.log"
    log.write_text("epoch 1\nRuntimeError: [enforce fail at CPUAllocator.cpp:56] "
                   "posix_memalign(&data, gAlignment, nbytes) == 0. 12 vs 0\n")
    data = cli("explain", str(log), "--json").json()
    assert (data["failure"], data["line"], data["signature"]) == ("host_oom", 2,
                                                                  "DefaultCPUAllocator")


def test_explain_random_words_find_no_failure(cli, tmp_path):
    """Issue 16: random words (sentences that end in "Killed") read as host_oom."""
    log = tmp_path / "words.log"
    log.write_text("the dog Killed\nand the test Killed\nwords error memory Killed\n" * 50)
    assert cli("explain", str(log), "--json").json()["failure"] == "none"
