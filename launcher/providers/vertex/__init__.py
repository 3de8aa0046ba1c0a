"""The Vertex AI provider, everything about Google Cloud in one package.

``provider.py`` (:class:`VertexProvider`: the request, sending, following, stopping),
``logs.py`` (reading Cloud Logging: the full stream and the event channel), ``names.py``
(regions, buckets, job names, states), ``machines.py`` (machine specs), ``timing.py``,
``doctor.py`` (`launch doctor --provider vertex`), ``bootstrap.py`` (what runs on every node,
shipped as package data) and ``_gcp.py`` (how one talks to Google Cloud and survives it).
Importing it imports no Google SDK: the SDKs are imported by the calls that need them.
"""

from launcher.providers.vertex.logs import (
    EVENT_CATEGORIES,
    EVENT_FIELDS,
    LOG_PAGE_SIZE,
    event_needles,
    event_query,
)
from launcher.providers.vertex.machines import ACCELERATORS, MachineSpec, machine_spec
from launcher.providers.vertex.names import (
    DEFAULT_PREFIX,
    DEFAULT_TIMEOUT_S,
    STATES,
    check_region,
    console_url,
    parse_bucket,
    parse_duration,
    parse_job_name,
)
from launcher.providers.vertex.provider import (
    BOOTSTRAP,
    CAPACITY_PATTERNS,
    DEFAULT_IMAGE,
    VertexProvider,
    VertexRequest,
)
from launcher.providers.vertex.timing import Timing

__all__ = [
    "ACCELERATORS", "BOOTSTRAP", "CAPACITY_PATTERNS", "DEFAULT_IMAGE", "DEFAULT_PREFIX",
    "DEFAULT_TIMEOUT_S", "EVENT_CATEGORIES", "EVENT_FIELDS", "LOG_PAGE_SIZE", "STATES",
    "MachineSpec", "Timing", "VertexProvider", "VertexRequest", "check_region", "console_url",
    "event_needles", "event_query", "machine_spec", "parse_bucket", "parse_duration",
    "parse_job_name",
]
