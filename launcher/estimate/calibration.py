"""Calibration: what real runs measured, fed back into later estimates.

Every attempt that ran on a GPU leaves its metrics lines' peaks (``torch.cuda.max_memory_allocated``
and ``max_memory_reserved``, the maximum over ranks). Next to the plan's prediction they give two
ratios, kept per machine type (its GPU) in ``<state dir>/calibration.jsonl``:

* ``reserve_ratio`` = reserved / allocated: the caching allocator's slack on this machine, which
  replaces the default (``overheads.ALLOCATOR_RESERVE_RATIO``) for every model;
* ``allocated_scale`` = measured / predicted allocated, per model (the script's content hash):
  what the trace could not see (a custom kernel's workspace, say). It only ever raises an
  estimate: a run that used less than predicted does not make the next plan tighter.

The median of the records is used, so one odd run does not swing the plan. CPU runs report RSS,
not allocator peaks, and are not recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FILE = "calibration.jsonl"


@dataclass(frozen=True)
class Record:
    gpu: str
    model: str                 # content hash of the script + the plan's precision/optimizer/ckpt
    predicted_allocated: int
    measured_allocated: int
    measured_reserved: int | None
    at: float


@dataclass(frozen=True)
class Calibration:
    reserve_ratio: float | None = None   # None: no record for this GPU type
    allocated_scale: float = 1.0
    records: int = 0


def model_key(script: Path) -> str:
    """The script's content hash: a changed model is a new model."""
    return hashlib.sha256(script.read_bytes()).hexdigest()[:16] if script.is_file() else "?"


def record(state_dir: Path, rec: Record) -> None:
    """Append one record (a single write of one line with O_APPEND: atomic on a local disk)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(asdict(rec), sort_keys=True) + "\n").encode()
    fd = os.open(state_dir / FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _records(state_dir: Path) -> list[Record]:
    path = state_dir / FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            out.append(Record(**json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue  # a torn or foreign line: skip it, keep the rest
    return out


def lookup(state_dir: Path, gpu: str | None, model: str | None = None) -> Calibration:
    if gpu is None:
        return Calibration()
    mine = [r for r in _records(state_dir) if r.gpu == gpu and r.measured_allocated > 0]
    if not mine:
        return Calibration()
    reserve = [r.measured_reserved / r.measured_allocated for r in mine if r.measured_reserved]
    scale = [r.measured_allocated / r.predicted_allocated for r in mine
             if model is not None and r.model == model and r.predicted_allocated > 0]
    return Calibration(
        reserve_ratio=max(1.0, statistics.median(reserve)) if reserve else None,
        allocated_scale=max(1.0, statistics.median(scale)) if scale else 1.0,
        records=len(mine))


def from_attempt(state_dir: Path, gpu: str | None, model: str, plan: dict[str, Any],
                 summary: dict[str, Any]) -> Record | None:
    """Record what a finished attempt measured, when it ran on a GPU and had a prediction."""
    measured = summary.get("peak_allocated_bytes")
    predicted = (plan.get("memory") or {}).get("peak_allocated")
    if gpu is None or not measured or not predicted:
        return None
    rec = Record(gpu=gpu, model=model, predicted_allocated=int(predicted),
                 measured_allocated=int(measured),
                 measured_reserved=summary.get("peak_reserved_bytes"), at=time.time())
    record(state_dir, rec)
    return rec
