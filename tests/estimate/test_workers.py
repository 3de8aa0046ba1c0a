"""The trace child's workers: no preflight hangs, stalls or dies without the documented result.

Every test here runs at the default thread count (no OMP_NUM_THREADS): the deadlock these guard
against needs OpenMP's pool, which a single thread never starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launcher.estimate import trace_process
from launcher.estimate.traced import TraceError, TraceTimeout, trace_recipe, trace_recipe_configs
from launcher.recipe import inspect_script

REPO = Path(__file__).resolve().parents[2]

# Large fills at import and in build_model: OpenMP splits them across threads, which starts its
# pool in whichever process runs them (2048 x 2048 is far above ATen's grain size).
FILLS = '''
import torch, torch.nn as nn

TABLE = torch.zeros(2048, 2048).fill_(0.5)

def build_model():
    torch.zeros(2048, 2048).normal_()
    return nn.Sequential(nn.Embedding(4096, 256), nn.Linear(256, 4096))

def example_batch(batch_size):
    return torch.randint(0, 4096, (batch_size, 16))

def training_step(model, batch):
    return nn.functional.cross_entropy(model(batch).flatten(0, 1), batch.flatten())

LAUNCH = {"global_batch_size": 8}
'''

STALL = '''
import time, torch

def build_model():
    return torch.nn.Linear(4, 4)

def example_batch(batch_size):
    return torch.randn(batch_size, 4)

def training_step(model, batch):
    time.sleep(600)
    return model(batch).sum()
'''

DIES = '''
import os, signal, torch

def build_model():
    os.kill(os.getpid(), signal.SIGKILL)

def example_batch(batch_size):
    return torch.randn(batch_size, 4)

def training_step(model, batch):
    return model(batch).sum()
'''


def _write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return path


@pytest.fixture(autouse=True)
def default_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)


def test_a_recipe_that_fills_large_tensors_is_probed_and_traced(tmp_path: Path) -> None:
    """The prestarted child probes the recipe (running its import and build_model), then traces
    it in two forked workers: the probe's fills must not leave the child unsafe to fork."""
    path = _write(tmp_path, "fills", FILLS)
    trace_process._reap()
    trace_process.prestart()
    started = time.monotonic()
    info = inspect_script(path, probe=trace_process.probe, count_flops=False, timeout_s=60)
    assert info.parameters == 4096 * 256 + 256 * 4096 + 4096
    results = trace_recipe_configs(path, [{"activation_checkpointing": False},
                                          {"precision": "bf16_mixed"}],
                                   device="cpu", micro_batch_sizes=(1, 2, 4), timeout_s=60)
    assert time.monotonic() - started < 60
    for result in results:
        assert not isinstance(result, TraceError), result
        assert result.peak_at(4) > result.parameter_bytes * 4  # weights, grads, 2 Adam moments


def test_workers_are_spawned_once_a_thread_pool_exists(tmp_path: Path) -> None:
    """If the child itself ever started a pool, forking is off and fresh interpreters answer."""
    script = textwrap.dedent(f'''
        import json, sys, torch
        from launcher.estimate.child import _workers, _trace_child
        _workers.prepare()
        safe_before = _workers.fork_safe()
        torch.set_num_threads(2)
        torch.zeros(4096, 4096).fill_(1.0)   # starts OpenMP's pool in this process
        request = {{"recipe_file": {str(_write(tmp_path, "fills", FILLS))!r},
                    "micro_batch_sizes": [1, 2], "verify_sizes": [], "precision": "fp32",
                    "optimizer": None, "activation_checkpointing": False,
                    "grad_accum_steps": 1, "device": "cpu", "scale_depth": False}}
        answer = _workers.run_all([request], _trace_child._work)[0]
        print(json.dumps({{"safe_before": safe_before, "safe_after": _workers.fork_safe(),
                          "ok": answer["ok"]}}))
    ''')
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    answer = proc.stdout.strip().splitlines()[-1]
    assert answer == '{"safe_before": true, "safe_after": false, "ok": true}'


def test_a_stalled_batch_trace_is_a_timeout(tmp_path: Path) -> None:
    """The batch request (the one a preflight sends) ends in TraceTimeout, killed with its
    workers, within the limit."""
    path = _write(tmp_path, "stall", STALL)
    started = time.monotonic()
    with pytest.raises(TraceTimeout, match="stall.py took longer than 5 s"):
        trace_recipe_configs(path, [{}, {"precision": "bf16_mixed"}], device="cpu",
                             micro_batch_sizes=(1, 2, 4), timeout_s=5)
    assert time.monotonic() - started < 20


def test_a_worker_that_dies_is_a_crash(tmp_path: Path) -> None:
    path = _write(tmp_path, "dies", DIES)
    with pytest.raises(TraceError, match="killed by SIGKILL") as info:
        trace_recipe(path, device="cpu", micro_batch_sizes=(1, 2, 4), timeout_s=60)
    assert info.value.kind == "crash"


def _launch(*args: str, cwd: Path, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    full.update(env or {})
    launch = Path(sys.executable).parent / "launch"  # the installed command, as a user runs it
    return subprocess.run([str(launch), *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=180, check=False)


def test_plan_falls_back_to_model_states_when_the_trace_stalls(tmp_path: Path) -> None:
    path = _write(tmp_path, "stall", STALL)
    proc = _launch("plan", str(path), "--provider", "local", "--micro-batch-size", "4", "--json",
                   cwd=tmp_path, env={"LAUNCH_TRACE_TIMEOUT": "8"})
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    import json

    chosen = json.loads(proc.stdout)["chosen"]
    assert chosen["memory"]["parameters"] == 4 * 4 * 4 + 4 * 4
    assert chosen["memory"]["activations"] is None  # model states only, as documented


def test_plan_of_a_recipe_that_kills_its_trace_is_a_one_line_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "dies", DIES)
    proc = _launch("plan", str(path), "--provider", "local", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2
    assert "SIGKILL" in proc.stderr


def test_kill_9_of_launch_during_a_preflight_leaves_no_trace_process(tmp_path: Path) -> None:
    """A launch killed while its trace stalls: the trace child and its worker die with it (the
    kernel's parent-death signal), however long the stalled trace would have gone on."""
    from launcher import processes

    path = _write(tmp_path, "stall", STALL)
    launch = Path(sys.executable).parent / "launch"
    proc = subprocess.Popen([str(launch), "plan", str(path), "--micro-batch-size", "4"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "LAUNCH_STATE_DIR": str(tmp_path / "state"),
                                 "LAUNCH_TRACE_TIMEOUT": "300"})
    deadline = time.monotonic() + 120
    tree: list[int] = []
    while time.monotonic() < deadline:  # until the trace child has a worker: the trace runs
        tree = processes.descendants(proc.pid)
        if len(tree) >= 2:
            break
        time.sleep(0.1)
    assert len(tree) >= 2, "the preflight never started its trace worker"
    time.sleep(1.0)
    tree = processes.descendants(proc.pid)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while any(processes.alive(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in tree if processes.alive(pid)]


def test_the_preflight_runs_the_recipe_without_cloud_credentials(tmp_path: Path) -> None:
    """The recipe probe and the trace import the user's code: neither sees the launcher's cloud
    credentials (a recipe that logs its environment must not log them)."""
    seen = tmp_path / "seen.txt"
    recipe = _write(tmp_path, "peek", f'''
import os, torch
with open({str(seen)!r}, "a") as out:
    out.write(f"{{'AWS_SECRET_ACCESS_KEY' in os.environ}} {{os.environ.get('AWS_REGION')}}\\n")

def build_model():
    return torch.nn.Linear(4, 4)

def example_batch(batch_size):
    return torch.randn(batch_size, 4)

def training_step(model, batch):
    return model(batch).sum()
''')
    proc = _launch("plan", str(recipe), "--json", cwd=tmp_path,
                   env={"AWS_SECRET_ACCESS_KEY": "very-secret", "AWS_REGION": "eu-west-1",
                        "LAUNCH_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 0, proc.stderr
    lines = seen.read_text().splitlines()
    assert len(lines) >= 2 and set(lines) == {"False eu-west-1"}, lines


def test_a_captured_recipe_preimports_what_the_users_script_and_model_need(tmp_path: Path
                                                                          ) -> None:
    """The packages the script imports, the names it takes from them (fetched: a lazy package
    loads them on access), and the modules of the model's and its blocks' classes are imported
    once in the trace child, for every forked worker; the script's own modules are not (they
    are the user's code, run in workers only), and none of it starts a thread while the trace
    child runs with OPENBLAS_NUM_THREADS=1 (numpy, which transformers imports, would start its
    pool)."""
    import json

    folder = tmp_path / "capture"
    folder.mkdir()
    (folder / "recipe.py").write_text("import torch\n")
    script = tmp_path / "train.py"
    script.write_text("import colorsys\nfrom transformers import GPT2Config\n"
                      "from mymodels import Net\n")
    (tmp_path / "mymodels.py").write_text("raise SystemExit('the user\\'s module was run')\n")
    (folder / "capture.json").write_text(json.dumps({
        "script": str(script), "model_class": "xml.dom.minidom.Document",
        "wrap_modules": ["json.decoder.JSONDecoder"]}))
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from launcher.estimate.child import _workers
        import torch
        _workers.prepare()
        done = _workers.preimport({str(folder / "recipe.py")!r})
        print(sorted(done))
        print("transformers.models.gpt2.configuration_gpt2" in sys.modules,
              "mymodels" in sys.modules, _workers.fork_safe())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
                         check=True).stdout.splitlines()
    assert out[0] == str(sorted(["colorsys", "transformers", "xml.dom.minidom"]))
    assert out[1] == "True False True"  # GPT2Config fetched; the user's module not
