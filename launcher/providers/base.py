"""What every provider does, and the data that flows through it.

Like torchx's schedulers, ``submit(job)`` is ``schedule(dryrun(job))``: the dry run builds the
exact request that is sent, so ``launch plan`` can show it and tests can compare it. A provider is
the only code that talks to its cloud (or, for ``local``, to torchrun).
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from launcher.plan.plan import Plan
from launcher.status import BadValue, JobState, UsageError

if TYPE_CHECKING:
    from launcher.providers.checks import Check
    from launcher.render import RenderedJob

#: The states a job does not leave. (``JobState`` is defined in ``launcher.status``: ``runs``
#: reads it too and may not import this module, which names ``render``, which imports ``runs``.)
TERMINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                   JobState.NOT_SUBMITTED)


@dataclass(frozen=True)
class Job:
    """One attempt, rendered and ready to send: what the supervisor hands a provider."""

    run_id: str
    attempt: int
    plan: Plan
    rendered: RenderedJob
    job_dir: Path          # where the rendered files were written
    attempt_dir: Path      # the attempt's folder in the run (request, logs)
    checkpoint_dir: Path   # shared by the run's attempts, so a resubmission resumes
    code_dir: Path         # the user's script folder
    memory_limit: int | None = None


class Request(Protocol):
    """A provider's payload; ``to_dict`` is what ``launch plan --json`` shows as ``request``."""

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class JobStatus:
    state: JobState              # pending | running | succeeded | failed | cancelled
    exit_code: int | None = None
    message: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", JobState(self.state))  # "running" -> the member

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class Provider(abc.ABC):
    name: ClassVar[str]
    #: Whether ``launch doctor --provider NAME`` has an account to check (:meth:`doctor_checks`).
    has_doctor: ClassVar[bool] = False
    #: How the platform says that it could not give a job its machines, or took them away
    #: (case-insensitive substrings of a job's end message): such an attempt is worth the same
    #: plan again, resumed (:meth:`lost_capacity`). None on a machine of one's own.
    capacity_patterns: ClassVar[tuple[str, ...]] = ()
    #: How a job's log names this platform (its paths, its error names, its hosts), as a regular
    #: expression, and lower-case words every match holds (looked for first: a line may be a
    #: megabyte long). Where the platform is named, a bare SIGKILL is the kernel's out-of-memory
    #: kill: a managed platform reports its own stops in words. The failure classifier joins
    #: every provider's (``failures._rules.names_platform``); empty on a machine of one's own.
    platform_pattern: ClassVar[str] = ""
    platform_needles: ClassVar[tuple[str, ...]] = ()
    #: Other names a log of this platform may be explained under (``launch explain
    #: --platform``): the platform's older names.
    platform_aliases: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_settings(cls, settings: dict[str, Any], environ: dict[str, str] | None = None
                      ) -> Provider:
        """Build from the run's provider settings (region, bucket, role, ...) and environment.

        Called for a new launch and again by `launch status|logs|cancel|attach`, from what the
        run folder recorded; credentials are never among the settings.
        """
        return cls()

    @abc.abstractmethod
    def dryrun(self, job: Job) -> Request:
        """The exact request ``schedule`` would send, built without side effects."""

    @abc.abstractmethod
    def schedule(self, request: Request) -> str:
        """Send the request; return the provider's job id."""

    def submit(self, job: Job) -> tuple[Request, str]:
        request = self.dryrun(job)
        return request, self.schedule(request)

    @abc.abstractmethod
    def poll(self, job_id: str) -> JobStatus: ...

    @abc.abstractmethod
    def logs(self, job_id: str, cursor: Any = None) -> tuple[list[str], Any]:
        """New complete log lines since ``cursor``, and the cursor to pass next time."""

    @abc.abstractmethod
    def stop(self, job_id: str) -> None:
        """Stop the job now; calling it on a finished job does nothing."""

    def events(self, job_id: str, cursor: Any = None) -> tuple[list[str], Any]:
        """The job's structured event lines (the templates' ``emit``) and, on the clouds, its
        failure lines (a server-side filtered query for the classifier's needles), from a
        channel of their own, read before the log so a failure never waits behind it; none where
        the provider has no such channel (then the log carries them). The log still carries
        every line: these are read twice, shown once."""
        return [], cursor

    def behind(self, job_id: str, cursor: Any) -> float | None:
        """How far the log read up to ``cursor`` trails the job, in seconds of log still to be
        read (``None``: caught up, or the provider cannot tell). The supervisor says so when it
        grows, instead of lagging silently; the event channel is not behind it."""
        return None

    def adopt(self, run_id: str, attempt: int, attempt_dir: Path) -> str | None:
        """The job id of an attempt that was (maybe) created but never recorded, found by the
        name or labels the dry run gives it; ``None`` if there is no such job."""
        return None

    def residue(self, job_id: str) -> list[int]:
        """What of an ended job still runs (the local provider's processes); a cloud's job is
        gone once its state is terminal."""
        return []

    def lost_capacity(self, message: str) -> bool:
        """Whether a job's end message (``JobStatus.message``) says the platform could not give
        the job its machines, or took them away (:attr:`capacity_patterns`)."""
        text = message.lower()
        return any(pattern.lower() in text for pattern in self.capacity_patterns)

    @classmethod
    def doctor_checks(cls, settings: Mapping[str, Any], environ: Mapping[str, str]
                      ) -> list[Check]:
        """`launch doctor`'s checks of this machine and the provider's account, made in order
        with these settings (flags and config keys, unset ones left out) and this environment:
        each says what it looked at and, failing, how to fix it. A setting that is missing is a
        failed check; a malformed one raises :class:`UsageError` before anything is checked.
        Nothing to check (``[]``) where :attr:`has_doctor` is false."""
        return []


# -- values every provider checks at its boundary, each against its own cloud's rules ----------


def checked_duration(value: Any, low: int, high: int, platform: str, bounds: str) -> int:
    """``--timeout`` (``3600``, ``90m``, ``12h``, ``2d``) in seconds, within ``[low, high]``
    (the platform's limits, said in ``bounds``), else a one-line :class:`BadValue`."""
    from launcher.units import parse_duration

    try:
        seconds = parse_duration(value)
    except ValueError:
        raise BadValue(f"--timeout {value!r} is not a duration",
                       "write it like 3600, 90m, 12h or 2d") from None
    if not low <= seconds <= high:
        raise BadValue(f"--timeout {value!r} is outside what {platform} allows", bounds)
    return seconds


def checked_region(region: Any, shape: re.Pattern[str], max_length: int, what: str,
                   expected: str, source: str = "") -> str:
    """``region`` when it matches ``shape`` whole, else a one-line :class:`BadValue` naming it
    and where it came from (``source``): a region becomes part of host names."""
    if not isinstance(region, str) or len(region) > max_length or not shape.fullmatch(region):
        shown = repr(region) if len(repr(region)) <= 80 else repr(region)[:77] + "..."
        where = f" (from {source})" if source else ""
        raise BadValue(f"region {shown}{where} is not {what}", f"expected {expected}")
    return region


#: torchrun's own options (torch 2.13's, both spellings; older ones have fewer): the
#: arguments after the script on a torchrun command line are the script's, but torchrun's
#: parser (argparse, abbreviations allowed) still reads each one to classify it first.
TORCHRUN_OPTIONS = frozenset({
    "--duplicate-stderr-filters", "--duplicate-stdout-filters", "--duplicate_stderr_filters",
    "--duplicate_stdout_filters", "--event-log-handler", "--event_log_handler", "--help",
    "--local-addr", "--local-ranks-filter", "--local_addr", "--local_ranks_filter", "--log-dir",
    "--log_dir", "--logs-specs", "--logs_specs", "--master-addr", "--master-port",
    "--master_addr", "--master_port", "--max-restarts", "--max_restarts", "--module",
    "--monitor-interval", "--monitor_interval", "--nnodes", "--no-python", "--no_python",
    "--node-rank", "--node_rank", "--nproc-per-node", "--nproc_per_node", "--numa-binding",
    "--numa_binding", "--rdzv-backend", "--rdzv-conf", "--rdzv-endpoint", "--rdzv-id",
    "--rdzv_backend", "--rdzv_conf", "--rdzv_endpoint", "--rdzv_id", "--redirects", "--role",
    "--run-path", "--run_path", "--shutdown-timeout", "--shutdown_timeout",
    "--signals-to-handle", "--signals_to_handle", "--standalone", "--start-method",
    "--start_method", "--tee", "--virtual-local-rank",
    "--virtual_local_rank",
})


def in_code_folder(path: str | Path, code_dir: Path, what: str = "script") -> str:
    """``path`` (absolute, or relative to ``code_dir``) as a POSIX path relative to the job's
    code folder: what the job finds under its unpacked code on the node, whichever cloud staged
    it. Every provider rebases the script and the recipe through this one function; a path
    outside the folder is not staged, so it is refused here, before anything is sent."""
    candidate = Path(path)
    candidate = candidate if candidate.is_absolute() else code_dir / candidate
    try:
        return candidate.resolve().relative_to(code_dir.resolve()).as_posix()
    except ValueError:
        raise UsageError(f"the {what} {path} is outside its code folder {code_dir}",
                         "keep the script and what it imports in the folder that is staged"
                         ) from None


def torchrun_script_args(args: tuple[str, ...] | list[str]) -> list[str]:
    """The script's arguments, for after the script on a torchrun command line, where they
    reach it verbatim except for what torchrun's own parser takes first, refused here in one
    line (:class:`BadValue`) instead of failing or changing on the machines: a bare ``--``
    (dropped when it comes first, kept after, depending on the Python), and an option that
    abbreviates two or more of torchrun's (``--max``: ``--max-restarts``, ``--max_restarts``),
    which torchrun refuses as ambiguous before the script starts."""
    for arg in args:
        if arg == "--":
            raise BadValue("the script's arguments hold a bare --, which torchrun (it starts the "
                           "script) may drop", "pass the script's arguments without it")
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        if name in TORCHRUN_OPTIONS:
            continue  # torchrun's exact option after the script: the script's, whole
        matches = sorted(o for o in TORCHRUN_OPTIONS if o.startswith(name))
        if len(matches) > 1:
            shown = arg if len(arg) <= 40 else arg[:37] + "..."
            raise BadValue(f"the script's argument {shown!r} abbreviates torchrun's own "
                           f"{', '.join(matches[:4])}{' ...' if len(matches) > 4 else ''}: "
                           "torchrun, which starts the script, refuses it as ambiguous",
                           "spell the script's option out in full")
    return list(args)
