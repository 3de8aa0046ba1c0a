"""The training templates' structured lines: ``{"launch": "<event>", ...}``, one JSON object a line.

They reach the launcher behind whatever the platform puts in front (torchrun's ``[rank3]:``, a
cloud log's timestamp), so the object is found by its opening ``{"launch":`` rather than by
position.
"""

from __future__ import annotations

import json
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
