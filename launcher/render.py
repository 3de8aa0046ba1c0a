"""Turn a plan into the files a job runs: a training script rendered from ``trainer_templates/``
and ``plan.json``.

The split is deliberate: the template decides *which code* the script contains (one template per
strategy), and ``plan.json`` carries *every value* the script uses. Templates are rendered with an
empty context under ``StrictUndefined``, so no plan value can be spliced into code by accident; a
replanned attempt changes ``plan.json`` and the environment, and a person can diff two attempts'
plans without diffing code.

No torch here: this runs in the CLI process, which must stay quick to start.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import jinja2

from launcher import strategies
from launcher.plan.plan import PRECISIONS, Plan
from launcher.statefiles import atomic_write

TEMPLATE_PACKAGE = "trainer_templates"
TEMPLATE_SUFFIX = ".py.j2"
SCRIPT_NAME = "launch_train.py"
#: launch's machinery beside the script (and the framework shim): the same file for every plan
#: and strategy, a plain Python module in the template package, written into the job as is.
RUNTIME_NAME = "launch_runtime.py"
PLAN_NAME = "plan.json"
#: The shim that runs a framework script (launcher/capture/frameworks.py) with the plan applied
#: through the framework's own settings; not a strategy, though its template sits beside them.
FRAMEWORK_TEMPLATE = "framework"
FRAMEWORK_SCRIPT = "launch_framework.py"
FRAMEWORKS = ("hf_trainer", "accelerate", "lightning")

Mode = Literal["recipe", "script"]


@dataclass(frozen=True)
class TrainSettings:
    """Job-level settings that are not part of the Plan contract (the planner does not choose
    them), but that the training script needs. They land in ``plan.json`` next to the plan."""

    # The user's script as the job sees it: relative to the job directory, or absolute.
    recipe_file: str
    # "recipe": render the strategy's script around the recipe. "script": bring-your-own plain
    # script, run as is; it gets the plan through LAUNCH_* environment variables.
    mode: Mode
    run_id: str
    attempt: int
    checkpoint_dir: str = "checkpoints"
    log_every: int = 1
    checkpoint_every: int = 50  # 0: only at the end
    keep_checkpoints: int = 2
    seed: int = 0
    max_grad_norm: float | None = 1.0  # None: no clipping
    weight_decay: float = 0.0
    # A framework script (mode "script"): its framework, whose own settings get the plan.
    framework: str | None = None
    # The settings the user pinned (``Spec.pinned``): the only ones of steps, lr, optimizer,
    # weight decay and clipping the framework shim writes over a script's own.
    pinned: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mode not in ("recipe", "script"):
            raise ValueError(f"mode must be 'recipe' or 'script', not {self.mode!r}")
        if self.framework is not None and (self.mode != "script"
                                           or self.framework not in FRAMEWORKS):
            raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)} for a script, "
                             f"not {self.framework!r} (mode {self.mode!r})")
        if not self.recipe_file:
            raise ValueError("recipe_file is empty")
        if self.log_every < 1:
            raise ValueError(f"log_every must be at least 1, not {self.log_every}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be 0 (only at the end) or more, not "
                             f"{self.checkpoint_every}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be at least 1, not {self.keep_checkpoints}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be positive or None, not {self.max_grad_norm}")


@dataclass(frozen=True)
class RenderedJob:
    """What a provider uploads and runs: files, the one torchrun starts, and its environment."""

    files: dict[str, str]  # relative path -> text
    entrypoint: str  # relative to the job directory (or absolute, for a user script elsewhere)
    env: dict[str, str] = field(default_factory=dict)
    #: The entrypoint's arguments, each provider puts them after it in its command (a list of
    #: strings, never a shell line): a plain script's own arguments, or those the framework
    #: shim passes on to the script as its ``sys.argv[1:]``. A rendered launch_train.py has none.
    args: tuple[str, ...] = ()

    def write(self, directory: Path) -> None:
        """Write every file under ``directory``, each atomically (temporary file, then rename), so
        a job that starts while an earlier attempt is being rewritten never reads half a file."""
        directory = Path(directory)
        for name, text in self.files.items():
            atomic_write(directory / _relative(name), text)


def available_strategies() -> tuple[str, ...]:
    """Strategies with a template: every ``<strategy>.py.j2`` not starting with ``_``."""
    # Listed through jinja's loader, which (unlike importlib.resources.files) also copes with
    # the package being seen as a namespace package, as a stale editable install makes it.
    return tuple(
        sorted(
            name.removesuffix(TEMPLATE_SUFFIX)
            for name in _environment().list_templates()
            if name.endswith(TEMPLATE_SUFFIX) and "/" not in name and not name.startswith("_")
            and name != FRAMEWORK_TEMPLATE + TEMPLATE_SUFFIX
        )
    )


def render_script(strategy: str) -> str:
    """The training script for ``strategy``. It does not depend on the plan's values, only on its
    strategy; ``ValueError`` names the strategies that have a template."""
    known = available_strategies()
    registered = strategies.STRATEGIES.get(strategy)  # its template: the registry says
    template = registered.template if registered else strategy + TEMPLATE_SUFFIX
    if template.removesuffix(TEMPLATE_SUFFIX) not in known:
        raise ValueError(
            f"no training template for strategy {strategy!r} yet; templates exist for: "
            f"{', '.join(known)}"
        )
    # An empty context: with StrictUndefined, any {{ value }} in a template fails here.
    return _environment().get_template(template).render()


@functools.cache
def runtime_source() -> str:
    """``launch_runtime.py``'s text: the same for every plan, so copied, not rendered (read
    once)."""
    source, _, _ = _environment().loader.get_source(_environment(), RUNTIME_NAME)
    return source


def render_framework_script() -> str:
    """The framework shim: the same for every plan and framework (it reads both from
    ``plan.json``), so, like the strategies' scripts, it is rendered with an empty context."""
    return _environment().get_template(FRAMEWORK_TEMPLATE + TEMPLATE_SUFFIX).render()


def plan_document(plan: Plan, settings: TrainSettings) -> dict[str, Any]:
    """``plan.json``: the plan's fields and the settings' fields in one flat object."""
    document = plan.to_dict()
    extra = dataclasses.asdict(settings)
    clash = document.keys() & extra.keys()
    if clash:  # a Plan field added with a settings name would be silently overwritten
        raise ValueError(f"plan and settings both define {', '.join(sorted(clash))}")
    return {**document, **extra}


def plan_env(plan: Plan, settings: TrainSettings) -> dict[str, str]:
    """The plan as environment variables, for plain scripts (and recipes that want a value, such
    as the sequence length, at import time)."""
    env = {
        "LAUNCH_STRATEGY": plan.strategy,
        "LAUNCH_MICRO_BATCH_SIZE": str(plan.micro_batch_size),
        "LAUNCH_GRAD_ACCUM_STEPS": str(plan.grad_accum_steps),
        "LAUNCH_GLOBAL_BATCH_SIZE": str(plan.global_batch_size),
        "LAUNCH_PRECISION": plan.precision,
        "LAUNCH_ACTIVATION_CHECKPOINTING": "1" if plan.activation_checkpointing else "0",
        # none | selective | full; the variable above stays "1" for either kind.
        "LAUNCH_CHECKPOINTING": plan.checkpointing or "none",
        "LAUNCH_OPTIMIZER": plan.optimizer,
        "LAUNCH_LR": repr(float(plan.lr)),  # repr round-trips a float exactly
        "LAUNCH_CHECKPOINT_DIR": settings.checkpoint_dir,
        "LAUNCH_SEED": str(settings.seed),
        "LAUNCH_RUN_ID": settings.run_id,
        "LAUNCH_ATTEMPT": str(settings.attempt),
        "LAUNCH_PLAN": PLAN_NAME,
    }
    if plan.steps is not None:  # None: a framework script's own length
        env["LAUNCH_STEPS"] = str(plan.steps)
    if plan.seq_len is not None:
        env["LAUNCH_SEQ_LEN"] = str(plan.seq_len)
    if plan.expandable_segments:
        # Read by PyTorch when CUDA initialises: it has to be in the process's environment.
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


def render(plan: Plan, settings: TrainSettings, script_args: tuple[str, ...] = ()) -> RenderedJob:
    """The files and environment of one attempt of ``plan``.

    In "recipe" mode the entrypoint is the rendered ``launch_train.py``, with
    ``launch_runtime.py`` beside it; in "script" mode it is the
    user's own script, and nothing is rendered but ``plan.json``; a framework script runs through
    ``launch_framework.py``, which gives the framework the plan and then runs the script as it is.
    ``script_args``: the script's own arguments (a recipe takes none: ``ValueError``).
    """
    _check(plan, own_length=settings.framework is not None)
    if script_args and settings.mode != "script":
        raise ValueError("a recipe takes no arguments: launch imports it, never runs it")
    args = tuple(script_args)
    text = json.dumps(plan_document(plan, settings), indent=2) + "\n"
    files = {PLAN_NAME: text}
    env = plan_env(plan, settings)
    if settings.mode == "script" and settings.framework is not None:
        files[FRAMEWORK_SCRIPT] = render_framework_script()
        files[RUNTIME_NAME] = runtime_source()
        return RenderedJob(files=files, entrypoint=FRAMEWORK_SCRIPT, env=env, args=args)
    if settings.mode == "script":
        return RenderedJob(files=files, entrypoint=settings.recipe_file, env=env, args=args)
    name = PurePosixPath(settings.recipe_file).name
    if name in (SCRIPT_NAME, RUNTIME_NAME) and not Path(settings.recipe_file).is_absolute():
        raise ValueError(f"the recipe may not be named {name}: launch writes a file of that "
                         "name beside it")
    files[SCRIPT_NAME] = render_script(plan.strategy)
    files[RUNTIME_NAME] = runtime_source()
    return RenderedJob(files=files, entrypoint=SCRIPT_NAME, env=env)


def _check(plan: Plan, own_length: bool = False) -> None:
    """Refuse plans whose numbers contradict each other: the script would run them as written.
    ``own_length``: a framework script, whose steps may be its own (None)."""
    for name in ("nodes", "gpus_per_node", "micro_batch_size", "grad_accum_steps", "steps"):
        if name == "steps" and plan.steps is None and own_length:
            continue
        if getattr(plan, name) is None or getattr(plan, name) < 1:
            raise ValueError(f"plan.{name} must be at least 1, not {getattr(plan, name)}")
    per_step = plan.micro_batch_size * plan.grad_accum_steps * plan.world_size
    if per_step != plan.global_batch_size:
        raise ValueError(
            f"global_batch_size {plan.global_batch_size} is not micro_batch_size "
            f"{plan.micro_batch_size} x grad_accum_steps {plan.grad_accum_steps} x "
            f"{plan.world_size} processes = {per_step}"
        )
    if plan.precision not in PRECISIONS:
        raise ValueError(f"precision {plan.precision!r} is not one of {', '.join(PRECISIONS)}")
    if not plan.lr > 0:
        raise ValueError(f"lr must be positive, not {plan.lr}")


def _relative(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValueError(f"job file {name!r} must be a relative path inside the job directory")
    return path


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        # package_path ".": the templates sit in the package itself, not in a templates/ folder.
        loader=jinja2.PackageLoader(TEMPLATE_PACKAGE, package_path="."),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
