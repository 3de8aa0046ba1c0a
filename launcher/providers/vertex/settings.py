"""The run's Vertex AI settings: the one declaration of what a Vertex job takes (flags, config
file, ``LAUNCH_*`` variables), read by `launch plan`, `launch run`, `launch doctor` and the
config file's check (``options.py``) without importing the provider. Never secrets: credentials
are application-default credentials, looked up at the first call that needs them.

Cheap to import: `launch --help` reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.flags import flag


@dataclass(frozen=True)
class VertexSettings:
    """``bucket`` is ``NAME`` or ``gs://NAME/PREFIX``; ``timeout`` seconds, or ``90m``, ``12h``,
    ``2d``; ``project`` and ``region`` fall back to the environment's (``VertexProvider.
    from_settings`` says in which order)."""

    region: str | None = None
    bucket: str | None = None
    project: str | None = flag("Google Cloud project.", envvar="LAUNCH_PROJECT")
    service_account: str | None = flag("Service account the jobs run as.",
                                       envvar="LAUNCH_SERVICE_ACCOUNT")
    spot: bool = False
    image: str | None = None
    timeout: str | None = None

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> VertexSettings:
        """The fields ``settings`` holds (the rest of it is other providers' or launch's own);
        empty text is unset, ``spot`` any truthy value."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = settings.get(f.name)
            if value is None or value == "":
                continue
            values[f.name] = bool(value) if f.name == "spot" else value
        return cls(**values)
