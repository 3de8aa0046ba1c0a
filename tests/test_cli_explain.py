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
    assert "log not found: " in result.stderr and "nope.log" in result.stderr
    assert "Traceback" not in result.stderr


def test_explain_refuses_what_is_no_log_file_in_one_line(cli, tmp_path):
    """A 5,000-character name, a symlink loop, /proc/self/mem (EIO on read), a FIFO (a read
    would block forever), a folder: each one line, exit 2 (issue 30; before: internal errors)."""
    import os

    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    os.mkfifo(tmp_path / "fifo")
    for log, words in [("a" * 5000, "name is too long"), ("loop1", "symlink loop"),
                       ("/proc/self/mem", "Input/output error"), ("fifo", "not a regular file"),
                       (str(tmp_path), "is a folder")]:
        result = cli("explain", log)
        assert result.status == ExitStatus.USAGE, (log[:20], result.stderr)
        assert words in result.stderr and result.stderr.count("\n") == 1, result.stderr
        assert len(result.stderr) < 400  # a long name is cut, not echoed whole


def test_the_report_is_written_through_never_over_what_is_not_a_file(cli, tmp_path):
    """--report replaced whatever was at the path (a symlink became a file; as root, the
    device /dev/full became HTML) and created missing folders (issue 30). Now: a new or
    regular file is written atomically; a symlink stays and its target is written; a device,
    FIFO or folder is refused; a missing folder is not created."""
    import os

    plan = ("plan", "--params", "125M", "--provider", "vertex", "--region", "us-central1")
    target = tmp_path / "real.html"
    target.write_text("old")
    os.chmod(target, 0o640)
    (tmp_path / "link.html").symlink_to(target)
    result = cli(*plan, "--report", str(tmp_path / "link.html"))
    assert result.status == 0, result.stderr
    assert (tmp_path / "link.html").is_symlink() and "<html" in target.read_text().lower()
    assert target.stat().st_mode & 0o777 == 0o640  # the file's own permissions kept
    os.mkfifo(tmp_path / "fifo")
    for path, words in [("/dev/full", "not a regular file"), (str(tmp_path / "fifo"),
                        "not a regular file"), (str(tmp_path), "a folder"),
                        (str(tmp_path / "new" / "x" / "plan.html"), "does not exist")]:
        result = cli(*plan, "--report", path)
        assert result.status == ExitStatus.USAGE, (path, result.stderr)
        assert words in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")
    assert not (tmp_path / "new").exists()
    assert not list(tmp_path.glob(".*.tmp"))


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
