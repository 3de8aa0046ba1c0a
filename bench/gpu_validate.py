"""The launcher's GPU estimate against the GPU's own allocator, row by row of the model zoo.

One command for the first machine with a GPU:

    python bench/gpu_validate.py --out "$OUT"                       # every row, < 8 min
    python bench/gpu_validate.py --device cpu --rows 2 --steps 1 --out /tmp/gv   # CPU smoke

For every row (a model of bench/zoo_hf.py or bench/models_zoo.py at one micro-batch,
accumulation, precision and checkpointing setting, strategy ``single``; or ``fsdp`` over 2 GPUs,
run with torchrun, where the machine has 2, else skipped with that reason) it:

1. writes the model's recipe file (``zoo_hf.write_recipe`` / ``models_zoo.write_recipe``);
2. asks the launcher for that exact plan, as a user would: ``launch plan RECIPE --json
   --strategy S --micro-batch-size B --global-batch-size B*A*G --precision P
   --[no-]activation-checkpointing --steps N`` (a child process; the trace emulates CUDA on
   the CPU, as everywhere, and the target is this GPU), and keeps ``chosen.memory``: the predicted
   ``peak_allocated`` and ``peak_reserved``;
3. renders that plan with ``launcher.render.render`` (the program that ships: ``launch_train.py``
   + ``plan.json``) into the row's folder and runs it, ``python launch_train.py``, for N
   optimizer steps in a child process; the script's last ``{"launch": "metrics"}`` line carries
   ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` since the process started
   (``memory_stats`` in trainer_templates/launch_runtime.py), read before the final checkpoint;
4. writes the row into ``OUT/gpu_validate.json`` (atomically: temporary file, then rename),
   so a sweep cut short still leaves every finished row.

On the CPU (``--device cpu``, the smoke mode a test runs) the rendered script reports no
allocator peaks (``peak_allocated_bytes`` is null there) but its peak RSS; the row then also
gets ``measure_recipe``'s CPU-allocator peak (two real steps of the same rendered script's
functions under ``torch.profiler``), so the CPU prediction has a real allocator to meet.

Budget: ``--budget-s`` (default 450 s) for the whole sweep and ``--row-timeout-s`` per child.
Rows start in order (the first rows are the ones that matter most: every model once in
bf16_mixed, then fp32, then the checkpointing / accumulation / batch grid, then fsdp); a row is
skipped, with the reason recorded, when the time left is less than the slowest row so far (or
than ``--row-timeout-s`` before any row finished), and every child's timeout ends at the
budget's deadline, so the sweep ends within ``--budget-s`` (plus the few seconds of the version
probe). ``--jobs`` rows run at once (each row's trace and run are their own processes; a row
that fails is ``status: "failed"`` with its ``reason``, and the sweep goes on).

Reading the output: ``rows[i].predicted`` and ``rows[i].measured`` hold ``peak_allocated`` and
``peak_reserved`` in bytes; ``rows[i].error`` is (predicted - measured) / measured for each;
``summary`` has the median |error| and the worst under-estimate of each; ``environment`` has
torch's and CUDA's versions and the GPU's name. A negative error is an under-estimate: the plan
would have promised memory the job needed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from launcher.plan.plan import Plan  # noqa: E402
from launcher.render import SCRIPT_NAME, TrainSettings, render  # noqa: E402
from launcher.statefiles import atomic_write  # noqa: E402

#: zoo_hf.MODELS and models_zoo.ARCHS by name, without importing torch in this process.
HF_MODELS = ("llama", "llama_masked", "gpt2", "qwen2", "t5", "bart", "whisper", "bert",
             "roberta", "vit", "swin", "convnext", "mixtral", "mixtral_eager", "qwen2_moe")
ARCH_MODELS = ("mlp", "cnn", "lstm", "gpt", "llama", "vit", "encdec", "moe")
#: Models of the grid (checkpointing, accumulation, a larger micro-batch) and of the fsdp rows.
GRID = (("hf", "llama"), ("hf", "gpt2"), ("hf", "t5"), ("hf", "bert"), ("hf", "vit"),
        ("arch", "gpt"), ("arch", "llama"))
FSDP = (("hf", "llama"), ("hf", "bert"), ("arch", "gpt"))
OUTPUT_NAME = "gpu_validate.json"
QUANTITIES = ("peak_allocated", "peak_reserved")


@dataclass
class Row:
    zoo: str  # "hf" (bench/zoo_hf.py) | "arch" (bench/models_zoo.py)
    model: str
    micro_batch: int
    accum: int
    precision: str
    checkpointing: bool
    strategy: str = "single"
    gpus: int = 1  # processes (GPUs) of the plan: 2 for the fsdp rows
    status: str = "pending"  # pending | running | done | failed | skipped
    reason: str | None = None  # why skipped, or the failure in one line
    predicted: dict[str, int | None] = field(default_factory=dict)
    measured: dict[str, int | None] = field(default_factory=dict)
    error: dict[str, float | None] = field(default_factory=dict)
    estimate_source: str | None = None  # launch plan's model.source: traced | config | ...
    plan_machine: str | None = None
    plan_s: float | None = None
    run_s: float | None = None
    row_s: float | None = None

    @property
    def slug(self) -> str:
        return (f"{self.zoo}_{self.model}_b{self.micro_batch}_a{self.accum}_{self.precision}_"
                f"ckpt{int(self.checkpointing)}_{self.strategy}")

    @property
    def name(self) -> str:
        return (f"{self.zoo}:{self.model} b={self.micro_batch} accum={self.accum} "
                f"{self.precision} ckpt={'on' if self.checkpointing else 'off'} {self.strategy}"
                f"{f' x{self.gpus}' if self.gpus > 1 else ''}")


def all_rows(steps: int) -> list[Row]:
    """The sweep, most important first (see the module's docstring)."""
    del steps  # every row runs the same number of steps
    zoo = [("hf", m) for m in HF_MODELS] + [("arch", m) for m in ARCH_MODELS]
    rows = [Row(z, m, 8, 1, "bf16_mixed", False) for z, m in zoo]
    rows += [Row(z, m, 8, 1, "fp32", False) for z, m in zoo]
    for z, m in GRID:
        rows += [Row(z, m, 8, 4, "bf16_mixed", False), Row(z, m, 8, 1, "bf16_mixed", True),
                 Row(z, m, 32, 1, "bf16_mixed", False), Row(z, m, 32, 1, "bf16_mixed", True)]
    rows += [Row(z, m, 8, 1, "bf16_mixed", False, strategy="fsdp", gpus=2) for z, m in FSDP]
    return rows


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text[-limit:]


def _child_env(device: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU run on a GPU machine too
    return env


def write_recipe(row: Row, directory: Path) -> Path:
    """The row's recipe file in the row's own folder (rows running at once share no file)."""
    if row.zoo == "hf":
        import zoo_hf  # imports torch: only here, in the parent's worker thread
        return zoo_hf.write_recipe(row.model, directory)
    import models_zoo
    return models_zoo.write_recipe(row.model, directory)


def _left(deadline: float, row_timeout: float) -> float:
    """A child's timeout: its own limit, cut to what is left of the sweep's budget."""
    return max(1.0, min(row_timeout, deadline - time.monotonic()))


def plan_row(row: Row, recipe: Path, steps: int, timeout: float, device: str) -> dict[str, Any]:
    """``launch plan`` for exactly this row's plan; returns the chosen plan's dictionary."""
    command = [sys.executable, "-m", "launcher.cli", "plan", str(recipe), "--json",
               "--provider", "local", "--strategy", row.strategy,
               "--micro-batch-size", str(row.micro_batch),
               "--global-batch-size", str(row.micro_batch * row.accum * row.gpus),
               "--precision", row.precision, "--steps", str(steps),
               "--activation-checkpointing" if row.checkpointing
               else "--no-activation-checkpointing"]
    if row.gpus > 1:
        command += ["--gpus-per-node", str(row.gpus)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          cwd=recipe.parent, env=_child_env(device))
    try:
        answer = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"launch plan exited {done.returncode}: "
                           f"{_one_line(done.stderr or done.stdout)}") from None
    chosen = answer.get("chosen")
    if not chosen:
        raise RuntimeError(f"launch plan chose nothing: {_one_line(json.dumps(answer))}")
    row.estimate_source = (answer.get("model") or {}).get("source")
    return chosen


def run_rendered(row: Row, plan: Plan, recipe: Path, directory: Path, timeout: float,
                 device: str) -> dict[str, Any]:
    """Render ``plan`` (launcher.render) and run the script; the last metrics line."""
    settings = TrainSettings(recipe_file=str(recipe), mode="recipe", run_id="gpu-validate",
                             attempt=1, checkpoint_dir=str(directory / "checkpoints"),
                             checkpoint_every=0, keep_checkpoints=1)
    job = render(plan, settings)
    job.write(directory)
    env = {**_child_env(device), **job.env, "LAUNCH_MERGE_STDERR": "1"}
    script = [str(directory / SCRIPT_NAME)]
    if plan.world_size > 1:  # torchrun, as the local provider starts a multi-process plan
        script = ["-m", "torch.distributed.run", "--standalone",
                  f"--nproc_per_node={plan.world_size}", *script]
    done = subprocess.run([sys.executable, *script], capture_output=True, text=True,
                          timeout=timeout, cwd=directory, env=env)
    (directory / "run.log").write_text(done.stdout + done.stderr)
    events = []
    for line in done.stdout.splitlines():
        if line.startswith('{"launch"'):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    oom = [e for e in events if e.get("launch") == "oom"]
    if oom:
        raise RuntimeError(f"out of memory in the rendered run: {_one_line(json.dumps(oom[0]))}")
    metrics = [e for e in events if e.get("launch") == "metrics"]
    if done.returncode != 0 or not metrics:
        raise RuntimeError(f"rendered script exited {done.returncode}: "
                           f"{_one_line(done.stdout + done.stderr)}")
    # Each rank's last line; the rank that holds the most (sharded ranks differ a little).
    last: dict[Any, dict[str, Any]] = {}
    for event in metrics:
        last[event.get("rank", 0)] = event
    return max(last.values(), key=lambda e: (e.get("peak_allocated_bytes") or 0,
                                             e.get("rss_bytes") or 0))


def measure_row(row: Row, work: Path, steps: int, row_timeout: float, device: str,
                deadline: float) -> None:
    """Plan, render and run one row; each child's timeout ends at the sweep's ``deadline``."""
    directory = work / row.slug
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    started = time.perf_counter()
    recipe = write_recipe(row, directory)
    chosen = plan_row(row, recipe, steps, _left(deadline, row_timeout), device)
    row.plan_s = round(time.perf_counter() - started, 1)
    memory = chosen.get("memory") or {}
    row.predicted = {q: memory.get(q) for q in (*QUANTITIES, "total", "framework_overhead")}
    row.plan_machine = chosen.get("machine")
    plan = Plan.from_dict(chosen)
    run_dir = directory / "job"
    started = time.perf_counter()
    metrics = run_rendered(row, plan, recipe, run_dir, _left(deadline, row_timeout), device)
    row.run_s = round(time.perf_counter() - started, 1)
    row.measured = {"peak_allocated": metrics.get("peak_allocated_bytes"),
                    "peak_reserved": metrics.get("peak_reserved_bytes"),
                    "peak_rss": metrics.get("rss_bytes"), "device": metrics.get("device"),
                    "steps": metrics.get("step"), "rank": metrics.get("rank")}
    if device == "cpu" and row.strategy == "single":
        # No allocator peak from the script on a CPU: the same functions under the profiler
        # (one process: measure_recipe has no strategy, so sharded rows keep RSS only).
        from launcher.estimate.traced import measure_recipe

        real = measure_recipe(recipe, micro_batch=row.micro_batch, grad_accum_steps=row.accum,
                              precision=row.precision,
                              activation_checkpointing=row.checkpointing,
                              timeout_s=_left(deadline, row_timeout))
        row.measured["cpu_allocator_peak"] = real.peak_allocated
        row.measured["peak_allocated"] = real.peak_allocated
    for q in QUANTITIES:
        p, m = row.predicted.get(q), row.measured.get(q)
        row.error[q] = None if p is None or not m else (p - m) / m


def environment(device: str) -> dict[str, Any]:
    """torch's and CUDA's versions and the GPU's name, asked of a child like the runs."""
    code = ("import json, platform, torch\n"
            "cuda = torch.cuda.is_available()\n"
            "p = torch.cuda.get_device_properties(0) if cuda else None\n"
            "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__,"
            " 'cuda': torch.version.cuda, 'cudnn': torch.backends.cudnn.version() if cuda "
            "else None, 'cuda_available': cuda, 'gpu_name': p.name if p else None,"
            " 'gpu_memory_bytes': p.total_memory if p else None,"
            " 'gpu_count': torch.cuda.device_count(),"
            " 'capability': list(torch.cuda.get_device_capability(0)) if cuda else None}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=_child_env(device))
    try:
        env = json.loads(done.stdout)
    except json.JSONDecodeError:
        env = {"error": _one_line(done.stderr)}
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    env["device"] = device
    return env


def summary(rows: list[Row]) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": len(rows)}
    for status in ("done", "failed", "skipped", "pending"):
        out[status] = sum(r.status == status for r in rows)
    for q in QUANTITIES:
        done = [r for r in rows if r.error.get(q) is not None]
        if not done:
            out[q] = None
            continue
        worst = min(done, key=lambda r: r.error[q])
        out[q] = {"compared": len(done),
                  "median_abs_error": statistics.median(abs(r.error[q]) for r in done),
                  "within_5%": sum(abs(r.error[q]) <= 0.05 for r in done),
                  "worst_under": ({"row": worst.name, "error": worst.error[q]}
                                  if worst.error[q] < 0 else None)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_validate_out",
                        help="output folder (default $OUT, else ./gpu_validate_out)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--rows", type=int, default=None, help="only the first N rows")
    parser.add_argument("--only", default="", help="comma-separated model names (hf or arch)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run")
    parser.add_argument("--budget-s", type=float, default=450.0, help="whole sweep")
    parser.add_argument("--row-timeout-s", type=float, default=150.0, help="each child process")
    parser.add_argument("--jobs", type=int, default=None,
                        help="rows at once (default: 6 on cuda, 1 on cpu)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = out / "rows"
    work.mkdir(exist_ok=True)

    env = environment(args.device)
    if args.device == "cuda" and not env.get("cuda_available"):
        atomic_write(out / OUTPUT_NAME, json.dumps(
            {"environment": env, "rows": [], "summary": {"rows": 0},
             "error": "--device cuda, but torch sees no GPU; --device cpu is the smoke mode"},
            indent=1))
        print("gpu_validate: torch sees no GPU (use --device cpu for the smoke mode)",
              file=sys.stderr)
        return 2
    rows = all_rows(args.steps)
    if args.only:
        names = set(args.only.split(","))
        rows = [r for r in rows if r.model in names]
    if args.rows is not None:
        rows = rows[:args.rows]
    jobs = args.jobs or (6 if args.device == "cuda" else 1)
    lock = threading.Lock()
    durations: list[float] = []

    def write() -> None:
        document = {"command": sys.argv, "environment": env, "steps": args.steps,
                    "budget_s": args.budget_s,
                    "elapsed_s": round(time.monotonic() - started, 1),
                    "summary": summary(rows), "rows": [asdict(r) | {"name": r.name}
                                                       for r in rows]}
        atomic_write(out / OUTPUT_NAME, json.dumps(document, indent=1))

    def one(row: Row) -> None:
        with lock:
            if args.device == "cuda" and row.gpus > (env.get("gpu_count") or 0):
                row.status = "skipped"
                row.reason = (f"needs {row.gpus} GPUs, this machine has {env.get('gpu_count')} "
                              "(NCCL puts one rank on one GPU)")
                write()
                return
            left = args.budget_s - (time.monotonic() - started)
            # Before any row finished, a row may take up to its timeout (twice: plan, run).
            need = max(durations) if durations else min(args.row_timeout_s, args.budget_s / 2)
            if left < need:
                row.status = "skipped"
                row.reason = (f"budget: {left:.0f} s left of {args.budget_s:.0f} s, a row "
                              f"takes up to {need:.0f} s")
                write()
                return
            row.status = "running"
        begun = time.monotonic()
        try:
            measure_row(row, work, args.steps, args.row_timeout_s, args.device,
                        deadline=started + args.budget_s)
            row.status = "done"
        except subprocess.TimeoutExpired as exc:
            row.status, row.reason = "failed", f"timeout after {exc.timeout:.0f} s: {exc.cmd[2:4]}"
        except Exception as exc:  # noqa: BLE001 - a failing row is a result, not the end
            row.status, row.reason = "failed", f"{type(exc).__name__}: {_one_line(str(exc))}"
        row.row_s = round(time.monotonic() - begun, 1)
        with lock:
            durations.append(row.row_s)
            write()
            err = " ".join(f"{q} {row.error[q] * 100:+.2f}%" for q in QUANTITIES
                           if row.error.get(q) is not None)
            print(f"[{time.monotonic() - started:5.0f}s] {row.name}: {row.status} "
                  f"{err}{' ' + row.reason if row.reason else ''}", file=sys.stderr, flush=True)

    write()
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, rows))
    write()
    result = summary(rows)
    print(json.dumps({"output": str(out / OUTPUT_NAME), "environment": env,
                      "summary": result}, indent=1))
    return 0 if result["done"] else 1


if __name__ == "__main__":
    sys.exit(main())
