"""Numbers a scenario measured, for a benchmark that reruns it (never asserted as timings).

Tests assert what must hold (the stop came through the event channel, every line once); how fast
it came is a benchmark's to report: ``bench/bench_cloud_stop.py`` reruns the flood scenarios with
``LAUNCH_BENCH_RECORD`` naming a file, and each appends one JSON line here.
"""

from __future__ import annotations

import json
import os
from typing import Any


def record(scenario: str, **values: Any) -> None:
    """Append ``{"scenario": ..., **values}`` to ``$LAUNCH_BENCH_RECORD`` when it is set."""
    path = os.environ.get("LAUNCH_BENCH_RECORD")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"scenario": scenario, **values}) + "\n")
