"""Framework scripts: a Hugging Face ``Trainer``, an ``accelerate`` loop or a Lightning
``Trainer.fit`` script, recognised and traced as the user wrote it.

A framework script is neither a recipe (it defines no ``build_model``) nor a plain script that
needs ``--params``: it builds its own model, optimizer and data, and hands them to the framework.
So launch runs it, unmodified, as ``__main__`` in a child process with a time limit
(``launcher.capture.child``), up to the point where training would start:

- Hugging Face: ``Trainer.train`` (the Trainer holds the model, its ``TrainingArguments`` and its
  train dataloader);
- Lightning: ``Trainer.fit`` (the LightningModule, its ``configure_optimizers``, the dataloader or
  datamodule);
- accelerate: ``Accelerator.prepare`` (the model, optimizer and dataloader handed in), then the
  first ``Accelerator.backward`` (how the loop made its loss from the model's output).

There it takes what a trace needs and stops the script: the model's structure (pickled with its
weights as ``meta`` tensors: nothing is copied, a 7B model pickles in kilobytes), one batch from
the framework's own dataloader, the optimizer's class and settings, and the framework's settings
(batch size, accumulation, precision). ``write_recipe`` turns that into a recipe
(``launcher/capture/recipe_template.py``, copied next to the capture) which the traced estimator
runs like any other. A script that does not get there (it exits, errors, or runs past the time
limit) keeps what was found on the way (a Hugging Face model's config) for the analytic estimate,
with a note that says why.

The job runs the script unmodified too, through ``launch_framework.py`` (rendered from
``trainer_templates/framework.py.j2``), which gives the framework the plan through its own
settings (docs/frameworks.md).

A plain PyTorch script (no recipe hooks, no framework) is captured the same way, kind ``plain``
(``inspect_plain``): stopped at its first optimizer step, with the batch flag its argparse
declares (docs/frameworks.md, "Plain PyTorch scripts").

This module imports neither torch nor the frameworks: recognising a script is ``ast`` only, and
``launch --help`` stays instant.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Kind = Literal["hf_trainer", "accelerate", "lightning", "plain"]
#: In the order they are recognised: a Trainer or Lightning script may import accelerate too.
#: ("plain" is no framework: a plain PyTorch script, captured at its first optimizer step.)
KINDS: tuple[Kind, ...] = ("hf_trainer", "lightning", "accelerate")
#: Seconds the script may run before it must have reached training (LAUNCH_CAPTURE_TIMEOUT).
DEFAULT_CAPTURE_TIMEOUT_S = 180.0
#: The Hugging Face Trainer classes (transformers' own and TRL's, which subclass it).
_HF_TRAINERS = {"Trainer", "Seq2SeqTrainer", "SFTTrainer", "DPOTrainer", "RewardTrainer"}
_LIGHTNING_MODULES = ("lightning", "lightning.pytorch", "pytorch_lightning")
_RECIPE_TEMPLATE = Path(__file__).with_name("recipe_template.py")


@dataclass(frozen=True)
class Detected:
    """What ``detect`` found: the framework, and the modules the script imports it from (the
    capture patches those classes: ``lightning`` and ``pytorch_lightning`` are distinct)."""

    kind: Kind
    modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Capture:
    """What the capture child found, as the parent keeps it (no torch objects).

    ``recipe`` is the generated recipe to trace (None when the script never reached training);
    ``config`` a Hugging Face config file written from the model it met on the way, for the
    analytic estimate when there is no recipe; ``notes`` say what was assumed or went wrong.
    """

    kind: Kind
    folder: Path
    recipe: Path | None = None
    config: Path | None = None
    reached: bool = False
    parameters: int | None = None
    trainable_parameters: int | None = None
    launch: dict[str, Any] = field(default_factory=dict)
    #: Where the script's own value of each ``launch`` key was found (``TrainingArguments.
    #: learning_rate``), and how long it trains by its own settings (``own_steps``).
    own: dict[str, str] = field(default_factory=dict)
    length: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    hooks: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    hardware: dict[str, Any] = field(default_factory=dict)
    #: A plain script's own flags for the plan's settings (``{"micro_batch_size":
    #: "--batch-size"}``), learned from its argparse, and their values as it ran.
    flags: dict[str, str] = field(default_factory=dict)
    flag_values: dict[str, Any] = field(default_factory=dict)
    #: Where a plain script put a tensor on a GPU itself (``train.py:42: .to('cuda')``), and
    #: its own option that would run it on the CPU (``--device cpu``), if it has one.
    needs_gpu: str | None = None
    cpu_flag: str | None = None


# --- recognition (ast only) -------------------------------------------------------------------


def detect(path: Path, source: str | None = None) -> Detected | None:
    """The framework ``path`` trains with, from its text alone; None for anything else.

    A Hugging Face script imports a Trainer class from transformers (or TRL) and calls ``.train``;
    a Lightning script imports ``Trainer`` from lightning (``lightning``, ``lightning.pytorch``,
    ``pytorch_lightning``, or their module as ``L``/``pl``) and calls ``.fit``; an accelerate
    script imports ``Accelerator`` and calls ``.prepare`` and ``.backward``. A recipe is never a
    framework script (``classify`` decides that first).
    """
    try:
        tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError):
        return None
    names: dict[str, str] = {}  # local name -> "module.attr" or "module"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    calls: set[str] = set()
    used: set[str] = set()  # "module.attr" of every name or attribute the script refers to
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            calls.add(node.func.attr)
        if isinstance(node, ast.Name) and node.id in names:
            used.add(names[node.id])
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (
                node.value.id in names):
            used.add(f"{names[node.value.id]}.{node.attr}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and (
                isinstance(node.value.value, ast.Name) and node.value.value.id in names):
            used.add(f"{names[node.value.value.id]}.{node.value.attr}.{node.attr}")

    def root(name: str) -> str:
        return name.split(".")[0]

    hf = {u for u in used if root(u) in ("transformers", "trl")
          and u.rsplit(".", 1)[-1] in _HF_TRAINERS}
    if hf and "train" in calls:
        return Detected("hf_trainer", tuple(sorted({root(u) for u in hf})))
    lightning = {u.rsplit(".", 1)[0] for u in used if u.endswith(".Trainer")
                 and u.rsplit(".", 1)[0] in _LIGHTNING_MODULES}
    if lightning and "fit" in calls:
        return Detected("lightning", tuple(sorted(lightning)))
    if any(u in ("accelerate.Accelerator",) for u in used) and {"prepare", "backward"} <= calls:
        return Detected("accelerate", ("accelerate",))
    return None


# --- capture (a child process with a time limit) ---------------------------------------------


def capture(
    path: Path, detected: Detected, *, argv: tuple[str, ...] | list[str] = (),
    folder: Path | None = None, python: str = sys.executable, timeout_s: float | None = None,
    env: dict[str, str] | None = None, hardware: bool = True,
) -> Capture:
    """Run ``path`` as ``__main__`` (with ``argv``) until training starts, in a child process
    that is killed with its whole process group after ``timeout_s`` (LAUNCH_CAPTURE_TIMEOUT,
    default 180 s); return what it found and write the recipe that traces it.

    ``folder/<hash of the script's path and argv>/`` receives the capture (``capture.json``,
    ``model.pkl``, ``batch.pt``) and the recipe, replacing an older one; without ``folder``, a
    new ``<tmp>/launch-framework-*``. Never raises for the user's code: a script
    that errors, exits or hangs comes back with ``reached=False`` and a note.
    """
    from launcher.options import env_seconds

    environ = dict(env if env is not None else os.environ)
    timeout = timeout_s or env_seconds(environ, "LAUNCH_CAPTURE_TIMEOUT", DEFAULT_CAPTURE_TIMEOUT_S)
    path = path.resolve()
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="launch-framework-"))
    else:
        digest = hashlib.sha256(f"{path}\0{chr(0).join(argv)}".encode()).hexdigest()[:16]
        folder = folder / digest
        shutil.rmtree(folder, ignore_errors=True)  # never an older capture taken for this one
        folder.mkdir(parents=True, exist_ok=True)
    args = [python, "-m", "launcher.capture.child", "--script", str(path),
            "--out", str(folder), "--kind", detected.kind,
            "--modules", ",".join(detected.modules)]
    if not hardware:
        args.append("--no-hardware")
    try:
        _run(args + ["--", *argv], environ=environ, cwd=path.parent, timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    answer = _read_json(folder / "capture.json") or {}
    notes = list(answer.get("notes") or ())
    if timed_out and not answer.get("reached"):
        where = {"hf_trainer": "Trainer.train()", "lightning": "Trainer.fit()",
                 "accelerate": "Accelerator.prepare()",
                 "plain": "its first optimizer step"}[detected.kind]
        notes.append(f"{path.name} did not reach {where} within {timeout:.0f} s "
                     "(LAUNCH_CAPTURE_TIMEOUT): it was stopped there")
    elif not answer:
        notes.append(f"{path.name} could not be run to the start of training "
                     "(the capture process ended without an answer)")
    recipe = None
    if answer.get("reached") and (folder / "model.pkl").exists():
        recipe = folder / "recipe.py"
        shutil.copyfile(_RECIPE_TEMPLATE, recipe)
    config = folder / "config.json" if (folder / "config.json").exists() else None
    return Capture(
        kind=detected.kind, folder=folder, recipe=recipe, config=config,
        reached=bool(answer.get("reached")), parameters=answer.get("parameters"),
        trainable_parameters=answer.get("trainable_parameters"),
        launch=dict(answer.get("launch") or {}), own=dict(answer.get("own") or {}),
        length=dict(answer.get("length") or {}), settings=dict(answer.get("settings") or {}),
        hooks=tuple(answer.get("hooks") or ()) if recipe else (), notes=tuple(notes),
        hardware=dict(answer.get("hardware") or {}),
        flags=dict(answer.get("flags") or {}) if recipe else {},
        flag_values=dict(answer.get("flag_values") or {}) if recipe else {},
        needs_gpu=_text(answer.get("needs_gpu")), cpu_flag=_text(answer.get("cpu_flag")),
    )


def _text(value: Any) -> str | None:
    """A string of the child's answer (it runs the user's code: anything else is dropped)."""
    return value[:200] if isinstance(value, str) else None


def _run(args: list[str], *, environ: dict[str, str], cwd: Path, timeout: float) -> None:
    """Run the capture child in its own process group until it exits (what it answers is in
    its ``--out`` folder) or ``timeout`` (then raise TimeoutExpired). Only the child is waited
    for, never the processes the script started; once it is done they are all killed: its
    group, its descendants and whatever carries its token (``processes.end_preflight``: a
    dataloader worker or a daemon in a session of its own). Its temporary files live in a
    folder removed with it."""
    from launcher import processes

    child_env = processes.user_environ(dict(environ))  # it runs the user's code: no credentials
    package_root = str(Path(__file__).resolve().parents[2])  # the folder launcher/ is in
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, child_env.get("PYTHONPATH", "")) if p)
    child_env.setdefault("OMP_NUM_THREADS", "1")
    # Nothing is downloaded: a model without local weights is built from its config instead.
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        child_env.setdefault(key, "1")
    child_env.setdefault("WANDB_MODE", "disabled")
    token = child_env[processes.PREFLIGHT_VAR] = processes.new_token()
    with tempfile.TemporaryDirectory(prefix="launch-capture-", ignore_cleanup_errors=True) as tmp:
        child_env["TMPDIR"] = tmp
        proc = subprocess.Popen(args, cwd=str(cwd), env=child_env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=processes.die_with_parent())
        try:
            exited = processes.wait_unreaped(proc.pid, timeout)
        finally:  # done, timed out or interrupted: nothing it started outlives it
            processes.end_preflight(token, proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # not reaped yet: still its group
            proc.wait()
    if not exited:
        raise subprocess.TimeoutExpired(args, timeout)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def inspect_framework(path: Path, detected: Detected, *, python: str = sys.executable,
                      env: dict[str, str] | None = None, local: bool = True,
                      argv: tuple[str, ...] | list[str] = (), folder: Path | None = None,
                      ) -> Any:
    """``launcher.recipe.inspect_script`` for a framework script: a ``ScriptInfo`` of mode
    ``script`` (it runs as it is) with the capture's model size, the framework's settings as
    ``LAUNCH`` defaults (global batch, lr, steps, clipping) and the recipe to trace."""
    from launcher.script_info import Hardware, ScriptInfo

    found = _capture_in_state(path, detected, python=python, env=env, local=local, argv=argv,
                              folder=folder)
    known = {f for f in Hardware.__dataclass_fields__}
    hardware = Hardware(**{k: v for k, v in found.hardware.items() if k in known})
    return ScriptInfo(
        path=path, mode="script", hooks=found.hooks, launch=found.launch,
        parameters=found.parameters, trainable_parameters=found.trainable_parameters,
        hardware=hardware, framework=found.kind, framework_recipe=found.recipe,
        framework_config=found.config, notes=found.notes, own=found.own, length=found.length,
    )


def _capture_in_state(path: Path, detected: Detected, *, python: str, env: dict[str, str] | None,
                      local: bool, argv: tuple[str, ...] | list[str], folder: Path | None
                      ) -> Capture:
    if folder is None:  # the state dir's, as hf_recipes; else one per user under the tmp dir
        state = (env if env is not None else os.environ).get("LAUNCH_STATE_DIR")
        folder = (Path(state) / "framework_recipes" if state else
                  Path(tempfile.gettempdir()) / f"launch-framework-{os.getuid()}")
    return capture(path, detected, argv=argv, folder=folder, python=python, env=env,
                   hardware=local)


def inspect_plain(path: Path, *, python: str = sys.executable, env: dict[str, str] | None = None,
                  local: bool = True, argv: tuple[str, ...] | list[str] = (),
                  folder: Path | None = None) -> Any:
    """``launcher.recipe.inspect_script`` for a plain PyTorch script (no recipe hooks, no
    framework): run as it is, with its own arguments, up to its first optimizer step
    (``capture/child/plain.py``), and traced through the recipe made from what it built, as
    a framework script is. It stays a plain script (``framework`` None: the job runs it as it
    is); its batch size is its own global batch, and the flag it reads it from (its argparse)
    is how the plan reaches it (``flags``). A script that does not get there keeps its notes:
    it is planned from ``--params`` then, as before."""
    from launcher.script_info import Hardware, ScriptInfo

    found = _capture_in_state(path, Detected("plain"), python=python, env=env, local=local,
                              argv=argv, folder=folder)
    known = {f for f in Hardware.__dataclass_fields__}
    hardware = Hardware(**{k: v for k, v in found.hardware.items() if k in known})
    if found.recipe is None:
        return ScriptInfo(path=path, mode="script", hardware=hardware, notes=found.notes)
    return ScriptInfo(
        path=path, mode="script", hooks=found.hooks, launch=found.launch,
        parameters=found.parameters, trainable_parameters=found.trainable_parameters,
        hardware=hardware, framework_recipe=found.recipe, notes=found.notes, own=found.own,
        flags=found.flags, flag_values=found.flag_values, length=found.length,
        needs_gpu=found.needs_gpu, cpu_flag=found.cpu_flag,
    )


# --- the script's own settings in the plan ----------------------------------------------------

#: How the plan says a value is the script's: ``steps 2 (the script's own: 1 epoch of 2
#: batches)``.
SCRIPT_OWN = "the script's own"
#: The pins each framework has no place for: the shim cannot set them, so the script's own
#: value stays and the plan says so (docs/frameworks.md). Lightning's and accelerate's
#: optimizer is the one the script builds (``configure_optimizers``, the one handed to
#: ``prepare``), and an accelerate loop counts its own batches.
UNREACHED: dict[str, dict[str, str]] = {
    "hf_trainer": {},
    "lightning": {"optimizer": "configure_optimizers builds the optimizer",
                  "lr": "configure_optimizers builds the optimizer"},
    "accelerate": {"optimizer": "the loop builds its optimizer",
                   "lr": "the loop builds its optimizer",
                   "steps": "the loop counts its own batches"},
}


def own_steps(length: dict[str, Any], global_batch: int | None) -> tuple[int | None, str]:
    """The optimizer steps a framework script makes by its own settings, at the plan's global
    batch, and how that was found (words for the plan); None when it cannot be known before it
    runs (an accelerate loop that stops itself, epochs of a dataset without a length).

    ``length`` is the capture's (``capture.child.capture.length``): ``max_steps`` and/or
    ``epochs`` of ``batches`` batches, ``accumulation`` a step, counted as the Trainer and
    Lightning count them (ceil(epochs x ceil(batches / accumulation)), the first of the two
    limits). At a global batch other than the script's own (micro-batch x accumulation, one
    process) an epoch is ceil(samples / global batch) steps."""
    max_steps = length.get("max_steps")
    epochs, batches = length.get("epochs"), length.get("batches")
    accum = int(length.get("accumulation") or 1)
    by_epochs: int | None = None
    words = ""
    if epochs and batches:
        script_batch = (length.get("batch_size") or 0) * accum
        samples = length.get("samples")
        count = f"{epochs:g} epoch{'' if epochs == 1 else 's'}"
        if samples and global_batch and script_batch and global_batch != script_batch:
            by_epochs = math.ceil(epochs * max(1, math.ceil(samples / global_batch)))
            words = f"{count} of {samples} samples at a global batch of {global_batch}"
        else:
            by_epochs = math.ceil(epochs * max(1, math.ceil(batches / accum)))
            words = f"{count} of {batches} batches" + (f", {accum} a step" if accum > 1 else "")
    if max_steps and (by_epochs is None or max_steps <= by_epochs):
        return int(max_steps), f"max_steps={max_steps}" + (
            f", before {words}" if by_epochs else "")
    if by_epochs is not None:
        return by_epochs, words
    return None, "not known before it runs: " + (length.get("unknown") or "its loop's own")


def plain_steps(info: Any, values: dict[str, Any]) -> dict[str, str]:
    """A captured plain script's own length in the plan, where its options tell it (its steps
    option, or its epochs of its loader's batches; ``own_steps``), in the script's own words
    (``--max_iters=50``); updates ``values``. Where they do not, launch's default stays and the
    plan says so (an empty answer)."""
    from launcher.script_info import flag_text

    if not info.length:
        return {}
    steps, how = own_steps(info.length, values.get("global_batch_size"))
    if steps is None:
        return {}
    flag = info.flags.get("steps")
    if flag and how.startswith("max_steps="):
        _, comma, rest = how.partition(",")
        how = flag_text(flag, info.length["max_steps"]) + comma + rest
    values["steps"] = steps
    return {"steps": f"{SCRIPT_OWN}: {how}"}


def own_settings(kind: str, values: dict[str, Any], pinned: set[str], launch: dict[str, Any],
                 own: dict[str, str], length: dict[str, Any]) -> dict[str, str]:
    """A framework script's settings in the plan: what the user did not pin stays the script's
    own (``launch``, as the capture found it, ``own`` says where), its ``steps`` counted by
    ``own_steps`` (None when unknown, never launch's default); a pin the framework has no place
    for (``UNREACHED``) is dropped from ``pinned`` and the script's value kept. Updates
    ``values`` and ``pinned``; returns each such setting's origin, in words."""
    origins: dict[str, str] = {}
    for key, why in UNREACHED.get(kind, {}).items():
        if key in pinned:
            pinned.discard(key)
            if key in launch:
                values[key] = launch[key]
            else:
                values.pop(key, None)  # the spec's default, not the pin
            origins[key] = f"{SCRIPT_OWN}: {why}, which the pin --{key} does not reach"
    for key in launch:
        if key not in pinned:
            origins.setdefault(key, f"{SCRIPT_OWN}" + (f": {own[key]}" if own.get(key) else ""))
    if "steps" not in pinned:
        values["steps"], how = own_steps(length, values.get("global_batch_size"))
        unreached = origins.get("steps", "").removeprefix(SCRIPT_OWN)  # ": ..., which --steps"
        origins["steps"] = SCRIPT_OWN + (", " if values["steps"] is None else ": ") + how + (
            f" ({unreached.removeprefix(': ')})" if unreached else "")
    return origins


# --- the pickled model's tensors --------------------------------------------------------------


def meta_tensor(shape: tuple[int, ...], dtype: Any, requires_grad: bool, parameter: bool) -> Any:
    """A weight as the capture pickles it: its shape, dtype and kind on the ``meta`` device
    (the recipe gives it storage on the device it is built on). Named here, in a module that
    imports no torch until called, because the pickle names it."""
    import torch

    tensor = torch.empty(shape, dtype=dtype, device="meta")
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor


def measure_step(path: Path, detected: Detected, *, argv: tuple[str, ...] | list[str] = (),
                 python: str = sys.executable, timeout_s: float = 300.0,
                 env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the framework's own training for two optimizer steps, from where the capture would
    stop the script, and return the CPU allocator's peak (``peak_allocated``: the model's weights
    and buffers alive at that point plus the most the steps allocated above them). The ground
    truth for a framework script's traced estimate; it uses real memory, keep models small."""
    folder = Path(tempfile.mkdtemp(prefix="launch-framework-measure-"))
    try:
        args = [python, "-m", "launcher.capture.child", "--script", str(path.resolve()),
                "--out", str(folder), "--kind", detected.kind,
                "--modules", ",".join(detected.modules), "--measure", "--no-hardware"]
        _run(args + ["--", *argv], environ=dict(env if env is not None else os.environ),
             cwd=path.resolve().parent, timeout=timeout_s)
        answer = _read_json(folder / "measure.json")
        if not answer or "peak_allocated" not in answer:
            notes = (_read_json(folder / "capture.json") or {}).get("notes")
            raise RuntimeError(f"measuring {path.name} failed: {notes}")
        return answer
    finally:
        shutil.rmtree(folder, ignore_errors=True)
