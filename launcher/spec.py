"""What the user asked for: command-line flags, the recipe's ``LAUNCH`` dict and a config file.

Validated once, here, so everything downstream can trust it. Precedence, highest first: flags,
environment variables (provider settings only, ``LAUNCH_REGION`` ...), the config file
(``launch.toml`` or ``[tool.launch]`` in ``pyproject.toml``), the recipe's ``LAUNCH``, defaults.
Flags and environment variables are resolved by click; this module adds the config file (as
click's ``default_map``) and the ``LAUNCH`` layer.

A bad value is a usage error (exit 2) that names where it came from: the flag, the environment
variable, the config file and its key, or the recipe's ``LAUNCH`` key.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import strategies
from launcher.estimate.analytic import ATTENTION
from launcher.estimate.footprint import OPTIMIZER_IMPLEMENTATIONS
from launcher.flags import ConfigKey
from launcher.options import check_provider_flags, config_keys, option_keys
from launcher.plan.plan import CHECKPOINTING, OPTIMIZERS, OWN_OPTIMIZERS, PRECISIONS
from launcher.providers import LOCAL
from launcher.providers import names as provider_names
from launcher.script_info import ScriptInfo, script_parallelism
from launcher.status import UsageError
from launcher.userfiles import CONFIG_LIMIT, read_text

#: Keys a recipe's LAUNCH dict may set, with their types (bool before int: bool is an int).
LAUNCH_KEYS: dict[str, type | tuple[type, ...]] = {
    "global_batch_size": int, "micro_batch_size": int, "steps": int, "lr": (float, int),
    "seq_len": int, "precision": str, "optimizer": str, "activation_checkpointing": bool,
    "checkpointing": str, "log_every": int, "checkpoint_every": int, "seed": int,
    "max_grad_norm": (float, int, type(None)), "weight_decay": (float, int),
}
DEFAULTS: dict[str, Any] = {
    "global_batch_size": 8, "steps": 100, "lr": 3e-4, "log_every": 1, "checkpoint_every": 50,
    "seed": 0, "max_grad_norm": 1.0, "weight_decay": 0.0,
}

#: The most any count may be: far beyond a real run, and small enough that every sum and product
#: made of it downstream stays a finite float (and a C int where torch or torchrun takes it).
MAX_COUNT = 2**31 - 1
#: The most a batch may be: the planner tries the micro-batches that divide it one by one.
MAX_BATCH = 2**20
#: The most parameters a model may have (a quadrillion).
MAX_PARAMS = 10**15
#: Seeds and memory caps: what a signed 64-bit integer holds (torch's seed, setrlimit).
MAX_INT64 = 2**63 - 1

#: Whole-number settings: (least, most).
INT_RANGES: dict[str, tuple[int, int]] = {
    **{name: (1, MAX_COUNT) for name in (
        "steps", "nodes", "gpus_per_node", "seq_len", "log_every", "checkpoint_every",
        "max_attempts", "layers", "hidden_size", "heads", "vocab_size")},
    "global_batch_size": (1, MAX_BATCH), "micro_batch_size": (1, MAX_BATCH),
    "params": (1, MAX_PARAMS), "seed": (0, MAX_INT64), "memory_limit": (1, MAX_INT64),
}
#: Real-number settings: whether zero is allowed, and a hint (all must be finite, none negative).
FLOAT_RULES: dict[str, tuple[bool, str]] = {
    "lr": (False, ""),
    "budget": (False, "the most USD to spend"),
    "max_grad_norm": (False, "None turns gradient clipping off"),
    "weight_decay": (True, ""),
}
#: Text settings: one line, no control characters (they end up in requests, names and paths).
TEXT_FIELDS = ("provider", "strategy", "machine", "precision", "optimizer", "region", "bucket",
               "image", "timeout", "model_config", "attention", "optimizer_impl")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Spec:
    """One launch request, fully resolved. ``None`` pins mean "the planner chooses"."""

    script: Path
    mode: str
    provider: str = LOCAL
    #: A framework script's framework (hf_trainer | accelerate | lightning: capture/frameworks.py)
    framework: str | None = None
    #: Where each of the plan's settings came from, in words (``--steps``, ``steps in
    #: launch.toml``, ``LAUNCH['lr'] in train.py``, ``the script's own: 1 epoch of 2 batches``,
    #: ``launch's default``), and those the user pinned: a framework script is given only these
    #: and what the plan must set (docs/frameworks.md).
    origins: dict[str, str] = dataclasses.field(default_factory=dict, hash=False)
    pinned: tuple[str, ...] = ()
    # Pins.
    strategy: str | None = None
    machine: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    micro_batch_size: int | None = None
    global_batch_size: int = DEFAULTS["global_batch_size"]
    #: False when nobody gave the global batch (flag, config, LAUNCH): the planner then derives
    #: one each layout can split (``planner.global_batch``) instead of refusing the layout.
    global_batch_given: bool = True
    precision: str | None = None
    optimizer: str | None = None
    activation_checkpointing: bool | None = None
    #: none | selective | full (``--checkpointing``); ``activation_checkpointing`` is the older
    #: on/off pin (on: full). When both are given they must agree.
    checkpointing: str | None = None
    reshard_after_forward: bool | None = None  # True full sharding, False ZeRO-2 (planner.py)
    seq_len: int | None = None
    #: None: a framework script's own length, not known before it runs.
    steps: int | None = DEFAULTS["steps"]
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
    #: The attention kernel the analytic activations assume (flash | efficient | math).
    attention: str | None = None
    #: How the script's optimizer steps (foreach | for-loop): its temporaries in the estimate.
    optimizer_impl: str | None = None
    # The settings every cloud takes. A provider's own (Vertex's project, SageMaker's role) are
    # its settings class's: they reach it from the options, and the run records them as given.
    region: str | None = None
    bucket: str | None = None
    spot: bool = False
    max_attempts: int = 3
    budget: float | None = None
    memory_limit: int | None = None
    image: str | None = None
    timeout: str | None = None
    #: The script's own arguments (``launch SCRIPT -- ARGS``, or ``script_args`` in a config
    #: file), passed to it verbatim as a list wherever it runs: never a shell string.
    script_args: tuple[str, ...] = ()
    #: A plain script launch captured and traces (``ScriptInfo.captured``): its own settings
    #: are not pins, and it needs no --params.
    captured: bool = False
    #: A captured plain script's own flags for the plan's settings (``{"micro_batch_size":
    #: "--batch-size"}``) and the values it runs with by itself: ``args_for`` gives a plan's
    #: values to it through them.
    script_flags: dict[str, str] = dataclasses.field(default_factory=dict, hash=False)
    script_flag_values: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    #: A plain script's own parallelism (``script_info.script_parallelism``): () runs one
    #: process, ("ddp",) replicates, ("ddp", "fsdp") can shard; None for a recipe or a
    #: framework script, which launch parallelises itself.
    script_parallelism: tuple[str, ...] | None = None

    def args_for(self, plan: Any) -> tuple[str, ...]:
        """The script's arguments for ``plan``: its own, with each learned flag set to the plan's
        value where that differs from the script's (``script_info.with_flags``)."""
        from launcher.script_info import with_flags

        return with_flags(self.script_args, self.script_flags, self.script_flag_values, plan,
                          self.pinned)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["script"] = str(self.script)
        data["model_config"] = str(self.model_config) if self.model_config else None
        data["script_args"] = list(self.script_args)
        return data


# -- the config file ---------------------------------------------------------------------------

_KIND_WORDS: dict[str, str] = {
    "int": "a whole number", "float": "a number", "bool": "true or false", "str": "text",
    "path": "a path (text)", "count": "a count like 7B or 7000000000",
    "size": "a size like 2GiB or 2147483648",
    "args": 'a list of strings like ["--train_file", "data.txt"]',
}


class Config(dict[str, Any]):
    """A config file's values by click parameter name (so it is click's ``default_map`` of the
    commands that read it); provider settings that are no option keep their own name.
    ``origin(name)`` says where a value came from, for messages."""

    def __init__(self, values: Mapping[str, Any] | None = None, path: Path | None = None,
                 names: Mapping[str, str] | None = None, table: str = ""):
        super().__init__(values or {})
        self.path = path
        self.names = dict(names or {})  # parameter name -> key as written in the file
        self.table = table  # "[tool.launch]" for a pyproject.toml

    @property
    def where(self) -> str:
        return f"{self.path} {self.table}".rstrip()

    def origin(self, name: str) -> str:
        return f"{self.names.get(name, name)} in {self.where}"

    def extras(self, options: Iterable[str]) -> dict[str, Any]:
        """The values that are none of ``options`` (provider settings like ``s3_prefix``)."""
        taken = set(options)
        return {k: v for k, v in self.items() if k not in taken}


def load_config(cwd: Path, keys: Mapping[str, ConfigKey] | None = None) -> tuple[Config,
                                                                                  Path | None]:
    """The nearest ``launch.toml`` or ``pyproject.toml`` ``[tool.launch]``, searching upward,
    checked against ``keys`` (by default every option of run, plan and doctor and every provider
    setting: ``launcher.options.config_keys()``, the providers' asked only for a key that is no
    option). A key it does not know, a value of the wrong type, a number that is not finite or
    text with control characters is a :class:`UsageError` that names the file and the key."""
    for folder in (cwd, *cwd.parents):
        for name in ("launch.toml", "pyproject.toml"):
            path = folder / name
            data: Any = _read_toml(path)
            if data is None:
                continue
            table, tool = "", data.get("tool")  # a launch.toml of [tool.launch] alone: pasted
            if name == "pyproject.toml" or data.keys() == {"tool"} and isinstance(tool, dict) \
                    and tool.keys() == {"launch"}:  # from pyproject, read as the table it is
                if not isinstance(tool, dict) or "launch" not in tool:
                    continue
                data, table = tool["launch"], "[tool.launch]"
                if not isinstance(data, dict):
                    raise UsageError(f"{path}: [tool.launch] must be a table of settings, not "
                                     f"{_show(data)}", "write it as [tool.launch] key = value")
            if keys is None:  # the providers are imported only for a key that is no option
                keys = option_keys()
                if any(str(raw).replace("-", "_") not in keys for raw in data):
                    keys = config_keys()
            return _checked(data, path, table, keys), path
    return Config(), None


#: The deepest a config file's values may nest: its settings are scalars (a provider's at most a
#: table of them); a file nested deeper is refused before anything walks it (repr, json.dumps
#: and tomllib itself recurse).
MAX_CONFIG_DEPTH = 32


def _read_toml(path: Path) -> dict[str, Any] | None:
    """The TOML of ``path``, or None where there is no such file (or a folder of that name).
    Read bounded (``userfiles.read_text``: a regular file of at most ``CONFIG_LIMIT`` bytes, so a
    FIFO, a device or a huge file is a one-line refusal); nesting deeper than
    ``MAX_CONFIG_DEPTH`` is refused too."""
    try:
        if not path.exists() or path.is_dir():
            return None
    except OSError:  # a name too long, a symlink loop: read_text says which
        pass
    text = read_text(path, "config file", CONFIG_LIMIT, f"fix or remove {path.name}")
    too_deep = UsageError(f"{path}: nested deeper than {MAX_CONFIG_DEPTH} levels",
                          "write its settings as key = value")
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError, a 5000-digit int
        raise UsageError(f"{path}: not valid TOML: {' '.join(str(exc).split())}") from None
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise too_deep from None
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise too_deep
        if isinstance(value, dict):
            stack += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, list):
            stack += [(v, depth + 1) for v in value]
    return data


def _checked(data: dict[str, Any], path: Path, table: str, keys: Mapping[str, ConfigKey]
             ) -> Config:
    where = f"{path} {table}".rstrip()
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    written: dict[str, str] = {}
    for raw, value in data.items():
        name = raw.replace("-", "_")
        key = keys.get(name)
        if key is None:
            raise unknown_key(where, "key", raw, [k.replace("_", "-") if "-" in raw else k
                                                  for k in keys], CONFIG_KEYS_ARE)
        if name in written:
            raise UsageError(f"{where}: {raw!r} and {written[name]!r} are the same key",
                             "keep one of them")
        written[name] = raw
        label = f"{raw} in {where}"
        values[key.param or name] = _config_value(value, key, label)
        names[key.param or name] = raw
    return Config(values, path, names, table)


def _config_value(value: Any, key: ConfigKey, label: str) -> Any:
    kind = key.kind
    if kind in ("int", "float", "count", "size"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind in ("count", "size"):
            ok = ok or isinstance(value, str)
        if ok and isinstance(value, float) and not _finite(value):
            raise UsageError(f"{label} must be a finite number, not {_toml(value)}")
    elif kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "args":
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        if ok:
            check_script_args(value, label)
            return list(value)
    else:
        ok = isinstance(value, str)
    if not ok:
        raise UsageError(f"{label} must be {_KIND_WORDS[kind]}, not {_toml(value)}")
    if isinstance(value, str):
        _one_line(value, label)
    if kind in ("count", "size"):
        from launcher.units import parse_bytes, parse_count

        try:
            (parse_count if kind == "count" else parse_bytes)(value)
        except ValueError as exc:
            raise UsageError(f"{label}: {exc}") from None
    if key.param is None and kind == "int" and value < 1:
        raise UsageError(f"{label} must be at least 1, not {value}")
    if key.param is None and kind == "float" and value < 0:
        raise UsageError(f"{label} must not be negative, not {value}")
    return value


def _toml(value: Any) -> str:
    """A config value as TOML writes it (``true``, ``"text"``, ``[1, 2]``), cut short."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):
        return _show(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: Where a config file's keys are, said in place of a list of 50 (many of them tuning only).
CONFIG_KEYS_ARE = "keys are the flags of `launch plan --help` without the --, README: config"


def unknown_key(where: str, what: str, key: str, known: Iterable[str], more: str = ""
                ) -> UsageError:
    """``where: unknown what 'key'`` with the closest known key, if one is close, and the rest
    (or ``more``, where the rest is over 8: one line never lists a config file's 50 keys)."""
    known = sorted(set(known))
    close = difflib.get_close_matches(str(key), known, n=1)
    rest = more if more and len(known) > 8 else f"known keys: {', '.join(known)}"
    hint = (f"did you mean {close[0]!r}? " if close else "") + rest
    return UsageError(f"{where}: unknown {what} {_show(key)}", hint)


# -- the spec ----------------------------------------------------------------------------------


def build_spec(options: dict[str, Any], info: ScriptInfo,
               origins: Mapping[str, str] | None = None) -> Spec:
    """Merge click's resolved options (flags > env > config) over ``LAUNCH`` and defaults.

    ``origins``: where each option's value came from, as messages should name it (``--steps``,
    ``steps in /work/launch.toml``); an option without one is named as its flag."""
    launch = dict(info.launch)
    name = info.path.name
    unknown = sorted(str(k) for k in set(launch) - set(LAUNCH_KEYS))
    if unknown:
        raise unknown_key(name, "LAUNCH key", unknown[0], LAUNCH_KEYS)
    labels: dict[str, str] = {}
    for key, value in launch.items():
        expected = LAUNCH_KEYS[key]
        # a framework script's are its own settings, as the capture found them
        labels[key] = (f"{name}'s own {key}" if info.framework or info.captured
                       else f"LAUNCH[{key!r}] in {name}")
        ok = isinstance(value, expected) and not (
            isinstance(value, bool) and expected in (int, (float, int), (float, int, type(None))))
        if not ok:
            raise UsageError(f"{labels[key]} must be {_type_words(expected)}, not {_show(value)}")
    fields = {f.name for f in dataclasses.fields(Spec)}
    values: dict[str, Any] = dict(DEFAULTS)
    values.update({k: v for k, v in launch.items() if k in fields})
    for key, value in options.items():
        if key in fields and value is not None:
            values[key] = tuple(value) if key == "script_args" else value
            labels[key] = (origins or {}).get(key) or _flag(key)
    # The two checkpointing pins: one given as an option replaces the other's LAUNCH value.
    pins = {"activation_checkpointing", "checkpointing"}
    given = {k for k in pins if options.get(k) is not None}
    if len(given) == 1:
        values.pop((pins - given).pop(), None)
    values["script"] = info.path
    values["mode"] = info.mode
    values["framework"] = info.framework
    values["captured"] = info.captured
    values["script_flags"] = dict(info.flags)
    values["script_flag_values"] = dict(info.flag_values)
    if info.mode == "script" and info.framework is None and info.path.is_file():
        values["script_parallelism"] = script_parallelism(info.path)
    values["global_batch_given"] = "global_batch_size" in labels
    values["origins"], values["pinned"] = _origins(values, options, labels, info)
    spec = Spec(**values)
    _validate(spec, labels, info.notes)
    return spec


#: The plan's settings: the user's pins of these reach a framework script (its own values of
#: the others stay), and the plan says where each came from.
SETTINGS = (*LAUNCH_KEYS, "strategy", "machine", "nodes", "gpus_per_node")
#: Settings whose origin a plan shows even when nobody pinned them.
SHOWN = ("global_batch_size", "steps", "lr", "optimizer")
DEFAULT_ORIGIN = "launch's default"


def _origins(values: dict[str, Any], options: Mapping[str, Any], labels: Mapping[str, str],
             info: ScriptInfo) -> tuple[dict[str, str], tuple[str, ...]]:
    """Where each of the plan's settings came from, and those the user pinned (a flag, the
    environment, the config file, a recipe's ``LAUNCH``). A framework script's own settings
    fill the rest (``frameworks.own_settings``: its steps are its own length, not the default),
    which updates ``values``."""
    pinned = {k for k in SETTINGS if k in values and (
        options.get(k) is not None or (k in info.launch and info.framework is None
                                        and not info.captured))}
    origins = {k: labels[k] for k in pinned}
    if info.captured:  # a plain script's own settings, as the capture found them
        from launcher.capture.frameworks import SCRIPT_OWN

        for key in info.launch:
            if key not in pinned:
                origins[key] = SCRIPT_OWN + (f": {info.own[key]}" if info.own.get(key) else "")
        if info.framework is None and "steps" not in pinned:
            from launcher.capture.frameworks import plain_steps

            origins.update(plain_steps(info, values))
    if info.framework is not None:
        from launcher.capture.frameworks import own_settings

        origins.update(own_settings(info.framework, values, pinned, dict(info.launch),
                                    info.own, info.length))
    elif "optimizer" not in pinned and "build_optimizer" in info.hooks and info.captured:
        origins.setdefault("optimizer", OWN_OPTIMIZERS[0])
    elif "optimizer" not in pinned and "build_optimizer" in info.hooks:
        origins["optimizer"] = OWN_OPTIMIZERS[1]
    for key in SHOWN:
        origins.setdefault(key, DEFAULT_ORIGIN)
    return ({k: origins[k] for k in SETTINGS if k in origins},
            tuple(k for k in SETTINGS if k in pinned))


def check_options(options: Mapping[str, Any], origins: Mapping[str, str] | None = None
                  ) -> None:
    """Each option's value on its own, before anything is probed or built (``build_spec``
    checks them again, with ``LAUNCH`` merged in): a bad flag fails at once, named as it came."""
    fields = {f.name for f in dataclasses.fields(Spec)}
    _check_fields({k: v for k, v in options.items() if k in fields and v is not None},
                  lambda name: (origins or {}).get(name) or _flag(name))
    check_provider_flags(options, origins)  # --role for Vertex: said, not dropped


def _validate(spec: Spec, labels: Mapping[str, str] | None = None,
              notes: tuple[str, ...] = ()) -> None:
    _check_fields({f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)},
                  lambda name: (labels or {}).get(name) or _flag(name))
    refuse_recipe_args(spec.script, spec.mode, spec.script_args,
                       (labels or {}).get("script_args") or _flag("script_args"))
    if refused := strategies.elsewhere(spec.strategy, spec.provider):
        raise UsageError(*refused)
    if (spec.mode == "script" and spec.params is None and spec.model_config is None
            and spec.framework is None and not spec.captured):  # traced from what it builds
        raise UsageError(
            f"{spec.script.name} is a plain script that launch could not capture at its first "
            f"optimizer step, so it cannot trace its model"
            + (f" ({'; '.join(notes)})" if notes else ""),
            "describe it with --model-config config.json or --params 7B, or make it a recipe "
            "(build_model, example_batch, training_step)",
        )


def _check_fields(values: Mapping[str, Any], label: Callable[[str], str]) -> None:
    """Every field of ``values`` on its own: text is one line, a choice is known, a number is
    finite and in range; ``label(name)`` names where a value came from."""
    for name in TEXT_FIELDS:
        if values.get(name) is not None:
            _one_line(str(values[name]), label(name))
    if values.get("script_args") is not None:
        check_script_args(values["script_args"], label("script_args"))

    def choice(name: str, allowed: tuple[str, ...]) -> None:
        value = values.get(name)
        if value is not None and value not in allowed:
            source = "" if label(name) == _flag(name) else f" from {label(name)}"
            raise UsageError(f"unknown {name} {_show(value)}{source}",
                             f"choose one of {', '.join(allowed)}")

    choice("provider", provider_names())  # the registry (launcher/providers/__init__.py)
    choice("strategy", strategies.NAMES)
    choice("precision", PRECISIONS)
    choice("optimizer", OPTIMIZERS)
    choice("attention", ATTENTION)
    choice("optimizer_impl", OPTIMIZER_IMPLEMENTATIONS)
    choice("checkpointing", CHECKPOINTING)
    some, mode = values.get("activation_checkpointing"), values.get("checkpointing")
    if some is not None and mode is not None and bool(some) != (mode != "none"):
        raise UsageError(f"{label('activation_checkpointing')} and {label('checkpointing')} "
                         f"{mode} contradict each other", "give one of them")
    for name, (least, most) in INT_RANGES.items():
        value = values.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise UsageError(f"{label(name)} must be a whole number, not {_show(value)}")
        if value < least:
            raise UsageError(f"{label(name)} must be at least {least}, not {_show(value)}")
        if value > most:
            raise UsageError(f"{label(name)} must be at most {most}, not {_show(value)}")
    for name, (zero, hint) in FLOAT_RULES.items():
        value = values.get(name)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise UsageError(f"{label(name)} must be a number, not {_show(value)}", hint)
        if not _finite(value):
            raise UsageError(f"{label(name)} must be a finite number, not {_show(value)}", hint)
        if value < 0 or (value == 0 and not zero):
            if name == "budget":
                raise UsageError(f"{label(name)} must be a positive amount of USD, not {value}")
            bound = "must not be negative" if zero else "must be positive"
            raise UsageError(f"{label(name)} {bound}, not {value}", hint)


#: How messages name the script's arguments given on the command line.
SCRIPT_ARGS_LABEL = "the script's arguments after --"


def check_script_args(args: Any, label: str) -> None:
    """The script's arguments: a list of strings, each of which a process can be given (no NUL
    character: no argv can hold one). Anything else is one line naming where they came from."""
    if not isinstance(args, (list, tuple)) or not all(isinstance(a, str) for a in args):
        raise UsageError(f"{label} must be a list of strings, not {_show(args)}")
    for arg in args:
        if "\0" in arg:
            raise UsageError(f"{label}: {_show(arg)} holds a NUL character, which no "
                             "command line can carry")


def refuse_recipe_args(script: Path, mode: str, args: tuple[str, ...] | list[str],
                       label: str) -> None:
    """A recipe takes no arguments: launch imports it (in the probe, the memory trace's workers
    and the rendered launch_train.py) and calls its functions; it never runs it as a script, so
    arguments would reach some of those imports and not others, and the estimate could be of
    another model than the one that trains. One line that says so, and what to do instead."""
    if args and mode == "recipe":
        raise UsageError(
            f"{script.name} is a recipe, which takes no arguments ({label}): launch imports it "
            "and calls build_model, example_batch and training_step, never runs it as a script",
            "give its settings through LAUNCH or environment variables, or drop the arguments")


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int no float holds
        return False


def _flag(name: str) -> str:
    if name == "script_args":  # no flag: what follows `--`
        return SCRIPT_ARGS_LABEL
    return "--" + name.replace("_", "-")


def _one_line(text: str, label: str) -> None:
    if _CONTROL.search(text):
        raise UsageError(f"{label} must be one line of text without control characters, "
                         f"not {_show(text)}")


def _type_words(expected: type | tuple[type, ...]) -> str:
    words = {int: "a whole number", float: "a number", str: "text", bool: "true or false",
             type(None): "None"}
    kinds = expected if isinstance(expected, tuple) else (expected,)
    if float in kinds:
        kinds = tuple(k for k in kinds if k is not int)
    return " or ".join(words[k] for k in kinds)


def _show(value: Any) -> str:
    """``repr`` of a value, cut short: it goes into a one-line message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
