"""The Vertex AI provider, everything about Google Cloud in one package.

``provider.py`` (:class:`VertexProvider`: the request, sending, following, stopping),
``logs.py`` (reading Cloud Logging: the full stream and the event channel), ``names.py``
(regions, buckets, job names, states), ``machines.py`` (machine specs), ``timing.py``,
``doctor.py`` (`launch doctor --provider vertex`), ``bootstrap.py`` (what runs on every node,
shipped as package data) and ``_gcp.py`` (how one talks to Google Cloud and survives it).
Importing it imports no Google SDK: the SDKs are imported by the calls that need them.

Its ``__init__`` imports only the settings (`launch --help` reads them); the rest of the
names below are imported from their modules on first use.
"""

from __future__ import annotations

from launcher.providers import lazy_names
from launcher.providers.vertex.settings import VertexSettings

#: This package's module -> the names imported from it on first use.
__getattr__ = lazy_names(__name__, {
    "logs": ("EVENT_CATEGORIES", "EVENT_FIELDS", "LOG_PAGE_SIZE", "event_needles", "event_query"),
    "machines": ("ACCELERATORS", "MachineSpec", "machine_spec"),
    "names": ("DEFAULT_PREFIX", "DEFAULT_TIMEOUT_S", "STATES", "check_region", "console_url",
              "parse_bucket", "parse_duration", "parse_job_name"),
    "provider": ("BOOTSTRAP", "CAPACITY_PATTERNS", "DEFAULT_IMAGE", "VertexProvider",
                 "VertexRequest"),
    "timing": ("Timing",),
})

__all__ = ["ACCELERATORS", "BOOTSTRAP", "CAPACITY_PATTERNS", "DEFAULT_IMAGE", "DEFAULT_PREFIX",
    "DEFAULT_TIMEOUT_S", "EVENT_CATEGORIES", "EVENT_FIELDS", "LOG_PAGE_SIZE", "MachineSpec",
    "STATES", "Timing", "VertexProvider", "VertexRequest", "VertexSettings", "check_region",
    "console_url", "event_needles", "event_query", "machine_spec", "parse_bucket",
    "parse_duration", "parse_job_name"]
