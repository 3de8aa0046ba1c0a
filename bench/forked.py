"""Run a function in a fork of this process and bring back the bytes it returns.

The benchmarks that compare two ways of tracing (``bench_shared_cache``, ``bench_trace_queue``)
warm one process as the trace child is warmed and run each arm in a fork of it, alternately, so
that neither arm inherits what the other left behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def in_fork(fn: Callable[[], bytes]) -> bytes:
    """``fn()``'s bytes, computed in a forked child of this process."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, fn())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 20):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return data


def untimed(answer: dict[str, Any]) -> dict[str, Any]:
    """A worker's answer without what differs from run to run (its wall and CPU times, its
    host peak), each depth's too: two ways of tracing compare equal when they traced alike."""
    for key in ("wall_s", "host_peak_rss_bytes", "timings"):
        answer.pop(key, None)
    for depth in (answer.get("by_depth") or {}).values():
        depth.pop("timings", None)
    return answer
