"""What a capture writes: the model with meta weights, one batch, the optimizer's settings.

``finish`` writes them once a framework's hook has the model, the batch and the step's recipe,
with the blocks to checkpoint and the script's plain module-level settings.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from launcher.capture.child.answer import ANSWER, STATE, note, write_answer

#: Tensors other than parameters above this many bytes are pickled as meta tensors too.
_KEEP_BUFFER_BYTES = 16 * 2**20


class MetaPickler(pickle.Pickler):
    """Pickles a model with its weights as meta tensors: no weight is copied or written."""

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return NotImplemented
        from launcher.capture.frameworks import meta_tensor

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
    out: Path = STATE["out"]
    with open(out / "model.pkl", "wb") as handle:
        MetaPickler(handle, protocol=pickle.HIGHEST_PROTOCOL).dump(model)
    params = list({id(p): p for p in model.parameters()}.values())
    ANSWER["parameters"] = sum(p.numel() for p in params)
    ANSWER["trainable_parameters"] = sum(p.numel() for p in params if p.requires_grad)
    ANSWER["model_class"] = f"{type(model).__module__}.{type(model).__qualname__}"
    ANSWER["parameter_bytes"] = sum(p.numel() * p.element_size() for p in params)
    ANSWER["buffer_bytes"] = sum(b.numel() * b.element_size() for b in model.buffers())


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
    note(f"the batch's {type(value).__name__} values are left out of the traced batch")
    return None


def _save_batch(batch: Any) -> Any:
    batch = _plain(batch)
    torch.save(batch, STATE["out"] / "batch.pt")
    sizes = [t.shape[0] for t in leaves(batch) if t.dim() > 0]
    ANSWER["batch_size"] = max(set(sizes), key=sizes.count) if sizes else None
    ANSWER["batch_shapes"] = _shapes(batch)
    return batch


def leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in leaves(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in leaves(v)]
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


def save_optimizer(optimizer: Any) -> None:
    """The optimizer's class and settings, for the recipe's ``build_optimizer``; the first of
    several (Lightning may return a list), with a note."""
    cls = type(optimizer)
    defaults = {}
    for key, value in getattr(optimizer, "defaults", {}).items():
        try:
            defaults[key] = _jsonable(value)
        except TypeError:
            continue
    name = f"{cls.__module__}.{cls.__qualname__}"
    ANSWER["optimizer"] = {"class": name, "defaults": defaults,
                            "name": _OPTIMIZER_NAMES.get(cls.__name__)}
    if ANSWER["optimizer"]["name"]:  # the plan names the optimizer the script builds
        shown = (f"torch.optim.{cls.__name__}" if cls.__module__.startswith("torch.optim.")
                 else name)
        own("optimizer", ANSWER["optimizer"]["name"], shown)
    if isinstance(defaults.get("lr"), (int, float)) and defaults["lr"] > 0:
        own("lr", float(defaults["lr"]), f"{cls.__name__}'s lr")
    if isinstance(defaults.get("weight_decay"), (int, float)) and defaults["weight_decay"] >= 0:
        own("weight_decay", float(defaults["weight_decay"]), f"{cls.__name__}'s weight_decay")


def own(key: str, value: Any, how: str) -> None:
    """One of the script's own settings, as the plan takes it when the user pins none (its
    ``LAUNCH`` defaults, ``launch``) and where it was found (``own``: the plan's origins)."""
    ANSWER.setdefault("launch", {})[key] = value
    ANSWER.setdefault("own", {})[key] = how


def length(*, max_steps: int | None = None, epochs: float | None = None,
           batches: int | None = None, accumulation: int = 1, batch_size: int | None = None,
           samples: int | None = None, unknown: str = "") -> None:
    """How long the script trains by its own settings (``launcher.capture.frameworks.own_steps``
    turns it into the plan's steps): a maximum of optimizer steps, and/or epochs of ``batches``
    batches (``batch_size`` rows each, ``samples`` in all, ``accumulation`` a step);
    ``unknown``: why it cannot be known before it runs."""
    ANSWER["length"] = {k: v for k, v in (
        ("max_steps", max_steps), ("epochs", epochs), ("batches", batches),
        ("accumulation", accumulation), ("batch_size", batch_size), ("samples", samples),
        ("unknown", unknown)) if v not in (None, "")}


def samples_of(loader: Any) -> int | None:
    """The number of samples a DataLoader's dataset holds, when it has a length."""
    try:
        return len(loader.dataset)
    except (TypeError, AttributeError):
        return None


def first_optimizer(value: Any) -> Any:
    """Lightning's ``configure_optimizers`` answer, any of its forms, to its first optimizer."""
    if isinstance(value, torch.optim.Optimizer):
        return value
    if isinstance(value, Mapping):
        return first_optimizer(value.get("optimizer"))
    if isinstance(value, (list, tuple)) and value:
        if len(value) == 2 and isinstance(value[0], (list, tuple)):  # ([opts], [schedulers])
            return first_optimizer(value[0])
        found = [o for o in (first_optimizer(v) for v in value) if o is not None]
        if len(found) > 1:
            note(f"configure_optimizers returns {len(found)} optimizers: the first is traced")
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


def finish(model: torch.nn.Module, batch: Any, step: dict[str, Any]) -> None:
    """Write the capture; ``reached`` only once the model, batch and step are all written."""
    _save_model(model)
    _save_batch(batch)
    ANSWER["step"] = step
    ANSWER["wrap_modules"] = _blocks(model)
    hooks = ["build_model", "example_batch", "training_step"]
    if ANSWER.get("optimizer", {}).get("class"):
        hooks.append("build_optimizer")
    if ANSWER["wrap_modules"]:
        hooks.append("wrap_modules")
    ANSWER["hooks"] = hooks
    ANSWER["constants"] = _constants()
    ANSWER["reached"] = True
    write_answer()


#: How a module-level ``torch.device`` is written in ``constants`` (JSON has no device).
DEVICE_CONSTANT = "torch.device"


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
        elif isinstance(value, torch.device):  # `device = torch.device(...)` a forward reads
            found[name] = {DEVICE_CONSTANT: str(value)}
    return found
