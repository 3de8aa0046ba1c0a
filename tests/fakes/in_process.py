"""``launch`` run in this process, as the tests that plan many scripts at once call it.

A module's plans start together in a small thread pool (each imports torch in its own capture
and trace children: seconds of CPU that overlap), so they call ``cli.main`` with an injected
``Environment`` (the state under the script's folder, the trace on) rather than the ``cli``
fixture, which is per test.
"""

from __future__ import annotations

import io
import json
import os
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

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


class Runs:
    """A module's launches, started together in a pool of two: each script in a folder of its
    own (``dir/NAME/main.py``, ``train.py`` for a name starting with nanogpt), its result a
    future by name."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.pool = ThreadPoolExecutor(2)
        self.futures: dict[str, Future] = {}
        self.scripts: dict[str, Path] = {}

    def write(self, name: str, source: str, files: dict[str, str] | None = None) -> Path:
        folder = self.dir / name
        folder.mkdir()
        script = folder / ("train.py" if name.startswith("nanogpt") else "main.py")
        script.write_text(source)
        for file, text in (files or {}).items():
            (folder / file).write_text(text)
        self.scripts[name] = script
        return script

    def plan(self, name: str, source: str, *args: str, files: dict[str, str] | None = None
             ) -> None:
        """``launch plan SCRIPT --json ARGS`` of ``source``, written as ``name``'s script."""
        script = self.write(name, source, files)
        self.futures[name] = self.pool.submit(
            launch, ["plan", str(script), "--json", *args], script.parent)

    def run(self, name: str, source: str, *args: str) -> None:
        """``launch run SCRIPT --json ARGS``: a job of ``source`` on the local provider."""
        script = self.write(name, source)
        self.futures[name] = self.pool.submit(
            launch, ["run", str(script), "--json", *args], script.parent)

    def json(self, name: str) -> dict[str, Any]:
        status, out, err = self.futures[name].result()
        assert status == 0, err
        return json.loads(out)
