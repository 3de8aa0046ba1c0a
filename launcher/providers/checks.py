"""What a provider's `launch doctor` checks are made of: one :class:`Check` per thing looked at.

A provider's checks (``Provider.doctor_checks``) live with the provider, since each talks to its
own cloud through the provider's own plumbing (the same endpoints and credentials as a launch);
``launcher/doctor.py`` runs them, prints the report and gives the exit status. This module is
what both sides share: the check record, the list the checks are appended to, and the two rules
every check keeps (a call gets :data:`CALL_TIMEOUT_S`; a lookup that may hang runs under a
deadline, :func:`within`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["ok", "warn", "fail", "skip"]

#: Seconds each doctor call may take (connect and read); a dead endpoint is a failed check.
CALL_TIMEOUT_S = 10.0
#: The credential lookup gets this long, all of it (the metadata services of the clouds can hang).
CREDENTIALS_DEADLINE_S = 1.5


@dataclass(frozen=True)
class Need:
    """One permission a step of the launcher needs, on what, and why (shown to the user)."""

    permission: str
    on: str
    why: str


@dataclass(frozen=True)
class Check:
    """One thing looked at: ``ok``, ``warn`` (works, but worth knowing), ``fail`` (a launch would
    fail; ``fix`` says what to do) or ``skip`` (could not be looked at because an earlier check
    failed)."""

    name: str
    status: Status
    detail: str
    fix: str = ""
    needs: tuple[str, ...] = ()  # the permissions (on what) this check relies on or found missing

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix,
                "needs": list(self.needs)}


class Checks:
    """The checks of one provider, appended to ``checks`` as they are made (a provider's doctor
    subclasses it and adds its checks in order)."""

    def __init__(self, settings: dict[str, Any], environ: dict[str, str],
                 checks: list[Check] | None = None):
        self.settings = settings
        self.environ = environ
        self.checks: list[Check] = [] if checks is None else checks

    def add(self, name: str, status: Status, detail: str, fix: str = "",
            needs: tuple[str, ...] | list[str] = ()) -> Check:
        check = Check(name, status, detail, fix, tuple(needs))
        self.checks.append(check)
        return check

    def skip(self, names: tuple[str, ...], why: str) -> None:
        for name in names:
            self.add(name, "skip", why)


def within(deadline: float, work: Callable[[], Any]) -> tuple[bool, Any, BaseException | None]:
    """Run ``work`` on a daemon thread for at most ``deadline`` seconds: (finished, result,
    error). A lookup that neither answers nor fails cannot hold the doctor past the deadline."""
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # reported, never raised on the thread
            error.append(exc)

    thread = threading.Thread(target=target, name="launch-doctor", daemon=True)
    thread.start()
    thread.join(deadline)
    if thread.is_alive():
        return False, None, None
    return True, result[0] if result else None, error[0] if error else None


def one_line(exc: BaseException) -> str:
    """An exception's message, its first line, at most 300 characters."""
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    lines = [part.strip() for part in str(text).splitlines() if part.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]
