"""The options of `launch run`, `launch plan` and `launch doctor` as data, and the config keys.

``cli.py`` builds its click options from these tables; ``spec.load_config`` checks a config file
(``launch.toml``, ``[tool.launch]``) against ``config_keys()``: every one of these options, named
as its flag (``global_batch_size``, ``report``), and every setting of a provider's settings
class (SageMaker's ``s3_prefix``, ``job_prefix`` ...). One table, read by both, so neither
imports the other. A cloud's own flags are not written here: each provider's settings class
declares them (``flags.flag()``), and they are gathered from the registry. Nothing here imports
click or a provider's class (`launch --help` reads it): only the providers' settings classes.
"""

from __future__ import annotations

import math
import typing
from typing import Any

from launcher.flags import ConfigKey, Kind, Option, either, settings_flags, settings_kinds
from launcher.providers import LOCAL, catalog_data, clouds, settings_class
from launcher.providers import names as provider_names
from launcher.strategies import NAMES as strategy_names

#: The providers a job can run on other than this machine (registry order).
CLOUDS = clouds()


def _cloud_options() -> tuple[tuple[Option, ...], dict[str, tuple[str, ...]]]:
    """Where a cloud job runs and as whom: the settings every cloud takes (``--region``,
    ``--bucket``), then each provider's own, as its settings class declares them
    (``flags.flag()``: Vertex's ``--project``, SageMaker's ``--role``), with whose each is. A
    flag two providers declare is one option (the first one's help)."""
    found: dict[str, Option] = {o.flag: o for o in (
        Option("--region", "Cloud region.", envvar="LAUNCH_REGION"),
        Option("--bucket", "Bucket for code and checkpoints.", envvar="LAUNCH_BUCKET"),
    )}
    owners: dict[str, tuple[str, ...]] = {}
    for name in CLOUDS:
        settings = settings_class(name)
        if settings is not None:
            for option in settings_flags(settings, _title(name)):
                found.setdefault(option.flag, option)
                owners[option.key] = (*owners.get(option.key, ()), name)
    return tuple(found.values()), owners


def _title(name: str) -> str:
    """A provider's name in ``--help``: its catalog's ``display_name``, else its name."""
    return str((catalog_data(name) or {}).get("display_name") or name)


#: Where a cloud job runs and as whom: `launch plan`, `launch run` and `launch doctor` take the
#: same flags, gathered once here from the providers' settings; ``OWNERS``: a provider's own
#: flag (``role``, ``project``) -> the providers whose settings declare it.
CLOUD_OPTIONS, OWNERS = _cloud_options()


def check_provider_flags(options: typing.Mapping[str, Any],
                         origins: typing.Mapping[str, str] | None = None) -> None:
    """A provider's own flag given on the command line for another provider (``--role`` with
    ``--provider vertex``) is one usage line, not silently dropped. From the environment or a
    config file it is let be: one ``launch.toml`` or shell may serve every cloud."""
    from launcher.status import UsageError

    provider = options.get("provider") or LOCAL
    for key, owners in OWNERS.items():
        flag = "--" + key.replace("_", "-")
        if (options.get(key) is None or provider in owners
                or (origins or {}).get(key, flag) != flag):
            continue
        theirs = either(tuple(_title(o) for o in owners))
        own = [f"--{k.replace('_', '-')}" for k, o in OWNERS.items() if provider in o]
        takes = f"; {provider} takes {either(tuple(own))}" if own else ""
        raise UsageError(f"{flag} is a {theirs} setting, not one --provider {provider} takes",
                         f"drop {flag}, or pass --provider {owners[0]}{takes}")


#: The options of `launch plan` and `launch run`, in ``--help``'s order (after the SCRIPT).
PLAN_OPTIONS: tuple[Option, ...] = (
    Option("--provider", f"Where to run: {either(provider_names())}.", envvar="LAUNCH_PROVIDER",
           default=LOCAL, show_default=True),
    Option("--strategy", f"Pin the strategy: {', '.join(strategy_names)}."),
    Option("--machine", "Pin the machine type (cloud providers)."),
    Option("--nodes", "Pin the number of nodes.", "int"),
    Option("--gpus-per-node", "Pin the processes per node (GPUs; CPU processes on the local CPU).",
           "int"),
    Option("--micro-batch-size", "Pin the per-process micro-batch.", "int"),
    Option("--global-batch-size", "Samples per optimizer step.", "int"),
    Option("--precision", "Pin the precision: fp32, bf16_mixed, bf16."),
    Option("--optimizer", "Pin the optimizer: adamw, sgd, adafactor, adam8bit."),
    Option("--optimizer-impl",
           "How the script's optimizer steps: foreach (PyTorch's default on CUDA, a whole group "
           "at once) or for-loop (one parameter at a time: foreach=False, transformers' AdamW); "
           "sets its temporaries."),
    Option("--activation-checkpointing/--no-activation-checkpointing",
           "Pin activation checkpointing of the wrap_modules() blocks.", "bool"),
    Option("--checkpointing",
           "Pin how the wrap_modules() blocks are checkpointed: none, selective (keep matmul and "
           "attention outputs, recompute the rest), full."),
    Option("--reshard-after-forward/--no-reshard-after-forward",
           "Pin how fsdp and hybrid_shard shard: full sharding (each block's weights freed "
           "after its forward, gathered again in the backward) or ZeRO-2 (kept until the "
           "backward: less communication, the whole model's weights held).", "bool"),
    Option("--seq-len", "Sequence length (for the estimate).", "int"),
    Option("--steps", "Optimizer steps to train.", "int"),
    Option("--lr", "Learning rate.", "float"),
    Option("--params", "A plain script's parameter count, like 7B (no recipe to trace).",
           "count"),
    Option("--model-config", "A Hugging Face config.json describing the model (plain scripts).",
           "path"),
    Option("--layers", "With --params: transformer layers.", "int"),
    Option("--hidden-size", "With --params: hidden size.", "int"),
    Option("--heads", "With --params: attention heads.", "int"),
    Option("--vocab-size", "With --params: vocabulary size.", "int"),
    Option("--attention",
           "With --model-config or --params: the attention kernel the estimate assumes: flash, "
           "efficient or math (math keeps the s x s scores; default: the config's, else what "
           "CUDA picks)."),
    *CLOUD_OPTIONS,
    Option("--spot/--no-spot", "Use spot capacity.", "bool", envvar="LAUNCH_SPOT"),
    Option("--max-attempts", "Attempts before giving up on out-of-memory (default 3).", "int",
           envvar="LAUNCH_MAX_ATTEMPTS"),
    Option("--budget", "Most USD to spend.", "float", envvar="LAUNCH_BUDGET"),
    Option("--image", "Training container image (cloud providers)."),
    Option("--timeout", "Longest a cloud job may run, like 90m, 12h or 2d."),
    Option("--memory-limit",
           "Local: cap each process's memory, like 2GiB (reproduces an OOM on CPU).", "size"),
)
#: `launch plan`'s own options, after PLAN_OPTIONS.
PLAN_ONLY: tuple[Option, ...] = (
    Option("--all", "Show the candidates of every GPU type: the best per strategy of each, "
           "with how many fit (--json lists every candidate).",
           "bool", param_name="show_all"),
    Option("--report", "Also write the plan as an HTML page (a CI artifact).", "path",
           param_name="report_path"),
    Option("--out", "Also write the chosen plan's job folder here (a new or empty folder): "
           "the rendered script, plan.json and the exact request, as the first attempt would "
           "run them.", "path", param_name="out_dir"),
    Option("--strict/--no-strict",
           "Exit 2 when a cloud plan has no request to check (a region, role or bucket "
           "missing). On by default where CI is set, as on every CI service.", "bool"),
)
#: `launch run`'s own option, after PLAN_OPTIONS.
RUN_ONLY: tuple[Option, ...] = (
    Option("--cancel-on-interrupt", "On Ctrl-C, cancel the job instead of detaching from it.",
           "bool"),
)
#: The options of `launch doctor`.
DOCTOR_OPTIONS: tuple[Option, ...] = (
    Option("--provider", f"{either(CLOUDS)}.", envvar="LAUNCH_PROVIDER", required=True),
    *CLOUD_OPTIONS,
    Option("--machine", "Also check the GPU quota of this machine type."),
)

#: The script's own arguments: on the command line everything after ``--`` (``launch SCRIPT --
#: ARGS``, which cli.py splits off before click parses the options: no option of the table), in
#: a config file a list of strings. The arguments after ``--`` win over the config's list.
SCRIPT_ARGS = ConfigKey("script_args", "args", "script_args")

#: The commands a config file is read for (it gives their options' defaults), with their options.
CONFIG_COMMANDS: dict[str, tuple[Option, ...]] = {
    "run": PLAN_OPTIONS + RUN_ONLY,
    "plan": PLAN_OPTIONS + PLAN_ONLY,
    "doctor": DOCTOR_OPTIONS,
}


def provider_settings() -> dict[str, Kind]:
    """Every registered provider's settings that are config keys: the fields of its settings
    class (SageMaker's ``s3_prefix``, Vertex's ``project``); a provider without one (local)
    takes only options. Imports each provider's settings, not its provider class."""
    kinds: dict[str, Kind] = {}
    for name in provider_names():
        settings = settings_class(name)
        if settings is not None:
            for key, kind in settings_kinds(settings).items():
                kinds.setdefault(key, kind)
    return kinds


def option_keys() -> dict[str, ConfigKey]:
    """The config keys that are options of run, plan and doctor (named as their flags:
    ``global_batch_size``, ``report``; not --json or --debug), and ``script_args``. Imports no
    provider."""
    keys: dict[str, ConfigKey] = {SCRIPT_ARGS.name: SCRIPT_ARGS}
    for options in CONFIG_COMMANDS.values():
        for option in options:
            keys.setdefault(option.key, ConfigKey(option.key, option.kind, option.param))
    return keys


def config_keys() -> dict[str, ConfigKey]:
    """Every key a config file may hold, name -> ``ConfigKey``: the options (``option_keys``)
    and every setting of a provider's settings class (SageMaker's ``s3_prefix``, ``job_prefix``,
    ``aws_max_attempts`` ...; Vertex's settings are all options)."""
    keys = option_keys()
    for key, kind in provider_settings().items():
        keys.setdefault(key, ConfigKey(key, kind))
    return keys


#: The environment variables that tune launch itself (an option's variable, ``LAUNCH_REGION``,
#: is that option's ``envvar`` above), each with what it takes: ``seconds`` (a positive finite
#: number), ``flag`` (on or off: :data:`FLAG_WORDS`), or the words it accepts. Read only through
#: :func:`env_seconds`, :func:`env_flag` and :func:`env_word`; a value of another kind is one
#: usage line naming the variable (:func:`check_environment` checks them all up front).
ENVIRONMENT: dict[str, str | tuple[str, ...]] = {
    "LAUNCH_PROBE_TIMEOUT": "seconds",  # the recipe's probe child (recipe.py)
    "LAUNCH_CAPTURE_TIMEOUT": "seconds",  # a framework script's capture (capture/frameworks.py)
    "LAUNCH_TRACE_TIMEOUT": "seconds",  # each trace (preflight.py)
    "LAUNCH_RANK_TRACE_BUDGET": "seconds",  # all the rank traces of one preflight
    "LAUNCH_NO_TRACE": "flag",  # plan on model states only
    "LAUNCH_TRACE_DEPTH": ("full",),  # trace every block, not two depths extrapolated
}
#: The spellings of a flag variable, lower-cased: on, and off (empty is off, as unset).
FLAG_WORDS = {"1": True, "true": True, "yes": True, "on": True,
              "0": False, "false": False, "no": False, "off": False, "": False}
#: The longest a seconds variable may ask for (30 days, as the message says): beyond it a time
#: limit is no limit, and the clocks that take it (``subprocess``'s ``timeout``) overflow.
MAX_SECONDS = 30 * 86400.0


def _env_shown(name: str, text: str) -> str:
    """``NAME=value`` for a one-line message: the value quoted and cut short unless it is short
    and printable."""
    if text.isprintable() and 0 < len(text) <= 40 and text.strip() == text:
        return f"{name}={text}"
    import json

    return f"{name}={json.dumps(text[:40])}{'...' if len(text) > 40 else ''}"


def env_seconds(environ: typing.Mapping[str, str], name: str, default: float) -> float:
    """The positive, finite number of seconds ``name`` sets (``default`` if it is unset or
    empty); ``abc``, ``nan``, ``inf``, ``-5``, ``0`` or ``1e400`` is a ``UsageError`` naming it."""
    from launcher.status import UsageError

    text = environ.get(name)
    if text is None or not text.strip():
        return default
    hint = "set it to e.g. 600, or unset it"
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if math.isnan(seconds):
        raise UsageError(f"{_env_shown(name, text)} is not a number of seconds", hint)
    if seconds <= 0:
        raise UsageError(f"{_env_shown(name, text)} is not a positive number of seconds", hint)
    if seconds > MAX_SECONDS:
        raise UsageError(f"{_env_shown(name, text)} is longer than 30 days", hint)
    return seconds


def env_flag(environ: typing.Mapping[str, str], name: str) -> bool:
    """Whether flag variable ``name`` is on: ``1``, ``true``, ``yes``, ``on`` (any case); off
    for ``0``, ``false``, ``no``, ``off``, empty or unset; any other value is a ``UsageError``
    naming it (``LAUNCH_NO_TRACE=yes`` must not trace silently)."""
    from launcher.status import UsageError

    text = environ.get(name)
    if text is None:
        return False
    word = FLAG_WORDS.get(text.strip().lower())
    if word is None:
        raise UsageError(f"{_env_shown(name, text)} is neither on nor off",
                         "set it to 1, true, yes or on; to 0, false, no or off; or unset it")
    return word


def env_word(environ: typing.Mapping[str, str], name: str) -> str | None:
    """The word ``name`` sets, one of those :data:`ENVIRONMENT` lists for it (None if it is
    unset or empty); any other value is a ``UsageError`` naming it and the words it takes."""
    from launcher.status import UsageError

    words = ENVIRONMENT[name]
    assert isinstance(words, tuple)
    text = environ.get(name)
    if text is None or not text.strip():
        return None
    word = text.strip().lower()
    if word not in words:
        raise UsageError(f"{_env_shown(name, text)} is not {either(words)}",
                         f"set {name}={words[0]}, or unset it")
    return word


def check_environment(environ: typing.Mapping[str, str]) -> None:
    """Every variable of :data:`ENVIRONMENT` that is set, checked at once (before planning): a
    bad value is refused whichever path of the plan would have read it."""
    for name, kind in ENVIRONMENT.items():
        if kind == "seconds":
            env_seconds(environ, name, 1.0)
        elif kind == "flag":
            env_flag(environ, name)
        else:
            env_word(environ, name)
