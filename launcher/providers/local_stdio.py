"""Run a plain script as ``__main__`` with its stderr on its stdout: one stream, in order.

torchrun copies each rank's stdout and stderr through separate readers, so a traceback written
to stderr can reach the log ahead of the lines the script printed just before it. The rendered
scripts merge the two themselves (``LAUNCH_MERGE_STDERR``); a user's own script is run through
this module instead (``torchrun ... -m launcher.providers.local_stdio train.py ARGS``), which
does the same and then runs the script exactly as ``python train.py ARGS`` would: ``__main__``,
``sys.argv[0]`` the script, its folder first on ``sys.path``.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m launcher.providers.local_stdio SCRIPT [ARGS...]")
    script = os.path.abspath(sys.argv[1])
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(sys.stdout.fileno(), sys.stderr.fileno())
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
