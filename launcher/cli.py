"""The `launch` command line: parse, call one function, print. No logic of its own.

Nothing heavy is imported at module level (no torch, no cloud SDK, not even rich): `launch --help`
must answer at once. ``main(args, env)`` runs in-process, with an injectable environment, so tests
drive the real CLI without a subprocess.
"""

from __future__ import annotations

import functools
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from launcher import __version__
from launcher.context import Environment
from launcher.status import BadValue, ExitStatus, LaunchError, UsageError

# -- the command group: `launch SCRIPT` means `launch run SCRIPT` ------------------------------


class DefaultGroup(click.Group):
    """A group whose first argument, when it is not a command, goes to ``run``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h",
                                                                      "--version"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


def _size(_ctx: Any, _param: Any, value: str | int | None) -> int | None:
    from launcher.units import parse_bytes

    if value is None:
        return None
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _count(_ctx: Any, _param: Any, value: str | int | None) -> int | None:
    from launcher.units import parse_count

    if value is None:
        return None
    try:
        return parse_count(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def common(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--json and --debug on every command (not on the group: `launch SCRIPT --json` must work)."""
    fn = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(fn)
    fn = click.option("--debug", is_flag=True, help="Show tracebacks.")(fn)
    return fn


PLAN_OPTIONS: list[Callable[..., Any]] = [
    click.argument("script", type=click.Path(path_type=Path)),
    click.option("--provider", envvar="LAUNCH_PROVIDER", default="local", show_default=True,
                 help="Where to run: local, vertex or sagemaker."),
    click.option("--strategy", help="Pin the strategy: single, ddp, fsdp, hybrid_shard, smp_v2."),
    click.option("--machine", help="Pin the machine type (cloud providers)."),
    click.option("--nodes", type=int, help="Pin the number of nodes."),
    click.option("--gpus-per-node", type=int,
                 help="Pin the processes per node (GPUs; CPU processes on the local CPU)."),
    click.option("--micro-batch-size", type=int, help="Pin the per-process micro-batch."),
    click.option("--global-batch-size", type=int, help="Samples per optimizer step."),
    click.option("--precision", help="Pin the precision: fp32, bf16_mixed, bf16."),
    click.option("--optimizer", help="Pin the optimizer: adamw, sgd, adafactor, adam8bit."),
    click.option("--activation-checkpointing/--no-activation-checkpointing", default=None,
                 help="Pin activation checkpointing of the wrap_modules() blocks."),
    click.option("--checkpointing",
                 help="Pin how the wrap_modules() blocks are checkpointed: none, selective "
                      "(keep matmul and attention outputs, recompute the rest), full."),
    click.option("--seq-len", type=int, help="Sequence length (for the estimate)."),
    click.option("--steps", type=int, help="Optimizer steps to train."),
    click.option("--lr", type=float, help="Learning rate."),
    click.option("--params", callback=_count,
                 help="A plain script's parameter count, like 7B (no recipe to trace)."),
    click.option("--model-config", type=click.Path(path_type=Path),
                 help="A Hugging Face config.json describing the model (plain scripts)."),
    click.option("--layers", type=int, help="With --params: transformer layers."),
    click.option("--hidden-size", type=int, help="With --params: hidden size."),
    click.option("--heads", type=int, help="With --params: attention heads."),
    click.option("--vocab-size", type=int, help="With --params: vocabulary size."),
    click.option("--attention",
                 help="With --model-config or --params: the attention kernel the estimate "
                 "assumes: flash, efficient or math (math keeps the s x s scores; default: "
                 "the config's, else what CUDA picks)."),
    click.option("--region", envvar="LAUNCH_REGION", help="Cloud region."),
    click.option("--bucket", envvar="LAUNCH_BUCKET", help="Bucket for code and checkpoints."),
    click.option("--project", envvar="LAUNCH_PROJECT", help="Google Cloud project (Vertex)."),
    click.option("--service-account", envvar="LAUNCH_SERVICE_ACCOUNT",
                 help="Service account the job runs as (Vertex)."),
    click.option("--role", envvar="LAUNCH_ROLE", help="Execution role ARN (SageMaker)."),
    click.option("--spot/--no-spot", default=None, envvar="LAUNCH_SPOT",
                 help="Use spot capacity."),
    click.option("--max-attempts", type=int, envvar="LAUNCH_MAX_ATTEMPTS",
                 help="Attempts before giving up on out-of-memory (default 3)."),
    click.option("--budget", type=float, envvar="LAUNCH_BUDGET", help="Most USD to spend."),
    click.option("--image", help="Training container image (cloud providers)."),
    click.option("--timeout", help="Longest a cloud job may run, like 90m, 12h or 2d."),
    click.option("--memory-limit", callback=_size,
                 help="Local: cap each process's memory, like 2GiB (reproduces an OOM on CPU)."),
]


def plan_options(fn: Callable[..., Any], script_required: bool = True) -> Callable[..., Any]:
    options = PLAN_OPTIONS if script_required else [
        click.argument("script", type=click.Path(path_type=Path), required=False),
        *PLAN_OPTIONS[1:]]
    for option in reversed(options):
        fn = option(fn)
    return common(fn)


#: The commands a config file is read for: it gives their options' defaults.
CONFIG_COMMANDS = ("run", "plan", "doctor")


def config_keys() -> dict[str, Any]:
    """Every key a config file may hold, name -> ``spec.ConfigKey``: the options of run, plan and
    doctor (named as their flags: ``global_batch_size``, ``report``; not --json or --debug) and
    every setting of a provider's settings class (SageMaker's ``s3_prefix``, ``job_prefix``,
    ``aws_max_attempts`` ...; Vertex's settings are all options)."""
    from launcher.providers.sagemaker import SageMakerSettings
    from launcher.spec import ConfigKey, settings_kinds

    keys: dict[str, Any] = {}
    for name in CONFIG_COMMANDS:
        for param in cli.commands[name].params:
            if not isinstance(param, click.Option) or param.name in ("as_json", "debug"):
                continue
            flag = next(o for o in param.opts if o.startswith("--"))
            key = flag.removeprefix("--").replace("-", "_")
            keys.setdefault(key, ConfigKey(key, _kind(param), param.name))
    for key, kind in settings_kinds(SageMakerSettings).items():
        keys.setdefault(key, ConfigKey(key, kind))
    return keys


def _kind(param: click.Option) -> str:
    if param.callback is _count:
        return "count"
    if param.callback is _size:
        return "size"
    if param.is_flag or isinstance(param.type, click.types.BoolParamType):
        return "bool"
    if isinstance(param.type, click.types.IntParamType):
        return "int"
    if isinstance(param.type, click.types.FloatParamType):
        return "float"
    return "path" if isinstance(param.type, click.Path) else "str"


def _origins(ctx: click.Context) -> dict[str, str]:
    """Where each option's value came from, as an error names it: ``--steps``,
    ``--budget (LAUNCH_BUDGET)`` or ``steps in /work/launch.toml``."""
    from click.core import ParameterSource

    from launcher.spec import Config

    origins = {}
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name is None:
            continue
        flag = next(o for o in param.opts if o.startswith("--"))
        source = ctx.get_parameter_source(param.name)
        if source == ParameterSource.ENVIRONMENT and param.envvar:
            origins[param.name] = f"{flag} ({param.envvar})"
        elif source == ParameterSource.DEFAULT_MAP and isinstance(ctx.default_map, Config):
            origins[param.name] = ctx.default_map.origin(param.name)
        else:
            origins[param.name] = flag
    return origins


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="launch")
def cli() -> None:
    """Launch PyTorch training that fits in GPU memory.

    \b
      launch train.py                       preflight, plan, render, run, watch (local)
      launch --provider vertex train.py     the same on a cloud
      launch plan train.py --json           dry run: the estimate and the plan
      launch status|logs|cancel|attach RUN  a run is the chain of attempts of one launch

    Exit status: 0 ok, 1 job failed, 2 usage, 3 no plan fits, 4 over budget,
    5 still out of memory, 6 provider or credentials error, 130 interrupted.
    """


def _env() -> Environment:
    return click.get_current_context().find_root().obj


# -- plan and run ------------------------------------------------------------------------------


def _progress(env: Environment, quiet: bool, what: str) -> Any:
    """A spinner on stderr while a multi-second step runs, for a person at a terminal only
    (not with --json, not into a pipe or a CI log)."""
    import contextlib

    if quiet or not getattr(env.stderr, "isatty", lambda: False)():
        return contextlib.nullcontext()
    from launcher.report import console

    return console(env.stderr).status(f"{what} ...", spinner="dots")


def _plan(env: Environment, options: dict[str, Any], *, dry_run: bool = False, quiet: bool = False
          ) -> tuple[Any, Any, Any, Any]:
    """Script -> spec -> plan. A dry run may plan for a cloud whose adapter is not built yet."""
    from launcher.preflight import preflight
    from launcher.providers import PLANNED, REGISTRY, get_provider
    from launcher.recipe import inspect_script
    from launcher.spec import Config, build_spec, check_options

    ctx = click.get_current_context()
    if isinstance(ctx.default_map, Config):  # provider settings that are no option: s3_prefix
        options = {**ctx.default_map.extras(p.name for p in ctx.command.params if p.name),
                   **options}
    origins = _origins(ctx)
    check_options({"provider": options.get("provider")}, origins)  # named where it came from
    script = options["script"]
    if script is None:  # `launch plan --params 7B`: sizing a model before its script exists
        if options.get("params") is None and options.get("model_config") is None:
            raise UsageError("give the training SCRIPT, or describe the model to size it",
                             "launch plan train.py, or launch plan --params 7B "
                             "(or --model-config config.json)")
        script = NO_SCRIPT
    options["script"] = script if script.is_absolute() else env.cwd / script
    for key in ("model_config",):
        if options.get(key) is not None and not options[key].is_absolute():
            options[key] = env.cwd / options[key]
    name = options.get("provider") or "local"
    provider = None
    provider_error = None
    if not (dry_run and name in PLANNED and name not in REGISTRY):
        try:
            provider = get_provider(name, {**options, "python": env.python}, env.environ)
        except LaunchError as exc:
            # A dry run still plans (the catalogs need no account); only the request is lost.
            # Not past a malformed value (a region that is no region): that is the user's to fix.
            if not dry_run or name not in REGISTRY or isinstance(exc, BadValue):
                raise
            provider_error = str(exc)
    check_options(options, origins)  # the provider's own checks first; then before any probe
    tracing = _prestart_trace(env, options)
    probe = None
    if tracing:
        from launcher.estimate.traced import probe
    if options["script"].name == NO_SCRIPT.name:
        from launcher.recipe import describe_only

        info = describe_only(options["script"], python=env.python, env=env.environ,
                             local=name == "local")
    else:
        info = inspect_script(options["script"], python=env.python, env=env.environ,
                              local=name == "local", count_flops=not tracing, probe=probe)
    spec = build_spec(options, info, origins)
    with _progress(env, quiet, "estimating memory and planning"):
        result = preflight(spec, info, env.state_dir, env.environ)
    if provider_error:
        result.notes.append(f"no {name} request: {provider_error}")
    return spec, info, result, provider


#: The script of a plan that has none (``launch plan --params 7B``): never a file.
NO_SCRIPT = Path("(no script)")


def _prestart_trace(env: Environment, options: dict[str, Any]) -> bool:
    """Start the estimator's trace child now if the plan will trace the recipe, so that its
    torch import overlaps the recipe's loading (seconds off every traced preflight); say
    whether it will (the trace then also counts the FLOPs the recipe probe would)."""
    from launcher.recipe import classify

    if (env.environ.get("LAUNCH_NO_TRACE") == "1" or options.get("model_config") is not None
            or options.get("params") is not None):
        return False
    try:
        mode, _hooks = classify(options["script"])
    except LaunchError:
        return False  # inspect_script says what is wrong
    if mode != "recipe":
        return False
    from launcher.estimate.traced import prestart

    prestart()
    return True


@cli.command("plan")
@functools.partial(plan_options, script_required=False)
@click.option("--all", "show_all", is_flag=True,
              help="Show every candidate, not the best one per strategy and machine family.")
@click.option("--report", "report_path", type=click.Path(path_type=Path),
              help="Also write the plan as an HTML page (a CI artifact).")
def plan_command(as_json: bool, debug: bool, report_path: Path | None, show_all: bool,
                 **options: Any) -> None:
    """Dry run: estimate, choose a plan, show it. Starts nothing, spends nothing."""
    env = _env()
    spec, _info, result, _provider = _plan(env, options, dry_run=True, quiet=as_json)
    if report_path is not None:
        from launcher.report import plan_html
        from launcher.runs import atomic_write

        path = report_path if report_path.is_absolute() else env.cwd / report_path
        try:
            atomic_write(path, plan_html(result, f"{spec.script.name} on {spec.provider}"))
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror}") from None
    request = _dry_request(env, spec, result, _provider)
    if as_json:
        _print_json(env, {**result.to_dict(), "request": request})
    else:
        from launcher.report import console, print_plan

        print_plan(console(env.stdout), result, show_all)
    if result.status != ExitStatus.SUCCESS:
        raise SystemExit(result.status)


def _dry_request(env: Environment, spec: Any, result: Any, provider: Any) -> Any:
    """The exact request a cloud provider would send for the chosen plan (torchx's dry run).

    ``None`` for the local provider, when nothing fits, or when the request cannot be built
    (a missing role or bucket): then a note says why, and the plan still stands.
    """
    from launcher.supervisor import build_job

    if spec.provider == "local" or result.chosen is None:
        return None
    if spec.script.name == NO_SCRIPT.name:
        result.notes.append(f"no {spec.provider} request: no script to render (give the "
                            "SCRIPT to see the exact request)")
        return None
    if provider is None:
        return None
    run_path = env.state_dir / "runs" / "dry-run"
    try:
        job = build_job(spec, result.chosen, "dry-run", 1, run_path)
        return provider.dryrun(job).to_dict()
    except BadValue:
        raise
    except LaunchError as exc:
        result.notes.append(f"no {spec.provider} request: {exc}")
        return None


@cli.command("run")
@plan_options
@click.option("--cancel-on-interrupt", is_flag=True,
              help="On Ctrl-C, cancel the job instead of detaching from it.")
def run_command(as_json: bool, debug: bool, cancel_on_interrupt: bool, **options: Any) -> None:
    """Plan, render, submit and follow a training run (the default command)."""
    from launcher.report import console, print_plan
    from launcher.runs import Run
    from launcher.supervisor import Supervisor

    env = _env()
    spec, _info, result, provider = _plan(env, options, quiet=as_json)
    out = console(env.stdout if not as_json else env.stderr)
    if not as_json:
        print_plan(out, result)
    if result.status == ExitStatus.OVER_BUDGET:
        raise LaunchError("every plan that fits costs more than --budget", result.status)
    if result.chosen is None:
        raise LaunchError("no plan fits in memory (see the rejected options above)",
                          ExitStatus.NO_PLAN_FITS)
    recorded = spec.to_dict()
    if spec.provider != "local":  # resolved from the environment now; later shells may lack it
        try:
            recorded["region"] = provider.region
        except (LaunchError, AttributeError):
            pass
    run = Run.create(env.state_dir, _run_stem(spec.script),
                     {"script": str(spec.script), "provider": spec.provider,
                      "spec": recorded, "plan": result.to_dict()})
    echo = _echo(out, as_json)
    note = (lambda text: None) if as_json else (lambda text: out.print(f"[bold]launch:[/] {text}"))
    note(f"run {run.id} (state in {run.path})")
    from launcher.replan import replan, retrace

    can_checkpoint = "wrap_modules" in _info.hooks
    # A recipe can be re-traced at the shapes a job died at (data that grew partway through);
    # a framework script through the recipe generated from what it built, when it got that far.
    traceable = spec.script if spec.mode == "recipe" else _info.framework_recipe
    measure = retrace(str(traceable)) if traceable is not None and env.environ.get(
        "LAUNCH_NO_TRACE") != "1" else None

    def fix(plan: Any, failure: dict[str, Any]) -> Any:
        return replan(plan, failure, can_checkpoint=can_checkpoint, measure=measure)

    supervisor = Supervisor(provider, run, on_line=echo, on_note=note, replan=fix)
    try:
        outcome = supervisor.launch(spec, result.chosen)
    except KeyboardInterrupt:
        _interrupted(env, provider, run, cancel_on_interrupt)
        raise
    _finish(env, out, run, outcome.status, outcome.message, as_json)


def _echo(out: Any, as_json: bool) -> Callable[[str], None]:
    """Job output for a person (events as sentences); nothing in JSON mode."""
    from launcher.report import format_log_line

    if as_json:
        return lambda line: None
    return lambda line: out.out(format_log_line(line), highlight=False)


def _run_stem(script: Path) -> str:
    return script.parent.name if script.stem in ("train", "main") else script.stem


def _interrupted(env: Environment, provider: Any, run: Any, cancel: bool) -> None:
    from launcher.supervisor import adopt_unrecorded, cancel_attempt

    attempts = adopt_unrecorded(run, provider)
    last = attempts[-1] if attempts else None
    if cancel and last is not None and last.job_id:
        done = cancel_attempt(run, provider, last)
        env.stderr.write(f"launch: cancelled run {run.id} (attempt {done.number}: "
                         f"{done.summary.get('message')})\n")
    else:
        env.stderr.write(f"launch: detached from run {run.id}; the job goes on. "
                         f"Follow it with `launch attach {run.id}`, "
                         f"stop it with `launch cancel {run.id}`\n")


def _finish(env: Environment, out: Any, run: Any, status: ExitStatus, message: str,
            as_json: bool) -> None:
    from dataclasses import asdict

    from launcher.report import print_summary

    attempts = run.attempts()
    last = attempts[-1] if attempts else None
    summary = last.summary if last else {}
    if as_json:
        _print_json(env, {"run_id": run.id, "status": status.name.lower(),
                          "exit_status": int(status), "message": message,
                          "summary": summary, "attempts": [asdict(a) for a in attempts]})
    else:
        print_summary(out, run.id, "succeeded" if status == ExitStatus.SUCCESS else
                      f"{status.name.lower().replace('_', ' ')}", summary, len(attempts))
        if message:
            out.print(f"  {message}")
    if status != ExitStatus.SUCCESS:
        raise SystemExit(status)


@cli.command("explain")
@click.argument("log")
@click.option("--platform", type=click.Choice(["vertex", "sagemaker", "local"]),
              help="Where the log comes from (a bare SIGKILL means host OOM on the clouds).")
@common
def explain_command(log: str, platform: str | None, as_json: bool, debug: bool) -> None:
    """Read a training log (a file, or - for stdin): what failed, why, and what to change."""
    from launcher.failures import explain_stream

    env = _env()
    try:
        if log == "-":
            stream = getattr(env.stdin, "buffer", None)
            if stream is None:  # a text stream (tests): encode it back to bytes
                import io

                stream = io.BytesIO(env.stdin.read().encode("utf-8", errors="replace"))
            diagnosis = explain_stream(stream, platform)
        else:
            path = Path(log) if Path(log).is_absolute() else env.cwd / log
            if path.is_dir():
                raise UsageError(f"{log} is a folder", "give a log file, or - for stdin")
            with open(path, "rb") as handle:
                diagnosis = explain_stream(handle, platform)
    except FileNotFoundError:
        raise UsageError(f"log not found: {log}", "give a log file, or - for stdin") from None
    except PermissionError:
        raise UsageError(f"cannot read {log}: permission denied") from None
    data = diagnosis.to_dict()
    if as_json:
        _print_json(env, data)
        return
    from launcher.units import format_bytes

    out = env.stdout
    if data["failure"] == "none":
        out.write("no failure found in the log\n")
        return
    where = f" on rank {data['rank']}" if data.get("rank") is not None else ""
    line = f" (line {data['line']})" if data.get("line") else ""
    out.write(f"failure: {data['failure']}{where}{line}; cause: {data['cause']}\n")
    figures = [(k, data.get(k)) for k in ("requested_bytes", "capacity_bytes", "allocated_bytes",
                                          "reserved_bytes", "free_bytes")]
    shown = ", ".join(f"{k.removesuffix('_bytes')} {format_bytes(v)}" for k, v in figures
                      if v is not None)
    if shown:
        out.write(f"figures: {shown}\n")
    out.write(f"excerpt: {data['excerpt']}\n")
    out.write(f"advice: {data['advice']}\n")


@cli.command("machines")
@click.option("--provider", envvar="LAUNCH_PROVIDER", default="vertex", show_default=True,
              help="Whose catalog: vertex or sagemaker.")
@click.option("--gpu", help="Only machines with this GPU (e.g. A100-80GB, H100, L4).")
@common
def machines_command(provider: str, gpu: str | None, as_json: bool, debug: bool) -> None:
    """The GPU machines a cloud offers, with GPU memory and price per hour."""
    from dataclasses import asdict

    from launcher.plan.catalog import UnknownGpu, load_catalog
    from launcher.plan.catalog import gpu as gpu_type

    env = _env()
    if provider not in ("vertex", "sagemaker"):
        raise UsageError(f"no machine catalog for provider {provider!r}",
                         "use --provider vertex or --provider sagemaker")
    catalog = load_catalog(provider)
    machines = list(catalog.machines)
    if gpu:
        try:
            wanted = gpu_type(gpu).name
        except UnknownGpu as exc:
            raise UsageError(str(exc)) from None
        machines = [m for m in machines if m.gpu == wanted]
    if as_json:
        _print_json(env, {"provider": provider, "machines": [asdict(m) for m in machines]})
        return
    from rich.table import Table

    from launcher.report import console
    from launcher.units import format_bytes

    table = Table(show_edge=False, pad_edge=False)
    for name in ("machine", "GPUs", "GPU memory", "vCPU", "RAM", "network", "$/h", "spot $/h",
                 "price as of"):
        left = name in ("machine", "GPUs")
        table.add_column(name, justify="left" if left else "right", no_wrap=left)
    for m in machines:
        price = "n/a" if m.price_per_hour is None else f"{m.price_per_hour:.2f}"
        spot = "n/a" if m.spot_price_per_hour is None else f"{m.spot_price_per_hour:.2f}"
        network = "-" if m.inter_node_gbps is None else f"{m.inter_node_gbps:g} Gbps"
        table.add_row(m.name, f"{m.gpu_count} x {m.gpu}", format_bytes(m.gpu_memory_bytes),
                      str(m.vcpus), f"{m.ram_gib:.0f} GiB", network, price, spot, m.as_of)
    out = console(env.stdout)
    out.print(table)
    out.print(f"[dim]{len(machines)} machines, {provider} ({machines[0].region if machines else ''}"
              "); prices and sources: launcher/plan/catalogs/README.md[/]")


@cli.command("doctor")
@click.option("--provider", envvar="LAUNCH_PROVIDER", required=True, help="vertex or sagemaker.")
@click.option("--region", envvar="LAUNCH_REGION", help="Cloud region.")
@click.option("--bucket", envvar="LAUNCH_BUCKET", help="Bucket for code and checkpoints.")
@click.option("--project", envvar="LAUNCH_PROJECT", help="Google Cloud project (Vertex).")
@click.option("--service-account", envvar="LAUNCH_SERVICE_ACCOUNT",
              help="The jobs' service account (Vertex).")
@click.option("--role", envvar="LAUNCH_ROLE", help="Execution role ARN (SageMaker).")
@click.option("--machine", help="Also check the GPU quota of this machine type.")
@common
def doctor_command(provider: str, as_json: bool, debug: bool, **options: Any) -> None:
    """Check credentials, account, bucket, role, permissions and GPU quota for a cloud."""
    from launcher.doctor import print_report, run_doctor

    env = _env()
    # The config file, as main() loaded and checked it: s3_prefix, job_prefix ... are config
    # keys, not flags.
    config = click.get_current_context().default_map or {}
    settings = {**config, **{k: v for k, v in options.items() if v is not None}}
    report = run_doctor(provider, settings, env.environ)
    print_report(report, env.stdout, as_json=as_json)
    raise SystemExit(report.exit_status)


# -- following runs ----------------------------------------------------------------------------


def _open_run(run_id: str | None) -> tuple[Any, Any, list[Any]]:
    """The run, its provider, and its attempts with any a dead launcher left ``submitting``
    completed first (``adopt_unrecorded``): every command that follows a run starts here."""
    from launcher.providers import get_provider
    from launcher.runs import Run
    from launcher.supervisor import adopt_unrecorded

    env = _env()
    run = Run.open(env.state_dir, run_id)
    settings = {**run.info.get("spec", {}), "python": env.python}
    provider = get_provider(run.info["provider"], settings, env.environ)
    return run, provider, adopt_unrecorded(run, provider)


@cli.command("status")
@click.argument("run_id", required=False)
@common
def status_command(run_id: str | None, as_json: bool, debug: bool) -> None:
    """Show a run's attempts and their state (the newest run by default)."""
    from dataclasses import asdict

    from launcher.providers.base import TERMINAL_STATES

    env = _env()
    run, provider, attempts = _open_run(run_id)
    rows = []
    for attempt in attempts:
        live = attempt.state
        if attempt.job_id and attempt.state not in TERMINAL_STATES:
            live = provider.poll(attempt.job_id).state
        rows.append({**asdict(attempt), "live_state": live})
    if as_json:
        _print_json(env, {"run_id": run.id, "script": run.info.get("script"),
                          "provider": run.info.get("provider"), "attempts": rows})
        return
    env.stdout.write(f"run {run.id}  {run.info.get('provider')}  {run.info.get('script')}\n")
    for row in rows:
        summary = row.get("summary") or {}
        env.stdout.write(
            f"  attempt {row['number']}: {row['live_state']:<10} outcome={row['outcome']} "
            f"step={summary.get('steps')} loss={summary.get('loss')}  {row['change']}\n")


@cli.command("logs")
@click.argument("run_id", required=False)
@click.option("--attempt", "number", type=int, help="Which attempt (default: the last).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@common
def logs_command(run_id: str | None, number: int | None, follow: bool, as_json: bool,
                 debug: bool) -> None:
    """Print a run's job output."""
    import time

    env = _env()
    run, provider, attempts = _open_run(run_id)
    chosen = [a for a in attempts if number is None or a.number == number]
    if not chosen or not chosen[-1].job_id:
        raise UsageError(f"run {run.id} has no attempt {number}" if number else
                         f"run {run.id} has no submitted attempt")
    job_id = chosen[-1].job_id
    cursor = None
    while True:
        lines, cursor = provider.logs(job_id, cursor)  # a page at a time: read until empty
        for line in lines:
            env.stdout.write(line + "\n")
        if not lines and (not follow or provider.poll(job_id).terminal):
            break
        if not lines:
            time.sleep(0.2)


@cli.command("cancel")
@click.argument("run_id", required=False)
@common
def cancel_command(run_id: str | None, as_json: bool, debug: bool) -> None:
    """Stop a run's running job, and check that nothing of it is left running."""
    from launcher.providers.base import TERMINAL_STATES
    from launcher.supervisor import cancel_attempt

    env = _env()
    run, provider, attempts = _open_run(run_id)
    live = [a for a in attempts if a.job_id and (
        not provider.poll(a.job_id).terminal or provider.residue(a.job_id))]
    done = [cancel_attempt(run, provider, attempt) for attempt in live]
    if as_json:
        _print_json(env, {"run_id": run.id, "cancelled": [a.number for a in done],
                          "states": {a.number: a.state for a in done}})
    else:
        env.stdout.write(f"run {run.id}: " + (
            f"cancelled attempt {done[-1].number} ({done[-1].summary.get('message')})\n" if done
            else "nothing running\n"))
    if any(a.state not in TERMINAL_STATES for a in done):
        raise LaunchError(f"run {run.id} was asked to stop but has not stopped yet",
                          ExitStatus.PROVIDER_ERROR,
                          hint=f"check again with `launch status {run.id}`")


@cli.command("attach")
@click.argument("run_id", required=False)
@common
def attach_command(run_id: str | None, as_json: bool, debug: bool) -> None:
    """Follow a run again (after Ctrl-C or a crashed launcher) until its job ends."""
    from launcher.report import console
    from launcher.supervisor import Supervisor

    env = _env()
    run, provider, attempts = _open_run(run_id)
    if not attempts or not attempts[-1].job_id:
        raise UsageError(f"run {run.id} has no submitted attempt")
    out = console(env.stdout if not as_json else env.stderr)
    supervisor = Supervisor(provider, run, on_line=_echo(out, as_json), on_note=lambda text: None)
    attempt = attempts[-1]
    supervisor.follow(attempt)
    status = {"success": ExitStatus.SUCCESS, "oom": ExitStatus.OUT_OF_MEMORY}.get(
        attempt.outcome or "", ExitStatus.JOB_FAILED)
    _finish(env, out, run, status, "", as_json)


# -- entry point -------------------------------------------------------------------------------


def _print_json(env: Environment, data: Any) -> None:
    env.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def main(args: list[str] | None = None, env: Environment | None = None) -> int:
    """Run the CLI; return the exit status instead of exiting (tests call this in-process)."""
    env = env or Environment()
    args = list(sys.argv[1:] if args is None else args)
    debug = "--debug" in args or env.environ.get("LAUNCH_DEBUG") == "1"
    as_json = "--json" in args
    try:
        defaults = None
        if _command(args) in CONFIG_COMMANDS:
            from launcher.spec import load_config

            try:
                config, _source = load_config(env.cwd, config_keys())
            except UsageError:
                if not {"--help", "-h"} & set(args):
                    raise
                config = None  # help needs no config, and a broken one must not hide it
            defaults = {name: config for name in CONFIG_COMMANDS}
        code = cli.main(args=args, prog_name="launch", standalone_mode=False, obj=env,
                        default_map=defaults)
        return int(code) if isinstance(code, int) else ExitStatus.SUCCESS
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else ExitStatus.USAGE
    except click.exceptions.Abort:
        env.stderr.write("launch: interrupted\n")
        return ExitStatus.INTERRUPTED
    except KeyboardInterrupt:
        return ExitStatus.INTERRUPTED
    except click.ClickException as exc:
        _error(env, exc.format_message(), "", ExitStatus.USAGE, as_json, debug)
        return ExitStatus.USAGE
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except LaunchError as exc:
        _error(env, exc.message, exc.hint, exc.status, as_json, debug)
        return exc.status
    except Exception as exc:  # a bug of ours: one line unless --debug
        _error(env, f"internal error: {type(exc).__name__}: {exc}",
               "rerun with --debug for the traceback", ExitStatus.JOB_FAILED, as_json, debug)
        return ExitStatus.JOB_FAILED


def _command(args: list[str]) -> str | None:
    """The command ``args`` run, as DefaultGroup reads them (``launch SCRIPT`` runs ``run``)."""
    if not args or args[0] in ("--help", "-h", "--version"):
        return None
    return args[0] if args[0] in cli.commands else "run"


def _error(env: Environment, message: str, hint: str, status: ExitStatus, as_json: bool,
           debug: bool) -> None:
    if debug:
        traceback.print_exc(file=env.stderr)
    line = f"launch: error: {message}" + (f" ({hint})" if hint else "")
    env.stderr.write(line + "\n")
    if as_json:
        _print_json(env, {"error": message, "hint": hint, "exit_status": int(status)})


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
