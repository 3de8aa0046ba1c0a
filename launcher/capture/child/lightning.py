"""Lightning: ``Trainer.fit`` is where training starts (of each module's Trainer named)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from launcher.capture.child.answer import ANSWER, STATE, Stop, note
from launcher.capture.child.capture import (
    finish,
    first_optimizer,
    length,
    own,
    samples_of,
    save_optimizer,
)
from launcher.capture.child.data_bound import bounded
from launcher.capture.child.measure import measure


def patch_lightning(modules: list[str]) -> None:
    import importlib

    for name in modules or ["lightning.pytorch"]:
        module = importlib.import_module("lightning.pytorch" if name == "lightning" else name)
        trainer_cls = module.Trainer
        if getattr(trainer_cls.fit, "_launch_capture", False):
            continue
        fit = trainer_cls.fit

        def capture_fit(self: Any, model: Any, *args: Any, _fit: Any = fit, **kwargs: Any
                        ) -> Any:
            if STATE.get("measure"):
                return measure(lambda: _measure_lightning(self, _fit, model, args, kwargs),
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
        note("the LightningModule optimizes manually (automatic_optimization=False): the "
              "traced step runs training_step as it is")
    model.setup("fit")
    if hasattr(model, "configure_model"):
        model.configure_model()
    loader = _lightning_dataloader(model, args, kwargs)
    batch = bounded(loader, next(iter(loader)))  # the largest, where batches vary in shape
    optimizer = first_optimizer(model.configure_optimizers())
    if optimizer is not None:
        save_optimizer(optimizer)
    accum = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
    batch_size = getattr(loader, "batch_size", None)
    clip = getattr(trainer, "gradient_clip_val", None)
    max_steps = int(getattr(trainer, "max_steps", -1))
    max_epochs = getattr(trainer, "max_epochs", None)
    ANSWER["settings"] = {
        "batch_size": batch_size, "accumulate_grad_batches": accum,
        "precision": str(getattr(trainer, "precision", "")),
        "max_steps": max_steps, "max_epochs": max_epochs, "gradient_clip_val": clip,
    }
    if isinstance(batch_size, int):
        own("global_batch_size", batch_size * accum,
            f"the DataLoader's batch_size {batch_size} x accumulate_grad_batches {accum}")
    own("max_grad_norm", float(clip) if clip else None, "Trainer(gradient_clip_val)")
    batches = _batches(trainer, loader)
    epochs = int(max_epochs) if isinstance(max_epochs, int) and max_epochs > 0 else None
    length(max_steps=max_steps if max_steps > 0 else None, epochs=epochs, batches=batches,
           accumulation=accum, batch_size=batch_size if isinstance(batch_size, int) else None,
           samples=samples_of(loader),
           unknown="" if max_steps > 0 or (epochs and batches) else
           "no max_steps, and max_epochs over a loader without a length")
    # Lightning's fetcher fetches a batch ahead only from a loader without a length.
    try:
        ahead = len(loader) is None
    except TypeError:
        ahead = True
    finish(model, batch, {"kind": "lightning", "lookahead": ahead})


def _batches(trainer: Any, loader: Any) -> int | None:
    """The batches of an epoch as Lightning counts them: the loader's length, cut to
    ``limit_train_batches`` (a count, or a fraction of the length)."""
    try:
        batches = len(loader)
    except TypeError:
        return None
    limit = getattr(trainer, "limit_train_batches", None)
    if isinstance(limit, int) and not isinstance(limit, bool):
        batches = min(batches, limit)
    elif isinstance(limit, float):
        batches = int(batches * limit)
    return batches or None


def _measure_lightning(trainer: Any, fit: Callable[..., Any], model: Any, args: tuple,
                       kwargs: dict) -> None:
    trainer.fit_loop.epoch_loop.max_steps = 2
    trainer.limit_val_batches = 0
    fit(trainer, model, *args, **kwargs)
