"""The environment `launch` runs in, injectable so the CLI runs in-process in tests (httpie's idea).

Everything the CLI reads from the outside world that a test wants to control goes through here:
the output streams, the working directory, the environment variables and where run state lives.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO


@dataclass
class Environment:
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    stdin: TextIO = field(default_factory=lambda: sys.stdin)
    cwd: Path = field(default_factory=Path.cwd)
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    #: The Python that runs children (probes, torchrun). Tests keep the venv's interpreter.
    python: str = field(default_factory=lambda: sys.executable)
    #: The command line `launch` was given (``cli.main`` sets it): a report says what made it.
    argv: list[str] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        """Where runs are kept: ``$LAUNCH_STATE_DIR`` or ``.launch`` in the working directory."""
        configured = self.environ.get("LAUNCH_STATE_DIR")
        path = Path(configured) if configured else Path(".launch")
        return path if path.is_absolute() else self.cwd / path

    @property
    def is_tty(self) -> bool:
        return bool(getattr(self.stdout, "isatty", lambda: False)())
