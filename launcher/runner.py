"""The session API behind `launch`: plan, run, attach, status, logs, cancel (torchx's Runner).

``Runner(env)`` does each command's work and returns a typed result; it prints nothing and knows
nothing of click. The CLI parses the options, calls one method, prints the result (text or
JSON) and maps errors to the exit status enum. What happens while a run goes on reaches the
caller through callbacks: ``on_line`` for each line of the job's output, ``on_note`` for what the
launcher says (attempts, replans, stops).

    planned = runner.plan(options)             the script traced, the spec, the plan (a dry run)
    result = runner.run(planned, on_line=...)  submit, follow, replan after out-of-memory
    runner.attach(run_id) / runner.status(run_id) / runner.logs(run_id) / runner.cancel(run_id)
    runner.explain(log) / runner.machines(provider, gpu)   a log's failure; a cloud's catalog

Like the CLI, nothing heavy is imported at module level: `launch --help` imports this module.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.context import Environment
from launcher.providers import LOCAL
from launcher.run_index import RunList, index_run, indexed_run, list_runs, state_home
from launcher.runs import Attempt, Outcome, Run, Summary
from launcher.status import BadValue, ExitStatus, JobState, LaunchError, UsageError

if TYPE_CHECKING:
    from launcher.failures import Diagnosis
    from launcher.plan.catalog import Machine
    from launcher.plan.planner import PlanResult
    from launcher.providers.base import Provider
    from launcher.script_info import ScriptInfo
    from launcher.spec import Spec

#: The script of a plan that has none (``launch plan --params 7B``): never a file.
NO_SCRIPT = Path("(no script)")

#: A spinner (or nothing) around a multi-second step: ``progress("estimating memory")``.
Progress = Callable[[str], AbstractContextManager[Any]]


def _quiet(_what: str) -> AbstractContextManager[Any]:
    return contextlib.nullcontext()


def _ignore(_text: str) -> None:
    pass


# -- results -----------------------------------------------------------------------------------


@dataclass
class PlannedRun:
    """What ``plan`` found: the spec built from the options and the script, what the script
    told (hooks, ``LAUNCH``, size), the planner's answer, the provider it is for (``None`` when
    a dry run could not configure it: a note says why) and, for a dry run on a cloud, the exact
    request its first attempt would send."""

    spec: Spec
    info: ScriptInfo
    result: PlanResult
    provider: Provider | None
    request: dict[str, Any] | None = None
    #: Every setting the run was planned with, wherever it came from (flags, environment,
    #: the config file's provider settings that are no option, ``s3_prefix``): recorded in the
    #: run, so `status`, `cancel` and `attach` rebuild the provider exactly as it was.
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The `launch plan --json` contract."""
        return {**self.result.to_dict(), "script_args": list(self.spec.script_args),
                "request": self.request}


@dataclass
class RunResult:
    """How a run (or the attempt `attach` followed) ended; ``attempts``: every attempt of the
    run as recorded."""

    run: Run
    status: ExitStatus
    attempts: list[Attempt]
    message: str = ""

    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def summary(self) -> Summary:
        """The last attempt's summary (steps, loss, peak memory, checkpoint, message)."""
        return self.attempts[-1].summary if self.attempts else Summary()

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run.id, "status": self.status.name.lower(),
                "exit_status": int(self.status), "message": self.message,
                "summary": self.summary.to_dict(), "attempts": [a.to_dict() for a in self.attempts]}


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP (what CI cancellation, ``timeout(1)`` and a closed terminal send),
    raised in the main thread as Ctrl-C is: one path for every interrupt, so each detaches or
    (``--cancel-on-interrupt``) cancels the same way. ``status``: 128 + the signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def status(self) -> int:
        return 128 + self.signum


def interrupt_status(exc: BaseException) -> int:
    """The exit status of an interrupt: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return int(getattr(exc, "status", ExitStatus.INTERRUPTED))


class RunInterrupted(KeyboardInterrupt):
    """An interrupt (Ctrl-C, SIGTERM, SIGHUP) while ``run`` followed its job: the job was left
    running (``cancelled`` is ``None``) or, with ``cancel_on_interrupt``, stopped
    (``cancelled``: its attempt as recorded). A KeyboardInterrupt still, so whatever handles
    Ctrl-C handles it."""

    def __init__(self, run_id: str, cancelled: Attempt | None, status: int = 130):
        super().__init__(run_id)
        self.run_id = run_id
        self.cancelled = cancelled
        self.status = status


@dataclass
class AttemptStatus:
    """One attempt as recorded, and its job's state as the provider reports it now."""

    attempt: Attempt
    live_state: JobState

    def to_dict(self) -> dict[str, Any]:
        return {**self.attempt.to_dict(), "live_state": self.live_state}


@dataclass
class RunStatus:
    run_id: str
    script: str | None
    provider: str | None
    attempts: list[AttemptStatus]

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "script": self.script, "provider": self.provider,
                "attempts": [a.to_dict() for a in self.attempts]}


@dataclass
class CancelResult:
    """The attempts ``cancel`` stopped, as recorded after; ``still_running``: those whose job
    had not ended when it stopped waiting."""

    run_id: str
    cancelled: list[Attempt] = field(default_factory=list)

    @property
    def still_running(self) -> list[Attempt]:
        from launcher.providers.base import TERMINAL_STATES

        return [a for a in self.cancelled if a.state not in TERMINAL_STATES]

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "cancelled": [a.number for a in self.cancelled],
                "states": {a.number: a.state for a in self.cancelled}}


# -- the runner --------------------------------------------------------------------------------


def _no_gpu_here(script: str, where: str, cpu_flag: str | None) -> UsageError:
    """A plain script that puts its tensors on a GPU itself, for a machine without one (the
    capture ran it on the CPU; the job runs it as it is, and would fail at once)."""
    return UsageError(
        f"{script} puts its tensors on a GPU ({where}) and this machine has none: the local job "
        "would fail",
        (f"run it with its own option: launch {script} -- {cpu_flag}" if cpu_flag else
         "choose the device with torch.cuda.is_available() in the script")
        + ", or pass --provider vertex|sagemaker")


class Runner:
    """Every command's work, in the environment ``env`` (streams unused: it prints nothing)."""

    def __init__(self, env: Environment):
        self.env = env

    # -- plan ----------------------------------------------------------------------------------

    def plan(self, options: Mapping[str, Any], origins: Mapping[str, str] | None = None, *,
             dry_run: bool = False, report: Path | None = None, out: Path | None = None,
             progress: Progress = _quiet) -> PlannedRun:
        """Script -> spec -> plan. ``options``: the run or plan command's options by parameter
        name (``script``, ``provider``, ``micro_batch_size`` ...; a relative path is the
        environment's cwd's), plus provider settings that are no option (``s3_prefix``).
        ``origins``: where each came from, as errors name it (``--steps``, ``steps in
        launch.toml``).

        A dry run may plan for a cloud whose adapter is not built yet, or that lacks a setting
        (a note says what request is lost); it also writes the plan as an HTML page to
        ``report`` and builds the exact request a cloud would be sent (``request``). ``out``:
        a new or empty folder to write the chosen plan's job into (``_write_job``).
        """
        if out is not None:
            from launcher.dry_run import check_new_folder

            out = out if out.is_absolute() else self.env.cwd / out
            check_new_folder(out)  # before any child runs: a plan takes seconds
        planned = self._plan(dict(options), dict(origins or {}), dry_run, progress)
        if dry_run:
            if report is not None:
                self._write_report(planned, report)
            from launcher.dry_run import dry_request

            planned.request = dry_request(planned.spec, planned.result, planned.provider,
                                          self.env.state_dir, _no_script(planned.spec))
        if out is not None:
            from launcher.dry_run import write_job_folder

            planned.result.notes.append(write_job_folder(
                planned.spec, planned.result.chosen, planned.provider, out, self.env.state_dir,
                _no_script(planned.spec)))
        return planned

    def _plan(self, options: dict[str, Any], origins: dict[str, str], dry_run: bool,
              progress: Progress) -> PlannedRun:
        from dataclasses import replace

        from launcher.options import check_environment
        from launcher.preflight import preflight
        from launcher.providers import PLANNED, REGISTRY, get_provider
        from launcher.recipe import classify, inspect_script
        from launcher.script_info import flag_notes, plain_reads, unseen_settings, unseen_words
        from launcher.spec import SCRIPT_ARGS_LABEL, build_spec, check_options, refuse_recipe_args

        env = self.env
        check_environment(env.environ)  # a bad LAUNCH_* value is refused before any child runs
        check_options({"provider": options.get("provider")}, origins)  # named where it came from
        script = options.get("script")
        script_args = tuple(options.get("script_args") or ())
        args_from = origins.get("script_args", SCRIPT_ARGS_LABEL)
        if script is None and script_args:
            if args_from == SCRIPT_ARGS_LABEL:
                raise UsageError(f"{args_from} are for a SCRIPT, and none is given",
                                 "launch plan train.py -- ARGS")
            options["script_args"] = script_args = ()  # a config's, for scripts: none here
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
        name = options.get("provider") or LOCAL
        provider = None
        provider_error = None
        if not (dry_run and name in PLANNED and name not in REGISTRY):
            try:
                provider = get_provider(name, {**options, "python": env.python,
                                               "state_dir": env.state_dir}, env.environ)
            except LaunchError as exc:
                # A dry run still plans (the catalogs need no account); only the request is
                # lost. Not past a malformed value (a region that is no region): that is the
                # user's to fix.
                if not dry_run or name not in REGISTRY or isinstance(exc, BadValue):
                    raise
                provider_error = str(exc)
        check_options(options, origins)  # the provider's own checks first; then before a probe
        if script_args:  # a recipe takes none: refused before its probe runs
            refuse_recipe_args(options["script"], classify(options["script"])[0], script_args,
                               args_from)
        tracing = self._prestart_trace(options)
        probe = None
        if tracing:
            from launcher.estimate.trace_process import probe
        if options["script"].name == NO_SCRIPT.name:
            from launcher.recipe import describe_only

            info = describe_only(options["script"], python=env.python, env=env.environ,
                                 local=name == LOCAL)
        else:
            info = inspect_script(options["script"], python=env.python, env=env.environ,
                                  local=name == LOCAL, count_flops=not tracing, probe=probe,
                                  argv=script_args, capture_plain=options.get("params") is None
                                  and options.get("model_config") is None)
        spec = build_spec(options, info, origins)
        with progress("estimating memory and planning"):
            result = preflight(spec, info, env.state_dir, env.environ)
        if spec.script_flags and result.chosen is not None:
            spec = replace(spec, script_args=spec.args_for(result.chosen))
        result.notes.extend(flag_notes(spec.script.name, spec.script_flags, result.chosen,
                                       plain_reads(spec) or frozenset()))
        if provider_error:
            result.notes.append(f"no {name} request: {provider_error}")
        if name == LOCAL and info.needs_gpu and not info.hardware.cuda_devices:
            no_gpu = _no_gpu_here(spec.script.name, info.needs_gpu, info.cpu_flag)
            if not dry_run:  # it would fail at its first .to("cuda"): nothing is started
                raise no_gpu
            result.notes.append(f"{no_gpu.message}: {no_gpu.hint}")
        unseen = unseen_settings(spec)
        if unseen:
            result.notes.append(
                f"{spec.script.name} reads none of {', '.join(unseen)} (nor LAUNCH_PLAN): the "
                f"plan's {unseen_words(unseen)} not reach it, and an "
                "out-of-memory failure will not be resubmitted with a change it cannot see")
        return PlannedRun(spec, info, result, provider, settings=_recordable(options))

    def _prestart_trace(self, options: Mapping[str, Any]) -> bool:
        """Start the estimator's trace child now if the plan will trace (a recipe, or the
        recipe a script's capture writes), so that its torch import overlaps the recipe's
        loading or the script's capture (seconds off every traced preflight); say whether a
        recipe will be traced (the trace then also counts the FLOPs the recipe probe would)."""
        from launcher.options import env_flag
        from launcher.recipe import classify

        if (env_flag(self.env.environ, "LAUNCH_NO_TRACE")
                or options.get("model_config") is not None or options.get("params") is not None):
            return False
        try:
            mode, _hooks = classify(options["script"])
        except LaunchError:
            return False  # inspect_script says what is wrong
        from launcher.estimate.trace_process import prestart

        # A plain or framework script is run to its first step in a capture child first, then
        # traced: the trace child imports torch and warms its fake tensors meanwhile (about 5 s
        # of a plain script's plan, which is measured against the script's own time to its
        # first step: bench_plain.py). It answers no probe: the capture reads the script.
        prestart()
        return mode == "recipe"

    def _write_report(self, planned: PlannedRun, report: Path) -> None:
        from launcher.report import plan_html, shown_command
        from launcher.userfiles import write_through

        spec = planned.spec
        path = report if report.is_absolute() else self.env.cwd / report
        write_through(path, plan_html(planned.result, f"{spec.script.name} on {spec.provider}",
                                      shown_command(self.env.argv)), "report")

    # -- run -----------------------------------------------------------------------------------

    def run(self, planned: PlannedRun, *, on_line: Callable[[str], None] = _ignore,
            on_note: Callable[[str], None] = _ignore, cancel_on_interrupt: bool = False
            ) -> RunResult:
        """Create the run folder, submit the chosen plan and follow its job to the end; after an
        out-of-memory failure, replan and resubmit (up to ``max_attempts``). Ctrl-C raises
        :class:`RunInterrupted`, with the job left running unless ``cancel_on_interrupt``."""
        from launcher.supervisor import Supervisor

        spec, info, result, provider = planned.spec, planned.info, planned.result, planned.provider
        if result.status == ExitStatus.OVER_BUDGET:
            raise LaunchError("every plan that fits costs more than --budget", result.status)
        if result.chosen is None:
            raise LaunchError("no plan fits in memory (see the rejected options above)",
                              ExitStatus.NO_PLAN_FITS)
        assert provider is not None  # only a dry run plans without one
        recorded = spec.to_dict()
        if spec.provider != LOCAL:  # resolved from the environment now; later shells may lack it
            try:
                recorded["region"] = provider.region
            except (LaunchError, AttributeError):
                pass
        run = Run.create(self.env.state_dir, run_stem(spec.script),
                         {"script": str(spec.script), "provider": spec.provider,
                          "spec": recorded, "settings": planned.settings,
                          "plan": result.to_dict()})
        unindexed = index_run(self.home, run)  # `launch runs`, `status RUN` from any folder
        if unindexed:
            on_note(unindexed)
        on_note(f"run {run.id} (state in {run.path})")
        supervisor = Supervisor(provider, run, on_line=on_line, on_note=on_note,
                                replan=self._replanner(spec, info))
        try:
            outcome = supervisor.launch(spec, result.chosen)
        except KeyboardInterrupt as exc:
            raise RunInterrupted(run.id, self._interrupted(provider, run, cancel_on_interrupt),
                                 interrupt_status(exc)) from exc
        return RunResult(run, outcome.status, run.attempts(), outcome.message)

    @property
    def home(self) -> Path:
        """The user's launch state home (``$LAUNCH_HOME``...), where the index of runs is."""
        return state_home(self.env.environ, self.env.cwd)

    def _replanner(self, spec: Spec, info: ScriptInfo) -> Callable[..., Any]:
        """The supervisor's replanner: a fixed plan from a failed one and its diagnosis."""
        from launcher import remedies
        from launcher.options import env_flag
        from launcher.remedies import replan, retrace
        from launcher.script_info import plain_reads

        can_checkpoint = remedies.can_checkpoint(info.hooks)
        # A recipe can be re-traced at the shapes a job died at (data that grew partway
        # through); a framework script through the recipe generated from what it built, when
        # it got that far.
        traceable = spec.script if spec.mode == "recipe" else info.framework_recipe
        measure = retrace(str(traceable)) if traceable is not None and not env_flag(
            self.env.environ, "LAUNCH_NO_TRACE") else None

        reads = plain_reads(spec)
        env = self.env

        def fix(plan: Any, failure: Any) -> Any:
            fixed = replan(plan, failure, can_checkpoint=can_checkpoint, measure=measure,
                           reads=reads)
            if not isinstance(fixed, tuple):
                return fixed
            from launcher.preflight import reprice

            changed, why = fixed
            try:  # priced by the planner for what will run (the budget is checked against it)
                return reprice(spec, info, changed, env.state_dir, env.environ), why
            except (UsageError, OSError, ValueError):  # no trace now: its cost is unknown
                return changed.replace(cost_per_hour_usd=None, step_time_s=None,
                                       total_cost_usd=None), why

        return fix

    def _interrupted(self, provider: Provider, run: Run, cancel: bool) -> Attempt | None:
        """After Ctrl-C: the run's record completed; with ``cancel``, its last job stopped."""
        from launcher.supervisor import adopt_unrecorded, cancel_attempt

        attempts = adopt_unrecorded(run, provider)
        last = attempts[-1] if attempts else None
        if cancel and last is not None and last.job_id:
            return cancel_attempt(run, provider, last)
        return None

    # -- following runs ------------------------------------------------------------------------

    def _open(self, run_id: str | None) -> tuple[Run, Provider, list[Attempt]]:
        """The run, its provider, and its attempts with any a dead launcher left ``submitting``
        completed first (``adopt_unrecorded``): every command that follows a run starts here."""
        from launcher.providers import get_provider
        from launcher.supervisor import adopt_unrecorded

        run = Run.open(self.env.state_dir, run_id, lambda rid: indexed_run(self.home, rid))
        info = run.info
        settings = {**info.settings, **info.spec, "python": self.env.python,
                    "state_dir": run.path.parent.parent}  # the run's own: maybe another folder's
        provider = get_provider(info.provider, settings, self.env.environ)
        return run, provider, adopt_unrecorded(run, provider)

    def status(self, run_id: str | None = None) -> RunStatus:
        """A run's attempts (the newest run by default), with each unfinished job's state as
        its provider reports it now."""
        from launcher.providers.base import TERMINAL_STATES

        run, provider, attempts = self._open(run_id)
        rows = []
        for attempt in attempts:
            live = attempt.state
            if attempt.job_id and attempt.state not in TERMINAL_STATES:
                live = provider.poll(attempt.job_id).state
            rows.append(AttemptStatus(attempt, live))
        return RunStatus(run.id, run.info.script, run.info.provider, rows)

    def runs(self, here: bool = False) -> RunList:
        """Every run (``here``: this folder's), newest first, as recorded: no provider asked."""
        return list_runs(self.env.state_dir, None if here else self.home, here)

    def logs(self, run_id: str | None = None, number: int | None = None, follow: bool = False
             ) -> Iterator[str]:
        """The output lines of one attempt's job (the last by default); with ``follow``, until
        the job ends. The run and attempt are checked now; the lines come as iterated."""
        run, provider, attempts = self._open(run_id)
        chosen = [a for a in attempts if number is None or a.number == number]
        if not chosen or not chosen[-1].job_id:
            raise UsageError(f"run {run.id} has no attempt {number}" if number else
                             f"run {run.id} has no submitted attempt")
        return _log_lines(provider, chosen[-1].job_id, follow)

    def cancel(self, run_id: str | None = None) -> CancelResult:
        """Stop every job of the run that still runs (or left a process behind), and wait until
        nothing of it does."""
        from launcher.supervisor import cancel_attempt

        run, provider, attempts = self._open(run_id)
        live = [a for a in attempts if a.job_id and (
            not provider.poll(a.job_id).terminal or provider.residue(a.job_id))]
        return CancelResult(run.id, [cancel_attempt(run, provider, a) for a in live])

    def attach(self, run_id: str | None = None, *, on_line: Callable[[str], None] = _ignore
               ) -> RunResult:
        """Follow a run's last job again (after Ctrl-C or a crashed launcher) until it ends."""
        from launcher.supervisor import Supervisor

        run, provider, attempts = self._open(run_id)
        if not attempts or not attempts[-1].job_id:
            raise UsageError(f"run {run.id} has no submitted attempt")
        supervisor = Supervisor(provider, run, on_line=on_line, on_note=_ignore)
        attempt = attempts[-1]
        try:
            supervisor.follow(attempt)
        except KeyboardInterrupt as exc:  # detached again: the job goes on, as after `run`
            raise RunInterrupted(run.id, None, interrupt_status(exc)) from exc
        # As `run` ends on the same outcome, and as `status` then shows it: a job cancelled
        # from elsewhere is an interruption, not a failure.
        if attempt.outcome == Outcome.CANCELLED:
            return RunResult(run, ExitStatus.INTERRUPTED, run.attempts(),
                             f"attempt {attempt.number} was cancelled")
        status = (ExitStatus.SUCCESS if attempt.outcome == Outcome.SUCCESS
                  else ExitStatus.OUT_OF_MEMORY if attempt.outcome == Outcome.OOM
                  else ExitStatus.JOB_FAILED)
        return RunResult(run, status, run.attempts())

    # -- reading logs and catalogs -------------------------------------------------------------

    def explain(self, log: str, platform: str | None = None) -> Diagnosis:
        """What failed in a training log (a file, relative to the cwd, or ``-`` for stdin), why,
        and what to change; ``platform``: where it comes from (a bare SIGKILL means host OOM on
        the clouds)."""
        from launcher.failures import explain_stream
        from launcher.userfiles import open_regular, shown, why

        env = self.env
        if log == "-":
            stream = getattr(env.stdin, "buffer", None)
            if stream is None:  # a text stream (tests): encode it back to bytes
                import io

                stream = io.BytesIO(env.stdin.read().encode("utf-8", errors="replace"))
            return explain_stream(stream, platform)
        path = Path(log) if Path(log).is_absolute() else env.cwd / log
        hint = "give a log file, or - for stdin"
        fd = open_regular(path, "log", hint)  # a regular file: not a FIFO, not a device
        try:
            with open(fd, "rb") as handle:
                return explain_stream(handle, platform)
        except OSError as exc:  # /proc/self/mem: EIO while read
            raise UsageError(f"cannot read the log {shown(path)}: {why(exc)}", hint) from None

    def machines(self, provider: str, gpu: str | None = None) -> list[Machine]:
        """The GPU machines of a cloud's catalog, only those with ``gpu`` when given."""
        from launcher.plan import catalog
        from launcher.providers import catalogued

        if provider not in catalogued():
            raise UsageError(f"no machine catalog for provider {provider!r}",
                             f"use {' or '.join(f'--provider {p}' for p in catalogued())}")
        machines = list(catalog.load_catalog(provider).machines)
        if gpu:
            try:
                wanted = catalog.gpu(gpu).name
            except catalog.UnknownGpu as exc:
                raise UsageError(str(exc)) from None
            machines = [m for m in machines if m.gpu == wanted]
        return machines


def _log_lines(provider: Provider, job_id: str, follow: bool) -> Iterator[str]:
    cursor = None
    while True:
        lines, cursor = provider.logs(job_id, cursor)  # a page at a time: read until empty
        yield from lines
        if not lines and (not follow or provider.poll(job_id).terminal):
            break
        if not lines:
            time.sleep(0.2)


def _recordable(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options worth recording in a run (plain values; paths as text; never the script,
    which the run records on its own). No credential is an option, so none is recorded."""
    kept: dict[str, Any] = {}
    for key, value in options.items():
        if key == "script" or value is None:
            continue
        if isinstance(value, Path):
            value = str(value)
        if isinstance(value, (str, int, float, bool)):
            kept[key] = value
    return kept


def _no_script(spec: Spec) -> bool:
    """A model described with no script (``launch plan --params 7B``): nothing to render."""
    return spec.script.name == NO_SCRIPT.name


def run_stem(script: Path) -> str:
    """The first part of a run id: the script's name, or its folder's for train.py/main.py."""
    return script.parent.name if script.stem in ("train", "main") else script.stem
