"""How long `launch plan SCRIPT` takes against how long the script takes to start training.

Issue 28's yardstick: a plan of a script the user already has should cost about what running it
to its first optimizer step costs (within 5 s), since that is what the plan does first (the
capture), before it traces. Each script is timed twice, each a fresh process as the user runs
it: ``launch plan SCRIPT --json`` (Python start, the capture, the trace, the planner), and
``python SCRIPT`` stopped at its first ``Optimizer.step``, or at the first forward after a backward
where it updates its weights by hand (``--first-step-child``: the script as it is, ``cuda``
mapped to this CPU as the capture maps it).

The scripts: bench_plain's plain ones (the tests' mnist and nanoGPT, bench/plain_scripts/) and the
tests' framework fixtures (a Trainer run_clm, an accelerate loop, two Lightning modules).

    .venv/bin/python bench/bench_plan_time.py                  # every script, once each
    .venv/bin/python bench/bench_plan_time.py --repeat 3 --only mnist hf_run_clm
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FRAMEWORKS = ROOT / "tests" / "fixtures" / "frameworks"
FRAMEWORK_SCRIPTS = ("hf_run_clm", "accelerate_nlp", "lightning_classifier",
                     "lightning_autoencoder")
#: Issue 28's target: the plan within this many seconds of the script's first step.
TARGET_S = 5.0


def scripts() -> dict[str, str]:
    from bench.bench_plain import scripts as plain

    found = dict(plain())
    for name in FRAMEWORK_SCRIPTS:
        found[name] = (FRAMEWORKS / f"{name}.py").read_text(encoding="utf-8")
    return found


def first_step_child(script: str) -> int:
    """Run ``script`` as ``__main__`` until its first optimizer step; print the seconds since
    the parent spawned this process (``BENCH_SPAWNED_AT``)."""
    import runpy

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from launcher.capture.child import on_the_cpu

    sys.argv = [script]
    sys.path.insert(0, str(Path(script).parent))
    on_the_cpu.patch_cuda()

    class Done(BaseException):
        pass

    def pre(*_: object) -> None:
        spawned = float(os.environ["BENCH_SPAWNED_AT"])
        print(f"FIRST-STEP {time.time() - spawned:.3f}", flush=True)
        raise Done

    # A loop without an optimizer (word_language_model updates its weights by hand) has
    # started training when its first top-level forward after a backward runs: step 1 is done.
    # (Not a loop with one: an accumulating loop's next micro-batch is not a step.)
    import torch

    backward, call, seen = torch.Tensor.backward, torch.nn.Module.__call__, {"depth": 0}
    init = torch.optim.Optimizer.__init__

    def optimizer_seen(self: torch.optim.Optimizer, *args: object, **kwargs: object) -> None:
        seen["optimizer"] = True
        init(self, *args, **kwargs)

    torch.optim.Optimizer.__init__ = optimizer_seen  # type: ignore[method-assign]

    def backward_seen(self: torch.Tensor, *args: object, **kwargs: object) -> object:
        seen["backward"] = True
        return backward(self, *args, **kwargs)

    def call_after_backward(self: torch.nn.Module, *args: object, **kwargs: object) -> object:
        if (seen.get("backward") and not seen.get("optimizer") and not seen["depth"]
                and torch.is_grad_enabled()):
            pre()
        seen["depth"] += 1
        try:
            return call(self, *args, **kwargs)
        finally:
            seen["depth"] -= 1

    torch.Tensor.backward = backward_seen  # type: ignore[method-assign]
    torch.nn.Module.__call__ = call_after_backward  # type: ignore[method-assign]
    register_optimizer_step_pre_hook(pre)
    try:
        runpy.run_path(script, run_name="__main__")
    except Done:
        pass
    os._exit(0)  # the script's loader workers and atexit hooks are not waited for


def time_one(name: str, source: str, folder: Path, repeat: int) -> dict:
    folder.mkdir(parents=True)
    script = folder / ("train.py" if name == "nanogpt" else "main.py")
    script.write_text(source)
    plans, firsts = [], []
    row: dict = {"name": name}
    for i in range(repeat):
        env = {**os.environ, "LAUNCH_STATE_DIR": str(folder / f"state-{i}"),
               "LAUNCH_NO_TRACE": "0"}
        started = time.perf_counter()
        done = subprocess.run([str(Path(sys.executable).parent / "launch"), "plan", str(script),
                               "--json"],
                              cwd=folder, env=env, capture_output=True, text=True, timeout=900,
                              check=False)
        plans.append(time.perf_counter() - started)
        if done.returncode != 0:
            row["failed"] = " ".join(done.stderr.split())[:200]
            return row
        child = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--first-step-child", str(script)],
            cwd=folder, capture_output=True, text=True, timeout=900, check=False,
            env={**os.environ, "BENCH_SPAWNED_AT": repr(time.time())})
        firsts += [float(line.split()[1]) for line in child.stdout.splitlines()
                   if line.startswith("FIRST-STEP ")]
    row["plan_s"] = statistics.median(plans)
    if firsts:
        row["first_step_s"] = statistics.median(firsts)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="these scripts only (by name)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each (medians shown)")
    parser.add_argument("--first-step-child", metavar="SCRIPT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_step_child:
        return first_step_child(args.first_step_child)
    chosen = {k: v for k, v in scripts().items() if not args.only or k in args.only}
    print("| script | launch plan | python SCRIPT to its first step | difference |")
    print("|---|---:|---:|---:|")
    differences = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, source in chosen.items():
            row = time_one(name, source, Path(tmp) / name, args.repeat)
            if "failed" in row or "first_step_s" not in row:
                print(f"| {name} | {row.get('failed', 'no first step')} | | |", flush=True)
                continue
            difference = row["plan_s"] - row["first_step_s"]
            differences.append(difference)
            print(f"| {name} | {row['plan_s']:.1f} s | {row['first_step_s']:.1f} s | "
                  f"{difference:+.1f} s |", flush=True)
    if differences:
        within = sum(d <= TARGET_S for d in differences)
        print(f"\n{len(differences)} scripts timed; median difference "
              f"{statistics.median(differences):+.1f} s, max {max(differences):+.1f} s; "
              f"{within} of {len(chosen)} within {TARGET_S:.0f} s of their first step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
