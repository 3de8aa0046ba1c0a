"""The training templates' structured lines: ``{"launch": "<event>", ...}``, one JSON object a line.

They reach the launcher behind whatever the platform puts in front (torchrun's ``[rank3]:``, a
cloud log's timestamp), so the object is found by its opening ``{"launch":`` rather than by
position. ``parse_event`` is the one parser of these lines: the supervisor, the report and the
failure classifier's segments (``failures/_clean.py``) all read them through it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MARKER = '{"launch":'


def parse_event(line: str) -> dict[str, Any] | None:
    """The event object in ``line``, or None when the line carries none."""
    start = line.find(MARKER)
    if start < 0:
        return None
    try:
        event, _ = json.JSONDecoder().raw_decode(line, start)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


@dataclass(frozen=True)
class OomEvent:
    """The templates' ``{"launch": "oom", ...}`` event, typed (``report_out_of_memory`` of
    ``trainer_templates/launch_runtime.py`` writes it, for the framework shim too). A field the
    line did not carry is None; ``fields`` is the object as it came (less ``"launch"``), for a
    record that keeps it whole (``remedies.Failure.of``)."""

    rank: int | None = None
    phase: str | None = None
    step: int | None = None
    micro_step: int | None = None
    micro_batch_size: int | None = None
    grad_accum_steps: int | None = None
    #: The micro-batch's tensors' shapes and dtypes (the templates' ``batch_shapes``).
    batch_shapes: Any = None
    device: str | None = None
    message: str | None = None
    requested_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    max_allocated_bytes: int | None = None
    free_bytes: int | None = None
    capacity_bytes: int | None = None
    fields: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_event(cls, event: Mapping[str, Any] | None) -> OomEvent | None:
        """The event as an ``OomEvent``, or None when it is not an ``oom`` event."""
        if not event or event.get("launch") != "oom":
            return None
        kept = {k: v for k, v in event.items() if k != "launch"}
        names = [name for name in cls.__dataclass_fields__ if name != "fields"]
        return cls(**{name: kept.get(name) for name in names}, fields=kept)


def parse_oom(line: str) -> OomEvent | None:
    """The ``oom`` event in ``line``, or None when the line carries none (``parse_event``)."""
    return OomEvent.from_event(parse_event(line))
