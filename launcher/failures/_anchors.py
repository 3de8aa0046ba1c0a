"""The anchors: a handful of byte strings that every failure's last lines contain.

Shared by the file scanner (which decodes only the lines around a hit) and by the watcher (which
cuts a line of a megabyte or more down to the stretches around its hits), so both read the same
parts of a log.
"""

from __future__ import annotations

import re

# Anchors, grouped by their first byte. Each group is found by scanning for that byte with
# bytes.find (memchr: several GB/s) and matching the group's pattern there. The first bytes are
# capitals (and 'x', 'q') that the bulk of a training log, JSON metrics lines, rarely contains; a
# byte that turns out frequent in a chunk (a log full of capitals) falls back to the regular
# expression's own scan for the rest of that chunk, which costs about as much as one find.
ANCHORS: dict[bytes, re.Pattern[bytes]] = {
    first: re.compile(pattern) for first, pattern in (
        (b"E", rb"E(?:rror|RROR|xception|XHAUSTED|xhausted|xit|XIT)"),  # exceptions, ExitCode
        (b"x", rb"xit"),  # exit code / exit status / exitcode / exited
        (b"K", rb"K(?:ill|ILL)"),  # Killed, OOMKilled, SIGKILL
        (b"S", rb"S(?:IG|egmentation|ignal)"),  # SIGTERM, Segmentation fault, SignalException
        (b"A", rb"A(?:borted|LLOC_FAILED|lgorithmError)"),
        (b"P", rb"P(?:reempt|REEMPT)"),
        (b"W", rb"Watchdog"),  # NCCL's collective timeouts
        (b"O", rb"O(?:OM|ut of memory|ut Of Memory|utOfMemory|UT_OF_MEMORY)"),
        (b"C", rb"C(?:UDA error|UDA out|UDA_ERROR|uda failure|annot allocate|UBLAS_|UDNN_)"),
        (b"M", rb"M(?:emory|PS backend)"),
        (b"T", rb"T(?:raceback|ried to allocate)"),
        (b"D", rb"D(?:efaultCPUAllocator|ataLoader worker|etected \d+ oom)"),  # Slurm
        (b"B", rb"Bus error"),
        (b"N", rb"NCCL (?:WARN|error)"),
        (b"q", rb"quested_bytes"),  # the launcher's own {"launch": "oom", ..., "requested_bytes"}
    )
}
_FALLBACK_AFTER = 2048  # candidates of one byte in one chunk before the regex scans instead


def anchor_hits(buf: bytes, start: int = 0, end: int | None = None) -> list[int]:
    """Sorted offsets in ``buf[start:end]`` where an anchor starts."""
    end = len(buf) if end is None else end
    hits: list[int] = []
    for first, pattern in ANCHORS.items():
        i = buf.find(first, start, end)
        seen = 0
        while i >= 0:
            seen += 1
            if seen > _FALLBACK_AFTER:
                hits.extend(m.start() for m in pattern.finditer(buf, i, end))
                break
            if pattern.match(buf, i, end):
                hits.append(i)
            i = buf.find(first, i + 1, end)
    hits.sort()
    return hits
