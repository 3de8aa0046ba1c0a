"""Ask before spending (issue 29): a cloud submission shows what will run and what it costs and
asks ``Proceed? [y/N]`` at a terminal; ``--yes`` skips the question; with no terminal and no
``--yes`` nothing is submitted; a submission refused before any job exists is a run marked
``not_submitted``, not ``failed``.

The terminal is a real pseudo-terminal (``pty``) in front of ``python -m launcher.cli``, answered
as a person would. The cloud is SageMaker with dummy credentials and its endpoint on a closed
loopback port: what is asked and refused is the launcher's, and a "yes" reaches the real client
library, which cannot connect, so nothing anywhere is created.
"""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from launcher.cli import main
from launcher.context import Environment
from launcher.status import ExitStatus

REPO = Path(__file__).resolve().parents[1]
SAGEMAKER = ("--provider", "sagemaker", "--role", "arn:aws:iam::123456789012:role/launch",
             "--bucket", "launch-test-bucket", "--region", "us-east-1",
             "--machine", "ml.g5.xlarge")
ENVIRON = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
           "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard", "LAUNCH_NO_TRACE": "1"}


def _in_process(tmp_path: Path, *args: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = Environment(stdout=out, stderr=err, stdin=io.StringIO(stdin), cwd=tmp_path,
                      environ={**os.environ, **ENVIRON,
                               "LAUNCH_STATE_DIR": str(tmp_path / "state")},
                      python=sys.executable)
    return int(main(list(args), env)), out.getvalue(), err.getvalue()


def _runs(tmp_path: Path) -> list[Path]:
    root = tmp_path / "state" / "runs"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


def _at_a_terminal(tmp_path: Path, script: Path, answer: bytes) -> tuple[int, str]:
    """``launch run SCRIPT ...`` under a pseudo-terminal; ``answer`` typed at the question."""
    main_fd, tty_fd = pty.openpty()
    env = {**os.environ, **ENVIRON, "LAUNCH_STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "run", str(script),
                             *SAGEMAKER], stdin=tty_fd, stdout=tty_fd, stderr=tty_fd,
                            cwd=tmp_path, env=env, start_new_session=True)
    os.close(tty_fd)
    seen = b""
    asked = False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main_fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(main_fd, 65536)
                except OSError:  # the other end closed: the process exited
                    break
                if not chunk:
                    break
                seen += chunk
                if not asked and b"Proceed? [y/N]" in seen:
                    os.write(main_fd, answer)
                    asked = True
            elif proc.poll() is not None:
                break
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main_fd)
    assert asked, seen.decode(errors="replace")[-2000:]
    return status, seen.decode(errors="replace")


def test_no_terminal_and_no_yes_submits_nothing(tmp_path, tiny_recipe):
    status, _, err = _in_process(tmp_path, "run", str(tiny_recipe), *SAGEMAKER)
    assert status == ExitStatus.USAGE
    assert "spends money and there is no terminal to ask at: nothing was submitted" in err
    assert "pass --yes" in err
    assert len(err.strip().splitlines()) == 1
    assert _runs(tmp_path) == []  # not even a run folder


def test_a_no_at_the_terminal_submits_nothing(tmp_path, tiny_recipe):
    status, seen = _at_a_terminal(tmp_path, tiny_recipe, b"n\n")
    assert status == ExitStatus.NOT_SUBMITTED, seen[-2000:]
    assert "about to submit to sagemaker (us-east-1):" in seen
    assert "ml.g5.xlarge x 1 node" in seen and "$" in seen and "/h" in seen
    assert "up to 3 attempts" in seen
    assert "not submitted: nothing was started or spent" in seen
    assert _runs(tmp_path) == []


def test_a_yes_at_the_terminal_submits_and_a_refused_create_is_not_a_failed_job(tmp_path,
                                                                               tiny_recipe):
    status, seen = _at_a_terminal(tmp_path, tiny_recipe, b"y\n")
    # it went on to the cloud, which is a closed port: a provider error, nothing created
    assert status == ExitStatus.PROVIDER_ERROR, seen[-2000:]
    runs = _runs(tmp_path)
    assert len(runs) == 1
    code, out, _ = _in_process(tmp_path, "status", runs[0].name, "--json")
    assert code == 0
    attempts = json.loads(out)["attempts"]
    assert len(attempts) == 1
    assert all(a["state"] == "not_submitted" and a["live_state"] == "not_submitted"
               and a["outcome"] == "not_submitted" for a in attempts), attempts


def test_yes_submits_without_asking(tmp_path, tiny_recipe):
    status, _, err = _in_process(tmp_path, "run", str(tiny_recipe), *SAGEMAKER, "-y")
    assert "Proceed?" not in err
    assert status == ExitStatus.PROVIDER_ERROR, err


def test_a_local_run_is_not_asked_about(tmp_path, tiny_recipe):
    status, _, err = _in_process(tmp_path, "run", str(tiny_recipe), "--steps", "1")
    assert "Proceed?" not in err
    assert status == ExitStatus.SUCCESS, err
