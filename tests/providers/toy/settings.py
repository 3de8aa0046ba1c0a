"""The toy's settings: its one flag (``--toy-root``) and config key, declared once, as a real
provider's settings class does (``launcher.flags.flag``)."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.flags import flag


@dataclass(frozen=True)
class ToySettings:
    toy_root: str | None = flag("Folder the toy's jobs live in.", envvar="LAUNCH_TOY_ROOT")
