"""A plain PyTorch script: its first ``Optimizer.step`` is where its training has started.

Nothing of a framework tells where the model, the batch and the loss are, so the capture watches
the script run until its first optimizer step (a global step pre-hook, torch's own), and takes
what it has seen by then:

- every top-level module call made with gradients on (``nn.Module.__call__`` at depth 0: the
  model the loop calls, not its submodules, nor a loss module inside it), with its inputs and
  output; the model is the one of those whose parameters the optimizer holds;
- the tensor the loop called ``backward`` on (its loss), and the tensors of the frame that called
  it (the loop's locals: its ``target``), where the loss is matched by value against the model's
  own loss, an element of its output tuple (nanoGPT's ``logits, loss``), or a loss function of
  its output and one of those tensors (accelerate's ``match_loss``);
- ``argparse``: each parser's options and the values it parsed, from which the script's batch
  flag is learned (the option whose value is the batch's rows);
- the batch's dimension (``batch_dim``): dimension 0, or dimension 1 of a sequence-first loop's
  ``[seq, batch]`` input, which its ``batch_first=False`` layers tell; a flattened target
  (``[seq * batch]``) is one of the batch's tensors too;
- a loop with no optimizer, which updates its weights by hand (``manual_step``): its first step
  ends where its next one starts, and is captured there.

A script written for the GPU it will get is run here without one: ``torch.cuda.is_available()``
is false, and ``.cuda()`` on a module or tensor stays on the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from launcher.capture.child.accelerate import (
    match_loss,
    output_loss,
    same_values,
    tensors_of,
)
from launcher.capture.child.answer import ANSWER, STATE, Stop, note, write_answer
from launcher.capture.child.batch_dim import (
    find_batch_dim,
    record_batch_dim,
    watch_sequence_first,
)
from launcher.capture.child.capture import finish, leaves, own, save_optimizer
from launcher.capture.child.data_bound import bounded_inputs, bounded_shape, record_loaders
from launcher.capture.child.manual_step import watch_plain
from launcher.capture.child.measure import start_profile, stop_profile
from launcher.capture.child.on_the_cpu import patch_cuda
from launcher.capture.child.script_options import env_options, patch_click, patch_environ
from launcher.script_info import flag_text

#: Option names that say "the batch size" (their dest, ``-`` as ``_``), best first.
_BATCH_DESTS = ("micro_batch_size", "per_device_train_batch_size", "batch_size", "train_batch_size",
                "bs", "batch", "mbs")
_ACCUM_DESTS = ("gradient_accumulation_steps", "grad_accum_steps", "accumulation_steps",
                "grad_accum", "accum_steps", "gradient_accumulation")
_STEPS_DESTS = ("max_steps", "steps", "max_iters", "iters", "num_steps", "train_steps")
_EPOCHS_DESTS = ("epochs", "num_epochs", "max_epochs", "num_train_epochs", "n_epochs")
_LR_DESTS = ("lr", "learning_rate", "base_lr")


def patch_plain() -> None:
    """The hooks: argparse's parsed values, the top-level module calls, backward, and the first
    optimizer step (which stops the script)."""
    from launcher.capture.child.pipeline import patch_pipeline, record_backward, record_call

    _patch_argparse()
    patch_click(STATE["plain_parsers"])
    patch_environ(STATE["script"])
    patch_cuda()
    patch_pipeline()
    _patch_compile()
    autocasts = _patch_autocast()
    #: a top-level call without gradients before the first step (an evaluation: nanoGPT's
    #: estimate_loss runs 2 x eval_iters forwards first), by module and input shapes
    repeats: dict[tuple, Any] = {}
    #: the loop's forwards and zero_grads in order: one after the last forward keeps the last
    #: step's gradients alive through the next forward (pytorch/examples' imagenet)
    order: list[str] = []
    STATE["plain_order"] = order
    for owner in (torch.optim.Optimizer, torch.nn.Module):
        _record_zero_grad(owner, order)
    record_loaders()
    watch_sequence_first()
    calls: dict[int, tuple[torch.nn.Module, tuple, dict, Any]] = {}
    STATE["plain_calls"] = calls
    depth = [0]
    STATE["plain_depth"] = depth  # the pipeline's operations are the loop's own, at depth 0
    module_call = torch.nn.Module.__call__

    def recording_call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not depth[0] and not torch.is_grad_enabled() and not STATE.get("measure"):
            return _repeated(repeats, module_call, self, args, kwargs)
        if depth[0] or not torch.is_grad_enabled():
            return module_call(self, *args, **kwargs)
        if STATE.get("measure"):
            if "measured_model" not in STATE and any(True for _ in self.parameters()):
                STATE["measured_model"] = self
                start_profile()  # from the loop's first forward on
            if "profile" in STATE and any(True for _ in self.parameters()):
                # every module the step calls: their weights are the step's too (a decoder's)
                STATE.setdefault("measured_models", {})[id(self)] = self
            # measured, not captured: nothing of the step is kept, or the measurement would
            # hold a batch and an output the script itself had let go (786,560 B on a ResNet)
            return module_call(self, *args, **kwargs)
        if autocasts and autocasts[-1] is not None:
            STATE["plain_autocast"] = autocasts[-1]  # the loop's forward runs under it
        order.append("forward")
        depth[0] += 1
        try:
            out = module_call(self, *args, **kwargs)
        finally:
            depth[0] -= 1
        calls.pop(id(self), None)
        calls[id(self)] = (self, args, kwargs, out)  # the last call of each, in call order
        record_call(self, args, kwargs, out)  # and all of them, for a step of several modules
        return out

    torch.nn.Module.__call__ = recording_call  # type: ignore[method-assign]
    backward = torch.Tensor.backward

    inside = [False]

    def recording_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if (not inside[0] and not ANSWER["reached"] and not STATE.get("capturing")
                and not STATE.get("measure")):
            # the last backward before the first step: it belongs with the model's last call
            # (an accumulating loop makes several, each of its own micro-batch's output); not
            # one the capture itself runs, nor the re-entry a torch function mode makes
            # (``on_the_cpu.OnTheCpu``: torch's backward hands itself to the mode, which calls
            # it again)
            STATE["plain_loss"] = self
            STATE["plain_frame"] = dict(_caller().f_locals)
            record_backward()
        outer, inside[0] = inside[0], True
        try:
            return backward(self, *args, **kwargs)
        finally:
            inside[0] = outer

    torch.Tensor.backward = recording_backward  # type: ignore[method-assign]
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def first_step(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if STATE.get("measure"):  # two real steps; stopped before the third
            STATE["steps"] = STATE.get("steps", 0) + 1
            if STATE["steps"] < 3 or "profile" not in STATE:
                return
            stop_profile()
            raise Stop
        if not ANSWER["reached"]:
            STATE["capturing"] = True
            _capture(optimizer)
        raise Stop

    register_optimizer_step_pre_hook(first_step)
    # a loop with no optimizer, which updates its weights by hand (word_language_model)
    watch_plain(capture_step)


def _caller() -> Any:
    """The frame that called ``backward``: the loop's, past the capture's own wrappers of it
    (``manual_step`` wraps it again)."""
    frame = sys._getframe(2)
    here = os.path.dirname(__file__)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(here):
        frame = frame.f_back
    return frame


def _record_zero_grad(owner: type, order: list[str]) -> None:
    zero_grad = owner.zero_grad

    def recording_zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not ANSWER["reached"] and not STATE.get("measure"):
            order.append("zero_grad")
        return zero_grad(self, *args, **kwargs)

    owner.zero_grad = recording_zero_grad  # type: ignore[method-assign]


def _grads_through_forward() -> bool:
    """Whether the loop zeroes its gradients after its forward (``output = model(x);
    optimizer.zero_grad(); loss.backward()``): then every forward but the first runs with the
    last step's gradients still allocated."""
    order = STATE.get("plain_order") or []
    if "forward" not in order:
        return False
    last = len(order) - 1 - order[::-1].index("forward")
    return "zero_grad" in order[last + 1:]


def _repeated(repeats: dict[tuple, Any], call: Any, module: torch.nn.Module, args: tuple,
              kwargs: dict) -> Any:
    """A top-level forward without gradients, before the first optimizer step: the first one of
    each module and input signature runs; a repeat returns that first output. An evaluation
    before training (nanoGPT's ``estimate_loss``: 2 x 200 forwards at iteration 0) would
    otherwise cost the capture minutes on a CPU for nothing it needs: the step it traces is
    the one with gradients, and the script's numbers from these calls are not used."""
    signature = (id(module), module.training, tuple(
        (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__
        for t in (*args, *kwargs.values())), tuple(kwargs))
    if signature not in repeats:
        repeats[signature] = call(module, *args, **kwargs)
    return repeats[signature]


def _patch_compile() -> None:
    """``torch.compile`` returns what it was given: the capture needs the model's modules and
    one step's shapes, not kernels (compiling on a CPU took nanoGPT's capture a minute), and the
    trace is of the eager model, as it already unwrapped a compiled one."""
    def no_compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        return model if model is not None else (lambda fn: fn)

    torch.compile = no_compile  # type: ignore[assignment]


def _patch_autocast() -> list[tuple[str, Any, bool] | None]:
    """Record each ``torch.autocast`` the script enters as it asked for it: on a machine without
    a GPU, torch turns ``autocast("cuda")`` off (a warning), and the plan must still know the
    script trains in 16-bit. Returns the stack of those entered, innermost last."""
    cls = torch.amp.autocast_mode.autocast
    init, enter, leave = cls.__init__, cls.__enter__, cls.__exit__
    entered: list[tuple[str, Any, bool] | None] = []

    def asked_init(self: Any, device_type: str, dtype: Any = None, enabled: bool = True,
                   cache_enabled: bool | None = None) -> None:
        try:
            wanted = dtype if dtype is not None else torch.get_autocast_dtype(device_type)
        except (RuntimeError, TypeError):
            wanted = dtype
        self._launch_asked = (str(device_type), wanted, bool(enabled))
        init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def asked_enter(self: Any) -> Any:
        entered.append(getattr(self, "_launch_asked", None))
        return enter(self)

    def asked_exit(self: Any, *exc: Any) -> Any:
        if entered:
            entered.pop()
        return leave(self, *exc)

    cls.__init__ = asked_init  # type: ignore[method-assign]
    cls.__enter__ = asked_enter  # type: ignore[method-assign]
    cls.__exit__ = asked_exit  # type: ignore[method-assign]
    return entered


def _own_precision() -> None:
    """The script's own precision, where its loop's forward ran under a 16-bit autocast: the
    plan's ``bf16_mixed`` (fp16 autocast keeps the same bytes: 16-bit activations, fp32
    weights, gradients and states). A plain script's precision is its code's: no flag sets it."""
    asked = STATE.get("plain_autocast")
    if not asked or not asked[2] or asked[1] not in (torch.bfloat16, torch.float16):
        return
    device, dtype, _ = asked
    how = f"torch.autocast({device!r}, dtype={dtype})"
    if dtype == torch.float16:
        how += ": float16, planned as bf16_mixed (the same bytes)"
    own("precision", "bf16_mixed", how)


def _patch_argparse() -> None:
    parse = argparse.ArgumentParser.parse_known_args
    parsed: list[dict[str, Any]] = []
    STATE["plain_parsers"] = parsed

    def recording_parse(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        namespace, rest = parse(self, *args, **kwargs)
        options = []
        for action in self._actions:
            if not action.option_strings or action.dest == "help":
                continue
            options.append({"options": list(action.option_strings), "dest": action.dest,
                            "type": getattr(action.type, "__name__", None),
                            "default": _plain_value(action.default),
                            "value": _plain_value(getattr(namespace, action.dest, None))})
        parsed.append({"prog": self.prog, "options": options})
        ANSWER["argparse"] = parsed
        return namespace, rest

    argparse.ArgumentParser.parse_known_args = recording_parse  # type: ignore[method-assign]


def _plain_value(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


def _unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP/DataParallel wrapper or a ``torch.compile``'d module."""
    for attribute in ("_orig_mod", "module"):
        inner = getattr(module, attribute, None)
        if isinstance(inner, torch.nn.Module) and type(module).__name__ in (
                "OptimizedModule", "DistributedDataParallel", "DataParallel"):
            return _unwrapped(inner)
    return module


def _capture(optimizer: torch.optim.Optimizer) -> None:
    from launcher.capture.child.pipeline import other_optimizers, pipeline_step

    several = pipeline_step(optimizer, _scaled_from)  # an encoder and a decoder, say
    if several is not None:
        _capture_several(*several)
        return
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    calls = list(STATE.get("plain_calls", {}).values())
    owners = []
    for module, args, kwargs, out in calls:
        mine = {id(p) for p in module.parameters()} & held
        if mine:
            owners.append((len(mine), module, args, kwargs, out))
    if not owners:
        note("no module whose parameters the optimizer holds was called before its first step: "
             "launch cannot trace the script")
        write_answer()
        raise Stop
    owners.sort(key=lambda o: -o[0])
    if len(owners) > 1:
        note(f"{len(owners)} modules hold the optimizer's parameters: the largest "
             f"({type(owners[0][1]).__name__}) is traced")
    count, model, args, kwargs, out = owners[0]
    if count < len(held):
        note("the optimizer holds parameters outside the traced model: their states are not "
             "counted")
    other_optimizers(optimizer, model)  # a GAN's: refused
    save_optimizer(optimizer)
    capture_step(model, args, kwargs, out)


def capture_step(model: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
    """The step of ``model``'s last call (its inputs, the loop's loss of its output), written
    as the capture; the optimizer, if any, is saved already. The batch's rows are along its
    batch dimension (``batch_dim``: dimension 1 of a sequence-first loop's input)."""
    batch = {"args": list(args), "kwargs": dict(kwargs), "extra": {}}
    found = find_batch_dim(batch)
    rows = found.rows
    step: dict[str, Any] = {"kind": "plain"}
    step.update(_loss(out, rows, batch, found.holds))
    if _grads_through_forward():
        step["grads_through_forward"] = True
    # the largest batch the loop's DataLoader makes, where its batches vary in shape
    batch = bounded_inputs(batch)
    if _loop_binds_output(STATE["script"]):
        step["held_output"] = [[bounded_shape(list(t.shape)), str(t.dtype).removeprefix("torch.")]
                               for t in leaves(tensors_of(out))]
    ANSWER["settings"] = {"batch_size": rows}
    finish(_unwrapped(model), batch, step)
    record_batch_dim(batch, found)
    _learn_flags(rows)
    write_answer()


def _capture_several(modules: list[torch.nn.Module], batch: dict[str, Any],
                     step: dict[str, Any]) -> None:
    """Write a step of several modules (``pipeline.pipeline_step``) as ``capture_step`` writes
    one model's: the modules as one ``ModuleList`` (the recipe's ``PipelineStep`` calls them)."""
    if _grads_through_forward():
        step["grads_through_forward"] = True
    if not _loop_binds_output(STATE["script"]):
        step.pop("held_output")
    found = find_batch_dim(batch)
    ANSWER["settings"] = {"batch_size": found.rows}
    stages = torch.nn.ModuleList([_unwrapped(m) for m in modules])
    finish(stages, batch, step)
    record_batch_dim(batch, found)
    ANSWER["pipeline"] = [f"{type(m).__module__}.{type(m).__qualname__}" for m in stages]
    ANSWER["model_class"] = " + ".join(ANSWER["pipeline"])
    _learn_flags(found.rows)
    write_answer()


def _loss(out: Any, rows: int | None, batch: dict[str, Any],
          batched: Callable[[torch.Tensor], bool] | None = None) -> dict[str, Any]:
    """How the loop's loss came from the model's output (``batch["extra"]`` receives the loop's
    tensor the loss function took: one of the batch's, ``batched``, else of its ``rows``)."""
    import torch.nn.functional as F

    loss = STATE.get("plain_loss")
    if not isinstance(loss, torch.Tensor):
        note("the loop's loss was not seen (no backward before the first optimizer step): the "
             "traced step takes the model's own loss, else the sum of its output")
        return {"loss": "model"}
    own_loss = output_loss(out)
    if own_loss is not None and (own_loss is loss or same_values(own_loss, loss)
                                 or _scaled_from(loss, own_loss)):
        return {"loss": "model"}
    if isinstance(out, (list, tuple)):
        for index, value in enumerate(out):
            if isinstance(value, torch.Tensor) and (value is loss or (
                    value.dim() == 0 and (same_values(value, loss)
                                          or _scaled_from(loss, value)))):
                return {"loss": "index", "index": index}
    inputs = {id(t) for t in _tensors(batch)}
    candidates = {name: value for name, value in (STATE.get("plain_frame") or {}).items()
                  if isinstance(value, torch.Tensor) and id(value) not in inputs
                  and not value.requires_grad and value.dim() > 0
                  and (value.shape[0] == rows if batched is None else batched(value))}
    match = match_loss(out, candidates, loss, F)
    if match is not None:
        batch["extra"][match["target"]] = candidates[match["target"]]
        return match
    note("the loop's loss is not the model's own nor a cross-entropy, MSE, L1, NLL or BCE of its "
         "output: the traced step sums the output (the loss's own activations are not counted)")
    return {"loss": "sum"}


#: The autograd nodes of a scalar's scaling: ``loss / gradient_accumulation_steps`` (nanoGPT,
#: every accumulating loop), ``scaler.scale(loss)`` (a GradScaler's multiplication).
_SCALING = ("DivBackward0", "DivBackward1", "MulBackward0", "MulBackward1")


def _scaled_from(loss: torch.Tensor, value: torch.Tensor, depth: int = 3) -> bool:
    """Whether the tensor the loop called ``backward`` on is ``value`` scaled by constants
    (divided by the accumulation steps, multiplied by a GradScaler's scale), read off its
    autograd graph: the same loss, with the same activations, as the model's own."""
    target = value.grad_fn
    if target is None or loss.dim() != 0 or value.dim() != 0:
        return False
    node = loss.grad_fn
    for _ in range(depth):
        if node is None or type(node).__name__ not in _SCALING:
            return False
        parents = [fn for fn, _ in node.next_functions if fn is not None]
        if target in parents:
            return True
        scaled = [fn for fn in parents if type(fn).__name__ in _SCALING]
        node = scaled[0] if len(scaled) == 1 and len(parents) == 1 else None
    return False


def _tensors(value: Any) -> list[torch.Tensor]:
    from launcher.capture.child.capture import leaves

    return leaves(value)


def _learn_flags(rows: int | None) -> None:
    """The script's own flags for the plan's settings: the option whose parsed value is the
    captured batch's rows (by name when several have that value), and, by name alone, its
    accumulation, steps and epochs."""
    options = [o for parser in STATE.get("plain_parsers", ()) for o in parser["options"]]
    options += _configurator_options() + env_options()
    flags: dict[str, str] = {}
    values: dict[str, Any] = {}

    def flag(option: dict[str, Any]) -> str:
        longs = [s for s in option["options"] if s.startswith("--")]
        return (longs or option["options"])[0]

    def norm(option: dict[str, Any]) -> str:
        return option["dest"].replace("-", "_").lower()

    if rows is not None:
        same = [o for o in options if isinstance(o["value"], int)
                and not isinstance(o["value"], bool) and o["value"] == rows]
        named = [o for o in same if norm(o) in _BATCH_DESTS or "batch" in norm(o)]
        ranked = sorted(named, key=lambda o: (_BATCH_DESTS.index(norm(o))
                                              if norm(o) in _BATCH_DESTS else len(_BATCH_DESTS)))
        chosen = None
        if len(ranked) == 1 or (len(ranked) > 1 and norm(ranked[0]) in _BATCH_DESTS and (
                norm(ranked[1]) not in _BATCH_DESTS)):
            chosen = ranked[0]
        elif len(ranked) > 1:
            note(f"several options hold the batch's {rows} rows "
                 f"({', '.join(flag(o) for o in ranked)}): none is taken as the batch flag")
        elif len(same) == 1 and options:
            chosen = same[0]
        elif len(same) > 1:
            note(f"several options hold the batch's {rows} rows "
                 f"({', '.join(flag(o) for o in same)}): none is taken as the batch flag")
        if chosen is not None:
            flags["micro_batch_size"] = flag(chosen)
            values["micro_batch_size"] = rows
    for key, names in (("grad_accum_steps", _ACCUM_DESTS), ("steps", _STEPS_DESTS),
                       ("epochs", _EPOCHS_DESTS)):
        found = [o for o in options if norm(o) in names and isinstance(o["value"], int)
                 and not isinstance(o["value"], bool)]
        if len(found) == 1:
            flags[key] = flag(found[0])
            values[key] = found[0]["value"]
    # the learning rate's option: the plan gives it a pinned --lr only (a schedule makes the
    # optimizer's first lr another number than the option's, and that is the script's own)
    found = [o for o in options if norm(o) in _LR_DESTS and isinstance(o["value"], (int, float))
             and not isinstance(o["value"], bool)]
    if len(found) == 1:
        flags["lr"] = flag(found[0])
        values["lr"] = found[0]["value"]
    ANSWER["flags"] = flags
    ANSWER["flag_values"] = values
    devices = [o for o in options if norm(o) == "device" and isinstance(o["value"], str)
               and o["value"].split(":", 1)[0] == "cuda"]
    if len(devices) == 1:  # how the user runs it where there is no GPU: said, never given
        ANSWER["cpu_flag"] = flag_text(flag(devices[0]), "cpu")
    accum = values.get("grad_accum_steps", 1) if "grad_accum_steps" in flags else 1
    _own_length(flags, values, rows, accum)
    _own_precision()
    if rows is not None:
        how = (flag_text(flags["micro_batch_size"], rows) if "micro_batch_size" in flags
               else f"its batch of {rows} rows")
        own("global_batch_size", rows * accum,
            how + (f" x {flag_text(flags['grad_accum_steps'], accum)}" if accum > 1 else ""))


#: nanoGPT's ``exec(open('configurator.py').read())``: its module-level settings are set from the
#: command line as ``--batch_size=32`` (and its forks keep the line as it is).
_CONFIGURATOR = r"""exec\(\s*open\(\s*['"]([^'"]*configurator\.py)['"]\s*\)\.read\(\)\s*\)"""


def _configurator_options() -> list[dict[str, Any]]:
    """A nanoGPT-style script's settings as options: where it runs a configurator that sets its
    module-level globals from ``--key=value`` arguments, each int global named like a batch,
    accumulation, steps or epochs setting, with its value after the configurator ran, as an
    option ``--key=`` (glued: the configurator splits on ``=`` and reads a bare word as a config
    file)."""
    import re

    script = STATE.get("script")
    main = sys.modules.get("__main__")
    try:
        text = script.read_text(encoding="utf-8") if script is not None else ""
    except (OSError, UnicodeDecodeError):
        return []
    found = re.search(_CONFIGURATOR, text)
    if found is None or main is None:
        return []
    names = (*_BATCH_DESTS, *_ACCUM_DESTS, *_STEPS_DESTS, *_EPOCHS_DESTS)
    return [{"options": [f"--{name}="], "dest": name, "value": value, "default": value,
             "configurator": found.group(1)}
            for name, value in vars(main).items()
            if ((name in names or "batch" in name) and isinstance(value, int)
                or name in _LR_DESTS and isinstance(value, float)
                or name == "device" and isinstance(value, str))
            and not name.startswith("_") and not isinstance(value, bool)]


def _own_length(flags: dict[str, str], values: dict[str, Any], rows: int | None,
                accum: int) -> None:
    """How long the script trains by its own options (``frameworks.own_steps`` counts it): its
    steps option's value, and/or its epochs option's value of the loader's batches. A loop
    counted some other way (nanoGPT's module-level ``max_iters``, ``while True``) is unknown."""
    from launcher.capture.child.capture import length, samples_of

    loader = (STATE.get("loader_batch") or (None, None))[0]
    batches = None
    if loader is not None:
        with contextlib.suppress(TypeError):
            batches = len(loader)
    epochs = values.get("epochs") if "epochs" in flags else None
    max_steps = values.get("steps") if "steps" in flags else None
    if max_steps is None and not (epochs and batches):
        why = ("its epochs option counts the batches of a loader without a length"
               if epochs else "it has no steps or epochs option that launch could read")
        length(unknown=why)
        return
    length(max_steps=max_steps, epochs=epochs, batches=batches, accumulation=accum,
           batch_size=rows, samples=samples_of(loader) if loader is not None else None)


def _loop_binds_output(script: Any) -> bool:
    """Whether a loop of the script that calls ``backward`` binds a call's results to names
    (``output = model(data)``, nanoGPT's ``logits, loss = model(X, Y)``): Python keeps the last
    step's output alive until the next forward returns and the names are bound again."""
    import ast

    try:
        tree = ast.parse(script.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False

    def names(target: ast.expr) -> bool:
        return isinstance(target, ast.Name) or (
            isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts))

    for loop in ast.walk(tree):
        if not isinstance(loop, (ast.For, ast.While)):
            continue
        inner = [n for stmt in loop.body for n in ast.walk(stmt)]
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == "backward" for n in inner) and any(
                isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                and all(names(t) for t in n.targets) for n in inner):
            return True
    return False
