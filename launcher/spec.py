"""What the user asked for: command-line flags, the recipe's ``LAUNCH`` dict and a config file.

Validated once, here, so everything downstream can trust it. Precedence, highest first: flags,
environment variables (provider settings only, ``LAUNCH_REGION`` ...), the config file
(``launch.toml`` or ``[tool.launch]`` in ``pyproject.toml``), the recipe's ``LAUNCH``, defaults.
Flags and environment variables are resolved by click; this module adds the config file (as
click's ``default_map``) and the ``LAUNCH`` layer.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.plan.plan import OPTIMIZERS, PRECISIONS, STRATEGIES
from launcher.recipe import ScriptInfo
from launcher.status import UsageError

PROVIDERS = ("local", "vertex", "sagemaker")

#: Keys a recipe's LAUNCH dict may set, with their types (bool before int: bool is an int).
LAUNCH_KEYS: dict[str, type | tuple[type, ...]] = {
    "global_batch_size": int, "micro_batch_size": int, "steps": int, "lr": (float, int),
    "seq_len": int, "precision": str, "optimizer": str, "activation_checkpointing": bool,
    "log_every": int, "checkpoint_every": int, "seed": int,
    "max_grad_norm": (float, int, type(None)), "weight_decay": (float, int),
}
DEFAULTS: dict[str, Any] = {
    "global_batch_size": 8, "steps": 100, "lr": 3e-4, "log_every": 1, "checkpoint_every": 50,
    "seed": 0, "max_grad_norm": 1.0, "weight_decay": 0.0,
}


@dataclass(frozen=True)
class Spec:
    """One launch request, fully resolved. ``None`` pins mean "the planner chooses"."""

    script: Path
    mode: str
    provider: str = "local"
    # Pins.
    strategy: str | None = None
    machine: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    micro_batch_size: int | None = None
    global_batch_size: int = DEFAULTS["global_batch_size"]
    precision: str | None = None
    optimizer: str | None = None
    activation_checkpointing: bool | None = None
    seq_len: int | None = None
    steps: int = DEFAULTS["steps"]
    lr: float = DEFAULTS["lr"]
    # Training loop settings that are not part of a plan.
    log_every: int = DEFAULTS["log_every"]
    checkpoint_every: int = DEFAULTS["checkpoint_every"]
    seed: int = DEFAULTS["seed"]
    max_grad_norm: float | None = DEFAULTS["max_grad_norm"]
    weight_decay: float = DEFAULTS["weight_decay"]
    # A model's description, when there is no recipe to trace (or to size a larger variant).
    params: int | None = None
    model_config: Path | None = None
    layers: int | None = None
    hidden_size: int | None = None
    heads: int | None = None
    vocab_size: int | None = None
    # Provider settings.
    region: str | None = None
    bucket: str | None = None
    project: str | None = None
    service_account: str | None = None
    role: str | None = None
    spot: bool = False
    max_attempts: int = 3
    budget: float | None = None
    memory_limit: int | None = None
    image: str | None = None
    timeout: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["script"] = str(self.script)
        data["model_config"] = str(self.model_config) if self.model_config else None
        return data


def load_config(cwd: Path) -> tuple[dict[str, Any], Path | None]:
    """The nearest ``launch.toml`` or ``pyproject.toml`` ``[tool.launch]``, searching upward."""
    for folder in (cwd, *cwd.parents):
        for name in ("launch.toml", "pyproject.toml"):
            path = folder / name
            if not path.is_file():
                continue
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise UsageError(f"{path}: not valid TOML: {exc}") from None
            if name == "pyproject.toml":
                data = data.get("tool", {}).get("launch")
                if data is None:
                    continue
            return {k.replace("-", "_"): v for k, v in data.items()}, path
    return {}, None


def build_spec(options: dict[str, Any], info: ScriptInfo) -> Spec:
    """Merge click's resolved options (flags > env > config) over ``LAUNCH`` and defaults."""
    launch = dict(info.launch)
    unknown = sorted(set(launch) - set(LAUNCH_KEYS))
    if unknown:
        raise UsageError(f"{info.path.name}: unknown LAUNCH key {unknown[0]!r}",
                         f"known keys: {', '.join(sorted(LAUNCH_KEYS))}")
    for key, value in launch.items():
        expected = LAUNCH_KEYS[key]
        ok = isinstance(value, expected) and not (
            isinstance(value, bool) and expected in (int, (float, int)))
        if not ok:
            raise UsageError(f"{info.path.name}: LAUNCH[{key!r}] = {value!r} has the wrong type")
    fields = {f.name for f in dataclasses.fields(Spec)}
    values: dict[str, Any] = dict(DEFAULTS)
    values.update({k: v for k, v in launch.items() if k in fields})
    values.update({k: v for k, v in options.items() if k in fields and v is not None})
    values["script"] = info.path
    values["mode"] = info.mode
    spec = Spec(**values)
    _validate(spec)
    return spec


def _validate(spec: Spec) -> None:
    def choice(name: str, value: str | None, allowed: tuple[str, ...]) -> None:
        if value is not None and value not in allowed:
            raise UsageError(f"unknown {name} {value!r}", f"choose one of {', '.join(allowed)}")

    choice("provider", spec.provider, PROVIDERS)
    choice("strategy", spec.strategy, STRATEGIES)
    choice("precision", spec.precision, PRECISIONS)
    choice("optimizer", spec.optimizer, OPTIMIZERS)
    for name in ("global_batch_size", "steps", "micro_batch_size", "nodes", "gpus_per_node",
                 "seq_len", "log_every", "checkpoint_every", "max_attempts", "layers",
                 "hidden_size", "heads", "vocab_size", "params"):
        value = getattr(spec, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    if spec.strategy == "smp_v2" and spec.provider != "sagemaker":
        raise UsageError("smp_v2 is SageMaker's model-parallel library and runs only there",
                         "use --provider sagemaker, or --strategy fsdp / hybrid_shard")
    if spec.lr <= 0:
        raise UsageError(f"the learning rate must be positive, not {spec.lr}")
    if spec.budget is not None and spec.budget <= 0:
        raise UsageError(f"--budget must be a positive amount of USD, not {spec.budget}")
    if spec.mode == "script" and spec.params is None and spec.model_config is None:
        raise UsageError(
            f"{spec.script.name} is a plain script, so launch cannot trace its model",
            "describe it with --model-config config.json or --params 7B, or make it a recipe "
            "(build_model, example_batch, training_step)",
        )
