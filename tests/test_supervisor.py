"""Whole runs through the CLI on the local provider: run, status, logs, OOM, detach, attach, cancel.

These start real torchrun jobs on the CPU; the CLI runs in-process except where a test needs a
launcher process to interrupt.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.status import ExitStatus
from tests.conftest import EXAMPLES, TINY_RECIPE

SLOW_RECIPE = TINY_RECIPE.replace(
    "def training_step(model, batch):\n",
    "def training_step(model, batch):\n    import time; time.sleep(0.3)\n",
).replace('"steps": 4', '"steps": 40')

# Forward allocates a float32 tensor of micro_batch x 64 Mi elements (256 MiB a sample): under a
# 2.5 GiB address-space cap, a micro-batch of 8 cannot get 2 GiB, one of 1 can.
OOM_RECIPE = TINY_RECIPE.replace(
    "def training_step(model, batch):\n",
    "def training_step(model, batch):\n"
    "    scratch = torch.ones(batch['x'].shape[0], 64 * 1024 * 1024)\n"
    "    del scratch\n",
).replace('"global_batch_size": 4', '"global_batch_size": 8')


def test_run_then_status_and_logs(cli, tiny_recipe, tmp_path):
    result = cli(str(tiny_recipe), "--json")
    assert result.status == 0, result.stderr
    data = result.json()  # stdout: the one result object, as always
    assert data["status"] == "success" and data["summary"]["steps"] == 4
    # stderr: what happened while it ran, one JSON object a line (issue 29: a CI job saw nothing
    # until the end)
    events = [json.loads(line) for line in result.stderr.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "note" and events[1]["message"].startswith("attempt 1: single")
    assert kinds.count("metrics") == 4 and kinds[-1] == "done"
    assert [e["step"] for e in events if e["event"] == "metrics"] == [1, 2, 3, 4]
    run_dir = tmp_path / "state" / "runs" / data["run_id"]
    assert (run_dir / "attempt-1" / "job" / "launch_train.py").is_file()
    plan = json.loads((run_dir / "attempt-1" / "job" / "plan.json").read_text())
    assert plan["micro_batch_size"] == 4 and plan["steps"] == 4
    request = json.loads((run_dir / "attempt-1" / "request.json").read_text())
    assert "torch.distributed.run" in request["argv"]
    attempts = (run_dir / "attempts.jsonl").read_text().splitlines()
    assert len(attempts) == 1 and json.loads(attempts[0])["outcome"] == "success"
    assert Path(data["summary"]["checkpoint"]).is_file()

    status = cli("status", data["run_id"], "--json")
    assert status.status == 0
    assert status.json()["attempts"][0]["live_state"] == "succeeded"
    logs = cli("logs", data["run_id"][:8], "--raw")
    assert '[rank0]:{"launch": "done"' in logs.stdout


def test_human_output_has_summary(cli, tiny_recipe):
    result = cli(str(tiny_recipe), "--steps", "2")
    assert result.status == 0, result.stderr
    assert "succeeded" in result.stdout
    for field in ("steps       2", "loss", "peak memory", "checkpoint", "attempts    1"):
        assert field in result.stdout
    assert "[rank0] step 2  loss" in result.stdout


def test_a_new_run_never_resumes_another_runs_checkpoint(cli, tiny_recipe, tmp_path):
    first = cli(str(tiny_recipe), "--json", "--steps", "2").json()
    # The same checkpoint folder with more steps: the template resumes at step 2.
    ckpt = Path(first["summary"]["checkpoint"]).parent
    second = cli(str(tiny_recipe), "--json", "--steps", "4",
                 environ={"LAUNCH_CHECKPOINT_DIR": str(ckpt)})
    # The launcher sets the job's checkpoint folder itself; a new run starts fresh.
    assert second.json()["summary"]["resumed_from_step"] is None


def test_plain_script_receives_the_plan(cli):
    result = cli(str(EXAMPLES / "plain" / "train.py"), "--params", "9", "--json",
                 "--gpus-per-node", "2", "--global-batch-size", "8", "--micro-batch-size", "2",
                 "--steps", "3")
    assert result.status == 0, result.stderr
    run_id = result.json()["run_id"]
    lines = cli("logs", run_id).stdout.splitlines()
    received = [json.loads(line.split(":", 1)[1]) for line in lines if '"plain": "received"'
                in line]
    assert sorted(r["rank"] for r in received) == [0, 1]
    env = received[0]["env"]
    assert env["LAUNCH_MICRO_BATCH_SIZE"] == "2"
    assert env["LAUNCH_GRAD_ACCUM_STEPS"] == "2"
    assert env["LAUNCH_STRATEGY"] == "ddp"
    assert env["LAUNCH_STEPS"] == "3"
    assert json.loads(Path(env["LAUNCH_PLAN"]).read_text())["micro_batch_size"] == 2
    # it reports no progress events: its steps are unknown, not 0, and the summary says why
    summary = result.json()["summary"]
    assert summary["steps"] is None and summary["loss"] is None
    assert summary["not_reported"] == "a plain script reports no progress events"


def test_a_job_s_steps_are_unknown_without_progress_events_and_0_before_the_first():
    from launcher.supervisor import Progress

    assert Progress().summary()["steps"] is None
    assert Progress().summary()["not_reported"] == "the job wrote no progress events"
    died = Progress()
    died.update({"launch": "oom", "rank": 0, "phase": "forward", "step": 0})
    assert died.summary()["steps"] == 0 and "not_reported" not in died.summary()


def test_out_of_memory_is_stopped_and_reported(cli, write_script):
    script = write_script(OOM_RECIPE)
    result = cli(str(script), "--json", "--memory-limit", "2560MiB", "--max-attempts", "1")
    assert result.status == ExitStatus.OUT_OF_MEMORY, result.stderr
    attempt = result.json()["attempts"][0]
    assert attempt["outcome"] == "oom"
    assert attempt["diagnosis"]["phase"] == "forward"
    assert attempt["diagnosis"]["micro_batch_size"] == 8


# Out of memory in the forward pass of step 2, raised outright (no memory cap needed).
RAISED_OOM_RECIPE = TINY_RECIPE.replace(
    "def training_step(model, batch):\n",
    "CALLS = 0\n\n\n"
    "def training_step(model, batch):\n"
    "    global CALLS\n"
    "    CALLS += 1\n"
    "    if CALLS >= 2:\n"
    "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n",
)


def test_the_oom_line_is_printed_before_the_traceback_a_stop_may_cut_short(
        cli, write_script, tmp_path):
    """The launcher stops a job a fraction of a second after the allocator's message (the
    traceback's last line); the rendered script frees memory before it prints its ``oom`` line,
    which on a loaded machine takes longer than that. So the ``oom`` line comes first: a stop
    set off by the traceback can no longer cut it off (the local log keeps the order written)."""
    script = write_script(RAISED_OOM_RECIPE)
    result = cli(str(script), "--json", "--max-attempts", "1")
    assert result.status == ExitStatus.OUT_OF_MEMORY, result.stderr
    attempt = result.json()["attempts"][0]
    assert attempt["diagnosis"]["signature"] == "launch_oom_event"
    assert attempt["diagnosis"]["phase"] == "forward"
    log = tmp_path / "state" / "runs" / result.json()["run_id"] / "attempt-1" / "output.log"
    lines = log.read_text().splitlines()
    event = next(i for i, line in enumerate(lines) if '"launch": "oom"' in line)
    message = next(i for i, line in enumerate(lines) if "torch.OutOfMemoryError: CUDA" in line)
    traceback = next(i for i, line in enumerate(lines) if "Traceback (most recent" in line)
    assert event < traceback < message, lines[-30:]


# Out of memory partway: from the third micro-batch on, every sample needs 256 MiB of scratch.
PARTWAY_RECIPE = TINY_RECIPE.replace(
    "def training_step(model, batch):\n",
    "CALLS = [0]\n\n"
    "def training_step(model, batch):\n"
    "    CALLS[0] += 1\n"
    "    if CALLS[0] > 2:\n"
    "        scratch = torch.ones(batch['x'].shape[0], 64 * 1024 * 1024)\n"
    "        del scratch\n",
).replace('"global_batch_size": 4', '"global_batch_size": 8').replace(
    '"lr": 0.01}', '"lr": 0.01, "checkpoint_every": 2}')


def test_overflowing_micro_batch_is_fixed_by_one_resubmission(cli, write_script):
    """Followed as a person follows it (no --json): the summary names each attempt's outcome
    and change, and the plan that finished (issue 29: it said `attempts 2` alone)."""
    script = write_script(OOM_RECIPE)
    result = cli(str(script), "--memory-limit", "2560MiB")
    assert result.status == 0, result.stderr
    assert "  attempts    2\n    1: oom" in result.stdout, result.stdout[-1500:]
    assert "    2: success       out of memory in forward at micro-batch 8" in result.stdout
    assert "  plan        single on 1 x local-cpu, micro-batch 4 x 2 accumulation" in (
        result.stdout)
    first, second = cli("status", "--json").json()["attempts"]
    assert first["outcome"] == "oom" and second["outcome"] == "success"
    assert (second["plan"]["micro_batch_size"], second["plan"]["grad_accum_steps"]) == (4, 2)
    assert second["plan"]["global_batch_size"] == first["plan"]["global_batch_size"] == 8
    assert "global batch 8 unchanged" in second["change"]


def test_oom_partway_resumes_from_the_last_checkpoint(cli, write_script):
    script = write_script(PARTWAY_RECIPE)
    result = cli(str(script), "--json", "--memory-limit", "2560MiB", "--steps", "4")
    assert result.status == 0, result.stderr
    data = result.json()
    first, second = data["attempts"]
    assert first["outcome"] == "oom" and first["diagnosis"]["step"] == 3
    assert second["summary"]["resumed_from_step"] == 2
    assert data["summary"]["steps"] == 4


# Preempted once: the first attempt prints a spot interruption notice and dies; the marker file
# tells the second attempt it is the second.
PREEMPTED_RECIPE = TINY_RECIPE.replace(
    "def training_step(model, batch):\n",
    "import os, pathlib, sys\n"
    "MARK = pathlib.Path(__file__).with_name('preempted-once')\n\n"
    "def training_step(model, batch):\n"
    "    if 'LOCAL_RANK' in os.environ and not MARK.exists():  # in the job, not the preflight\n"
    "        MARK.write_text('1')\n"
    "        print('Spot instance interruption notice: the instance will be reclaimed', "
    "flush=True)\n"
    "        os._exit(1)\n",
)


def test_preemption_resubmits_the_same_plan(cli, write_script):
    script = write_script(PREEMPTED_RECIPE)
    result = cli(str(script), "--json")
    assert result.status == 0, result.stderr
    first, second = result.json()["attempts"]
    assert first["outcome"] == "failed" and first["diagnosis"]["signature"] == "preemption"
    assert second["outcome"] == "success" and second["plan"] == first["plan"]
    assert "same plan again" in second["change"]


def test_a_plain_failure_is_not_retried(cli, write_script):
    script = write_script(TINY_RECIPE.replace(
        "def training_step(model, batch):\n",
        "def training_step(model, batch):\n    raise ValueError('bug in the loss')\n"))
    result = cli(str(script), "--json")
    assert result.status == ExitStatus.JOB_FAILED
    assert len(result.json()["attempts"]) == 1


def _interruptible() -> None:
    """Ctrl-C as at a terminal, whatever the test runner was started with: a shell starts a
    background job (`make test &`, a CI runner's `nohup`) with SIGINT ignored, its children
    inherit that, and Python then installs no KeyboardInterrupt handler, so the SIGINT these
    tests send would be ignored, as a background `launch` rightly ignores it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _launch_subprocess(script: Path, state: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "LAUNCH_STATE_DIR": str(state), "LAUNCH_NO_TRACE": "1"}
    return subprocess.Popen([sys.executable, "-m", "launcher.cli", str(script), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(script.parent), preexec_fn=_interruptible)


def _wait_for_run(state: Path, timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in (state / "runs").glob("*/attempt-1/output.log"):
            if '"launch": "metrics"' in log.read_text():
                return log.parents[1]
        time.sleep(0.1)
    raise AssertionError("the job never reported a step")


def test_ctrl_c_detaches_and_attach_follows_to_the_end(cli, write_script, tmp_path):
    script = write_script(SLOW_RECIPE)
    state = tmp_path / "state"
    proc = _launch_subprocess(script, state, "--steps", "8")
    run_dir = _wait_for_run(state)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitStatus.INTERRUPTED
    assert f"launch attach {run_dir.name}" in err
    # The launcher is gone; the job is not. Attach from a new process (in-process CLI).
    result = cli("attach", run_dir.name, "--json")
    assert result.status == 0, result.stderr
    assert result.json()["summary"]["steps"] == 8


def test_attach_agrees_with_cancel_and_status_and_ctrl_c_on_attach_says_how_to_reattach(
        cli, write_script, tmp_path):
    """Issue 29: a run detached, re-attached, then cancelled from another shell: `attach`
    printed `job failed` and exited 1 while `status` said cancelled; Ctrl-C on `attach` said
    only "launch: interrupted". Now attach ends as `run` would (cancelled, 130) and a Ctrl-C on
    it says how to follow the job again."""
    script = write_script(SLOW_RECIPE)
    state = tmp_path / "state"
    proc = _launch_subprocess(script, state, "--steps", "400")
    run_dir = _wait_for_run(state)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    env = {**os.environ, "LAUNCH_STATE_DIR": str(state), "LAUNCH_NO_TRACE": "1"}

    def attach() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "launcher.cli", "attach", run_dir.name],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=str(script.parent), preexec_fn=_interruptible)

    first = attach()
    time.sleep(3)  # following
    first.send_signal(signal.SIGINT)
    _out, err = first.communicate(timeout=60)
    assert first.returncode == ExitStatus.INTERRUPTED, err
    assert f"launch attach {run_dir.name}" in err and "the job goes on" in err
    second = attach()
    time.sleep(3)
    assert cli("cancel", run_dir.name).status == 0
    out, err = second.communicate(timeout=60)
    assert second.returncode == ExitStatus.INTERRUPTED, (out, err)
    assert "cancelled" in out and "job failed" not in out, out
    status = cli("status", run_dir.name, "--json").json()
    assert status["attempts"][0]["live_state"] == "cancelled"
    assert status["attempts"][0]["outcome"] == "cancelled"


def test_the_json_event_stream_is_read_line_by_line_while_the_job_runs(write_script, tmp_path):
    """`launch run --json`: each event reaches stderr as it happens (a CI log shows progress),
    not at the end; stdout is still the one result object."""
    script = write_script(SLOW_RECIPE)
    proc = _launch_subprocess(script, tmp_path / "state", "--steps", "12", "--json")
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(json.loads(line))
        if seen[-1]["event"] == "metrics" and seen[-1]["step"] == 2:
            assert proc.poll() is None  # read while the job is still training
            break
    out, _err = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert json.loads(out)["summary"]["steps"] == 12
    assert seen[0]["event"] == "note"


def test_cancel_from_another_process(cli, write_script, tmp_path):
    script = write_script(SLOW_RECIPE)
    state = tmp_path / "state"
    proc = _launch_subprocess(script, state, "--steps", "200")
    run_dir = _wait_for_run(state)
    result = cli("cancel", run_dir.name)
    assert result.status == 0, result.stderr
    assert "cancelled attempt 1" in result.stdout
    proc.communicate(timeout=60)
    assert proc.returncode == ExitStatus.INTERRUPTED
    status = cli("status", run_dir.name, "--json").json()
    assert status["attempts"][0]["live_state"] == "cancelled"


def test_cancel_on_interrupt_records_the_attempt_and_leaves_no_process(cli, write_script,
                                                                       tmp_path):
    from launcher import processes
    from launcher.providers.local import job_token

    script = write_script(SLOW_RECIPE)
    state = tmp_path / "state"
    proc = _launch_subprocess(script, state, "--steps", "200", "--cancel-on-interrupt")
    run_dir = _wait_for_run(state)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitStatus.INTERRUPTED, err
    assert f"cancelled run {run_dir.name}" in err
    attempt = json.loads((run_dir / "attempts.jsonl").read_text().splitlines()[0])
    assert attempt["state"] == "cancelled" and attempt["outcome"] == "cancelled"
    assert processes.tagged(job_token(run_dir / "attempt-1")) == []


def test_a_run_whose_runner_was_killed_ends_for_attach_logs_and_cancel(cli, write_script,
                                                                        tmp_path):
    script = write_script(SLOW_RECIPE)
    state = tmp_path / "state"
    proc = _launch_subprocess(script, state, "--steps", "200")
    run_dir = _wait_for_run(state)
    proc.send_signal(signal.SIGINT)  # detach: the job goes on without a launcher
    proc.communicate(timeout=60)
    runner = json.loads((run_dir / "attempt-1" / "runner.json").read_text())["pid"]
    os.kill(runner, signal.SIGKILL)
    started = time.monotonic()
    attach = cli("attach", run_dir.name, "--json")
    assert attach.status == ExitStatus.JOB_FAILED, attach.stderr
    assert "runner died" in attach.json()["summary"]["message"]
    logs = cli("logs", run_dir.name, "--follow")
    assert logs.status == 0
    cancel = cli("cancel", run_dir.name)
    assert cancel.status == 0 and "nothing running" in cancel.stdout
    assert time.monotonic() - started < 60


#: A state file, and what a crash, a full disk or a hand left in it: each is a usage error (exit 2)
#: naming the file, for every command that reads it.
CORRUPTIONS = [
    ("attempts.jsonl", '{"number": 1, "pla'), ("run.json", "{}"),
    ("attempt-1/exit.json", "not json"), ("attempt-1/runner.json", "[]"),
]


def test_corrupt_state_is_exit_2_naming_the_file(cli, tiny_recipe, tmp_path):
    """One finished run, each corruption applied to a fresh copy of its state (one job for the
    four cases: the job is what costs seconds, the state is what is tested)."""
    result = cli(str(tiny_recipe), "--json")
    assert result.status == 0, result.stderr
    run_dir = tmp_path / "state" / "runs" / result.json()["run_id"]
    pristine = tmp_path / "pristine"
    shutil.copytree(run_dir, pristine)
    for name, content in CORRUPTIONS:
        shutil.rmtree(run_dir)
        shutil.copytree(pristine, run_dir)
        if name.startswith("attempt-1/"):  # recorded as running: every command polls the job
            (run_dir / "attempt-1" / "exit.json").unlink()
            lines = (run_dir / "attempts.jsonl").read_text().replace('"succeeded"', '"running"')
            (run_dir / "attempts.jsonl").write_text(lines)
        (run_dir / name).write_text(content)
        for command in ("status", "cancel", "attach"):
            out = cli(command, run_dir.name)
            assert out.status == ExitStatus.USAGE, (name, command, out.stderr)
            assert out.stderr.count("\n") == 1 and Path(name).name in out.stderr, (
                name, out.stderr)
            assert "Traceback" not in out.stderr and "internal error" not in out.stderr, name


# Data that grows partway through: sequences of 64 tokens for the first 48 samples (three steps
# of 16), then 1024. Each token needs 256 KiB of scratch in the step, so micro-batch 16 (planned
# on the 64-token example batch: 256 MiB) overflows a 2.5 GiB address-space cap at 1024 tokens
# (4 GiB), and so does 8 (2 GiB): halving takes two resubmissions. The failure's batch shapes,
# re-traced, give the micro-batch whose step needs no more than the one that ran: 1, at once.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_replan import RECIPE as GROWING  # noqa: E402  (the benchmark's recipe, one copy)

GROWING_RECIPE = GROWING.format(tokens=1024)


def test_data_that_grows_mid_run_is_fixed_by_exactly_one_resubmission(cli, write_script):
    script = write_script(GROWING_RECIPE)
    result = cli(str(script), "--json", "--memory-limit", "2560MiB",
                 environ={"LAUNCH_NO_TRACE": "0"})
    assert result.status == 0, result.stderr
    first, second = result.json()["attempts"]
    assert first["outcome"] == "oom" and second["outcome"] == "success"
    shapes = first["diagnosis"]["batch_shapes"]
    assert shapes == {"dict": {"ids": {"shape": [16, 1024], "dtype": "int64"}}}
    assert "re-traced at the batch shapes" in second["change"]
    assert (second["plan"]["micro_batch_size"], second["plan"]["grad_accum_steps"]) == (1, 16)
    assert second["plan"]["global_batch_size"] == 16
    assert second["summary"]["resumed_from_step"] == 3 and second["summary"]["steps"] == 5


def test_events_have_a_channel_of_their_own_beside_the_log(cli, tiny_recipe, tmp_path):
    """The rendered script writes its events to events.jsonl too, which the supervisor reads
    before the log (an out-of-memory event never queues behind a chatty job's output)."""
    result = cli(str(tiny_recipe), "--json")
    assert result.status == 0, result.stderr
    attempt = tmp_path / "state" / "runs" / result.json()["run_id"] / "attempt-1"
    events = [json.loads(line) for line in (attempt / "events.jsonl").read_text().splitlines()]
    assert {e["launch"] for e in events} >= {"metrics", "done"}
    assert (attempt / "events.jsonl").stat().st_mode & 0o077 == 0
    logged = [line for line in (attempt / "output.log").read_text().splitlines()
              if '"launch": ' in line]
    assert len(logged) == len(events)  # the same lines, in the log as well


ORDERED_RECIPE = TINY_RECIPE.replace(
    "def training_step(model, batch):\n",
    "import sys\n\n"
    "def training_step(model, batch):\n"
    "    for i in range(200):\n"
    "        print(f'out {i}')\n"
    "        print(f'err {i}', file=sys.stderr)\n",
)


def test_a_local_job_s_output_and_errors_are_logged_in_the_order_written(cli, write_script,
                                                                          tmp_path):
    script = write_script(ORDERED_RECIPE)
    result = cli(str(script), "--json", "--steps", "1")
    assert result.status == 0, result.stderr
    log = tmp_path / "state" / "runs" / result.json()["run_id"] / "attempt-1" / "output.log"
    lines = [line.split(":", 1)[1] for line in log.read_text().splitlines()
             if line.startswith("[rank0]:") and line.split(":", 1)[1][:4] in ("out ", "err ")]
    calls = len(lines) // 400
    assert calls >= 1
    assert lines == [f"{kind} {i}" for _ in range(calls) for i in range(200)
                     for kind in ("out", "err")]


PLAIN_ORDERED = (
    "import sys\n"
    "if __name__ == '__main__':\n"
    "    assert sys.argv[0].endswith('plain_ordered.py'), sys.argv\n"
    "    for i in range(300):\n"
    "        print(f'out {i}')\n"
    "        print(f'err {i}', file=sys.stderr)\n"
    "    raise SystemExit(3)\n"
)


def test_a_plain_script_s_output_and_errors_are_logged_in_the_order_written(cli, tmp_path):
    """A user's own script runs through the stdio shim (it cannot merge its streams itself):
    its lines interleave as written, and its exit status is still the job's."""
    script = tmp_path / "plain_ordered.py"
    script.write_text(PLAIN_ORDERED)
    result = cli(str(script), "--params", "9", "--json", "--max-attempts", "1")
    assert result.status != 0
    log = tmp_path / "state" / "runs" / result.json()["run_id"] / "attempt-1" / "output.log"
    lines = [line for line in log.read_text().splitlines() if line[:4] in ("out ", "err ")]
    assert lines == [f"{kind} {i}" for i in range(300) for kind in ("out", "err")]


NANOGPT_STYLE = """
import os
# nanoGPT's train.py: torchrun's RANK means "this is a DDP run"
ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    raise SystemExit("took the DDP branch: init_process_group(backend='nccl') would fail here")
print(f"single process, WORLD_SIZE={os.environ.get('WORLD_SIZE')}", flush=True)
"""


def test_one_process_of_a_plain_script_runs_as_python_script_would(cli, tmp_path):
    """torchrun sets RANK even for one process, and nanoGPT reads it as "DDP": on a CPU it died
    with "Distributed package doesn't have NCCL built in" (issue 28). One process of a user's
    own script now runs as `python train.py`; two still go through torchrun."""
    script = tmp_path / "train.py"
    script.write_text(NANOGPT_STYLE)
    result = cli(str(script), "--params", "9", "--json")
    assert result.status == 0, result.stderr
    log = cli("logs", result.json()["run_id"]).stdout
    assert "single process, WORLD_SIZE=None" in log


# -- issue 30: interrupts, crashes at every step, moved and deleted folders ----------------------


def _tokens(run_dir: Path) -> list[str]:
    """The job token of every attempt of a run that was handed to the local provider."""
    return [json.loads(p.read_text())["env"]["LAUNCH_JOB_TOKEN"]
            for p in sorted(run_dir.glob("attempt-*/request.json"))]


def _gone(tokens: list[str], timeout: float = 30) -> bool:
    from launcher import processes

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(processes.tagged(t) for t in tokens):
            return True
        time.sleep(0.1)
    return False


def test_sigterm_is_an_interrupt_with_and_without_cancel_on_interrupt(cli, write_script,
                                                                      tmp_path):
    """What CI cancellation and timeout(1) send. Before: launch died of it silently (-15) and
    the job kept running, with or without --cancel-on-interrupt. Both runs share the wait."""
    script = write_script(SLOW_RECIPE)
    cancelled = _launch_subprocess(script, tmp_path / "a", "--steps", "200",
                                   "--cancel-on-interrupt")
    detached = _launch_subprocess(script, tmp_path / "b", "--steps", "200")
    runs = [_wait_for_run(tmp_path / "a"), _wait_for_run(tmp_path / "b")]
    for proc in (cancelled, detached):
        proc.send_signal(signal.SIGTERM)
    (_out, err_a), (_out, err_b) = (p.communicate(timeout=60) for p in (cancelled, detached))
    assert cancelled.returncode == ExitStatus.TERMINATED == 143, err_a
    assert "SIGTERM received" in err_a and f"cancelled run {runs[0].name}" in err_a
    assert "Traceback" not in err_a
    assert _gone(_tokens(runs[0]), timeout=5)
    attempt = json.loads((runs[0] / "attempts.jsonl").read_text())
    assert attempt["state"] == attempt["outcome"] == "cancelled"

    assert detached.returncode == 143, err_b
    assert f"detached from run {runs[1].name}" in err_b
    where = {"LAUNCH_STATE_DIR": str(tmp_path / "b")}
    status = cli("status", runs[1].name, "--json", environ=where)
    assert status.json()["attempts"][0]["live_state"] == "running"  # the job goes on
    stop = cli("cancel", runs[1].name, environ=where)
    assert stop.status == 0 and "cancelled attempt 1" in stop.stdout
    assert _gone(_tokens(runs[1]), timeout=5)


# Attempt 1 runs out of memory (micro-batch 8 under the cap); attempt 2 (micro-batch 4) trains
# slowly, so that whatever a crash left can be seen running, followed and cancelled.
RESUBMITTED_RECIPE = OOM_RECIPE.replace(
    "    del scratch\n",
    "    del scratch\n"
    "    if batch['x'].shape[0] < 8:\n"
    "        import time; time.sleep(0.5)\n",
).replace('"steps": 4', '"steps": 400')

#: Every fault point of a resubmission, at the attempt where it matters.
CRASH_POINTS = ["follow.ended@1", "replan.chosen@1", "submit.recorded@2", "schedule.request@2",
                "schedule.started@2", "schedule.recorded@2", "submit.running@2"]


def test_a_launcher_killed_at_every_step_of_a_resubmission_leaves_a_run_it_can_act_on(
        cli, write_script, tmp_path):
    """`launch` is SIGKILLed (fault point, not timing luck) at each step between attempt 1's
    out-of-memory end and attempt 2 running. Whatever it left, `status` completes the record
    so that every job that was handed over has an attempt with its id, `logs` reads a started
    job, and `cancel` leaves no process of the run. Before: a kill after attempt 2's runner
    started and before runner.json was written recorded "never submitted" while the job
    trained on, and `cancel` said "nothing running". The seven launches run at once."""
    script = write_script(RESUBMITTED_RECIPE)
    procs = {}
    for point in CRASH_POINTS:
        state = tmp_path / point
        env = {**os.environ, "LAUNCH_STATE_DIR": str(state), "LAUNCH_NO_TRACE": "1",
               "LAUNCH_FAULT": point}
        procs[point] = subprocess.Popen(
            [sys.executable, "-m", "launcher.cli", str(script), "--memory-limit", "2560MiB"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
            cwd=str(script.parent))
    for point, proc in procs.items():
        _out, err = proc.communicate(timeout=300)
        assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, err)
    for point in CRASH_POINTS:
        environ = {"LAUNCH_STATE_DIR": str(tmp_path / point)}
        run_dir = next((tmp_path / point / "runs").iterdir())
        status = cli("status", "--json", environ=environ)
        assert status.status == 0, (point, status.stderr)
        recorded = {a["number"]: a for a in status.json()["attempts"]}
        for request in run_dir.glob("attempt-*/request.json"):
            number = int(request.parent.name.removeprefix("attempt-"))
            assert recorded[number]["job_id"], (point, recorded)  # handed over: tracked
        if (run_dir / "attempt-2" / "runner.json").exists():
            logs = cli("logs", "--attempt", "2", environ=environ)
            assert logs.status == 0, (point, logs.stderr)
        cancel = cli("cancel", environ=environ)
        assert cancel.status == 0, (point, cancel.stderr)
        assert _gone(_tokens(run_dir), timeout=10), point
        final = cli("status", "--json", environ=environ).json()["attempts"]
        assert all(a["live_state"] in ("succeeded", "failed", "cancelled", "not_submitted")
                   for a in final), (
            point, final)
    # The step where the old code lost the job: attempt 2 ran, and is recorded and cancelled.
    started = cli("status", "--json", environ={
        "LAUNCH_STATE_DIR": str(tmp_path / "schedule.started@2")}).json()["attempts"]
    assert [(a["outcome"], a["live_state"]) for a in started] == [
        ("oom", "cancelled"), ("cancelled", "cancelled")], started


def test_a_moved_state_folder_keeps_its_runs_and_a_deleted_one_stops_its_job(cli, write_script,
                                                                            tmp_path):
    """`mv` of the project (the state folder is ./.launch): a finished run and a running one
    keep working from the new place; the runner writes its end into the moved folder and never
    recreates the old one. A runner whose folder was deleted stops its job. Before: attach
    hung, logs printed nothing, cancel waited 30 s and rewrote a succeeded attempt."""
    relative = {"LAUNCH_STATE_DIR": ".launch"}
    done_project, live_project, doomed_project = (tmp_path / n for n in ("p1", "p2", "p3"))
    for project in (done_project, live_project, doomed_project):
        (project / "code").mkdir(parents=True)
        (project / "code" / "train.py").write_text(SLOW_RECIPE)
    live = [_launch_subprocess(p / "code" / "train.py", p / ".launch", "--steps", "400")
            for p in (live_project, doomed_project)]
    finished = cli(str(done_project / "code" / "train.py"), "--steps", "2", "--json",
                   cwd=done_project, environ=relative)
    assert finished.status == 0, finished.stderr
    live_run, doomed_run = (_wait_for_run(p / ".launch") for p in (live_project, doomed_project))
    for proc in live:
        proc.send_signal(signal.SIGINT)  # detach: the jobs go on
        proc.communicate(timeout=60)

    doomed_tokens = _tokens(doomed_run)
    shutil.rmtree(doomed_project / ".launch")
    assert _gone(doomed_tokens, timeout=10)  # its runner saw the folder go and stopped it
    assert not (doomed_project / ".launch").exists()

    moved_done, moved_live = tmp_path / "q1", tmp_path / "q2"
    done_project.rename(moved_done)
    live_project.rename(moved_live)
    run_id = finished.json()["run_id"]
    status = cli("status", run_id, "--json", cwd=moved_done, environ=relative)
    assert status.status == 0 and status.json()["attempts"][0]["live_state"] == "succeeded"
    logs = cli("logs", run_id, "--raw", cwd=moved_done, environ=relative)
    assert logs.status == 0 and '"launch": "done"' in logs.stdout
    cancel = cli("cancel", run_id, cwd=moved_done, environ=relative)
    assert cancel.status == 0 and "nothing running" in cancel.stdout
    attach = cli("attach", run_id, "--json", cwd=moved_done, environ=relative)
    assert attach.status == 0 and attach.json()["attempts"][0]["state"] == "succeeded"

    stop = cli("cancel", live_run.name, cwd=moved_live, environ=relative)
    assert stop.status == 0 and "cancelled attempt 1" in stop.stdout, stop.stderr
    moved_attempt = moved_live / ".launch" / "runs" / live_run.name / "attempt-1"
    assert json.loads((moved_attempt / "exit.json").read_text())["state"] == "cancelled"
    assert not live_project.exists()  # the runner wrote through its folder, not the old path


# -- issue 28: a change the script cannot see is never resubmitted -------------------------------

# pytorch/examples' style: the batch size is the script's own flag; LAUNCH_* is never read. Each
# step asks for batch_size x 64 Mi floats (5 GiB at its default 20): over a 2.5 GiB cap.
ARGPARSE_SCRIPT = """
import argparse
import torch

parser = argparse.ArgumentParser(description="word language model, abridged")
parser.add_argument("--batch_size", type=int, default=20, metavar="N")
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()



class RNNModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.decoder = torch.nn.Linear(16, 16)

    def forward(self, input):
        hidden = torch.ones(input.shape[0], 64 * 1024 * 1024)  # the activations
        return self.decoder(input) + hidden[:, :16]


model = RNNModel()
for epoch in range(args.epochs):
    output = model(torch.ones(args.batch_size, 16))
    output.sum().backward()
    print("epoch", epoch, float(output.sum()))
"""


def test_an_oom_fix_the_script_cannot_see_is_not_resubmitted(cli, tmp_path):
    """word_language_model reads --batch_size, not LAUNCH_MICRO_BATCH_SIZE: the OOM loop
    halved a micro-batch it never saw, three times, each attempt failing on the same 5 GiB
    request (three paid jobs on a cloud). Now the plan says before anything runs that the
    script reads none of the plan's settings, and the run stops after the first failure
    saying which variable would have carried the fix."""
    script = tmp_path / "main.py"
    script.write_text(ARGPARSE_SCRIPT)
    plan = cli("plan", str(script), "--params", "1M", "--json")
    assert plan.status == 0, plan.stderr
    assert any("reads none of LAUNCH_MICRO_BATCH_SIZE" in n for n in plan.json()["notes"])
    result = cli(str(script), "--params", "1M", "--json", "--memory-limit", "2560MiB",
                 "--global-batch-size", "20")
    assert result.status == ExitStatus.OUT_OF_MEMORY, result.stderr
    data = result.json()
    assert len(data["attempts"]) == 1
    assert "LAUNCH_MICRO_BATCH_SIZE" in data["message"] and "same job again" in data["message"]


def test_a_failure_repeated_exactly_stops_the_run(cli, tmp_path):
    """A script that names LAUNCH_MICRO_BATCH_SIZE but does not use it for the allocation that
    fails: attempt 2 dies on the very request attempt 1 did. The run stops there, saying so,
    instead of halving again."""
    script = tmp_path / "main.py"
    script.write_text(ARGPARSE_SCRIPT.replace(
        "args = parser.parse_args()\n",
        "args = parser.parse_args()\n"
        "import os\nprint('planned micro-batch', os.environ.get('LAUNCH_MICRO_BATCH_SIZE'))\n"))
    result = cli(str(script), "--params", "1M", "--json", "--memory-limit", "2560MiB",
                 "--global-batch-size", "20", "--max-attempts", "4",
                 "--", "--batch_size", "20", "--epochs=1")
    assert result.status == ExitStatus.OUT_OF_MEMORY, result.stderr
    data = result.json()
    assert len(data["attempts"]) == 2, [a["change"] for a in data["attempts"]]
    assert "failed exactly as attempt 1 did" in data["message"]
    # The resubmission runs the script with its own arguments too.
    run = tmp_path / "state" / "runs" / data["run_id"]
    for number in (1, 2):
        request = json.loads((run / f"attempt-{number}" / "request.json").read_text())
        assert request["argv"][-3:] == ["--batch_size", "20", "--epochs=1"]


# -- issue 28 item 7: an evaluation loop's OOM is not "fixed" by the training micro-batch ---------

# Training steps at the planned micro-batch are small; the evaluation loop, under torch.no_grad,
# runs at its own eval_batch_size=32: 32 x 64 Mi floats (8 GiB), over a 2.5 GiB cap whatever the
# training micro-batch.
EVAL_OOM_SCRIPT = """
import os
import torch

micro = int(os.environ.get("LAUNCH_MICRO_BATCH_SIZE", "4"))
eval_batch_size = 32
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def evaluate(model):
    model.eval()
    with torch.no_grad():
        hidden = torch.ones(eval_batch_size, 64 * 1024 * 1024)
        return float(model(hidden[:, :16]).sum())


for step in range(2):
    loss = model(torch.ones(micro, 16)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("eval loss", evaluate(model))
"""


def test_an_evaluation_oom_stops_after_one_attempt_with_the_evaluation_advice(cli, tmp_path):
    """The replanner used to halve the training micro-batch, which left the evaluation batch
    as it was: a second paid attempt failing the same way. Now one attempt, exit 5, and the
    message says to lower the evaluation batch."""
    script = tmp_path / "main.py"
    script.write_text(EVAL_OOM_SCRIPT)
    result = cli(str(script), "--params", "1M", "--json", "--memory-limit", "2560MiB",
                 "--global-batch-size", "8", "--max-attempts", "3")
    assert result.status == ExitStatus.OUT_OF_MEMORY, result.stderr
    data = result.json()
    assert len(data["attempts"]) == 1, [a["change"] for a in data["attempts"]]
    assert data["attempts"][0]["diagnosis"]["phase"] == "evaluation"
    assert "evaluation batch" in data["message"], data["message"]
    assert "per_device_eval_batch_size" in data["message"]


# -- issue 28 item 7: torchrun's ChildFailedError stays the job's output ---------------------------

RANK_1_RAISES = """
import os
if os.environ.get("RANK") == "1":
    raise ValueError("boom on rank 1")
"""


def test_a_failed_rank_is_one_line_of_launch_s_own_and_torchrun_s_table_stays_in_the_log(
        cli, tmp_path):
    """torchrun prints a ChildFailedError traceback and a "Root Cause (first observed failure)"
    table when a worker fails: that is the job's output (torchrun's stderr, in the log, echoed
    while following). launch's own account of the failure is one line naming the rank, its
    exit code and the first failure, and never repeats the table."""
    script = tmp_path / "main.py"
    script.write_text(RANK_1_RAISES)
    result = cli(str(script), "--params", "1M", "--gpus-per-node", "2", "--json")
    assert result.status == ExitStatus.JOB_FAILED, result.stderr
    data = result.json()
    message = data["message"]
    assert "\n" not in message and "ChildFailedError" not in message, message
    assert message == ("attempt 1 failed: torchrun: rank 1 failed with exit code 1 (first "
                       "failure: ValueError: boom on rank 1)"), message
    assert "\n" not in data["attempts"][0]["summary"]["message"]
    log = (tmp_path / "state" / "runs" / data["run_id"] / "attempt-1" / "output.log").read_text()
    assert "ChildFailedError" in log and "Root Cause (first observed failure)" in log
    assert "ChildFailedError" not in result.stderr
