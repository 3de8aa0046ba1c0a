"""Loading the user's script: what kind it is, its ``LAUNCH`` defaults and its model's size.

The parent side (``inspect_script``) never imports torch or the user's code: it parses the file
with ``ast`` (so a syntax error is reported with file and line at once) and then runs this same
module as a child process (``python -m launcher.recipe``) under a time limit. The child imports the
script, builds the model on the ``meta`` device (no memory used, so a 70B model costs nothing)
and answers with one JSON object. A hook that raises becomes one line naming the hook, the error
and the line of the user's code it came from.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from launcher.options import env_seconds
from launcher.script_info import Hardware, ScriptInfo
from launcher.status import UsageError

REQUIRED_HOOKS = ("build_model", "example_batch", "training_step")
OPTIONAL_HOOKS = ("build_dataloader", "build_optimizer", "wrap_modules")
DEFAULT_TIMEOUT_S = 120.0


def classify(path: Path) -> tuple[Literal["recipe", "script"], tuple[str, ...]]:
    """Read the script's top-level functions without running it; reject half a recipe."""
    if not path.exists():
        raise UsageError(f"script not found: {path}", "check the path")
    if not path.is_file() or path.suffix != ".py":
        raise UsageError(f"not a Python file: {path}", "give the path of a .py training script")
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except SyntaxError as exc:
        raise UsageError(f"{path}:{exc.lineno}: syntax error: {exc.msg}",
                         "fix the script and rerun") from None
    names = {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    hooks = tuple(h for h in REQUIRED_HOOKS + OPTIONAL_HOOKS if h in names)
    present = [h for h in REQUIRED_HOOKS if h in names]
    if not present:
        return "script", hooks
    missing = [h for h in REQUIRED_HOOKS if h not in names]
    if missing:
        raise UsageError(
            f"{path.name} defines {', '.join(present)} but not {', '.join(missing)}",
            "a recipe needs all of build_model, example_batch and training_step; "
            "define none of them to run it as a plain script",
        )
    return "recipe", hooks


def inspect_script(
    path: Path, *, python: str = sys.executable, timeout_s: float | None = None,
    env: dict[str, str] | None = None, local: bool = True, count_flops: bool = True,
    probe: Callable[..., dict[str, Any] | None] | None = None,
    argv: tuple[str, ...] | list[str] = (), capture_plain: bool = False,
) -> ScriptInfo:
    """Classify ``path`` and, for a recipe, load it in a child process for LAUNCH and its size.

    ``local``: the job runs here, so the child also reports this machine's GPUs. A plain script
    planned for a cloud needs no child at all (and no torch import). ``count_flops=False`` leaves
    the training FLOPs to the estimator's trace, which counts them on the model it traces.
    ``probe(path, count_flops=, timeout_s=)``, if given, loads a recipe in a process that is
    already running (the estimator's prestarted trace child) and may answer None: then the
    usual child does it. ``argv``: the script's own arguments, which a framework script is run
    with (its ``sys.argv[1:]``) up to where training starts; a recipe takes none
    (``spec.refuse_recipe_args``). ``capture_plain``: a plain script (no hooks, no framework) is
    run the same way up to its first optimizer step (``frameworks.inspect_plain``) and traced
    from what it built; without it (the model is described: --params, --model-config) it is not
    run here.
    """
    mode, hooks = classify(path)
    if mode == "script":
        from launcher.capture.frameworks import detect, inspect_framework, inspect_plain

        detected = detect(path)
        if detected is not None:  # run to where training starts (a time limit), not imported
            return inspect_framework(path, detected, python=python, env=env, local=local,
                                     argv=argv)
        if capture_plain:  # run to its first optimizer step (a time limit), not imported
            return inspect_plain(path, python=python, env=env, local=local, argv=argv)
    if mode == "script" and not local:
        return ScriptInfo(path=path, mode=mode, hooks=hooks)
    answer = None
    if mode == "recipe" and probe is not None:
        timeout = timeout_s or env_seconds(env or os.environ, "LAUNCH_PROBE_TIMEOUT",
                                           DEFAULT_TIMEOUT_S)
        try:
            answer = probe(path, count_flops=count_flops, timeout_s=timeout)
        except TimeoutError:
            raise _too_slow(path, timeout) from None
        if answer is not None:
            _raise_for(answer, path)
    if answer is None:
        args = ["--script", str(path.resolve())] if mode == "recipe" else []
        if mode == "recipe" and not count_flops:
            args.append("--no-flops")
        answer = _run_child(args, python=python, timeout_s=timeout_s, env=env, path=path)
    hardware = Hardware(**answer.get("hardware", {}))
    if mode == "script":
        return ScriptInfo(path=path, mode=mode, hooks=hooks, hardware=hardware)
    return ScriptInfo(
        path=path, mode=mode, hooks=hooks, launch=answer.get("launch") or {},
        parameters=answer.get("parameters"),
        trainable_parameters=answer.get("trainable_parameters"),
        parameter_bytes=answer.get("parameter_bytes"), buffer_bytes=answer.get("buffer_bytes"),
        trainable_bytes=answer.get("trainable_bytes"),
        wrap_modules=tuple(answer.get("wrap_modules") or ()), hardware=hardware,
        unit_parameters=answer.get("unit_parameters"),
        flops_per_sample=answer.get("flops_per_sample"),
    )


def describe_only(path: Path, *, python: str = sys.executable, env: dict[str, str] | None = None,
                  local: bool = True) -> ScriptInfo:
    """No script at all (``launch plan --params 7B``): the model is what the flags describe;
    for the local provider the child still reports this machine's GPUs (from the current
    folder: ``path`` does not exist)."""
    if not local:
        return ScriptInfo(path=path, mode="script")
    answer = _run_child([], python=python, timeout_s=None, env=env, path=path)
    return ScriptInfo(path=path, mode="script", hardware=Hardware(**answer.get("hardware", {})))


def _run_child(args: list[str], *, python: str, timeout_s: float | None,
               env: dict[str, str] | None, path: Path) -> dict[str, Any]:
    """Run ``python -m launcher.recipe ARGS`` and return its answer.

    Only the child is waited for, never what the user's script started: its answer is a file
    (not the last line of a pipe that a background process started at import still holds), and
    once it has answered, failed or run out of time, every process it started is killed (each
    carries the child's token, ``processes.end_preflight``), a daemon in a session of its own
    included. The child's temporary files live in a folder removed with it."""
    import tempfile

    from launcher import processes

    timeout = timeout_s or env_seconds(env or os.environ, "LAUNCH_PROBE_TIMEOUT",
                                       DEFAULT_TIMEOUT_S)
    child_env = processes.user_environ(dict(env if env is not None else os.environ))
    child_env.setdefault("OMP_NUM_THREADS", "1")
    # The child must import this very launcher, wherever the CLI was imported from.
    package_root = str(Path(__file__).resolve().parent.parent)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, child_env.get("PYTHONPATH", "")) if p)
    token = child_env[processes.PREFLIGHT_VAR] = processes.new_token()
    with tempfile.TemporaryDirectory(prefix="launch-probe-", ignore_cleanup_errors=True) as tmp:
        folder = Path(tmp)
        (folder / "tmp").mkdir()
        child_env["TMPDIR"] = str(folder / "tmp")  # the user's temporary files, removed with it
        answer_file = folder / "answer.json"
        with open(folder / "stderr", "wb") as stderr:
            proc = subprocess.Popen(
                [python, "-m", "launcher.recipe", *args, "--answer", str(answer_file)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                env=child_env, cwd=str(path.resolve().parent), start_new_session=True,
                preexec_fn=processes.die_with_parent(),  # a launch killed with -9 takes it along
            )
        try:
            exited = processes.wait_unreaped(proc.pid, timeout)
        finally:  # answered, timed out or interrupted: nothing it started outlives it
            _end_child(proc, token)
        if not exited:
            raise _too_slow(path, timeout)
        try:
            answer = json.loads(answer_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            answer = None
        if not isinstance(answer, dict):
            lines = (folder / "stderr").read_text(encoding="utf-8", errors="replace")
            detail = (lines.strip().splitlines() or [
                f"it exited with status {proc.returncode} without an answer"])[-1]
            raise UsageError(
                f"could not load {path.name}: {detail}",
                "launch imports the script and runs build_model, example_batch and "
                "training_step on fake tensors; they must not exit the process") from None
    _raise_for(answer, path)
    return answer


def _end_child(proc: subprocess.Popen[bytes], token: str) -> None:
    """Kill ``proc`` (not reaped yet: its pid and group are still its own), everything that
    carries its token or descends from it, and its process group; then reap it."""
    import signal

    from launcher import processes

    processes.end_preflight(token, proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _too_slow(path: Path, timeout: float) -> UsageError:
    return UsageError(
        f"loading {path.name} took longer than {timeout:.0f} s",
        "make build_model() cheap (no downloads or data loading at import), "
        "or raise LAUNCH_PROBE_TIMEOUT",
    )


def _raise_for(answer: dict[str, Any], path: Path) -> None:
    """The user's error in the probe's answer, as one line with its file and line."""
    if "error" in answer:
        err = answer["error"]
        if "what" not in err:  # the loading process died or failed, not the user's code raising
            raise UsageError(f"could not load {path.name}: {err.get('message')}",
                             "launch imports the script and runs build_model on the meta device;"
                             " it must not exit or kill the process")
        where = f" ({Path(err['file']).name}:{err['line']})" if err.get("file") else ""
        if err.get("type") is None:  # a broken contract, not an exception: the message says it
            raise UsageError(f"{err['message']}{where}", "fix the script and rerun")
        raise UsageError(f"{err['what']} raised {err['type']}: {err['message']}{where}",
                         "fix the script and rerun")


# --- child side: runs with torch imported, in its own process ------------------------------


def _user_frame(exc: BaseException, script: Path) -> tuple[str | None, int | None]:
    """The innermost traceback frame inside the user's script (or its folder)."""
    import traceback

    best: tuple[str | None, int | None] = (None, None)
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve().parent == script.parent:
            best = (frame.filename, frame.lineno)
    return best


def hardware() -> dict[str, Any]:
    """This machine's CPUs, memory and CUDA GPUs (imports torch): the probe's and the framework
    capture's ``hardware``."""
    import torch

    info: dict[str, Any] = {"cpus": os.cpu_count() or 1}
    try:
        info["host_memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    if torch.cuda.is_available():
        info["cuda_devices"] = torch.cuda.device_count()
        gpu = _nvidia_smi_gpu()
        if gpu is None:
            # No nvidia-smi: ask torch, which creates a CUDA context; in a worker forked after
            # its parent asked CUDA anything, torch refuses ("Cannot re-initialize CUDA in
            # forked subprocess") and the GPU's name and size stay unknown.
            with contextlib.suppress(RuntimeError, AssertionError):
                props = torch.cuda.get_device_properties(0)
                gpu = (props.name, props.total_memory)
        if gpu is not None:
            info.update(cuda_name=gpu[0], cuda_memory_bytes=gpu[1])
    return info


def _nvidia_smi_gpu() -> tuple[str, int] | None:
    """The first GPU's name and memory in bytes from ``nvidia-smi``: no CUDA context is created
    (a probe that made one would cost a second and hundreds of MiB of the GPU, and would poison
    the trace child's forks). None when it is missing or does not answer."""
    import shutil

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    # torch's device 0 is the first of CUDA_VISIBLE_DEVICES, which nvidia-smi does not read
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        done = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,"
                               "nounits", f"--id={first}"], capture_output=True, text=True,
                              timeout=10)
        name, mib = done.stdout.strip().splitlines()[0].rsplit(",", 1)
        return name.strip(), int(mib.strip()) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _probe(script: Path, count_flops: bool = True) -> dict[str, Any]:
    import importlib.util

    import torch

    sys.path.insert(0, str(script.parent))
    answer: dict[str, Any] = {}
    what = f"importing {script.name}"
    try:
        spec = importlib.util.spec_from_file_location("launch_recipe", script)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        # Registered before it runs: dataclasses and pickling look the module up by name.
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        launch = getattr(module, "LAUNCH", {})
        if not isinstance(launch, dict):
            raise TypeError(f"LAUNCH must be a dict, not {type(launch).__name__}")
        answer["launch"] = json.loads(json.dumps(launch))
        what = "wrap_modules()"
        if hasattr(module, "wrap_modules"):
            answer["wrap_modules"] = [t.__name__ for t in module.wrap_modules()]
        what = "build_model()"
        # On the meta device parameters have shapes and dtypes but no storage.
        with torch.device("meta"):
            model = module.build_model()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"build_model() must return a torch.nn.Module, not "
                            f"{type(model).__name__}")
    except Exception as exc:  # the user's code: report it, never a traceback dump
        file, line = _user_frame(exc, script)
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"error": {"what": what, "type": type(exc).__name__, "message": message[:300],
                          "file": file, "line": line}}
    params = list({id(p): p for p in model.parameters()}.values())
    if hasattr(module, "wrap_modules"):
        # FSDP gathers one wrapped block at a time: the largest sets the gather buffer.
        kinds = tuple(module.wrap_modules())
        units = [sum(p.numel() for p in m.parameters()) for m in model.modules()
                 if isinstance(m, kinds)]
        answer["unit_parameters"] = max(units) if units else None
    try:
        answer["flops_per_sample"] = _training_flops(module) if count_flops else None
    except NotALoss as exc:
        return {"error": exc.error(module.training_step)}
    answer["parameters"] = sum(p.numel() for p in params)
    answer["trainable_parameters"] = sum(p.numel() for p in params if p.requires_grad)
    answer["parameter_bytes"] = sum(p.numel() * p.element_size() for p in params)
    answer["trainable_bytes"] = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    answer["buffer_bytes"] = sum(b.numel() * b.element_size() for b in model.buffers())
    return answer


class NotALoss(Exception):
    """``training_step`` returned something that is not a tensor (the loss to backpropagate)."""

    def __init__(self, value: object) -> None:
        super().__init__(not_a_loss(value))

    def error(self, function: Any) -> dict[str, Any]:
        """The probe's answer for it: no exception type, the line of the function."""
        code = getattr(function, "__code__", None)
        return {"what": "training_step()", "type": None, "message": str(self),
                "file": code.co_filename if code else None,
                "line": code.co_firstlineno if code else None}


def not_a_loss(value: object) -> str:
    """What to say when ``training_step`` returns ``value`` instead of the loss tensor (the
    template divides it by the accumulation steps and calls ``backward`` on it). Also said by the
    trace (launcher.estimate.child._trace_run)."""
    what = "None" if value is None else f"a {type(value).__name__}"
    return f"training_step returned {what}: it must return the loss tensor"


def _training_flops(module: Any) -> float | None:
    """Forward + backward FLOPs of one sample, counted by PyTorch's FlopCounterMode on fake
    tensors (nothing is computed or allocated). None when the step cannot run on fake tensors
    (data-dependent shapes, say); the cost model then says the step time is unknown."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from launcher.estimate._blocks import SCALED_DEPTHS, truncate_blocks

    def count(depth: int | None) -> tuple[float, dict[str, Any] | None]:
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = module.build_model()
            cut = truncate_blocks(model, depth) if depth is not None else None
            batch = module.example_batch(1)
            counter = FlopCounterMode(display=False)
            with counter:
                loss = module.training_step(model, batch)
                if not isinstance(loss, torch.Tensor):
                    raise NotALoss(loss)
                loss.backward()
        return float(counter.get_total_flops()), cut

    try:
        # A deep stack of identical blocks costs the same FLOPs per block: count two depths
        # and extrapolate (exact), as the memory trace does, instead of running all of them.
        shallow, deep = SCALED_DEPTHS
        flops, cut = count(shallow)
        if cut is not None:
            more, _ = count(deep)
            flops += (cut["count"] - shallow) / (deep - shallow) * (more - flops)
        return flops or None
    except NotALoss:
        raise
    except Exception:  # the estimate degrades to "unknown", the launch goes on
        return None
    finally:
        torch.set_grad_enabled(True)


def probe_answer(script: Path | None, count_flops: bool = True) -> dict[str, Any]:
    """The child's whole answer: the script's probe (none for a plain script) and, unless the
    user's code failed, this machine's hardware. Also served by the estimator's prestarted
    trace child (launcher.estimate.trace_process.probe)."""
    answer = _probe(script, count_flops=count_flops) if script is not None else {}
    if "error" not in answer:
        answer["hardware"] = hardware()
    return answer


def main(argv: list[str]) -> int:
    import argparse

    from launcher import processes

    parser = argparse.ArgumentParser(prog="python -m launcher.recipe")
    parser.add_argument("--script", type=Path)
    parser.add_argument("--no-flops", action="store_true")
    parser.add_argument("--answer", type=Path, help="write the answer here, not to stdout")
    args = parser.parse_args(argv)
    # Orphans of what the script starts at import come back to this process (not init), so
    # that it ends them all before it exits (the parent kills what carries its token too).
    processes.become_subreaper()
    try:
        answer = probe_answer(args.script, count_flops=not args.no_flops)
        text = json.dumps(answer)
        if args.answer is None:
            sys.stdout.write("\n" + text + "\n")
        else:  # written whole, then named: the parent reads it once this process has exited
            partial = args.answer.with_name(args.answer.name + ".partial")
            partial.write_text(text, encoding="utf-8")
            partial.replace(args.answer)
    finally:
        processes.end_preflight(None, os.getpid(), keep_root=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
