"""The step that is traced: the rendered script's model, optimizer and optimizer step.

For one trace request, ``build`` imports the training script ``launch`` renders for the
strategy (``_script``) and makes the model, its wrapping and the optimizer with the script's
own functions; ``Step.run`` runs the script's ``optimizer_step`` at a micro-batch size and
``first_optimizer_step`` step 1's update (optimizer state created). The same step serves the
fake-tensor trace (``_trace_run``) and the real reference run (``_measure``). A failure of the
user's code becomes one line with the user's file and line (``describe_error``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from launcher import strategies
from launcher.estimate._blocks import truncate_blocks
from launcher.estimate.child import _script
from launcher.plan.plan import checkpointing_mode


class RecipeError(Exception):
    """An error in the user's code, already reduced to one line and the user's file:line."""

    def __init__(self, message: str, file: str | None, line: int | None, kind: str) -> None:
        super().__init__(message)
        self.message, self.file, self.line, self.kind = message, file, line, kind


def load_recipe(recipe_file: str) -> ModuleType:
    """Import the recipe from its path, its directory first on sys.path (as the templates do)."""
    path = Path(recipe_file).resolve()
    sys.path.insert(0, str(path.parent))
    name = path.stem if path.stem not in sys.modules else "launch_recipe"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    recipe = importlib.util.module_from_spec(spec)
    sys.modules[name] = recipe
    spec.loader.exec_module(recipe)
    for hook in ("build_model", "example_batch", "training_step"):
        if not callable(getattr(recipe, hook, None)):
            raise RecipeError(f"{path.name} defines no {hook}()", str(path), None, "contract")
    return recipe


def shaped_batches(shapes: Any) -> Callable[[int], Any]:
    """An ``example_batch`` that makes batches of the structure, shapes and dtypes an
    out-of-memory report recorded (the templates' ``batch_shapes``), with the micro-batch as the
    leading dimension of every tensor: the step re-traced at the data that failed, not at the
    example the plan was sized on. Integer tensors are zeros (valid token ids and labels)."""

    def make(node: Any, batch_size: int) -> Any:
        if "shape" in node:
            shape = [batch_size, *node["shape"][1:]] if node["shape"] else []
            dtype = getattr(torch, str(node.get("dtype", "float32")), torch.float32)
            if dtype.is_floating_point or dtype.is_complex:
                return torch.randn(shape, dtype=dtype)
            return torch.zeros(shape, dtype=dtype)
        if "dict" in node:
            return {key: make(value, batch_size) for key, value in node["dict"].items()}
        if "list" in node:
            return [make(value, batch_size) for value in node["list"]]
        return node.get("value")

    return lambda batch_size: make(shapes, batch_size)


def build(request: dict[str, Any], recipe: ModuleType, device: torch.device, fake: bool,
          blocks: dict[str, Any] | None = None) -> Step:
    """The model and optimizer of the rendered script for ``request``, built by its own
    ``build_model``, ``wrap_model`` and ``build_optimizer`` (``_script``).

    The tracer makes the recipe's model itself and hands it over (``_script.Recipe``): with
    ``depth`` (depth scaling) only the first ``depth`` blocks of its repeated stack are kept,
    right after it is built, and ``blocks`` receives what was cut; on fake tensors it is moved to
    the device and dtype first (``_fake_to``), since ``Module.to`` refuses fake parameters. A
    ``strategy`` (DDP, FSDP, hybrid sharding at a world size) joins a fake process group of that
    size as rank 0 (a real group, under ``_trace_dist``'s reference runs, is kept).
    """
    strategy = request.get("strategy")
    script, digest = _script.load(strategy_name(request))
    world, rank = 1, 0
    if strategy:
        from launcher.estimate.child import _trace_dist

        _trace_dist.setup_world(strategy["world_size"])
        world, rank = _trace_dist.world()
    runtime = script.Runtime(rank=rank, local_rank=rank, world_size=world, device=device)
    plan = script_plan(request)
    script.launch.seed_all(plan["seed"])  # as the script seeds every rank before building
    model = recipe.build_model()
    if not isinstance(model, torch.nn.Module):
        raise RecipeError(f"build_model() must return a torch.nn.Module, not "
                          f"{type(model).__name__}", request["recipe_file"], None, "contract")
    if request.get("depth") is not None:
        cut = truncate_blocks(model, request["depth"])
        if blocks is not None and cut is not None:
            blocks.update(cut)
    if fake:
        _fake_to(model, device, script.launch.param_dtype(plan["precision"]))
        model.to = lambda *args, **kwargs: model  # done just above; Module.to would refuse
    proxy = _script.Recipe(recipe, model)
    model = script.build_model(proxy, plan, runtime)
    model.__dict__.pop("to", None)
    model = script.wrap_model(model, proxy, plan, runtime)
    saved = sys.modules.get("bitsandbytes")  # no CPU or fake kernels: the stand-in's state
    sys.modules["bitsandbytes"] = _script.bitsandbytes_stand_in()
    try:
        optimizer = script.build_optimizer(proxy, plan, model)
    finally:
        if saved is None:
            del sys.modules["bitsandbytes"]
        else:
            sys.modules["bitsandbytes"] = saved
    if request.get("foreach") is not None and "foreach" in optimizer.defaults:
        # the benchmark measures each implementation; a job uses torch's default
        optimizer.defaults["foreach"] = request["foreach"]
        for group in optimizer.param_groups:
            group["foreach"] = request["foreach"]
    return Step(script=script, digest=digest, recipe=proxy, plan=plan, runtime=runtime,
                model=model, optimizer=optimizer)


def strategy_name(request: dict[str, Any]) -> str:
    """The rendered script a request traces: its strategy's, else the single-device one."""
    return (request.get("strategy") or {}).get("name", strategies.SINGLE)


def script_plan(request: dict[str, Any]) -> dict[str, Any]:
    """The ``plan.json`` values the script's functions read, from a trace request."""
    strategy = request.get("strategy") or {}
    world = strategy.get("world_size", 1)
    replicas = strategy.get("replicas", 1)
    return {
        "precision": request["precision"],
        "activation_checkpointing": bool(request["activation_checkpointing"]),
        "checkpointing": checkpointing_mode(request["activation_checkpointing"]),
        "optimizer": request.get("optimizer") or "adamw",
        "lr": request.get("lr", 3e-4),
        "weight_decay": request.get("weight_decay", 0.0),
        "max_grad_norm": request.get("max_grad_norm"),
        "grad_accum_steps": int(request["grad_accum_steps"]),
        "micro_batch_size": 1,
        "seed": request.get("seed", 0),
        "strategy": strategy.get("name", strategies.SINGLE),
        "nodes": replicas,
        "gpus_per_node": world // replicas,
        "hybrid_shard_degree": world // replicas,
        "reshard_after_forward": strategy.get("reshard_after_forward", True),
    }


@dataclasses.dataclass
class Step:
    """What the rendered script built for one trace: its module and the objects it made."""

    script: ModuleType
    digest: str
    recipe: Any
    plan: dict[str, Any]
    runtime: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer

    def run(self, micro_batch: int, start: int, on_phase: Callable[[str, int], None],
            update: bool = True) -> None:
        """One optimizer step of the script (``optimizer_step``) at ``micro_batch``, its data the
        script's own synthetic stream from micro-batch ``start``. ``update=False`` stops where
        the optimizer would start and drops the gradients instead."""
        plan = {**self.plan, "micro_batch_size": micro_batch}
        batches = self.script.launch.synthetic_stream(self.recipe, micro_batch, plan["seed"],
                                               self.runtime, start)
        progress = _script.Progress(on_phase, stop_at_optimizer=not update)
        on_phase("forward", 1)  # the step's loss accumulator belongs to the step
        with contextlib.suppress(_script.StopStep):
            self.script.optimizer_step(self.model, self.optimizer, batches, self.recipe, plan,
                                       self.runtime, progress)
        del batches
        if not update:
            on_phase("zero_grad", 0)
            self.optimizer.zero_grad(set_to_none=True)


def _fake_to(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None) -> None:
    """``model.to(device, dtype)`` for a model of fake tensors, plus one repair.

    ``Module._apply`` always swaps FakeTensor parameters (``torch.utils.swap_tensors``), which
    refuses tensors with weak references, and every fake ``Parameter`` has one. Assigning
    ``.data`` instead is what ``Module.to`` does for real tensors: the Parameter objects stay the
    same, so modules that keep their own references (``nn.LSTM._flat_weights``) stay valid.

    The repair: a fake tensor made by ``copy.deepcopy`` (``nn.TransformerEncoder`` clones its
    layer that way) hands out a new storage object for each of its views. MemTracker keys storages
    by object, so every ``weight.t()`` of such a weight counted as a new allocation (+11% on an
    encoder-decoder). Such tensors are replaced by fresh ones (through ``setattr``, which
    ``nn.RNNBase`` also watches); tied weights stay tied.
    """
    replaced: dict[int, torch.Tensor] = {}

    def broken(t: torch.Tensor) -> bool:
        return t.untyped_storage() is not t.detach().untyped_storage()

    def fresh(t: torch.Tensor, cast: torch.dtype | None) -> torch.Tensor:
        return torch.empty_strided(t.size(), t.stride(), dtype=cast or t.dtype, device=device)

    for module in model.modules():
        for kind in ("_parameters", "_buffers"):
            for name, t in list(getattr(module, kind).items()):
                if t is None:
                    continue
                if id(t) in replaced:
                    setattr(module, name, replaced[id(t)])
                    continue
                floating = t.is_floating_point() or t.is_complex()
                cast = dtype if dtype is not None and floating else None
                if broken(t):
                    new = fresh(t, cast)
                    if isinstance(t, torch.nn.Parameter):
                        new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
                    replaced[id(t)] = new
                    setattr(module, name, new)
                elif t.device != device or (cast is not None and t.dtype != cast):
                    with torch.no_grad():
                        t.data = t.data.to(device=device, dtype=cast)
    replaced.clear()


def first_optimizer_step(
    step: Step,
    *,
    on_phase: Callable[[str, int], None] = lambda phase, micro: None,
    on_grad: Callable[[torch.Tensor], None] = lambda grad: None,
) -> None:
    """The first optimizer step (its state gets created) with zero gradients put in place.

    The micro-batches of step 1 see the memory of step 2's minus the optimizer state, so tracing
    them again adds nothing to the peak; only step 1's optimizer phase can differ from step 2's
    (state is allocated while gradients are alive), and for that only the gradients matter.
    The clipping, update and ``zero_grad`` are the script's (``optimizer_step``'s tail).
    """
    from launcher.estimate.child import _trace_dist  # cheap: imports no torch.distributed

    model, optimizer = step.model, step.optimizer
    if not _trace_dist.put_zero_grads(model, on_grad):  # DDP: views into its buckets
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                on_grad(p.grad)
    on_phase("optimizer", 0)
    if step.plan["max_grad_norm"] is not None:
        step.script.clip_gradients(model, step.plan["max_grad_norm"])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _user_frame(
    exc: BaseException, recipe_file: str
) -> tuple[str | None, int | None, str | None]:
    """The innermost frame of the user's code: the recipe file, else a file next to it."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return exc.filename, exc.lineno, None
    recipe_path = str(Path(recipe_file).resolve())
    recipe_dir = str(Path(recipe_file).resolve().parent)
    frames = traceback.extract_tb(exc.__traceback__)
    for pick in (
        lambda f: f == recipe_path,
        lambda f: f.startswith(recipe_dir) and "site-packages" not in f,
    ):
        for frame in reversed(frames):
            if pick(str(Path(frame.filename).resolve()) if frame.filename else ""):
                return frame.filename, frame.lineno, frame.name
    return None, None, None


def describe_error(exc: BaseException, recipe_file: str) -> dict[str, Any]:
    """The error of an answer: one line (the function of the user's code it came from, the
    exception's type and first line), the user's file and line, and its kind (contract,
    syntax, user_code), so that the CLI can print it without a traceback."""
    if isinstance(exc, RecipeError):
        return {"message": exc.message, "file": exc.file, "line": exc.line, "kind": exc.kind}
    file, line, function = _user_frame(exc, recipe_file)
    first = (str(exc).strip().splitlines() or [""])[0]
    kind = "syntax" if isinstance(exc, SyntaxError) else "user_code"
    if isinstance(exc, SyntaxError):
        first = exc.msg
    message = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    if function and function != "<module>":
        message = f"in {function}(): {message}"
    return {"message": message, "file": file, "line": line, "kind": kind}
