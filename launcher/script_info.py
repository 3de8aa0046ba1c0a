"""What ``launch`` knows about the user's script: ``ScriptInfo`` and the local ``Hardware``.

Plain dataclasses, built by ``recipe.inspect_script`` (a recipe or a plain script) and by
``frameworks.inspect_framework`` (a framework script), and read by the spec, the preflight and
the planner. A module of their own so that neither builder imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


@dataclass(frozen=True)
class Hardware:
    """What the local machine offers, as torch sees it (asked in the child, not the CLI)."""

    cuda_devices: int = 0
    cuda_name: str | None = None
    cuda_memory_bytes: int | None = None
    host_memory_bytes: int | None = None
    cpus: int = 1


@dataclass(frozen=True)
class ScriptInfo:
    path: Path
    mode: Literal["recipe", "script"]
    hooks: tuple[str, ...] = ()
    launch: dict[str, Any] = field(default_factory=dict)
    parameters: int | None = None
    trainable_parameters: int | None = None
    parameter_bytes: int | None = None
    buffer_bytes: int | None = None
    #: The trained weights' bytes as built (their gradients' bytes, in the weights' dtypes).
    trainable_bytes: int | None = None
    wrap_modules: tuple[str, ...] = ()
    unit_parameters: int | None = None
    flops_per_sample: float | None = None
    hardware: Hardware = field(default_factory=Hardware)
    #: A framework script (launcher/capture/frameworks.py): hf_trainer | accelerate | lightning, the
    #: recipe generated from what it built (None when it never reached training), a Hugging
    #: Face config it built a model from (for the analytic estimate then), and notes.
    framework: str | None = None
    framework_recipe: Path | None = None
    framework_config: Path | None = None
    notes: tuple[str, ...] = ()
    #: A framework script's own settings: where each ``launch`` value was found
    #: (``TrainingArguments.learning_rate``) and how long it trains by itself (its max steps,
    #: epochs and batches: ``frameworks.own_steps``).
    own: dict[str, str] = field(default_factory=dict)
    length: dict[str, Any] = field(default_factory=dict)
    #: A captured plain script's own flags for the plan's settings, learned from its argparse
    #: (``{"micro_batch_size": "--batch-size"}``), and the values it ran with: the plan reaches
    #: the script through them (``with_flags``).
    flags: dict[str, str] = field(default_factory=dict)
    flag_values: dict[str, Any] = field(default_factory=dict)
    #: Where a captured plain script puts a tensor on a GPU itself (``train.py:42:
    #: .to('cuda')``; the capture ran it on the CPU), and its own option that would run it
    #: without one (``--device cpu``), if any: a machine without a GPU cannot run it as it is.
    needs_gpu: str | None = None
    cpu_flag: str | None = None

    @property
    def captured(self) -> bool:
        """A plain script launch ran to its first optimizer step: traced, no --params needed."""
        return self.framework is None and self.framework_recipe is not None


#: What a plain script does across processes by itself (``script_parallelism``): it replicates
#: the model (runs DDP or an all-reduce of its own), it shards it (FSDP). The words are the
#: strategies' names, which ``Strategy.script_parallelism`` gives.
REPLICATES = "ddp"
SHARDS = "fsdp"

#: Names a script's source uses when it runs data parallelism itself (DDP, or an all-reduce of
#: its own after ``init_process_group``), and when it shards its model (FSDP1, FSDP2).
_DDP_NAMES = frozenset({"DistributedDataParallel", "init_process_group"})
_FSDP_NAMES = frozenset({"FullyShardedDataParallel", "fully_shard"})


def script_parallelism(path: Path) -> tuple[str, ...]:
    """What a plain script does across processes by itself, read from its source without
    running it: ``("ddp",)`` when it replicates the model (DDP, or its own all-reduce after
    ``init_process_group``), ``("ddp", "fsdp")`` when it can also shard it (FSDP), ``()`` when
    it is a one-process script: torchrun starting it N times would train N copies, each the
    whole model on the whole batch. A source that does not parse does nothing."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, SyntaxError, RecursionError):
        return ()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.name.rsplit(".", 1)[-1])
        elif isinstance(node, ast.ImportFrom) and node.module and ".fsdp" in node.module:
            names.add("fully_shard")
    found = tuple(kind for kind, words in ((REPLICATES, _DDP_NAMES | _FSDP_NAMES),
                                           (SHARDS, _FSDP_NAMES)) if names & words)
    return found


#: Reading this variable (the plan's JSON file) reaches every setting of the plan.
PLAN_VARIABLE = "LAUNCH_PLAN"


def launch_variables(path: Path) -> frozenset[str]:
    """The ``LAUNCH_*`` variables a plain script's source names (string constants: an
    ``os.environ["LAUNCH_MICRO_BATCH_SIZE"]``, a ``getenv("LAUNCH_LR", ...)``): the settings of
    the plan that can reach it. A script that names none of them never sees the plan, and a
    change the script cannot see must not be resubmitted as a fix. Read without running it; a
    source that does not parse names nothing."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, SyntaxError, RecursionError):
        return frozenset()
    return frozenset(
        node.value for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and node.value.startswith("LAUNCH_") and node.value[7:].replace("_", "").isalnum()
        and node.value.isupper())


#: The plan's settings a plain script's own flag can carry, and the ``LAUNCH_*`` variable each
#: stands for (a learned flag reaches the script as reading that variable would).
FLAG_VARIABLES = {"micro_batch_size": "LAUNCH_MICRO_BATCH_SIZE",
                  "grad_accum_steps": "LAUNCH_GRAD_ACCUM_STEPS", "steps": "LAUNCH_STEPS",
                  "lr": "LAUNCH_LR"}
#: Learned flags the plan sets only where the user pinned the setting: the script's own value
#: of it is not the option's (a learning-rate schedule's first lr is not ``--lr``).
PIN_ONLY = frozenset({"lr"})


#: A learned setting read from an environment variable of the script's own: ``$BATCH_SIZE``
#: (``capture/child/script_options.py``).
ENV_PREFIX = "$"


def flag_text(flag: str, value: Any) -> str:
    """A learned flag with its value as the script reads it: ``--batch-size 64``, glued for a
    flag learned ending in ``=`` (nanoGPT's configurator reads only ``--batch_size=64``), or
    ``BATCH_SIZE=64`` for an environment variable."""
    if flag.startswith(ENV_PREFIX):
        return f"{flag[len(ENV_PREFIX):]}={value}"
    return f"{flag}{value}" if flag.endswith("=") else f"{flag} {value}"


def with_flags(args: tuple[str, ...] | list[str], flags: dict[str, str],
               own: dict[str, Any], plan: Any, pinned: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``args`` with each learned flag (``FLAG_VARIABLES``) set to ``plan``'s value where that
    differs from the script's own (``own``): an occurrence in ``args`` (``--batch-size 64``,
    ``--batch-size=64``) is replaced, else the flag is appended (argparse, and nanoGPT's
    configurator: the last one wins). A glued flag (``--batch_size=``) is one argument. A
    ``PIN_ONLY`` setting is given only where the user ``pinned`` it."""
    out = list(args)
    for key, flag in flags.items():
        if key in PIN_ONLY and key not in pinned or flag.startswith(ENV_PREFIX):
            continue
        value = getattr(plan, key, None) if key in FLAG_VARIABLES else None
        if value is None or value == own.get(key):
            continue
        text = str(value)
        if flag.endswith("="):
            at = [i for i, arg in enumerate(out) if arg.startswith(flag)]
            if at:
                out[at[-1]] = flag + text
            else:
                out.append(flag + text)
            continue
        for i, arg in enumerate(out):
            if arg == flag and i + 1 < len(out):
                out[i + 1] = text
                break
            if arg.startswith(flag + "="):
                out[i] = f"{flag}={text}"
                break
        else:
            out += [flag, text]
    return tuple(out)


def env_flags(flags: dict[str, str], plan: Any, pinned: tuple[str, ...] = ()
              ) -> dict[str, str]:
    """The environment a plain script that reads its settings from variables of its own
    (``$BATCH_SIZE``: ``capture/child/script_options.py``) gets for ``plan``: each such
    variable set to the plan's value, also where that is the script's own (a variable the user
    exported here is not in a cloud job's environment). A ``PIN_ONLY`` setting only where
    ``pinned``."""
    out = {}
    for key, flag in flags.items():
        if not flag.startswith(ENV_PREFIX) or key in PIN_ONLY and key not in pinned:
            continue
        value = getattr(plan, key, None) if key in FLAG_VARIABLES else None
        if value is not None:
            out[flag[len(ENV_PREFIX):]] = str(value)
    return out


def flag_words(flag: str) -> str:
    """How the plan names a learned flag: ``--batch-size``, ``--batch_size=N``, or the
    environment variable ``BATCH_SIZE``."""
    if flag.startswith(ENV_PREFIX):
        return f"${flag[len(ENV_PREFIX):]} (the script's own environment variable)"
    return f"{flag + 'N' if flag.endswith('=') else flag} (the script's own flag)"


def flag_variables(flags: dict[str, str]) -> frozenset[str]:
    """The ``LAUNCH_*`` variables a script's learned flags stand for."""
    return frozenset(FLAG_VARIABLES[k] for k in flags if k in FLAG_VARIABLES)


def flag_notes(name: str, flags: dict[str, str], plan: Any, reads: frozenset[str]) -> list[str]:
    """Which of the plan's settings a plain script's own flags carry, in the plan's words, and
    what a micro-batch without an accumulation flag means for it (``reads``: the variables it
    reads, ``plain_reads``)."""
    words = {"micro_batch_size": "micro-batch", "grad_accum_steps": "accumulation",
             "steps": "steps", "lr": "a pinned lr"}
    notes = [f"{words[k]} -> {flag_words(flag)}" for k, flag in flags.items()
             if k in FLAG_VARIABLES]
    if (plan is not None and "micro_batch_size" in flags and plan.grad_accum_steps > 1
            and "grad_accum_steps" not in flags and "LAUNCH_GRAD_ACCUM_STEPS" not in reads):
        notes.append(f"{name} has no accumulation flag: it trains at "
                     f"{flag_text(flags['micro_batch_size'], plan.micro_batch_size)} per "
                     "process, not "
                     f"the plan's {plan.grad_accum_steps} micro-batches a step")
    return notes


def plain_reads(spec: Any) -> frozenset[str] | None:
    """The ``LAUNCH_*`` variables a plain script reads, or whose setting its own flag carries
    (``Spec.script_flags``, learned from its argparse: ``--batch-size`` reaches it as
    ``LAUNCH_MICRO_BATCH_SIZE`` would); ``None`` for a recipe or a framework script, which the
    plan reaches whole (rendered, or through the framework's settings)."""
    if spec.mode != "script" or spec.framework is not None or not spec.script.is_file():
        return None
    return launch_variables(spec.script) | flag_variables(spec.script_flags)


def unseen_settings(spec: Any) -> list[str]:
    """The variables of the plan's remedies that a plain script reads none of (empty when it
    reads the plan, or is no plain script)."""
    from launcher.remedies import REACHED_BY

    reads = plain_reads(spec)
    if reads is None or "LAUNCH_PLAN" in reads:
        return []
    return [v for carriers in REACHED_BY.values() if not set(carriers) & reads for v in carriers]


def unseen_words(unseen: list[str]) -> str:
    """``micro-batch, accumulation and checkpointing do`` for the settings ``unseen`` carry
    (a script with its own batch flag still misses checkpointing: ``checkpointing does``)."""
    if "LAUNCH_MICRO_BATCH_SIZE" in unseen:
        return "micro-batch, accumulation and checkpointing do"
    return "checkpointing does"
