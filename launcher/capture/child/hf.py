"""Hugging Face: ``Trainer.train`` is where training starts; ``from_pretrained`` runs offline.

Also patched whenever a script mentions transformers: every model built leaves its config for the
analytic estimate, and ``from_pretrained`` without local weights builds from the config.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from launcher.capture.child.answer import ANSWER, STATE, Stop, note
from launcher.capture.child.capture import finish, length, own, samples_of, save_optimizer
from launcher.capture.child.data_bound import bounded
from launcher.capture.child.measure import measure

#: from_pretrained's arguments about loading weights, not about the config.
_MODEL_ONLY = {"torch_dtype", "dtype", "attn_implementation", "device_map", "low_cpu_mem_usage",
               "quantization_config", "use_safetensors", "weights_only", "state_dict",
               "ignore_mismatched_sizes", "output_loading_info", "tp_plan", "key_mapping",
               "trust_remote_code", "local_files_only", "token", "force_download"}


def patch_transformers() -> None:
    """Trainer.train is where training starts; from_pretrained without local weights is served
    from the config (offline); every model built leaves its config for the analytic estimate."""
    import transformers
    from transformers import PreTrainedModel

    post_init = PreTrainedModel.post_init

    def recording_post_init(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = post_init(self, *args, **kwargs)
        try:
            count = sum(p.numel() for p in self.parameters())
            if count >= STATE.get("config_parameters", -1):
                STATE["config_parameters"] = count
                (STATE["out"] / "config.json").write_text(
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
                        note(f"no weights or config for '{name}' here (launch runs the script "
                              "offline): give a local folder, or --model-config")
                        raise exc from None
                else:
                    for key, value in settings.items():
                        if hasattr(config, key):
                            setattr(config, key, value)
                note(f"no local weights for '{name}' (launch runs the script offline): the "
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
        if STATE.get("measure"):
            return measure(lambda: _measure_hf(self, train, args, kwargs), self.model)
        _capture_hf(self)
        raise Stop

    Trainer.train = capture_train  # type: ignore[method-assign]


def _capture_hf(trainer: Any) -> None:
    from transformers import Trainer

    args = trainer.args
    if type(trainer).compute_loss is not Trainer.compute_loss:
        note(f"{type(trainer).__name__} overrides compute_loss: the traced step takes the "
              "model's own loss")
    try:
        save_optimizer(trainer.create_optimizer())
    except Exception as exc:  # noqa: BLE001 - bitsandbytes missing, say: the plan's optimizer
        note(f"the Trainer's optimizer ({args.optim}) could not be built here ({exc}): the "
              "plan's optimizer is traced")
        name = str(args.optim)
        ANSWER["optimizer"] = {"class": None, "defaults": {},
                                "name": "adam8bit" if "8bit" in name else (
                                    "adafactor" if "adafactor" in name else None)}
        if ANSWER["optimizer"]["name"]:
            own("optimizer", ANSWER["optimizer"]["name"], f"TrainingArguments.optim {name}")
    loader = trainer.get_train_dataloader()
    batch = bounded(loader, next(iter(loader)))  # the largest, where batches vary in shape
    accum = int(args.gradient_accumulation_steps)
    micro = int(args.per_device_train_batch_size)
    ANSWER["settings"] = {
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accum, "learning_rate": float(args.learning_rate),
        "max_steps": int(args.max_steps), "num_train_epochs": float(args.num_train_epochs),
        "optim": str(getattr(args.optim, "value", args.optim)), "bf16": bool(args.bf16),
        "fp16": bool(args.fp16), "gradient_checkpointing": bool(args.gradient_checkpointing),
        "max_grad_norm": args.max_grad_norm,
    }
    own("global_batch_size", micro * accum,
        f"per_device_train_batch_size {micro} x gradient_accumulation_steps {accum}")
    own("lr", float(args.learning_rate), "TrainingArguments.learning_rate")
    own("weight_decay", float(args.weight_decay), "TrainingArguments.weight_decay")
    own("max_grad_norm", float(args.max_grad_norm) if args.max_grad_norm else None,
        "TrainingArguments.max_grad_norm")
    # The Trainer's own length: max_steps when set, else its epochs over the loader
    # (Trainer.set_initial_training_values: ceil(epochs x ceil(batches / accumulation))).
    if int(args.max_steps) > 0:
        length(max_steps=int(args.max_steps))
    else:
        try:
            batches = len(loader)
        except TypeError:
            batches = None
        length(epochs=float(args.num_train_epochs), batches=batches, accumulation=accum,
               batch_size=micro, samples=samples_of(loader),
               unknown="" if batches else "epochs of a dataset without a length")
    # the Trainer's loader is accelerate's DataLoaderShard, which fetches a batch ahead
    finish(trainer.model, batch, {"kind": "hf_loss", "lookahead": True})


def _measure_hf(trainer: Any, train: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    trainer.args.max_steps = 2
    trainer.args.output_dir = str(STATE["out"] / "trainer")  # nothing left in the script's
    trainer.args.save_strategy = "no"
    trainer.args.eval_strategy = "no"
    trainer.args.report_to = []
    train(trainer, *args, **kwargs)
