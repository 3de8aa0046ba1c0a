"""The capture child: runs a framework script as ``__main__`` up to where training would start.

``python -m launcher._framework_child --script train.py --out DIR --kind hf_trainer -- ARGS``
runs ``train.py ARGS`` with hooks on the framework's entry points (``launcher.frameworks`` has
the why). Each hook takes the model, optimizer, batch and settings, writes them to ``DIR`` and
raises ``Stop`` (a BaseException, so the script's own ``except Exception`` cannot swallow it):

- ``capture.json``: what was found (``reached``: the hook ran), the step's recipe
  (``step``), the optimizer's class and settings, the framework's settings, notes;
- ``model.pkl``: the model, pickled with every parameter (and any tensor over 16 MiB) as a
  ``meta`` tensor of its shape and dtype (``launcher.frameworks.meta_tensor``); small buffers keep
  their values (a rotary embedding's frequencies);
- ``batch.pt``: one batch from the framework's own dataloader (after its collator);
- ``config.json``: the config of the largest Hugging Face model built on the way, written as
  soon as it is built, so a script that never reaches training still has an analytic estimate.

``from_pretrained`` without local weights (the child runs offline) builds the model from its
config at random init and says so in a note. With ``--measure`` the hook instead lets the
framework train for two optimizer steps under the CPU profiler and writes ``measure.json``: the
framework's own step, which the traced estimate is checked against.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import runpy
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

#: Tensors other than parameters above this many bytes are pickled as meta tensors too.
_KEEP_BUFFER_BYTES = 16 * 2**20
_ANSWER: dict[str, Any] = {"reached": False, "notes": []}
#: from_pretrained's arguments about loading weights, not about the config.
_MODEL_ONLY = {"torch_dtype", "dtype", "attn_implementation", "device_map", "low_cpu_mem_usage",
               "quantization_config", "use_safetensors", "weights_only", "state_dict",
               "ignore_mismatched_sizes", "output_loading_info", "tp_plan", "key_mapping",
               "trust_remote_code", "local_files_only", "token", "force_download"}
_STATE: dict[str, Any] = {}


class Stop(BaseException):
    """Training would start here: the capture has what it needs, the script stops."""


def _note(text: str) -> None:
    if text not in _ANSWER["notes"]:
        _ANSWER["notes"].append(text)


def _write_answer() -> None:
    out: Path = _STATE["out"]
    tmp = out / ".capture.json.tmp"
    tmp.write_text(json.dumps(_ANSWER, default=str, indent=1), encoding="utf-8")
    os.replace(tmp, out / "capture.json")


# --- what is written -------------------------------------------------------------------------


class _MetaPickler(pickle.Pickler):
    """Pickles a model with its weights as meta tensors: no weight is copied or written."""

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return NotImplemented
        from launcher.frameworks import meta_tensor

        shape = tuple(obj.shape)
        if isinstance(obj, torch.nn.Parameter):
            return meta_tensor, (shape, obj.dtype, obj.requires_grad, True)
        if obj.device.type == "meta" or obj.numel() * obj.element_size() > _KEEP_BUFFER_BYTES:
            return meta_tensor, (shape, obj.dtype, False, False)
        if obj.grad_fn is not None or obj.device.type != "cpu":
            return obj.detach().cpu().clone().__reduce_ex__(2)
        return NotImplemented


def _save_model(model: torch.nn.Module) -> None:
    """``model.pkl``, and the model's size for the answer (the unwrapped module's)."""
    out: Path = _STATE["out"]
    with open(out / "model.pkl", "wb") as handle:
        _MetaPickler(handle, protocol=pickle.HIGHEST_PROTOCOL).dump(model)
    params = list({id(p): p for p in model.parameters()}.values())
    _ANSWER["parameters"] = sum(p.numel() for p in params)
    _ANSWER["trainable_parameters"] = sum(p.numel() for p in params if p.requires_grad)
    _ANSWER["model_class"] = f"{type(model).__module__}.{type(model).__qualname__}"
    _ANSWER["parameter_bytes"] = sum(p.numel() * p.element_size() for p in params)
    _ANSWER["buffer_bytes"] = sum(b.numel() * b.element_size() for b in model.buffers())


def _plain(value: Any) -> Any:
    """A batch as plain containers of CPU tensors (a BatchEncoding is a Mapping, not a dict)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return tuple(_plain(v) for v in value)  # a namedtuple unpacks as a tuple
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    _note(f"the batch's {type(value).__name__} values are left out of the traced batch")
    return None


def _save_batch(batch: Any) -> Any:
    batch = _plain(batch)
    torch.save(batch, _STATE["out"] / "batch.pt")
    sizes = [t.shape[0] for t in _leaves(batch) if t.dim() > 0]
    _ANSWER["batch_size"] = max(set(sizes), key=sizes.count) if sizes else None
    _ANSWER["batch_shapes"] = _shapes(batch)
    return batch


def _leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _leaves(v)]
    return []


def _shapes(value: Any) -> Any:
    """The batch's structure, shapes and dtypes (the format of the templates' batch_shapes)."""
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, Mapping):
        return {"dict": {k: _shapes(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"list": [_shapes(v) for v in value]}
    return {"value": value}


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return list(value)
    raise TypeError(type(value).__name__)


#: The launcher's optimizer names, by the optimizer class a framework built.
_OPTIMIZER_NAMES = {"AdamW": "adamw", "Adam": "adamw", "SGD": "sgd", "Adafactor": "adafactor",
                    "AdamW8bit": "adam8bit", "Adam8bit": "adam8bit", "PagedAdamW8bit": "adam8bit"}


def _save_optimizer(optimizer: Any) -> None:
    """The optimizer's class and settings, for the recipe's ``build_optimizer``; the first of
    several (Lightning may return a list), with a note."""
    cls = type(optimizer)
    defaults = {}
    for key, value in getattr(optimizer, "defaults", {}).items():
        try:
            defaults[key] = _jsonable(value)
        except TypeError:
            continue
    _ANSWER["optimizer"] = {"class": f"{cls.__module__}.{cls.__qualname__}",
                            "defaults": defaults, "name": _OPTIMIZER_NAMES.get(cls.__name__)}
    launch = _ANSWER.setdefault("launch", {})
    if isinstance(defaults.get("lr"), (int, float)) and defaults["lr"] > 0:
        launch["lr"] = float(defaults["lr"])
    if isinstance(defaults.get("weight_decay"), (int, float)) and defaults["weight_decay"] >= 0:
        launch["weight_decay"] = float(defaults["weight_decay"])


def _first_optimizer(value: Any) -> Any:
    """Lightning's ``configure_optimizers`` answer, any of its forms, to its first optimizer."""
    if isinstance(value, torch.optim.Optimizer):
        return value
    if isinstance(value, Mapping):
        return _first_optimizer(value.get("optimizer"))
    if isinstance(value, (list, tuple)) and value:
        if len(value) == 2 and isinstance(value[0], (list, tuple)):  # ([opts], [schedulers])
            return _first_optimizer(value[0])
        found = [o for o in (_first_optimizer(v) for v in value) if o is not None]
        if len(found) > 1:
            _note(f"configure_optimizers returns {len(found)} optimizers: the first is traced")
        return found[0] if found else None
    return None


def _blocks(model: torch.nn.Module) -> list[str]:
    """Names of the block classes to checkpoint (and shard): those a Hugging Face model names as
    ``_no_split_modules`` that repeat in a ModuleList, else the largest repeated block class."""
    named = set(getattr(model, "_no_split_modules", None) or ())
    repeated: dict[type, int] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1:
            for block in module:
                repeated[type(block)] = repeated.get(type(block), 0) + sum(
                    p.numel() for p in block.parameters())
    blocks = [t for t in repeated if t.__name__ in named]
    if not blocks and repeated:
        best = max(repeated, key=lambda t: repeated[t])
        blocks = [best] if repeated[best] else []
    return [f"{t.__module__}.{t.__qualname__}" for t in blocks]


def _finish(model: torch.nn.Module, batch: Any, step: dict[str, Any]) -> None:
    """Write the capture; ``reached`` only once the model, batch and step are all written."""
    _save_model(model)
    _save_batch(batch)
    _ANSWER["step"] = step
    _ANSWER["wrap_modules"] = _blocks(model)
    hooks = ["build_model", "example_batch", "training_step"]
    if _ANSWER.get("optimizer", {}).get("class"):
        hooks.append("build_optimizer")
    if _ANSWER["wrap_modules"]:
        hooks.append("wrap_modules")
    _ANSWER["hooks"] = hooks
    _ANSWER["constants"] = _constants()
    _ANSWER["reached"] = True
    _write_answer()


def _constants() -> dict[str, Any]:
    """The script's module-level names bound to plain values when training started
    (``SCRATCH = 96 * 2**20``, ``AFTER = int(os.environ[...])``): the recipe rebuilds the script's
    classes without running the script, and their code may read these."""
    main = sys.modules.get("__main__")
    found: dict[str, Any] = {}
    for name, value in vars(main).items() if main is not None else ():
        if name.startswith("__"):
            continue
        if isinstance(value, str) and len(value) > 4096:
            continue  # a text the script read, not a setting
        if isinstance(value, (bool, int, float, str)) or value is None or (
                isinstance(value, (tuple, list)) and len(value) <= 64
                and all(isinstance(v, (bool, int, float)) for v in value)):
            found[name] = value
    return found


# --- Hugging Face -----------------------------------------------------------------------------


def _patch_transformers() -> None:
    """Trainer.train is where training starts; from_pretrained without local weights is served
    from the config (offline); every model built leaves its config for the analytic estimate."""
    import transformers
    from transformers import PreTrainedModel

    post_init = PreTrainedModel.post_init

    def recording_post_init(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = post_init(self, *args, **kwargs)
        try:
            count = sum(p.numel() for p in self.parameters())
            if count >= _STATE.get("config_parameters", -1):
                _STATE["config_parameters"] = count
                (_STATE["out"] / "config.json").write_text(
                    self.config.to_json_string(use_diff=False), encoding="utf-8")
        except Exception:  # noqa: BLE001 - a config that does not serialise: no analytic
            pass
        return out

    PreTrainedModel.post_init = recording_post_init  # type: ignore[method-assign]

    def offline(original: Callable[..., Any], build: Callable[..., Any]) -> Callable[..., Any]:
        def from_pretrained(cls: Any, name: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original(cls, name, *args, **kwargs)
            except OSError as exc:
                config = kwargs.get("config")
                # what from_pretrained would apply to the config (num_labels=2, say)
                settings = {k: v for k, v in kwargs.items()
                            if k not in _MODEL_ONLY and k != "config"}
                if config is None or isinstance(config, (str, os.PathLike)):
                    try:
                        config, _ = transformers.AutoConfig.from_pretrained(
                            config or name, return_unused_kwargs=True, **settings)
                    except Exception:  # noqa: BLE001 - no config either: the script fails
                        _note(f"no weights or config for '{name}' here (launch runs the script "
                              "offline): give a local folder, or --model-config")
                        raise exc from None
                else:
                    for key, value in settings.items():
                        if hasattr(config, key):
                            setattr(config, key, value)
                _note(f"no local weights for '{name}' (launch runs the script offline): the "
                      "model is built from its config at random init; the memory is the same")
                return build(cls, config, kwargs)
        return classmethod(from_pretrained)  # type: ignore[return-value]

    keep = ("torch_dtype", "dtype", "attn_implementation")

    def build_direct(cls: Any, config: Any, kwargs: dict[str, Any]) -> Any:
        return cls._from_config(config, **{k: v for k, v in kwargs.items() if k in keep})

    def build_auto(cls: Any, config: Any, kwargs: dict[str, Any]) -> Any:
        return cls.from_config(config, **{k: v for k, v in kwargs.items() if k in keep})

    PreTrainedModel.from_pretrained = offline(  # type: ignore[method-assign]
        PreTrainedModel.from_pretrained.__func__, build_direct)
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    _BaseAutoModelClass.from_pretrained = offline(  # type: ignore[method-assign]
        _BaseAutoModelClass.from_pretrained.__func__, build_auto)

    from transformers import Trainer

    train = Trainer.train

    def capture_train(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _STATE.get("measure"):
            return _measure(lambda: _measure_hf(self, train, args, kwargs), self.model)
        _capture_hf(self)
        raise Stop

    Trainer.train = capture_train  # type: ignore[method-assign]


def _capture_hf(trainer: Any) -> None:
    from transformers import Trainer

    args = trainer.args
    if type(trainer).compute_loss is not Trainer.compute_loss:
        _note(f"{type(trainer).__name__} overrides compute_loss: the traced step takes the "
              "model's own loss")
    try:
        _save_optimizer(trainer.create_optimizer())
    except Exception as exc:  # noqa: BLE001 - bitsandbytes missing, say: the plan's optimizer
        _note(f"the Trainer's optimizer ({args.optim}) could not be built here ({exc}): the "
              "plan's optimizer is traced")
        name = str(args.optim)
        _ANSWER["optimizer"] = {"class": None, "defaults": {},
                                "name": "adam8bit" if "8bit" in name else (
                                    "adafactor" if "adafactor" in name else None)}
    batch = next(iter(trainer.get_train_dataloader()))
    accum = int(args.gradient_accumulation_steps)
    _ANSWER["settings"] = {
        "per_device_train_batch_size": int(args.per_device_train_batch_size),
        "gradient_accumulation_steps": accum, "learning_rate": float(args.learning_rate),
        "max_steps": int(args.max_steps), "optim": str(getattr(args.optim, "value", args.optim)),
        "bf16": bool(args.bf16),
        "fp16": bool(args.fp16), "gradient_checkpointing": bool(args.gradient_checkpointing),
        "max_grad_norm": args.max_grad_norm,
    }
    launch = _ANSWER.setdefault("launch", {})
    launch["global_batch_size"] = int(args.per_device_train_batch_size) * accum
    launch["lr"] = float(args.learning_rate)
    launch["weight_decay"] = float(args.weight_decay)
    launch["max_grad_norm"] = float(args.max_grad_norm) if args.max_grad_norm else None
    if int(args.max_steps) > 0:
        launch["steps"] = int(args.max_steps)
    # the Trainer's loader is accelerate's DataLoaderShard, which fetches a batch ahead
    _finish(trainer.model, batch, {"kind": "hf_loss", "lookahead": True})


def _measure_hf(trainer: Any, train: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    trainer.args.max_steps = 2
    trainer.args.output_dir = str(_STATE["out"] / "trainer")  # nothing left in the script's
    trainer.args.save_strategy = "no"
    trainer.args.eval_strategy = "no"
    trainer.args.report_to = []
    train(trainer, *args, **kwargs)


# --- Lightning --------------------------------------------------------------------------------


def _patch_lightning(modules: list[str]) -> None:
    import importlib

    for name in modules or ["lightning.pytorch"]:
        module = importlib.import_module("lightning.pytorch" if name == "lightning" else name)
        trainer_cls = module.Trainer
        if getattr(trainer_cls.fit, "_launch_capture", False):
            continue
        fit = trainer_cls.fit

        def capture_fit(self: Any, model: Any, *args: Any, _fit: Any = fit, **kwargs: Any
                        ) -> Any:
            if _STATE.get("measure"):
                return _measure(lambda: _measure_lightning(self, _fit, model, args, kwargs),
                                model)
            _capture_lightning(self, model, args, kwargs)
            raise Stop

        capture_fit._launch_capture = True  # type: ignore[attr-defined]
        trainer_cls.fit = capture_fit


def _lightning_dataloader(model: Any, args: tuple, kwargs: dict) -> Any:
    """The train dataloader fit would use: given, from the datamodule, or the module's own."""
    loaders = kwargs.get("train_dataloaders", args[0] if args else None)
    datamodule = kwargs.get("datamodule")
    if loaders is not None and hasattr(loaders, "train_dataloader") and not hasattr(
            loaders, "__iter__"):
        datamodule, loaders = loaders, None  # fit(model, datamodule) positionally
    if loaders is None:
        source = datamodule if datamodule is not None else model
        if datamodule is not None:
            datamodule.prepare_data()
            datamodule.setup("fit")
        loaders = source.train_dataloader()
    if isinstance(loaders, Mapping):
        loaders = next(iter(loaders.values()))
    elif isinstance(loaders, (list, tuple)):
        loaders = loaders[0]
    return loaders


def _capture_lightning(trainer: Any, model: Any, args: tuple, kwargs: dict) -> None:
    if not getattr(model, "automatic_optimization", True):
        _note("the LightningModule optimizes manually (automatic_optimization=False): the "
              "traced step runs training_step as it is")
    model.setup("fit")
    if hasattr(model, "configure_model"):
        model.configure_model()
    loader = _lightning_dataloader(model, args, kwargs)
    batch = next(iter(loader))
    optimizer = _first_optimizer(model.configure_optimizers())
    if optimizer is not None:
        _save_optimizer(optimizer)
    accum = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
    batch_size = getattr(loader, "batch_size", None)
    clip = getattr(trainer, "gradient_clip_val", None)
    _ANSWER["settings"] = {
        "batch_size": batch_size, "accumulate_grad_batches": accum,
        "precision": str(getattr(trainer, "precision", "")),
        "max_steps": int(getattr(trainer, "max_steps", -1)), "gradient_clip_val": clip,
    }
    launch = _ANSWER.setdefault("launch", {})
    if isinstance(batch_size, int):
        launch["global_batch_size"] = batch_size * accum
    launch["max_grad_norm"] = float(clip) if clip else None
    if int(getattr(trainer, "max_steps", -1)) > 0:
        launch["steps"] = int(trainer.max_steps)
    # Lightning's fetcher fetches a batch ahead only from a loader without a length.
    try:
        ahead = len(loader) is None
    except TypeError:
        ahead = True
    _finish(model, batch, {"kind": "lightning", "lookahead": ahead})


def _measure_lightning(trainer: Any, fit: Callable[..., Any], model: Any, args: tuple,
                       kwargs: dict) -> None:
    trainer.fit_loop.epoch_loop.max_steps = 2
    trainer.limit_val_batches = 0
    fit(trainer, model, *args, **kwargs)


# --- accelerate -------------------------------------------------------------------------------


def _patch_accelerate() -> None:
    """prepare: the model, optimizer and dataloader; the first backward: how the loop made its
    loss (the model's own, or a loss function of the model's output the values identify)."""
    from accelerate import Accelerator
    from accelerate import data_loader as accel_data

    prepare, backward = Accelerator.prepare, Accelerator.backward

    def capture_prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _STATE.get("measure"):
            out = prepare(self, *args, **kwargs)
            model = next((o for o in args if isinstance(o, torch.nn.Module)), None)
            if model is not None and "profile" not in _STATE:
                _STATE["measured_model"] = model
                _start_profile()  # from the loop's first forward on
            return out
        if "prepared" not in _STATE:
            _capture_prepare(self, args)
        return prepare(self, *args, **kwargs)

    def capture_backward(self: Any, loss: Any, **kwargs: Any) -> Any:
        if _STATE.get("measure"):
            _STATE["backwards"] = _STATE.get("backwards", 0) + 1
            if _STATE["backwards"] == 3 and "profile" in _STATE:  # two steps, a third forward
                _stop_profile()
                raise Stop
            return backward(self, loss, **kwargs)
        if "prepared" in _STATE:
            _capture_loss(loss)
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
                _STATE["last_batch"] = batch
                yield batch

        cls.__iter__ = recording_iter


def _capture_prepare(accelerator: Any, objects: tuple) -> None:
    from torch.utils.data import DataLoader

    model = next((o for o in objects if isinstance(o, torch.nn.Module)), None)
    optimizer = next((o for o in objects if isinstance(o, torch.optim.Optimizer)), None)
    loader = next((o for o in objects if isinstance(o, DataLoader)), None)
    if model is None or loader is None:
        return  # prepared in parts: wait for the call that has the model and the data
    _STATE["prepared"] = model
    if optimizer is not None:
        _save_optimizer(optimizer)
    accum = int(getattr(accelerator, "gradient_accumulation_steps", 1) or 1)
    _ANSWER["settings"] = {"batch_size": loader.batch_size, "gradient_accumulation_steps": accum,
                           "mixed_precision": str(getattr(accelerator, "mixed_precision", ""))}
    if isinstance(loader.batch_size, int):
        _ANSWER.setdefault("launch", {})["global_batch_size"] = loader.batch_size * accum
    _ANSWER.setdefault("launch", {})["max_grad_norm"] = None  # a loop clips only if it says so
    # Written now: a loop that never reaches backward is still traced, with the model's loss.
    _finish(model, next(iter(loader)),  # DataLoaderShard fetches a batch ahead of the loop
            {"kind": "model_output", "call": {"style": "auto"}, "lookahead": True})
    calls: list[tuple[tuple, dict, Any]] = []
    _STATE["calls"] = calls  # the last forward's inputs and output (hooked after pickling)
    model.register_forward_hook(
        lambda _m, a, k, out: calls.__setitem__(slice(None), [(a, k, out)]), with_kwargs=True)
    _note("the loop's loss was not seen (no backward before the script stopped): the traced step "
          "takes the model's own loss, else the sum of its output")
    _write_answer()


def _capture_loss(loss: torch.Tensor) -> None:
    """How the loop's loss came from the last forward: the same tensor as the output's loss, or
    one of a few loss functions of the output and a tensor of the batch, matched by value."""
    import torch.nn.functional as F

    notes = _ANSWER["notes"]
    stale = [n for n in notes if n.startswith("the loop's loss was not seen")]
    for n in stale:
        notes.remove(n)
    calls = _STATE.get("calls") or []
    batch = _STATE.get("last_batch")
    if not calls or batch is None:
        _note("the loop's loss could not be related to the model's output: the traced step "
              "takes the model's own loss, else the sum of its output")
        _write_answer()
        return
    args, kwargs, out = calls[0]
    step: dict[str, Any] = {"kind": "model_output", "call": _call_style(batch, args, kwargs),
                            "lookahead": True}
    own = _output_loss(out)
    if own is not None and (own is loss or _same(own, loss)):
        step["loss"] = "model"
    else:
        match = _match_loss(out, batch, loss, F)
        if match is None:
            _note("the loop's loss is not the model's own nor a cross-entropy, MSE, L1, NLL or "
                  "BCE of its output: the traced step sums the output (the loss's own "
                  "activations are not counted)")
            step["loss"] = "sum"
        else:
            step.update(match)
    if _loop_binds_output(_STATE["script"]):
        step["held_output"] = [[list(t.shape), str(t.dtype).removeprefix("torch.")]
                               for t in _leaves(_tensors_of(out))]
    _ANSWER["step"] = step
    _write_answer()


def _tensors_of(out: Any) -> Any:
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


def _output_loss(out: Any) -> torch.Tensor | None:
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    return loss if isinstance(loss, torch.Tensor) else None


def _output_tensor(out: Any) -> tuple[torch.Tensor | None, str]:
    if isinstance(out, torch.Tensor):
        return out, "tensor"
    logits = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits, "logits"
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], torch.Tensor):
        return out[0], "first"
    return None, "none"


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.detach().float(), b.detach().float(),
                                                      rtol=1e-5, atol=1e-6))


def _match_loss(out: Any, batch: Any, loss: torch.Tensor, F: Any) -> dict[str, Any] | None:
    output, which = _output_tensor(out)
    if output is None:
        return None
    targets: list[tuple[Any, torch.Tensor]] = []
    if isinstance(batch, Mapping):
        targets = [(k, v) for k, v in batch.items() if isinstance(v, torch.Tensor)]
    elif isinstance(batch, (list, tuple)):
        targets = [(i, v) for i, v in enumerate(batch) if isinstance(v, torch.Tensor)]
    functions = ("cross_entropy", "mse_loss", "l1_loss", "nll_loss",
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
                    if _same(got, loss):
                        return {"loss": "function", "function": name, "output": which,
                                "target": key, "flatten": flatten}
    return None


def _apply_loss(F: Any, name: str, output: torch.Tensor, target: torch.Tensor,
                flatten: bool) -> torch.Tensor:
    """The same as the recipe's ``_loss_function`` (launcher/_framework_recipe.py)."""
    if flatten:
        output, target = output.reshape(-1, output.shape[-1]), target.reshape(-1)
    if name in ("mse_loss", "l1_loss", "binary_cross_entropy_with_logits"):
        target = target.to(output.dtype)
    return getattr(F, name)(output, target)


# --- measuring the framework's own step -------------------------------------------------------


def _start_profile() -> None:
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    prof.__enter__()
    _STATE["profile"] = prof
    _STATE["t0"] = time.perf_counter()


def _stop_profile() -> None:
    from launcher.estimate._measure import cpu_allocation_events

    prof = _STATE.pop("profile")
    prof.__exit__(None, None, None)
    live = peak = 0
    for event in cpu_allocation_events(prof):
        live += event.alloc_size
        peak = max(peak, live)
    model = _STATE["measured_model"]
    base = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}
               .values()) + sum(b.numel() * b.element_size() for b in model.buffers())
    answer = {"peak_allocated": base + peak, "above_weights": peak, "weights": base,
              "wall_s": time.perf_counter() - _STATE["t0"]}
    (_STATE["out"] / "measure.json").write_text(json.dumps(answer), encoding="utf-8")


def _measure(run: Callable[[], None], model: Any) -> None:
    _STATE["measured_model"] = model
    _start_profile()
    try:
        run()
    finally:
        if "profile" in _STATE:
            _stop_profile()
    raise Stop


# --- entry ------------------------------------------------------------------------------------


def _user_line(exc: BaseException, script: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve().parent == script.parent]
    return f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


def _hardware() -> dict[str, Any]:
    from launcher.recipe import _hardware as hardware

    return hardware()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher._framework_child")
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kind", required=True)
    parser.add_argument("--modules", default="")
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--no-hardware", action="store_true")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    script: Path = options.script.resolve()
    script_args = options.args[1:] if options.args[:1] == ["--"] else options.args
    _STATE.update(out=options.out, measure=options.measure, script=script)
    _ANSWER.update(framework=options.kind, script=str(script), script_dir=str(script.parent),
                   argv=script_args)
    if not options.no_hardware:
        _ANSWER["hardware"] = _hardware()
    _write_answer()
    modules = [m for m in options.modules.split(",") if m]
    where = {"hf_trainer": "Trainer.train()", "lightning": "Trainer.fit()",
             "accelerate": "Accelerator.prepare()"}[options.kind]
    sys.argv = [str(script), *script_args]
    sys.path.insert(0, str(script.parent))
    try:
        if options.kind == "hf_trainer" or "transformers" in script.read_text(encoding="utf-8"):
            _patch_transformers()
        if options.kind == "lightning":
            _patch_lightning(modules)
        elif options.kind == "accelerate":
            _patch_accelerate()
    except ImportError as exc:
        _note(f"{options.kind} cannot be imported here ({exc}): install it to trace the script")
        _write_answer()
        return 0
    try:
        runpy.run_path(str(script), run_name="__main__")
        if not _ANSWER["reached"]:
            _note(f"{script.name} ended without reaching {where}")
    except Stop:
        pass
    except SystemExit as exc:
        if not _ANSWER["reached"]:
            _note(f"{script.name} exited (status {exc.code}) before reaching {where}")
    except BaseException as exc:  # noqa: BLE001 - the user's error, as one line
        if not _ANSWER["reached"]:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            _note(f"{script.name} raised {type(exc).__name__}: {first}{_user_line(exc, script)}"
                  f" before reaching {where}")
    _write_answer()
    sys.stdout.flush()
    os._exit(0)  # the script's threads and atexit hooks (loggers, pools) are not waited for


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
