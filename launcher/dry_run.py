"""The chosen plan's first attempt as it would run, shown before anything is paid for.

`launch plan` is a dry run (torchx's ``submit_dryrun``): ``dry_request`` builds the exact
request a cloud provider would send; ``--out DIR`` (``write_job_folder``) writes the program
too, so that what a job would run can be read, kept, diffed or run by hand: the rendered job's
files (the training script or the framework shim, ``plan.json``, its helpers) and
``request.json``, the provider's exact request with ``DIR`` as the job's folder (for the local
provider its command, folder and environment). Both build the job with the function a run's
attempts use (``supervisor.build_job``). Only a new or empty folder is written: what is already
somewhere is not launch's to replace.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.providers import LOCAL
from launcher.status import BadValue, LaunchError, UsageError

if TYPE_CHECKING:
    from launcher.plan.plan import Plan
    from launcher.plan.planner import PlanResult
    from launcher.providers.base import Job, Provider
    from launcher.spec import Spec

#: The request's file in the job folder.
REQUEST_FILE = "request.json"


def _first_attempt(spec: Spec, chosen: Plan, state_dir: Path) -> Job:
    """The job the chosen plan's first attempt would run (a run's attempts are built so too)."""
    from launcher.supervisor import build_job

    return build_job(spec, chosen, "dry-run", 1, state_dir / "runs" / "dry-run")


def dry_request(spec: Spec, result: PlanResult, provider: Provider | None, state_dir: Path,
                no_script: bool = False) -> dict[str, Any] | None:
    """The exact request a cloud provider would send for the chosen plan (``no_script``: the
    model was described with no script to render).

    ``None`` for the local provider, when nothing fits, or when the request cannot be built
    (a missing role or bucket): then a note says why, and the plan still stands. A bad value
    (a region the SDK publishes no image in) is the user's to fix: raised.
    """
    if spec.provider == LOCAL or result.chosen is None:
        return None
    if no_script:
        result.notes.append(f"no {spec.provider} request: no script to render (give the "
                            "SCRIPT to see the exact request)")
        return None
    if provider is None:
        return None
    try:
        request: dict[str, Any] = provider.dryrun(
            _first_attempt(spec, result.chosen, state_dir)).to_dict()
        return request
    except BadValue:
        raise
    except LaunchError as exc:
        result.notes.append(f"no {spec.provider} request: {exc}")
        return None


def check_new_folder(out: Path) -> None:
    """Refuse a folder that holds anything (or a file in its place), in one line."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} {'is not empty' if out.is_dir() else 'is not a folder'}: "
                         "--out writes a new job folder", "give a new or empty folder")


def write_job_folder(spec: Spec, chosen: Plan | None, provider: Provider | None, out: Path,
                     state_dir: Path, no_script: bool = False) -> str:
    """Write ``chosen``'s first attempt into ``out``; the sentence the plan's notes say of it
    (what was written, or why nothing was: no plan fits, no script, no request)."""
    from launcher.statefiles import atomic_write

    if chosen is None:
        return f"nothing written to {out}: no plan fits"
    if no_script:
        return f"nothing written to {out}: no script to render (give the SCRIPT)"
    check_new_folder(out)  # again: the plan took seconds
    job = dataclasses.replace(_first_attempt(spec, chosen, state_dir), job_dir=out,
                              attempt_dir=out)
    job.rendered.write(out)
    written = f"{len(job.rendered.files)} file(s)"
    if provider is None:
        return f"job folder written to {out} ({written}; no request: the provider is not set up)"
    try:
        request = provider.dryrun(job).to_dict()
    except LaunchError as exc:
        return f"job folder written to {out} ({written}; no {REQUEST_FILE}: {exc})"
    atomic_write(out / REQUEST_FILE, json.dumps(request, indent=2, default=str) + "\n")
    return f"job folder written to {out} ({written} and {REQUEST_FILE})"
