"""``launch`` run in this process, as the tests that plan many scripts at once call it.

A module's plans start together in a small thread pool (each imports torch in its own capture
and trace children: seconds of CPU that overlap), so they call ``cli.main`` with an injected
``Environment`` (the state under the script's folder, the trace on) rather than the ``cli``
fixture, which is per test.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

from launcher.cli import main
from launcher.context import Environment


def launch(args: list[str], cwd: Path, environ: dict[str, str] | None = None
           ) -> tuple[int, str, str]:
    """``launch ARGS`` in ``cwd`` (state in ``cwd/state``): its status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    env = Environment(stdout=out, stderr=err, cwd=cwd,
                      environ={**os.environ, "LAUNCH_STATE_DIR": str(cwd / "state"),
                               "LAUNCH_NO_TRACE": "0", **(environ or {})},
                      python=sys.executable)
    status = main(args, env)
    return int(status), out.getvalue(), err.getvalue()
