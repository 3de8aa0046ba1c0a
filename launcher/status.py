"""Exit statuses of `launch`: the one place they are defined (CI pipelines branch on them); and
the job states, which the state files and ``--json`` carry."""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """What `launch` exits with. Documented in the README; other tools rely on these numbers."""

    SUCCESS = 0
    #: The job failed for a reason other than memory (or the launcher hit an internal error).
    JOB_FAILED = 1
    #: Bad command line, bad script, bad config: fix the input and rerun.
    USAGE = 2
    #: No candidate plan fits in memory on the machines allowed.
    NO_PLAN_FITS = 3
    #: Every plan that fits costs more than --budget.
    OVER_BUDGET = 4
    #: Still out of memory after the last allowed attempt.
    OUT_OF_MEMORY = 5
    #: The cloud provider refused or could not be reached, or credentials are missing.
    PROVIDER_ERROR = 6
    #: The question before a cloud submission was answered no: nothing was started or spent.
    NOT_SUBMITTED = 7
    #: SIGHUP (128 + 1): the terminal closed; handled as Ctrl-C.
    HANGUP = 129
    #: Ctrl-C (128 + SIGINT).
    INTERRUPTED = 130
    #: SIGTERM (128 + 15): CI cancellation, ``timeout(1)``; handled as Ctrl-C.
    TERMINATED = 143


class JobState(enum.StrEnum):
    """A job's state in the launcher's words, whatever the provider: each provider maps its
    cloud's states (``JOB_STATE_RUNNING``, ``InProgress``) to these. An attempt's record
    (``runs.Attempt.state``) adds ``submitting``: written ahead, before the job exists. A ``str``,
    so the state files and ``--json`` hold the plain value."""

    SUBMITTING = "submitting"
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: An attempt's record only: the create was refused (credentials, quota, a bad request) or
    #: never made (the launcher stopped first). No job exists and nothing was spent.
    NOT_SUBMITTED = "not_submitted"


class LaunchError(Exception):
    """An error the user can act on: printed as one line, exits with ``status``, no traceback.

    ``hint`` is the "what to do" part, kept apart so JSON output can carry it as its own field.
    """

    def __init__(self, message: str, status: ExitStatus = ExitStatus.USAGE, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.status = status
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(LaunchError):
    def __init__(self, message: str, hint: str = ""):
        super().__init__(message, ExitStatus.USAGE, hint)


class BadValue(UsageError):
    """A value that was given is malformed (a region, a duration). Unlike a missing setting,
    which `launch plan` notes before planning on without the request, it stops every command:
    a region that is not a region must never get as far as a host name."""


class ProviderError(LaunchError):
    def __init__(self, message: str, hint: str = ""):
        super().__init__(message, ExitStatus.PROVIDER_ERROR, hint)
