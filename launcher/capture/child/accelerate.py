"""accelerate: ``Accelerator.prepare`` has the model, optimizer and data; the first backward shows
how the loop made its loss (the model's own, or a loss function of its output matched by value).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from launcher.capture.child.answer import ANSWER, STATE, Stop, note, write_answer
from launcher.capture.child.capture import (
    finish,
    leaves,
    length,
    own,
    samples_of,
    save_optimizer,
)
from launcher.capture.child.data_bound import bounded, bounded_shape
from launcher.capture.child.measure import start_profile, stop_profile


def patch_accelerate() -> None:
    """prepare: the model, optimizer and dataloader; the first backward: how the loop made its
    loss (the model's own, or a loss function of the model's output the values identify)."""
    from accelerate import Accelerator
    from accelerate import data_loader as accel_data

    prepare, backward = Accelerator.prepare, Accelerator.backward

    def capture_prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        if STATE.get("measure"):
            out = prepare(self, *args, **kwargs)
            model = next((o for o in args if isinstance(o, torch.nn.Module)), None)
            if model is not None and "profile" not in STATE:
                STATE["measured_model"] = model
                start_profile()  # from the loop's first forward on
            return out
        if "prepared" not in STATE:
            _capture_prepare(self, args)
        return prepare(self, *args, **kwargs)

    def capture_backward(self: Any, loss: Any, **kwargs: Any) -> Any:
        if STATE.get("measure"):
            STATE["backwards"] = STATE.get("backwards", 0) + 1
            if STATE["backwards"] == 3 and "profile" in STATE:  # two steps, a third forward
                stop_profile()
                raise Stop
            return backward(self, loss, **kwargs)
        if "prepared" in STATE:
            _capture_loss(loss)
            _capture_length(sys._getframe(1))
        raise Stop

    Accelerator.prepare = capture_prepare  # type: ignore[method-assign]
    Accelerator.backward = capture_backward  # type: ignore[method-assign]
    for name in ("DataLoaderShard", "DataLoaderDispatcher"):
        cls = getattr(accel_data, name, None)
        if cls is None:
            continue
        iterate = cls.__iter__

        def recording_iter(self: Any, _iterate: Any = iterate) -> Any:
            for batch in _iterate(self):
                STATE["last_batch"] = batch
                yield batch

        cls.__iter__ = recording_iter


def _capture_prepare(accelerator: Any, objects: tuple) -> None:
    from torch.utils.data import DataLoader

    model = next((o for o in objects if isinstance(o, torch.nn.Module)), None)
    optimizer = next((o for o in objects if isinstance(o, torch.optim.Optimizer)), None)
    loader = next((o for o in objects if isinstance(o, DataLoader)), None)
    if model is None or loader is None:
        return  # prepared in parts: wait for the call that has the model and the data
    STATE["prepared"] = model
    if optimizer is not None:
        save_optimizer(optimizer)
    accum = int(getattr(accelerator, "gradient_accumulation_steps", 1) or 1)
    ANSWER["settings"] = {"batch_size": loader.batch_size, "gradient_accumulation_steps": accum,
                           "mixed_precision": str(getattr(accelerator, "mixed_precision", ""))}
    if isinstance(loader.batch_size, int):
        own("global_batch_size", loader.batch_size * accum,
            f"the DataLoader's batch_size {loader.batch_size} x gradient_accumulation_steps "
            f"{accum}")
    own("max_grad_norm", None, "none: a loop clips only where it says so")
    length(unknown="its loop did not reach backward before the capture stopped it")
    # Written now: a loop that never reaches backward is still traced, with the model's loss.
    # the largest batch the data makes, where its batches vary in shape (data_bound.py)
    finish(model, bounded(loader, next(iter(loader))),  # DataLoaderShard fetches one ahead
            {"kind": "model_output", "call": {"style": "auto"}, "lookahead": True})
    calls: list[tuple[tuple, dict, Any]] = []
    STATE["calls"] = calls  # the last forward's inputs and output (hooked after pickling)
    model.register_forward_hook(
        lambda _m, a, k, out: calls.__setitem__(slice(None), [(a, k, out)]), with_kwargs=True)
    note("the loop's loss was not seen (no backward before the script stopped): the traced step "
          "takes the model's own loss, else the sum of its output")
    write_answer()


def _capture_loss(loss: torch.Tensor) -> None:
    """How the loop's loss came from the last forward: the same tensor as the output's loss, or
    one of a few loss functions of the output and a tensor of the batch, matched by value."""
    import torch.nn.functional as F

    notes = ANSWER["notes"]
    stale = [n for n in notes if n.startswith("the loop's loss was not seen")]
    for n in stale:
        notes.remove(n)
    calls = STATE.get("calls") or []
    batch = STATE.get("last_batch")
    if not calls or batch is None:
        note("the loop's loss could not be related to the model's output: the traced step "
              "takes the model's own loss, else the sum of its output")
        write_answer()
        return
    args, kwargs, out = calls[0]
    step: dict[str, Any] = {"kind": "model_output", "call": _call_style(batch, args, kwargs),
                            "lookahead": True}
    own = output_loss(out)
    if own is not None and (own is loss or same_values(own, loss)):
        step["loss"] = "model"
    else:
        match = match_loss(out, batch, loss, F)
        if match is None:
            note("the loop's loss is not the model's own nor a cross-entropy, MSE, L1, NLL or "
                  "BCE of its output: the traced step sums the output (the loss's own "
                  "activations are not counted)")
            step["loss"] = "sum"
        else:
            step.update(match)
    if _loop_binds_output(STATE["script"]):
        step["held_output"] = [[bounded_shape(list(t.shape)), str(t.dtype).removeprefix("torch.")]
                               for t in leaves(tensors_of(out))]
    ANSWER["step"] = step
    write_answer()


def _capture_length(frame: Any) -> None:
    """How many optimizer steps the loop makes by its own count, read from the loops around
    its ``accelerator.backward`` (``frame``: the function that called it) when they are bounded:
    ``for`` loops over ``range(...)`` and, innermost, the prepared DataLoader (or
    ``enumerate``/``tqdm`` of it), with no ``break``, ``return`` or ``while``. Anything else
    stays unknown: the loop's length is its own, and known only as it runs."""
    settings = ANSWER.get("settings") or {}
    found = _loop_counts(frame)
    if isinstance(found, str):
        length(unknown=found)
        write_answer()
        return
    epochs, batches, loader = found
    length(epochs=epochs, batches=batches,
           accumulation=int(settings.get("gradient_accumulation_steps") or 1),
           batch_size=settings.get("batch_size"), samples=samples_of(loader))
    write_answer()


def _loop_counts(frame: Any) -> tuple[int, int, Any] | str:
    """(iterations of the outer loops, batches of the innermost, its DataLoader), or why not."""
    from torch.utils.data import DataLoader

    unknown = "its loop counts its own batches"
    try:
        tree = ast.parse(Path(frame.f_code.co_filename).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return unknown
    line = frame.f_lineno
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    scope: ast.AST = tree
    for node in ast.walk(tree):
        if isinstance(node, functions) and node.name == frame.f_code.co_name and (
                node.lineno <= line <= (node.end_lineno or node.lineno)):
            if scope is tree or node.lineno > scope.lineno:  # type: ignore[attr-defined]
                scope = node
    loops: list[ast.AST] = []

    def around(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (*functions, ast.ClassDef, ast.Lambda)):
                continue
            start = getattr(child, "lineno", None)
            if start is not None and start <= line <= (child.end_lineno or start):
                if isinstance(child, (ast.For, ast.While, ast.AsyncFor)):
                    loops.append(child)
                around(child)

    around(scope)
    if not loops or any(not isinstance(loop, ast.For) for loop in loops):
        return "its loop is a while loop" if loops else unknown
    if any(isinstance(n, (ast.Break, ast.Return)) for n in ast.walk(loops[0])):
        return "its loop stops itself (a break or return)"
    counts: list[int] = []
    loader = None
    for loop in loops:
        assert isinstance(loop, ast.For)
        try:
            iterable = _iterable(loop.iter, frame)
            counts.append(len(iterable))
        except Exception:  # noqa: BLE001 - a loop over what cannot be read here
            return unknown
        loader = iterable
    if not isinstance(loader, DataLoader) or not counts[-1]:
        return unknown
    epochs = 1
    for count in counts[:-1]:
        epochs *= count
    return epochs, counts[-1], loader


def _iterable(node: ast.expr, frame: Any) -> Any:
    """What a ``for`` loop iterates over, read from the frame: ``range(...)`` of plain values,
    ``enumerate(x)``/``tqdm(x, ...)`` as ``x``, or a name, attribute or subscript."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "range" and not node.keywords:
            return range(*(int(_value(a, frame)) for a in node.args))
        if node.func.id in ("enumerate", "tqdm") and node.args:
            return _iterable(node.args[0], frame)
    return _value(node, frame)


def _value(node: ast.expr, frame: Any) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        for scope in (frame.f_locals, frame.f_globals, frame.f_builtins):
            if node.id in scope:
                return scope[node.id]
        raise LookupError(node.id)
    if isinstance(node, ast.Attribute):
        return getattr(_value(node.value, frame), node.attr)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return _value(node.value, frame)[node.slice.value]
    raise TypeError(type(node).__name__)


def tensors_of(out: Any) -> Any:
    """The tensors a model's output holds (a ModelOutput is a Mapping of them)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
    if isinstance(out, (list, tuple)):
        return [v for v in out if isinstance(v, torch.Tensor)]
    return []


def _loop_binds_output(script: Path) -> bool:
    """Whether the loop around ``accelerator.backward`` binds the step's results to names in
    its own body (``outputs = model(**batch)``): Python then keeps the last step's output alive
    until the next forward returns and the name is bound again."""
    import ast

    try:
        tree = ast.parse(script.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    for loop in ast.walk(tree):
        if not isinstance(loop, (ast.For, ast.While)):
            continue
        inner = [n for stmt in loop.body for n in ast.walk(stmt)]
        backward = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                       and n.func.attr == "backward" for n in inner)
        binds = any(isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                    and all(isinstance(t, ast.Name) for t in n.targets) for n in inner)
        if backward and binds:
            return True
    return False


def _call_style(batch: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """How the loop called the model with the batch: ``model(**batch)``, ``model(batch[i],
    ...)`` or ``model(batch)``."""
    if isinstance(batch, Mapping) and kwargs and not args:
        keys = [k for k, v in kwargs.items() if k in batch and batch[k] is v]
        if keys:
            return {"style": "kwargs", "keys": keys}
    if isinstance(batch, (list, tuple)) and args:
        index = [next((i for i, b in enumerate(batch) if b is a), None) for a in args]
        if all(i is not None for i in index):
            return {"style": "positional", "index": index}
    if args and args[0] is batch:
        return {"style": "whole"}
    return {"style": "auto"}


def output_loss(out: Any) -> torch.Tensor | None:
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    return loss if isinstance(loss, torch.Tensor) else None


def output_tensor(out: Any) -> tuple[torch.Tensor | None, str]:
    """The output tensor a loss is taken of, and how the recipe finds it again (its
    ``_output_tensor``'s ``which``): the tensor, a ``logits`` field, or a tuple's first."""
    if isinstance(out, torch.Tensor):
        return out, "tensor"
    logits = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits, "logits"
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], torch.Tensor):
        return out[0], "first"
    return None, "none"


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.detach().float(), b.detach().float(),
                                                      rtol=1e-5, atol=1e-6))


def match_loss(out: Any, batch: Any, loss: torch.Tensor, F: Any) -> dict[str, Any] | None:
    output, which = output_tensor(out)
    if output is None:
        return None
    targets: list[tuple[Any, torch.Tensor]] = []
    if isinstance(batch, Mapping):
        targets = [(k, v) for k, v in batch.items() if isinstance(v, torch.Tensor)]
    elif isinstance(batch, (list, tuple)):
        targets = [(i, v) for i, v in enumerate(batch) if isinstance(v, torch.Tensor)]
    # nll_loss before cross_entropy: of log-probabilities (a log_softmax output: mnist's
    # ``F.nll_loss``, word_language_model's ``nn.NLLLoss``) both give the same value, and the
    # cross-entropy would trace a second log_softmax the loop never makes (+22% on
    # word_language_model, whose [700, 2000] output is as large as its activations)
    functions = ("nll_loss", "cross_entropy", "mse_loss", "l1_loss",
                 "binary_cross_entropy_with_logits")
    import warnings

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a broadcasting loss is tried, and does not match
        for key, target in targets:
            for name in functions:
                for flatten in (False, True):
                    try:
                        got = _apply_loss(F, name, output, target, flatten)
                    except Exception:  # noqa: BLE001 - shapes that do not go together
                        continue
                    if same_values(got, loss):
                        return {"loss": "function", "function": name, "output": which,
                                "target": key, "flatten": flatten}
    return None


def _apply_loss(F: Any, name: str, output: torch.Tensor, target: torch.Tensor,
                flatten: bool) -> torch.Tensor:
    """The same as the recipe's ``_loss_function`` (launcher/capture/recipe_template.py)."""
    if flatten:
        output, target = output.reshape(-1, output.shape[-1]), target.reshape(-1)
    if name in ("mse_loss", "l1_loss", "binary_cross_entropy_with_logits"):
        target = target.to(output.dtype)
    return getattr(F, name)(output, target)
