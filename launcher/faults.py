"""Named fault points, so that tests can stop `launch` at an exact instant instead of by luck.

``LAUNCH_FAULT=NAME[@N][:ACTION]`` makes the Nth time (default: the first) this process passes
``point(NAME)`` do ACTION; ``NAME*N`` makes each of the first N times do it:

- ``kill`` (the default): SIGKILL this process, as a crash or ``kill -9`` would, mid-step;
- ``enospc``: raise ``OSError(ENOSPC)``, as a full disk would, at a state write.

The points (each where a crash leaves a different record on disk; tests kill at every one):

    submit.recorded     the attempt is written ahead as ``submitting``, nothing scheduled yet
    schedule.request    the local job's request is on disk, its runner not started
    schedule.started    the runner is started, launch has not recorded it
    schedule.recorded   launch recorded the runner (``runner.json``)
    submit.running      the attempt is recorded ``running`` with its job id
    follow.ended        the job ended (an OOM stopped), its outcome not yet recorded
    replan.chosen       the fixed plan is chosen, the next attempt not yet written
    state.write         any state file about to be written (with ``:enospc``, a full disk)
    runner.record       the local runner about to record the job's end (``:enospc``)

Reading one variable per call is the whole cost when unset; this is how etcd's and TiKV's
failpoints work, and why they ship in release builds.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

_hits: dict[str, int] = {}


def point(name: str, path: Path | str | None = None) -> None:
    """Pass the fault point ``name`` (``path``: the file an ``enospc`` fault names)."""
    spec = os.environ.get("LAUNCH_FAULT")
    if not spec:
        return
    where, _, action = spec.partition(":")
    wanted, _, nth = where.partition("@")
    wanted, _, first = wanted.partition("*")
    if wanted != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if first.isdigit():
        if _hits[name] > int(first):
            return
    elif _hits[name] != (int(nth) if nth.isdigit() else 1):
        return
    if action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path or ""))
    os.kill(os.getpid(), signal.SIGKILL)
