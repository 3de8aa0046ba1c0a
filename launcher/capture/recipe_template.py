"""A launch recipe for a framework script, from what ``launcher.capture.frameworks.capture`` found.

``launcher.capture.frameworks`` copies this file, unchanged, next to a capture (``capture.json``,
``model.pkl``, ``batch.pt``); the traced estimator then runs it like any recipe. Nothing of the
user's script runs again but its definitions (imports, classes and functions, when the pickled
model names a class of the script's own): the model is the one the script built, unpickled with
its weights given storage where it is built (fake tensors in a trace, real ones in a
measurement), the batch the framework's own dataloader made, resized along its first dimension,
and the step the framework would run:

- Hugging Face ``Trainer``: ``model(**batch).loss``, as ``Trainer.compute_loss`` takes it;
- Lightning: the LightningModule's own ``training_step(batch, 0)`` (its ``loss`` if it answers a
  dict), through a wrapper module so that DDP and FSDP see one forward;
- accelerate: the model called with the batch as the loop called it, and the loss the loop took:
  the model's own, or the loss function of its output that the capture matched by value;
- a plain PyTorch script (``capture/child/plain.py``): the model called with the inputs of its
  last call before the first optimizer step, and the loop's loss found the same way (or an
  element of the output tuple, nanoGPT's ``logits, loss``). Its batch is resized along its own
  batch dimension, tensor by tensor (``batch_layout``: dimension 1 of a sequence-first loop's
  ``[seq, batch]`` tokens and ``[layers, batch, hidden]`` state, a flattened ``[seq * batch]``
  target as the dimensions it was flattened from; ``capture/child/batch_dim.py``);
- a plain script whose step runs several modules (``capture/child/pipeline.py``: an encoder
  and a decoder): their calls, and the loop's operations between them, replayed in order by
  one wrapper module, ``PipelineStep``.

``build_optimizer`` rebuilds the optimizer the framework made (its class and settings), so the
trace holds the state that optimizer holds. Imported from launcher/ as a module it does nothing:
there is no capture next to it.

Over 600 lines on purpose: it is copied, as one file, beside each capture, and imports nothing
of launcher, so that a capture folder is a recipe on its own (traced, measured or read again from
the folder alone); each kind of step it replays (Trainer, Lightning, accelerate, plain, a
pipeline of modules) is one function of it.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import pickle
import sys
import types
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

_HERE = Path(__file__).resolve().parent
_built: list[Any] = []  # a weak reference to the last model build_model() made
_AHEAD: list[Any] = []  # the batch the framework's loader has fetched ahead of this one
_HELD: list[Any] = []  # an accelerate loop's last output (its rows, the output)
_SCRIPT_MODULE = "__launch_framework_script__"


@functools.cache
def _capture() -> dict[str, Any]:
    return json.loads((_HERE / "capture.json").read_text(encoding="utf-8"))


def _load_batch() -> Any:
    """Loaded at import, outside any fake-tensor mode: real tensors every batch is made from."""
    if not (_HERE / "batch.pt").exists():
        return None
    if _capture()["script_dir"] not in sys.path:
        sys.path.insert(0, _capture()["script_dir"])  # the script's own modules
    return torch.load(_HERE / "batch.pt", weights_only=False)


_BATCH = _load_batch()


def _real_answers(batch: Any) -> dict[str, bool]:
    """What transformers would find in the captured batch's values, which it cannot read on fake
    tensors (``is_tracing`` is true for them): whether the attention mask masks anything, and
    whether the position ids pack several sequences in a row. Example batches are made of the
    captured rows, so the answers hold for them too."""
    if not isinstance(batch, Mapping):
        return {"mask_all_ones": False, "packed": True}
    mask = batch.get("attention_mask")
    positions = batch.get("position_ids")
    packed = False
    if isinstance(positions, torch.Tensor) and positions.dim() == 2:
        packed = bool((positions[:, 1:] - positions[:, :-1] != 1).any())
    return {"mask_all_ones": isinstance(mask, torch.Tensor) and bool(mask.all()),
            "packed": packed}


_REAL = _real_answers(_BATCH)


def _as_on_real_tensors() -> None:
    """On fake tensors transformers assumes packed sequences (``find_packed_sequence_indices``
    is data-dependent), builds a 4D mask and copies GQA's keys and values for it, where a real
    run of these rows finds no packing and passes no mask (launcher/estimate/hf_recipe.py has
    the same answer for its own batches)."""
    if _REAL["packed"] or "transformers" not in sys.modules:
        return
    from transformers import masking_utils

    if hasattr(masking_utils, "find_packed_sequence_indices"):
        masking_utils.find_packed_sequence_indices = lambda position_ids: None


@functools.cache
def _definitions() -> types.ModuleType:
    """The script's imports, classes, functions and literal constants, without the rest of it
    (which would train): where the pickled model's classes were defined in ``__main__``."""
    path = Path(_capture()["script"])
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = types.ModuleType(_SCRIPT_MODULE)  # its classes' __module__
    module.__file__ = str(path)
    # the plain values the script's globals held when it was captured (computed ones included);
    # a device is the trace's: the step is traced on the CPU, emulating the target's GPU
    module.__dict__.update({
        name: torch.device("cpu") if isinstance(value, dict) and "torch.device" in value
        else value for name, value in (_capture().get("constants") or {}).items()})
    for node in tree.body:
        kept = isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                 ast.AsyncFunctionDef, ast.ClassDef))
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            try:
                ast.literal_eval(node.value)
                kept = True
            except ValueError:
                kept = False
        if kept:
            try:
                exec(compile(ast.Module([node], []), str(path), "exec"), module.__dict__)
            except Exception:  # noqa: BLE001 - a definition that needs what was left out
                continue
    return module


def _resolve(qualified: str) -> Any:
    module, _, name = qualified.rpartition(".")
    owner: Any = _definitions() if module == "__main__" else importlib.import_module(module)
    for part in name.split("."):
        owner = getattr(owner, part)
    return owner


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "__main__":
            return _resolve(f"__main__.{name}")
        return super().find_class(module, name)


class LightningStep(torch.nn.Module):
    """A LightningModule's ``training_step`` as a forward, as Lightning's own strategy wrapper
    calls it: DDP and FSDP then see the step as one forward of one module."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Any, batch_idx: int = 0) -> Any:
        return self.module.training_step(batch, batch_idx)


class PipelineStep(torch.nn.Module):
    """A step of several modules (``capture/child/pipeline.py``) as one forward: each call
    made as the loop made it, its arguments the batch's inputs, earlier calls' outputs or the
    values the loop gave. One module, so that DDP and FSDP wrap the whole step and the optimizer
    is given every stage's parameters.

    Where the loop binds each call's results to names, each stays alive until that call returns
    again in the next step (``held_output``): the last step's outputs are kept here and
    replaced as each call returns, as Python rebinds them; at a new batch size, stand-ins of
    their shapes are made for the first step, as ``training_step`` does for one model.
    """

    def __init__(self, stages: torch.nn.ModuleList, calls: list[dict[str, Any]],
                 held: list[list[Any]] | None, answer: int) -> None:
        super().__init__()
        self.stages = stages
        self._calls = calls
        self._held_shapes = held
        self._answer = answer
        self._held: list[Any] = []  # [rows, the last output of each call]

    def forward(self, batch: dict[str, Any]) -> Any:
        inputs = batch["inputs"]
        outs: list[Any] = []
        sizes = [len(t) for t in inputs if isinstance(t, torch.Tensor) and t.dim() > 0]
        # the batch's rows as the capture counted them (the commonest first dimension)
        rows = (max(set(sizes), key=sizes.count) if sizes else None, _capture().get("batch_size"))
        held = self._held_shapes is not None and rows[0] is not None
        if held:
            rows_now = rows[0]
            if self._held and self._held[0] != rows_now:
                self._held.clear()
            if not self._held:
                self._held[:] = [rows_now, *([torch.empty(_rows(shape, rows_now),
                                                      dtype=getattr(torch, dtype))
                                          for shape, dtype in shapes]
                                         for shapes in self._held_shapes)]
        for index, call in enumerate(self._calls):
            # a module's call, or the loop's own operation on earlier outputs (``h[:, -1]``)
            run = self.stages[call["module"]] if "module" in call else _operation(call["op"])
            out = run(*_replayed(call["args"], inputs, outs, rows),
                      **_replayed(call["kwargs"], inputs, outs, rows))
            outs.append(out)
            if held and "module" in call:
                self._held[1 + index] = out  # the last step's output of this call is let go
        return outs[self._answer]


def _operation(name: str) -> Any:
    """A torch function the loop called between its modules, by ``pipeline._op_name``."""
    import torch.nn.functional as F

    owner, _, attribute = name.partition(".")
    return getattr({"Tensor": torch.Tensor, "torch": torch, "F": F}[owner], attribute)


def _replayed(spec: dict[str, Any], inputs: list[Any], outs: list[Any],
              rows: tuple[int, int | None]) -> Any:
    """A call's argument from its recorded reference (``pipeline._Flow.spec``); ``rows``: the
    replayed batch's and the captured one's, for a shape operation's sizes."""
    if "in" in spec:
        return inputs[spec["in"]]
    if "out" in spec:
        value = outs[spec["out"]]
        for key in spec["path"]:
            value = value[key]
        return value
    if "dict" in spec:
        return {k: _replayed(v, inputs, outs, rows) for k, v in spec["dict"].items()}
    if "list" in spec:
        items = [_replayed(v, inputs, outs, rows) for v in spec["list"]]
        return tuple(items) if spec.get("tuple") else items
    if "size" in spec:
        return rows[0] if rows[0] is not None and spec["size"] == rows[1] else spec["size"]
    if "slice" in spec:
        return slice(*(_replayed(v, inputs, outs, rows) for v in spec["slice"]))
    if "ellipsis" in spec:
        return Ellipsis
    if "dtype" in spec:
        return getattr(torch, spec["dtype"])
    return spec["value"]


def _materialize(model: torch.nn.Module, device: torch.device) -> None:
    """Storage for the pickled meta weights on ``device`` (fake under a trace, real on the CPU
    for a measurement, meta when sized on the meta device), random values; tied weights stay
    tied; kept buffers are copied to ``device``."""
    made: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in made:
                new = param
                if param.device != device:
                    data = torch.empty(param.shape, dtype=param.dtype, device=device)
                    if device.type != "meta":
                        with torch.no_grad():
                            _init(data)
                    new = torch.nn.Parameter(data, requires_grad=param.requires_grad)
                made[id(param)] = new
            setattr(module, name, made[id(param)])
        for name, buffer in list(module._buffers.items()):
            if buffer is None:
                continue
            if id(buffer) not in made:
                if buffer.device.type == "meta" or device.type == "meta":
                    made[id(buffer)] = torch.zeros(buffer.shape, dtype=buffer.dtype,
                                                   device=device)
                else:
                    copy = torch.empty(buffer.shape, dtype=buffer.dtype, device=device)
                    copy.copy_(buffer)
                    made[id(buffer)] = copy
            setattr(module, name, made[id(buffer)])


def _init(data: torch.Tensor) -> None:
    if data.is_floating_point():
        data.normal_(0.0, 0.02)
    else:
        data.zero_()


def build_model() -> torch.nn.Module:
    _AHEAD.clear()
    _HELD.clear()
    with open(_HERE / "model.pkl", "rb") as handle:
        model = _Unpickler(handle).load()
    _materialize(model, torch.empty(0).device)  # the device (and mode) it is built under
    model.train()
    _as_on_real_tensors()
    step = _capture()["step"]
    if step["kind"] == "lightning":
        model = LightningStep(model)
    elif step["kind"] == "pipeline":
        model = PipelineStep(model, step["calls"], step.get("held_output"), step["from"])
    _built[:] = [weakref.ref(model)]
    return model


def example_batch(batch_size: int) -> Any:
    """The captured batch at ``batch_size`` rows: its first rows, or it repeated; tensors whose
    first dimension is not the batch's are copied as they are.

    Where the framework's loader holds the next batch while this one trains (accelerate's
    ``DataLoaderShard``, which the Trainer uses too, looks one batch ahead to know the last;
    Lightning's fetcher does for a loader without a length), a second batch is made and kept
    until the next call.
    """
    _AHEAD.clear()
    batch = _resized(batch_size)
    if _capture()["step"].get("lookahead"):
        _AHEAD.append(_resized(batch_size))
    return batch


def _resized(batch_size: int) -> Any:
    rows = _capture().get("batch_size")
    layouts = iter(_capture().get("batch_layout") or ())
    laid_out = "batch_layout" in _capture()  # a plain capture: each tensor's own layout

    def resize(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if laid_out:
                return _resized_along(value, next(layouts, None), rows, batch_size)
            if value.dim() == 0 or value.shape[0] != rows:
                return value.clone()
            if batch_size <= rows:
                return value[:batch_size].clone()
            repeats = -(-batch_size // rows)
            return torch.cat([value] * repeats)[:batch_size]
        if isinstance(value, Mapping):
            return {k: resize(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(resize(v) for v in value)
        return value

    return resize(_BATCH)


def _resized_along(value: torch.Tensor, layout: dict[str, Any] | None, rows: int,
                   batch_size: int) -> torch.Tensor:
    """One tensor of a plain capture at ``batch_size`` rows, as its layout says
    (``capture/child/batch_dim.py``): along its batch dimension (1 for a sequence-first
    loop's ``[seq, batch]`` input and ``[layers, batch, hidden]`` state), or, for a target the
    loop flattened (``[seq * batch]``), as the input's leading dimensions it was flattened from;
    a tensor that is not the batch's is copied as it is."""
    if layout is None:
        return value.clone()
    dim, flat = int(layout["dim"]), layout.get("flat")
    if dim == 0 and flat is None:  # as the batch-first loops always were
        if batch_size <= rows:
            return value[:batch_size].clone()
        return torch.cat([value] * -(-batch_size // rows))[:batch_size]
    shaped = value.reshape(*flat, *value.shape[1:]) if flat is not None else value
    if batch_size <= rows:
        shaped = shaped.narrow(dim, 0, batch_size)
    else:
        shaped = torch.cat([shaped] * -(-batch_size // rows), dim).narrow(dim, 0, batch_size)
    shaped = shaped.clone(memory_format=torch.contiguous_format)  # its own, of its own size
    return shaped.reshape(-1, *value.shape[1:]) if flat is not None else shaped


def _output_loss(out: Any) -> torch.Tensor | None:
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    return loss if isinstance(loss, torch.Tensor) else None


def _output_tensor(out: Any, which: str = "auto") -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    logits = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor) and which in ("auto", "logits"):
        return logits
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"the model's output ({type(out).__name__}) has no tensor to take a loss of")


def _call(model: torch.nn.Module, batch: Any, call: dict[str, Any]) -> Any:
    style = call.get("style", "auto")
    if style == "kwargs":
        return model(**{k: batch[k] for k in call["keys"]})
    if style == "positional":
        return model(*[batch[i] for i in call["index"]])
    if style == "whole" or isinstance(batch, torch.Tensor):
        return model(batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    return model(batch[0])


def _loss_function(name: str, output: torch.Tensor, target: torch.Tensor, flatten: bool
                   ) -> torch.Tensor:
    """The same as the capture's ``_apply_loss`` (launcher/capture/child/accelerate.py)."""
    import torch.nn.functional as F

    if flatten:
        output, target = output.reshape(-1, output.shape[-1]), target.reshape(-1)
    if name in ("mse_loss", "l1_loss", "binary_cross_entropy_with_logits"):
        target = target.to(output.dtype)
    return getattr(F, name)(output, target)


def training_step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    step = _capture()["step"]
    if step["kind"] == "hf_loss":
        if _REAL["mask_all_ones"] and "attention_mask" in batch:
            # A mask that masks nothing is skipped on real tensors (SDPA's is_causal) but, its
            # values unknown, built in full on fake ones: the model gets what it would use.
            batch = {k: v for k, v in batch.items() if k != "attention_mask"}
        out = model(**batch)
        loss = _output_loss(out)
        if loss is None:
            raise ValueError("the model returned no loss for the Trainer's batch (no labels?)")
        return loss
    if step["kind"] == "lightning":
        # Lightning's closure calls zero_grad after training_step, before backward: the last
        # step's gradients are alive during this forward (the launch loop has dropped them).
        held = _last_gradients(model)
        out = model(batch, 0)
        del held
        if isinstance(out, Mapping):
            out = out["loss"]
        if not isinstance(out, torch.Tensor):
            raise ValueError("training_step returned no loss (manual optimization?)")
        return out
    if step["kind"] == "pipeline":
        return _pipeline_step(model, batch, step)
    plain = step["kind"] == "plain"  # a plain script's loop: {"args", "kwargs", "extra"}
    holds = step.get("held_output") is not None
    if holds:
        # The loop binds the step's output to a name: Python keeps it alive through backward
        # and the optimizer step, until the next forward returns and the name is bound again.
        # The last step's output at this size is that one; at a new size, one of its shape.
        first = (_first_rows(batch["args"] + list(batch["kwargs"].values())) if plain
                 else _first_rows(batch))
        dim = int(_capture().get("batch_dim") or 0)  # a sequence-first input's is 1
        rows = first.shape[dim] if first.dim() > dim else len(first)
        if _HELD and _HELD[0] != rows:
            _HELD.clear()
        ghost = [] if _HELD else [torch.empty(_rows(shape, rows), dtype=getattr(torch, dtype))
                                  for shape, dtype in step["held_output"]]
    # a loop that zeroes its gradients after its forward runs each forward with the last
    # step's gradients still allocated, as Lightning's closure does
    grads = _last_gradients(model) if step.get("grads_through_forward") else []
    # a plain script's model is called with the inputs its loop called it with
    out = (model(*batch["args"], **batch["kwargs"]) if plain
           else _call(model, batch, step.get("call") or {}))
    del grads
    if holds:
        del ghost
        _HELD[:] = [rows, out]
    how = step.get("loss", "model")
    if how == "index":  # an element of the output: nanoGPT's ``logits, loss = model(X, Y)``
        return out[step["index"]]
    if how == "function":  # of the output and the loop's tensor (a plain loop's ``target``)
        target = batch["extra"][step["target"]] if plain else batch[step["target"]]
        return _loss_function(step["function"], _output_tensor(out, step.get("output", "auto")),
                              target, bool(step.get("flatten")))
    loss = _output_loss(out) if how == "model" else None
    return loss if loss is not None else _output_tensor(out).float().sum()


def _pipeline_step(model: torch.nn.Module, batch: dict[str, Any], step: dict[str, Any]
                   ) -> torch.Tensor:
    """A step of several modules (``PipelineStep``), its loss taken from the output it was
    matched against, the target a batch input or a tensor of the loop's own."""
    grads = _last_gradients(model) if step.get("grads_through_forward") else []
    out = model(batch)
    del grads
    how = step.get("loss", "model")
    if how == "output":
        return out
    if how == "index":
        return out[step["index"]]
    if how == "function":
        target = (batch["inputs"][step["target_input"]] if "target_input" in step
                  else batch["extra"][step["target"]])
        return _loss_function(step["function"], _output_tensor(out, step.get("output", "auto")),
                              target, bool(step.get("flatten")))
    loss = _output_loss(out) if how == "model" else None
    return loss if loss is not None else _output_tensor(out).float().sum()


def _last_gradients(model: torch.nn.Module) -> list[torch.Tensor]:
    """Stand-ins for the last step's gradients, held through a forward, where the launch loop
    has dropped them (none when it is accumulating: the gradients are there already)."""
    held = [torch.empty_like(p) for p in model.parameters() if p.requires_grad and p.grad is None]
    if len(held) < sum(1 for p in model.parameters() if p.requires_grad):
        return []
    return held


def _rows(shape: list[int], batch_size: int) -> list[int]:
    """A captured output's shape at ``batch_size``: its batch dimension scaled (dimension 1 of
    a sequence-first loop's ``[seq, batch, vocab]``), else its first dimension when it was the
    captured batch's (a flattened ``[rows * seq, ...]`` output too)."""
    rows = _capture().get("batch_size") or 1
    dim = int(_capture().get("batch_dim") or 0)
    if 0 < dim < len(shape) and shape[dim] == rows:
        return [*shape[:dim], batch_size, *shape[dim + 1:]]
    if shape and shape[0] % rows == 0:
        return [shape[0] // rows * batch_size, *shape[1:]]
    return list(shape)


def _first_rows(batch: Any) -> torch.Tensor:
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch
    return next(v for v in values if isinstance(v, torch.Tensor) and v.dim() > 0)


def build_optimizer(params: Any) -> torch.optim.Optimizer | Optimizers:
    """The framework's optimizer, rebuilt from its class and the settings it was made with."""
    spec = _capture()["optimizer"]
    cls = _resolve(spec["class"])
    settings = dict(spec.get("defaults") or {})
    accepted = inspect.signature(cls.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        settings = {k: v for k, v in settings.items() if k in accepted}
    params = list(params)
    ordered = _stage_parameters(params) if spec.get("groups") or spec.get("parts") else None
    if ordered is not None and spec.get("parts"):
        return Optimizers([_rebuilt(part["class"], part.get("defaults") or {},
                                    _group_dicts(part["groups"], ordered))
                           for part in spec["parts"]])
    groups = _group_dicts(spec.get("groups") or [], ordered) if ordered is not None else []
    return cls(groups or params, **settings)


def _rebuilt(name: str, defaults: dict[str, Any], groups: list[dict[str, Any]]) -> Any:
    cls = _resolve(name)
    accepted = inspect.signature(cls.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        defaults = {k: v for k, v in defaults.items() if k in accepted}
    return cls(groups, **{k: tuple(v) if isinstance(v, list) else v
                          for k, v in defaults.items()})


def _stage_parameters(params: list[Any]) -> list[Any] | None:
    """The built model's parameters in the order the capture numbered them (its stages'), or
    None where ``params`` are not those (FSDP's flat ones): a step's several optimizers
    (``pipeline._optimizers``) are then one of the first's settings."""
    model = _built[0]() if _built else None
    if model is None:
        return None
    stages = model.stages if isinstance(model, PipelineStep) else model
    ordered = list({id(p): p for p in stages.parameters()}.values())
    given = {id(p) for p in params}
    if any(id(p) not in given for p in ordered if p.requires_grad):
        return None
    return ordered


def _group_dicts(groups: list[dict[str, Any]], ordered: list[Any]) -> list[dict[str, Any]]:
    """Parameter groups from their captured settings and the parameters' places."""
    return [{**{k: tuple(v) if isinstance(v, list) else v for k, v in g["settings"].items()},
             "params": [ordered[i] for i in g["params"] if ordered[i].requires_grad]}
            for g in groups if g["params"]]


class Optimizers:
    """A step's optimizers of different classes (an Adam for the encoder, an SGD for the
    decoder) as the one optimizer a launch step holds: each steps its own parameters and keeps
    its own states; ``defaults`` are the first's (which the tracer reads for ``foreach``)."""

    def __init__(self, parts: list[torch.optim.Optimizer]) -> None:
        self.parts = parts
        self.defaults = parts[0].defaults

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for part in self.parts for g in part.param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        return {k: v for part in self.parts for k, v in part.state.items()}

    def step(self, closure: Any = None) -> None:
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def register_step_pre_hook(self, hook: Any) -> Any:
        return self.parts[0].register_step_pre_hook(hook)  # before the first part's update

    def register_step_post_hook(self, hook: Any) -> Any:
        return self.parts[-1].register_step_post_hook(hook)  # after the last part's update

    def state_dict(self) -> dict[str, Any]:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for part, saved in zip(self.parts, state["parts"], strict=True):
            part.load_state_dict(saved)


def wrap_modules() -> tuple[type, ...]:
    """The block classes the capture found repeated (a transformer's layers), for activation
    checkpointing and FSDP units."""
    names = set(_capture().get("wrap_modules") or ())
    model = _built[0]() if _built else None
    if model is None:
        with torch.device("meta"):
            model = build_model()
    found = {type(m) for m in model.modules() if _qualified(type(m)) in names}
    return tuple(sorted(found, key=lambda t: t.__qualname__))


def _qualified(cls: type) -> str:
    """A class's name as the capture wrote it (the script's own classes were ``__main__``'s)."""
    module = "__main__" if cls.__module__ == _SCRIPT_MODULE else cls.__module__
    return f"{module}.{cls.__qualname__}"


# A capture without an optimizer the recipe can rebuild (bitsandbytes missing, say) leaves the
# choice to the plan, as a recipe without build_optimizer does; likewise the blocks.
if (_HERE / "capture.json").exists():
    if not (_capture().get("optimizer") or {}).get("class"):
        del build_optimizer
    if not _capture().get("wrap_modules"):
        del wrap_modules
