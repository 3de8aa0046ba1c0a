"""`launch doctor --provider vertex|sagemaker`: is this machine and this cloud account ready?

A first job that fails twenty minutes in because a role cannot be passed, or a bucket is in the
wrong region, costs more than the minute this takes. Each check names what it looked at, and a
failing one says how to fix it (usually: the Terraform in ``infra/`` and one of its outputs).

The checks belong to the providers (``Provider.doctor_checks``: launcher/providers/vertex/doctor.py
and launcher/providers/sagemaker/doctor.py list them, in order, with the permissions each relies
on); they go through the provider's own plumbing, so the doctor talks to the same endpoints with
the same credentials as a launch does, and the loopback test servers stand in for both. This
module asks the provider for them, and prints the report and its exit status.

Exit status (:attr:`DoctorReport.exit_status`): 0 when nothing failed (warnings allowed), 6 when a
check failed; malformed input (an unknown provider, a role that is not an ARN, a bucket that is
not a bucket name) raises :class:`UsageError` before anything is checked (2). A setting that is
missing is a failed check, with the flag, variable, config key and Terraform output that give it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from launcher.providers.checks import Check, Status
from launcher.status import ExitStatus, UsageError

__all__ = ["Check", "DoctorReport", "Status", "doctor_providers", "print_report", "run_doctor"]


@dataclass
class DoctorReport:
    provider: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warn"]

    @property
    def exit_status(self) -> ExitStatus:
        """0 with warnings; 6 (provider or credentials error) as soon as one check failed."""
        return ExitStatus.PROVIDER_ERROR if self.failed else ExitStatus.SUCCESS

    def check(self, name: str) -> Check:
        for item in self.checks:
            if item.name == name:
                return item
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "ok": not self.failed,
                "exit_status": int(self.exit_status),
                "checks": [c.to_dict() for c in self.checks]}


def doctor_providers() -> list[str]:
    """The providers with an account to check (``has_doctor``), in the registry's order."""
    from launcher.providers import names, provider_class

    return [name for name in names() if provider_class(name).has_doctor]


def run_doctor(provider: str, settings: Mapping[str, Any], environ: Mapping[str, str]
               ) -> DoctorReport:
    """Check everything a launch on ``provider`` needs, with these settings (flags and config
    file keys: region, bucket, project, service_account, role, machine, s3_prefix, job_prefix ...)
    and this environment. Raises :class:`UsageError` for an unknown provider or a malformed
    setting; everything else is a check in the report."""
    checkable = doctor_providers()
    if provider not in checkable:
        raise UsageError(f"launch doctor checks a cloud account, not {provider!r}",
                         "pass " + " or ".join(f"--provider {name}" for name in checkable))
    from launcher.providers import provider_class

    values = {k: v for k, v in dict(settings).items() if v is not None and v != ""}
    checks = provider_class(provider).doctor_checks(values, dict(environ))
    return DoctorReport(provider, list(checks))


# -- printing ----------------------------------------------------------------------------------

_LABELS = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def print_report(report: DoctorReport, out: TextIO, as_json: bool = False) -> None:
    """The report as one line per check (a failure or warning adds its fix and what it needs),
    or as JSON (``--json``)."""
    if as_json:
        out.write(json.dumps(report.to_dict(), indent=2) + "\n")
        return
    width = max((len(c.name) for c in report.checks), default=0)
    out.write(f"launch doctor --provider {report.provider}\n")
    for c in report.checks:
        out.write(f"  {_LABELS[c.status]:<4}  {c.name:<{width}}  {c.detail}\n")
        if c.status in ("fail", "warn"):
            pad = " " * (8 + width)
            if c.fix:
                out.write(f"{pad}fix: {c.fix}\n")
            if c.needs:
                out.write(f"{pad}needs: {'; '.join(c.needs)}\n")
    failed, warned = len(report.failed), len(report.warnings)
    if failed:
        summary = f"{failed} check(s) failed, {warned} warning(s): a launch would fail"
    elif warned:
        summary = f"ready, with {warned} warning(s)"
    else:
        summary = "ready"
    out.write(f"{summary} (exit {int(report.exit_status)})\n")
