"""``capture.json`` and the state the hooks share: what was found so far, written as it is found.

``ANSWER`` is the capture's answer (``launcher.capture.frameworks`` reads it), ``STATE`` the run's
own bookkeeping (the output folder, the script, what a hook saw); ``Stop`` ends the script where
training would start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ANSWER: dict[str, Any] = {"reached": False, "notes": []}
STATE: dict[str, Any] = {}


class Stop(BaseException):
    """Training would start here: the capture has what it needs, the script stops."""


def note(text: str) -> None:
    if text not in ANSWER["notes"]:
        ANSWER["notes"].append(text)


def write_answer() -> None:
    out: Path = STATE["out"]
    tmp = out / ".capture.json.tmp"
    tmp.write_text(json.dumps(ANSWER, default=str, indent=1), encoding="utf-8")
    os.replace(tmp, out / "capture.json")
