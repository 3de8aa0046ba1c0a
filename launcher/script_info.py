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
    wrap_modules: tuple[str, ...] = ()
    unit_parameters: int | None = None
    flops_per_sample: float | None = None
    hardware: Hardware = field(default_factory=Hardware)
    #: A framework script (launcher/frameworks.py): hf_trainer | accelerate | lightning, the
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
