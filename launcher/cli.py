"""The `launch` command line: parse, call one function, print. No logic of its own.

Each command parses its options, calls one method of ``launcher.runner.Runner`` (plan, run,
attach, status, runs, logs, cancel, explain, machines) or ``launcher.doctor``, prints the typed
result as text or ``--json``, and maps errors to the exit status enum (``launcher.status``).

Nothing heavy is imported at module level (no torch, no cloud SDK, not even rich): `launch --help`
must answer at once. ``main(args, env)`` runs in-process, with an injectable environment, so tests
drive the real CLI without a subprocess.

Over 600 lines on purpose: it is the one place where each command's options are declared and its
result is printed; every command is a few lines of the same shape, and the work is elsewhere.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from launcher import __version__
from launcher.cli_script import ScriptCommand
from launcher.context import Environment
from launcher.flags import Option, either
from launcher.options import (
    CLOUDS,
    CONFIG_COMMANDS,
    DOCTOR_OPTIONS,
    PLAN_ONLY,
    PLAN_OPTIONS,
    RUN_ONLY,
    check_provider_flags,
)
from launcher.providers import LOCAL
from launcher.runner import Interrupted, RunInterrupted, Runner, RunResult, interrupt_status
from launcher.status import ExitStatus, LaunchError, UsageError

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


class _TableOption(click.Option):
    """An option of the table: a value of its environment variable that click cannot convert
    names the variable too (``'--budget' (LAUNCH_BUDGET)``), as ``_origins`` names it after."""

    def get_error_hint(self, ctx: click.Context | None) -> str:
        from click.core import ParameterSource

        hint = super().get_error_hint(ctx)
        if (ctx is not None and self.name and self.envvar
                and ctx.get_parameter_source(self.name) == ParameterSource.ENVIRONMENT):
            return f"{hint} ({self.envvar})"
        return hint


def _option(option: Option) -> Callable[..., Any]:
    """The click option of one entry of the table in ``launcher.options``."""
    decls = [option.flag, *([option.param_name] if option.param_name else [])]
    kwargs: dict[str, Any] = {"cls": _TableOption}
    if option.kind == "bool" and "/" not in option.flag:
        kwargs["is_flag"] = True
    elif "/" in option.flag or option.default is not None:
        kwargs["default"] = option.default  # an on/off pair is unset (None) unless given
    if option.kind == "int":
        kwargs["type"] = int
    elif option.kind == "float":
        kwargs["type"] = float
    elif option.kind == "path":
        kwargs["type"] = click.Path(path_type=Path)
    elif option.kind in ("count", "size"):
        kwargs["callback"] = _count if option.kind == "count" else _size
    if option.envvar:
        kwargs["envvar"] = option.envvar
    if option.show_default:
        kwargs["show_default"] = True
    if option.required:
        kwargs["required"] = True
    return click.option(*decls, help=option.help, **kwargs)


def table_options(options: tuple[Option, ...]) -> Callable[..., Any]:
    """A decorator adding ``options`` (a table of ``launcher.options``), in their order."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            fn = _option(option)(fn)
        return fn

    return decorate


def plan_options(fn: Callable[..., Any], script_required: bool = True,
                 own: tuple[Option, ...] = ()) -> Callable[..., Any]:
    """SCRIPT, the options of plan and run and then the command's ``own``, --json and --debug."""
    fn = table_options(PLAN_OPTIONS + own)(fn)
    fn = click.argument("script", type=click.Path(path_type=Path), required=script_required)(fn)
    return common(fn)


def _kind(param: click.Option) -> str:
    """The kind of a click option's value, read back from the option (tests check it against
    the table it was built from)."""
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
      launch train.py -- --lr 3e-4          the script's own arguments go after --
      launch runs                           every run, from any folder, newest first
      launch status|logs|cancel|attach RUN  a run is the chain of attempts of one launch

    Exit status: 0 ok, 1 job failed, 2 usage, 3 no plan fits, 4 over budget,
    5 still out of memory, 6 provider or credentials error, 7 not submitted
    (the question before spending was answered no), 130 interrupted.
    """


def _env() -> Environment:
    return click.get_current_context().find_root().obj


# -- plan and run ------------------------------------------------------------------------------


def _plan_inputs(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The command's options with the config file's settings that are no option (``s3_prefix``,
    ``script_args``: the arguments after ``--`` replace it), and where each option came from."""
    from launcher.spec import SCRIPT_ARGS_LABEL, Config

    ctx = click.get_current_context()
    script_args = options.pop("script_args", None)
    origins = _origins(ctx)
    if isinstance(ctx.default_map, Config):  # settings that are no option: s3_prefix
        options = {**ctx.default_map.extras(p.name for p in ctx.command.params if p.name),
                   **options}
        origins["script_args"] = ctx.default_map.origin("script_args")
    if script_args is not None:
        options["script_args"], origins["script_args"] = script_args, SCRIPT_ARGS_LABEL
    return options, origins


def _progress(env: Environment, quiet: bool) -> Callable[[str], Any]:
    """A spinner on stderr while a multi-second step runs, for a person at a terminal only
    (not with --json, not into a pipe or a CI log)."""

    def progress(what: str) -> Any:
        import contextlib

        if quiet or not getattr(env.stderr, "isatty", lambda: False)():
            return contextlib.nullcontext()
        from launcher.report import console

        return console(env.stderr).status(f"{what} ...", spinner="dots")

    return progress


@cli.command("plan", cls=ScriptCommand)
@functools.partial(plan_options, script_required=False, own=PLAN_ONLY)
def plan_command(as_json: bool, debug: bool, report_path: Path | None, show_all: bool,
                 strict: bool | None, out_dir: Path | None, **options: Any) -> None:
    """Dry run: estimate, choose a plan, show it. Starts nothing, spends nothing."""
    env = _env()
    planned = Runner(env).plan(*_plan_inputs(options), dry_run=True, report=report_path,
                               progress=_progress(env, as_json), out=out_dir)
    unchecked = _unchecked(env, planned, strict)
    if as_json:
        data = planned.to_dict()
        if unchecked:
            data["error"] = {"message": unchecked, "status": int(ExitStatus.USAGE)}
        _print_json(env, data)
    else:
        from launcher.report import console, print_plan

        print_plan(console(env.stdout), planned.result, show_all, planned.spec.script_args)
    if unchecked:
        env.stderr.write(f"launch: error: {unchecked}\n")
        raise SystemExit(ExitStatus.USAGE)
    if planned.result.status != ExitStatus.SUCCESS:
        raise SystemExit(planned.result.status)


def _unchecked(env: Environment, planned: Any, strict: bool | None) -> str | None:
    """Why a strict cloud plan is no gate (a CI job's plan that built no request checked none
    of what a submission needs: the region, the role, the bucket), or None. Strict with
    ``--strict``, or by default where ``CI`` is set (GitHub Actions, GitLab, Buildkite...)."""
    if strict is None:
        strict = env.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    spec, result = planned.spec, planned.result
    if (not strict or spec.provider == LOCAL or planned.request is not None
            or result.status != ExitStatus.SUCCESS):
        return None
    prefix = f"no {spec.provider} request: "
    why = next((n.removeprefix(prefix) for n in result.notes if n.startswith(prefix)),
               "it could not be built")
    return (f"the plan has no {spec.provider} request to check ({why}); set what it names, "
            "or pass --no-strict to plan without one")


@cli.command("run", cls=ScriptCommand)
@functools.partial(plan_options, own=RUN_ONLY)
@click.option("--yes", "-y", "yes", is_flag=True,
              help="Submit to a cloud without asking (CI; there is no terminal to ask at).")
def run_command(as_json: bool, debug: bool, cancel_on_interrupt: bool, yes: bool,
                **options: Any) -> None:
    """Plan, render, submit and follow a training run (the default command)."""
    from launcher.report import console, print_plan

    env = _env()
    runner = Runner(env)
    planned = runner.plan(*_plan_inputs(options), progress=_progress(env, as_json))
    out = console(env.stdout if not as_json else env.stderr)
    if not as_json:
        print_plan(out, planned.result, script_args=planned.spec.script_args)
    _confirm_spending(env, planned, yes)
    view = _LiveView(out)
    note = _json_event(env, "note") if as_json else view.note
    try:
        result = runner.run(planned, on_line=_echo(out, as_json, env) if as_json else view.line,
                            on_note=note, cancel_on_interrupt=cancel_on_interrupt)
    except RunInterrupted as stop:
        view.flush()
        _interrupted(env, stop)
        raise
    view.flush(result.run_id)
    _finish(env, out, result, as_json)


class _LiveView:
    """What a person sees while a run goes: the job's lines as sentences and launch's notes.
    Once an out-of-memory failure is said, the log still arriving (a backlog of megabytes, on
    a terminal slower than the job) is summed up: its last ``TAIL`` lines are shown when the
    attempt ends, the rest counted, all of it in `launch logs` (the supervisor hands every line
    over; what is shown is the view's)."""

    TAIL = 50

    def __init__(self, out: Any) -> None:
        from launcher.report import format_log_line

        self.out, self.format = out, format_log_line
        self.held: collections.deque[str] = collections.deque()
        self.unshown = 0
        self.said = False

    def line(self, line: str) -> None:
        if not self.said:
            self.out.out(self.format(line), highlight=False)
            return
        self.held.append(line)
        if len(self.held) > self.TAIL:
            self.held.popleft()
            self.unshown += 1

    def note(self, text: str) -> None:
        if text.startswith("attempt "):  # a new attempt: the last one's tail first
            self.flush()
        self.out.print(f"[bold]launch:[/] {text}")
        if text.startswith("out of memory"):
            self.said = True

    def flush(self, run_id: str | None = None) -> None:
        if self.unshown:
            where = f"`launch logs {run_id}`" if run_id else "`launch logs`"
            self.out.print(f"[bold]launch:[/] {self.unshown} earlier lines of the job's log not "
                           f"shown here (all of it: {where}); its last {len(self.held)}:")
        for line in self.held:
            self.out.out(self.format(line), highlight=False)
        self.held.clear()
        self.unshown, self.said = 0, False


def _confirm_spending(env: Environment, planned: Any, yes: bool) -> None:
    """Before a cloud submission: what will run and what it costs, and ``Proceed? [y/N]`` at a
    terminal (SkyPilot's ``sky launch`` asks the same). ``--yes`` skips the question; with no
    terminal to ask at and no ``--yes``, nothing is submitted (exit 2, the flag named). A local
    run spends nothing and is not asked about; a plan that cannot run is refused later, as
    before. Written to stderr: stdout may be ``--json``."""
    from launcher.report import format_usd
    from launcher.units import format_bytes

    spec, result, chosen = planned.spec, planned.result, planned.result.chosen
    if yes or spec.provider == LOCAL or chosen is None or result.status != ExitStatus.SUCCESS:
        return
    provider = planned.provider
    try:
        where = f"{spec.provider} ({provider.region})"
    except (LaunchError, AttributeError):
        where = spec.provider
    memory = chosen.memory
    peak, capacity = memory.total, memory.capacity
    headroom = (f", {format_bytes(capacity - peak)} headroom"
                if peak is not None and capacity is not None else "")
    steps = "its own length" if chosen.steps is None else f"{chosen.steps} steps"
    total = (f"the total for {steps} not estimated" if chosen.total_cost_usd is None
             else f"about ${format_usd(chosen.total_cost_usd)} for {steps} (estimated)")
    hourly = ("price unknown" if chosen.cost_per_hour_usd is None
              else f"${format_usd(chosen.cost_per_hour_usd)}/h")
    lines = [
        f"launch: about to submit to {where}:",
        f"  {chosen.machine} x {chosen.nodes} node{'s' if chosen.nodes != 1 else ''}, "
        f"{chosen.strategy} over {chosen.nodes * chosen.gpus_per_node} GPU"
        f"{'s' if chosen.nodes * chosen.gpus_per_node != 1 else ''}, micro-batch "
        f"{chosen.micro_batch_size} x {chosen.grad_accum_steps}, {chosen.precision}",
        f"  per GPU {format_bytes(peak)} of {format_bytes(capacity)}{headroom}" if peak
        is not None else f"  per GPU: the peak is not estimated; {format_bytes(capacity)} each",
        f"  {hourly}, {total}",
        f"  an out-of-memory failure is resubmitted with a fixed plan, up to "
        f"{spec.max_attempts} attempts in all",
    ]
    tty = all(getattr(stream, "isatty", lambda: False)() for stream in (env.stdin, env.stderr))
    if not tty:
        raise UsageError(f"submitting to {spec.provider} spends money and there is no terminal "
                         "to ask at: nothing was submitted",
                         "pass --yes to submit without asking (as CI does)")
    env.stderr.write("\n".join(lines) + "\nProceed? [y/N] ")
    env.stderr.flush()
    answer = env.stdin.readline()
    if answer.strip().lower() not in ("y", "yes"):
        raise LaunchError("not submitted: nothing was started or spent", ExitStatus.NOT_SUBMITTED)


def _echo(out: Any, as_json: bool, env: Environment | None = None) -> Callable[[str], None]:
    """Job output for a person (events as sentences); in JSON mode the job's events only, one
    JSON object a line on stderr as they happen (``_json_event``)."""
    from launcher.report import format_log_line

    if as_json:
        if env is None:
            return lambda line: None
        from launcher.events import parse_event

        emit = _json_event(env, None)

        def event_line(line: str) -> None:
            event = parse_event(line)
            if event is not None:
                emit(event)

        return event_line
    return lambda line: out.out(format_log_line(line), highlight=False)


def _json_event(env: Environment, kind: str | None) -> Callable[[Any], None]:
    """With ``--json``, what happens while a job runs, as it happens: one JSON object a line on
    stderr (``{"event": "note", "message": "attempt 1: ..."}``, the job's own events as the
    templates write them: ``{"event": "metrics", "step": 3, ...}``), so a CI log shows progress
    while stdout stays the one result object it always was."""

    def emit(value: Any) -> None:
        if kind is None:  # a job's event: {"launch": "metrics", ...}
            data = {"event": value.get("launch"),
                    **{k: v for k, v in value.items() if k != "launch"}}
        else:
            data = {"event": kind, "message": str(value)}
        env.stderr.write(json.dumps(data, default=str) + "\n")
        env.stderr.flush()

    return emit


def _interrupted(env: Environment, stop: RunInterrupted) -> None:
    done = stop.cancelled
    if stop.status != ExitStatus.INTERRUPTED:
        env.stderr.write(f"launch: {signal.Signals(stop.status - 128).name} received\n")
    if done is not None:
        env.stderr.write(f"launch: cancelled run {stop.run_id} (attempt {done.number}: "
                         f"{done.summary.message})\n")
    else:
        env.stderr.write(f"launch: detached from run {stop.run_id}; the job goes on. "
                         f"Follow it with `launch attach {stop.run_id}`, "
                         f"stop it with `launch cancel {stop.run_id}`\n")


def _finish(env: Environment, out: Any, result: RunResult, as_json: bool) -> None:
    from launcher.report import print_summary

    status = result.status
    if as_json:
        _print_json(env, result.to_dict())
    else:
        word = ("succeeded" if status == ExitStatus.SUCCESS
                else "cancelled" if result.message.endswith("was cancelled")
                else status.name.lower().replace("_", " "))
        print_summary(out, result.run_id, word, result.summary, result.attempts)
        if result.message:
            out.print(f"  {result.message}")
    if status != ExitStatus.SUCCESS:
        raise SystemExit(status)


@cli.command("explain")
@click.argument("log")
@click.option("--provider", type=click.Choice([*CLOUDS, LOCAL]),
              help="Where the log comes from (a bare SIGKILL means host OOM on the clouds); "
                   "not read from LAUNCH_PROVIDER: a log may come from anywhere.")
@click.option("--platform", type=click.Choice([*CLOUDS, LOCAL]), hidden=True,
              help="Deprecated: --provider.")
@common
def explain_command(log: str, provider: str | None, platform: str | None, as_json: bool,
                    debug: bool) -> None:
    """Read a training log (a file, or - for stdin): what failed, why, and what to change."""
    env = _env()
    if platform is not None:  # the name it had before every command said --provider
        if provider not in (None, platform):
            raise UsageError(f"--provider {provider} and --platform {platform} disagree",
                             "--platform is the old name of --provider: pass --provider alone")
        provider = platform
        env.stderr.write("launch: note: --platform is deprecated; it is --provider now\n")
    diagnosis = Runner(env).explain(log, provider)
    data = diagnosis.to_dict()
    if as_json:
        _print_json(env, data)
        return
    from launcher.units import format_bytes

    out = env.stdout
    if data["failure"] == "none":
        note = f" ({data['note']})" if data.get("note") else ""
        out.write(f"no failure found in the log{note}\n")
        return
    where = f" on rank {data['rank']}" if data.get("rank") is not None else ""
    line = f" (line {data['line']})" if data.get("line") else ""
    cause = f"; cause: {data['cause']}" if data.get("cause") is not None else ""
    out.write(f"failure: {data['failure']}{where}{line}{cause}\n")
    figures = [(k, data.get(k)) for k in ("requested_bytes", "capacity_bytes", "allocated_bytes",
                                          "reserved_bytes", "free_bytes")]
    shown = ", ".join(f"{k.removesuffix('_bytes')} {format_bytes(v)}" for k, v in figures
                      if v is not None)
    if shown:
        out.write(f"figures: {shown}\n")
    out.write(f"excerpt: {data['excerpt']}\n")
    out.write(f"advice: {data['advice']}\n")


@cli.command("machines")
@click.option("--provider", envvar="LAUNCH_PROVIDER",
              help=f"Whose catalog: {either(CLOUDS)} (default: every cloud's).")
@click.option("--gpu", help="Only machines with this GPU or GPU family, any case (e.g. "
                            "A100-80GB; H100 or A100: each variant of the family; L4).")
@common
def machines_command(provider: str | None, gpu: str | None, as_json: bool, debug: bool) -> None:
    """The GPU machines a cloud offers, with GPU memory and price per hour.

    Without --provider, every cloud's catalog, one table each: `local` (the default of the
    other commands) has no catalog, so LAUNCH_PROVIDER=local lists every cloud's too, and
    only `--provider local` is refused."""
    from dataclasses import asdict

    from click.core import ParameterSource

    env = _env()
    from_env = click.get_current_context().get_parameter_source("provider")
    providers = ((provider,) if provider is not None and not (
        provider == LOCAL and from_env == ParameterSource.ENVIRONMENT) else CLOUDS)
    names = _gpu_family(gpu) if gpu else None
    listed = {p: [m for m in Runner(env).machines(p, None if names else gpu)
                  if names is None or m.gpu in names] for p in providers}
    if as_json:  # "provider": the one asked for, null for every cloud's ("providers" says)
        data: dict[str, Any] = {"provider": providers[0] if len(providers) == 1 else None,
                                "providers": list(providers),
                                "machines": [asdict(m) for p in providers for m in listed[p]]}
        if gpu:
            data["gpus"] = sorted({m.gpu for p in providers for m in listed[p]})
        _print_json(env, data)
        return
    out = None
    for p in providers:
        out = _machines_table(env, out, p, listed[p])


def _gpu_family(query: str) -> list[str]:
    """The catalog's GPU names that ``query`` means, any case: the name itself, or the variants
    of a family (``H100``: H100-80GB; ``A100``: A100-40GB and A100-80GB; ``A10``: A10G, not
    A100). Nothing matched: ``[]`` (the catalog's own lookup then says what is close)."""
    from launcher.plan.catalog import gpus

    q = query.strip().lower()
    names = list(gpus())
    exact = [n for n in names if n.lower() == q]
    return exact or [n for n in names if q and n.lower().startswith(q)
                     and not n[len(q)].isdigit()]


def _machines_table(env: Environment, out: Any, provider: str, machines: list[Any]) -> Any:
    """One cloud's machines as a table (after a blank line when another came before)."""
    from rich.table import Table

    from launcher.report import console
    from launcher.units import format_bytes

    if out is not None:
        out.print()
    from rich import box

    # Short headers, units in them, no rules between columns: every row on one line of a
    # 100-column terminal (it wrapped "1000 Gbps" and cut "2026-07..." before).
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for name in ("machine", "GPUs", "GPU mem", "vCPU", "RAM GiB", "net Gb/s", "$/h",
                 "spot $/h", "as of"):
        left = name in ("machine", "GPUs")
        table.add_column(name, justify="left" if left else "right", no_wrap=True)
    for m in machines:
        price = "n/a" if m.price_per_hour is None else f"{m.price_per_hour:.2f}"
        spot = "n/a" if m.spot_price_per_hour is None else f"{m.spot_price_per_hour:.2f}"
        network = "-" if m.inter_node_gbps is None else f"{m.inter_node_gbps:g}"
        table.add_row(m.name, f"{m.gpu_count} x {m.gpu}", format_bytes(m.gpu_memory_bytes),
                      str(m.vcpus), f"{m.ram_gib:.0f}", network, price, spot,
                      str(m.as_of)[:7])  # the month the price was read
    out = out or console(env.stdout)
    out.print(table)
    out.print(f"[dim]{len(machines)} machines, {provider} ({machines[0].region if machines else ''}"
              "); prices and sources: launcher/plan/catalogs/README.md[/]")
    return out


@cli.command("doctor")
@table_options(DOCTOR_OPTIONS)
@common
def doctor_command(provider: str, as_json: bool, debug: bool, **options: Any) -> None:
    """Check credentials, account, bucket, role, permissions and GPU quota for a cloud."""
    from launcher.doctor import print_report, run_doctor

    env = _env()
    # The config file, as main() loaded and checked it: s3_prefix, job_prefix ... are config
    # keys, not flags.
    ctx = click.get_current_context()
    check_provider_flags({**options, "provider": provider}, _origins(ctx))
    config = ctx.default_map or {}
    settings = {**config, **{k: v for k, v in options.items() if v is not None}}
    report = run_doctor(provider, settings, env.environ)
    print_report(report, env.stdout, as_json=as_json)
    raise SystemExit(report.exit_status)


# -- following runs ----------------------------------------------------------------------------


@cli.command("status")
@click.argument("run_id", required=False)
@common
def status_command(run_id: str | None, as_json: bool, debug: bool) -> None:
    """Show a run's attempts and their state (the newest run by default)."""
    env = _env()
    status = Runner(env).status(run_id)
    if as_json:
        _print_json(env, status.to_dict())
        return
    from launcher.report import format_attempt

    head = [part for part in (status.provider, status.script) if part]
    env.stdout.write("  ".join([f"run {status.run_id}", *head]) + "\n")
    for row in status.attempts:
        env.stdout.write(f"  {format_attempt(row.attempt, row.live_state)}\n")


@cli.command("runs")
@click.option("--here", is_flag=True,
              help="Only this folder's runs (its state folder), not every run launch knows.")
@common
def runs_command(here: bool, as_json: bool, debug: bool) -> None:
    """List every run, newest first: id, script, provider, state, attempts, cost, age.

    Runs started from any folder are found through the index in the state home
    ($LAUNCH_HOME, else $XDG_STATE_HOME/launch or ~/.local/state/launch). The state is the
    last attempt's as recorded: no cloud is asked (`launch status RUN` asks)."""
    env = _env()
    listing = Runner(env).runs(here=here)
    shown_notes = listing.notes[:10]
    for note in shown_notes:
        env.stderr.write(f"launch: note: {note}\n")
    if len(listing.notes) > len(shown_notes):
        env.stderr.write(f"launch: note: and {len(listing.notes) - len(shown_notes)} more "
                         "skipped\n")
    if as_json:
        _print_json(env, [run.to_dict() for run in listing.runs])
        return
    if not listing.runs:
        where = "in this folder's state folder" if here else "yet"
        env.stdout.write(f"no runs {where} (start one with `launch SCRIPT`)\n")
        return
    from launcher.report import format_runs

    env.stdout.write(format_runs(listing.runs, env.state_dir, env.environ.get("HOME")))


@cli.command("logs")
@click.argument("run_id", required=False)
@click.option("--attempt", "number", type=int, help="Which attempt (default: the last).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@click.option("--raw", is_flag=True,
              help="The log as the job wrote it (default: its events as sentences, as "
                   "`launch` shows them while it follows a run).")
@common
def logs_command(run_id: str | None, number: int | None, follow: bool, raw: bool,
                 as_json: bool, debug: bool) -> None:
    """Print a run's job output."""
    env = _env()
    lines = Runner(env).logs(run_id, number, follow)
    if raw or as_json:  # --json printed the lines as written before --raw existed
        for line in lines:
            env.stdout.write(line + "\n")
        return
    from launcher.report import format_log_line

    for line in lines:
        env.stdout.write(format_log_line(line) + "\n")


@cli.command("cancel")
@click.argument("run_id", required=False)
@common
def cancel_command(run_id: str | None, as_json: bool, debug: bool) -> None:
    """Stop a run's running job, and check that nothing of it is left running."""
    env = _env()
    result = Runner(env).cancel(run_id)
    done = result.cancelled
    if as_json:
        _print_json(env, result.to_dict())
    else:
        env.stdout.write(f"run {result.run_id}: " + (
            f"cancelled attempt {done[-1].number} ({done[-1].summary.message})\n" if done
            else "nothing running\n"))
    if result.still_running:
        raise LaunchError(f"run {result.run_id} was asked to stop but has not stopped yet",
                          ExitStatus.PROVIDER_ERROR,
                          hint=f"check again with `launch status {result.run_id}`")


@cli.command("attach")
@click.argument("run_id", required=False)
@common
def attach_command(run_id: str | None, as_json: bool, debug: bool) -> None:
    """Follow a run again (after Ctrl-C or a crashed launcher) until its job ends."""
    from launcher.report import console

    env = _env()
    out = console(env.stdout if not as_json else env.stderr)
    try:
        result = Runner(env).attach(run_id, on_line=_echo(out, as_json, env))
    except RunInterrupted as stop:  # Ctrl-C: how to follow it again, as `run` says it
        _interrupted(env, stop)
        raise
    _finish(env, out, result, as_json)


# -- entry point -------------------------------------------------------------------------------


def _print_json(env: Environment, data: Any) -> None:
    env.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def main(args: list[str] | None = None, env: Environment | None = None) -> int:
    """Run the CLI; return the exit status instead of exiting (tests call this in-process).
    SIGTERM and SIGHUP are interrupts while it runs, as Ctrl-C is (``_interrupts``)."""
    with _interrupts():
        return _main(args, env)


@contextlib.contextmanager
def _interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`launcher.runner.Interrupted` (a KeyboardInterrupt) in
    the main thread while the CLI runs: CI cancellation, ``timeout(1)`` and a closed terminal
    then detach from or (``--cancel-on-interrupt``) cancel the job as Ctrl-C does, with its
    message, instead of killing `launch` silently with the job left running. The previous
    handlers come back after (tests run the CLI in-process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(args: list[str] | None, env: Environment | None) -> int:
    env = env or Environment()
    args = list(sys.argv[1:] if args is None else args)
    env.argv = list(args)
    own = args[:args.index("--")] if "--" in args else args  # after --: the script's
    debug = "--debug" in own or env.environ.get("LAUNCH_DEBUG") == "1"
    as_json = "--json" in own
    try:
        _typo(args, env.cwd)
        defaults = None
        if _command(args) in CONFIG_COMMANDS:
            from launcher.spec import load_config

            try:
                config, _source = load_config(env.cwd)
            except UsageError:
                if not {"--help", "-h"} & set(own):
                    raise
                config = None  # help needs no config, and a broken one must not hide it
            defaults = {name: config for name in CONFIG_COMMANDS}
        code = cli.main(args=args, prog_name="launch", standalone_mode=False, obj=env,
                        default_map=defaults)
        return int(code) if isinstance(code, int) else ExitStatus.SUCCESS
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else ExitStatus.USAGE
    except click.exceptions.Abort as exc:  # click's wrapping of a KeyboardInterrupt
        cause = exc.__cause__ or exc.__context__
        if not isinstance(cause, RunInterrupted):  # that one said what became of the job
            env.stderr.write("launch: interrupted\n")
        return interrupt_status(cause) if cause is not None else ExitStatus.INTERRUPTED
    except KeyboardInterrupt as exc:
        return interrupt_status(exc)
    except click.ClickException as exc:
        _error(env, exc.format_message(), "", ExitStatus.USAGE, as_json, debug)
        return ExitStatus.USAGE
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except LaunchError as exc:
        _error(env, exc.message, exc.hint, exc.status, as_json, debug)
        return exc.status
    except OSError as exc:  # the machine's answer about a path the user gave: theirs to fix
        from launcher.userfiles import shown, why

        where = f" {shown(exc.filename)}" if exc.filename else ""
        _error(env, f"cannot use{where}: {why(exc)}", "check the path and its permissions",
               ExitStatus.USAGE, as_json, debug)
        return ExitStatus.USAGE
    except Exception as exc:  # a bug of ours: one line unless --debug
        _error(env, f"internal error: {type(exc).__name__}: {exc}",
               "rerun with --debug for the traceback", ExitStatus.JOB_FAILED, as_json, debug)
        return ExitStatus.JOB_FAILED


def _command(args: list[str]) -> str | None:
    """The command ``args`` run, as DefaultGroup reads them (``launch SCRIPT`` runs ``run``)."""
    if not args or args[0] in ("--help", "-h", "--version"):
        return None
    return args[0] if args[0] in cli.commands else "run"


def _typo(args: list[str], cwd: Path) -> None:
    """A first argument that is a command's name misspelt (``launch plna train.py``) is one line
    that names the command, not `run` given a script called ``plna``: a bare word (no dot, no
    slash) close to a command's name (difflib) that is no file here. A file, or a name ending in
    .py, is the script of `run`, as ``launch SCRIPT`` always is."""
    import re

    word = args[0] if args else ""
    if word in cli.commands or not re.fullmatch(r"[A-Za-z][A-Za-z-]*", word):
        return
    import difflib

    close = difflib.get_close_matches(word.lower(), sorted(cli.commands), n=1, cutoff=0.6)
    with contextlib.suppress(OSError):
        if close and not (cwd / word).exists():
            raise UsageError(f"no command {word!r}; did you mean `{close[0]}`?",
                             f"`launch {close[0]} --help`; a script runs as `launch SCRIPT`")


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
