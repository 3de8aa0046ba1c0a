"""Reading a whole log file fast and in bounded memory.

A 1 GiB multi-rank log is almost all metrics lines. Handing every line to Python would cost a
microsecond or more each; instead the file is read in 4 MiB chunks, each chunk is searched at C
speed for the needles of the findings that could still change the answer (:mod:`._anchors`, the
same test the :class:`~launcher.failures._watch.LogWatcher` applies to each line it is given), and
only those candidate lines are decoded and fed to the watcher, with the lines that continue them
(a message cut over lines, the traceback chained after an error) for as long as it asks for them.
The lines before a candidate are not fed: the watcher reads them back through a function lent
with the line, only when a finding needs its traceback. So :func:`explain_file` reads exactly what
:func:`explain_lines` would classify, and a chunk costs a few passes of ``find`` plus a Python step
per candidate line; once the root cause is in, most needles drop out and later chunks cost less.

A line longer than :data:`MAX_LINE` (a flattened log, a binary file) is never held whole: it is
scanned piecewise and only the 4 KiB around each hit (64 at most) is kept.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import deque
from collections.abc import Callable, Iterable
from typing import BinaryIO

from launcher.failures._anchors import NeedleSet
from launcher.failures._diagnosis import Diagnosis
from launcher.failures._watch import CONTEXT_LINES, MAX_LINE, ContextSource, LogWatcher

CHUNK = 4 << 20
_WINDOW = 2048  # bytes kept either side of a hit inside an over-long line
_MAX_WINDOWS = 64
_CTX_BYTES = 8192  # a line read back for context is cut to this
_MIN_SLICE = 32 << 10  # a region is searched this much at a time after a finding, ...
_MAX_SLICE = 1 << 20  # ... and twice as much each time up to this once findings stop
_SLACK = 64 << 10  # room past CHUNK for what a long line's reads leave over


@dataclasses.dataclass
class ScanStats:
    bytes: int = 0
    lines: int = 0
    lines_fed: int = 0
    nul_bytes: bool = False
    longest_cut: bool = False


class _Scanner:
    def __init__(self, watcher: LogWatcher) -> None:
        self.watcher = watcher
        self.stats = ScanStats()
        # The last lines of the regions before the current one: context for a finding early in it.
        self.tail: deque[tuple[int, bytes]] = deque(maxlen=CONTEXT_LINES)
        self.slice = _MIN_SLICE

    def _feed(self, lineno: int, raw: bytes | bytearray, context: ContextSource,
              candidate: NeedleSet | None = None) -> None:
        self.stats.lines_fed += 1
        self.watcher.feed_numbered(lineno, raw.decode("utf-8", "replace"), context, candidate)

    def _context(self, buf: bytearray | bytes, start: int, lineno: int) -> ContextSource:
        """The lines before line ``lineno`` (which starts at ``buf[start]``; the region's first
        line starts at offset 0, lines before it are in the tail), read only if asked for."""

        def lines(lo: int) -> list[tuple[int, str]]:
            out: list[tuple[int, bytes]] = []
            n, pos = lineno, start
            while n > lo and pos > 0:
                prev = buf.rfind(b"\n", 0, pos - 1) + 1
                out.append((n - 1, bytes(buf[prev:min(pos - 1, prev + _CTX_BYTES)])))
                n, pos = n - 1, prev
            if n > lo:
                out.extend((m, raw) for m, raw in self.tail if lo <= m < n)
            out.sort(key=lambda item: item[0])
            return [(m, raw.decode("utf-8", "replace")) for m, raw in out]

        return lines

    def region(self, buf: bytearray | bytes, end: int, first: int, final: bool) -> int:
        """Handle the complete lines in ``buf[:end]`` (line ``first`` starts at offset 0);
        returns the number of lines in it."""
        n_lines = buf.count(b"\n", 0, end)
        if final and end and buf[end - 1] != 0x0A:
            n_lines += 1
        if n_lines == 0:
            return 0
        last = first + n_lines - 1
        watcher = self.watcher
        pos, line = 0, first
        if watcher.wants_next() and watcher.last_line == first - 1:
            # The previous region's last line left a message open: its continuation comes first.
            pos, line = self._follow(buf, end, pos, line, last)
        low = buf.lower() if pos < end else b""  # needles match in any case (only [:end] is read)
        while pos < end:
            # A slice of the region at a time, so that when a finding makes needles drop out (the
            # watcher's version changes) little has been searched for in vain: small slices
            # while findings come, larger ones once they stop.
            size = self.slice
            stop = end if end - pos < 2 * size else buf.find(b"\n", pos + size, end) + 1
            stop = stop or end
            while pos < stop:
                version = watcher.version
                needles = watcher.needles
                for hit in needles.hits(low, pos, stop, lowered=True):
                    if hit < pos:
                        continue  # in a line already fed
                    k = buf.rfind(b"\n", pos, hit)
                    start = pos if k < 0 else k + 1
                    line += buf.count(b"\n", pos, start)
                    pos, line = self._follow(buf, end, start, line, last, needles)
                    if watcher.version != version:
                        self.slice = _MIN_SLICE
                        break  # fewer needles matter now: search the rest again
                else:
                    break
            if pos < stop:
                line += buf.count(b"\n", pos, stop)
                pos = stop
            self.slice = min(2 * self.slice, _MAX_SLICE)
        self._keep_tail(buf, end, first, last)
        return n_lines

    def _follow(self, buf: bytearray | bytes, end: int, pos: int, line: int, last: int,
                candidate: NeedleSet | None = None) -> tuple[int, int]:
        """Feed the line at ``pos`` (a candidate for the needle set ``candidate``, if given) and
        the lines after it for as long as the watcher wants them; returns the offset and number
        of the next line."""
        while True:
            nl = buf.find(b"\n", pos, end)
            stop = end if nl < 0 else nl
            self._feed(line, buf[pos:stop], self._context(buf, pos, line), candidate)
            candidate = None
            pos, line = stop + 1, line + 1
            if line > last or pos >= end or not self.watcher.wants_next():
                return min(pos, end), line

    def _keep_tail(self, buf: bytearray | bytes, end: int, first: int, last: int) -> None:
        kept: list[tuple[int, bytes]] = []
        stop = end - 1 if end and buf[end - 1] == 0x0A else end
        n = last
        while len(kept) < CONTEXT_LINES and n >= first:
            start = buf.rfind(b"\n", 0, stop) + 1
            kept.append((n, bytes(buf[start:min(stop, start + _CTX_BYTES)])))
            if start == 0:
                break
            stop, n = start - 1, n - 1
        self.tail.extend(reversed(kept))

    def long_line(self, head: bytes, stream: BinaryIO) -> tuple[bytes, bytes]:
        """Consume a line of ``MAX_LINE`` bytes or more that starts with ``head``; returns the
        windows kept around its hits and the bytes read past its end.

        The line is read in pieces that overlap by two windows; a hit too close to the end of a
        piece for its window waits for the next piece, so a message is never cut at a seam."""
        self.stats.longest_cut = True
        needles = self.watcher.needles
        windows: list[bytes] = []
        buf = head
        consumed = 0  # offset in the whole line of buf[0]
        taken_upto = 0  # offsets of the line before this are already in a window
        eof = False
        while True:
            nl = buf.find(b"\n")
            last_piece = nl >= 0 or eof
            line_end = nl if nl >= 0 else len(buf)
            for h in needles.hits(buf, 0, line_end, limit=_MAX_WINDOWS, skip=_WINDOW):
                if len(windows) >= _MAX_WINDOWS:
                    break
                if consumed + h < taken_upto:
                    continue
                if not last_piece and h > len(buf) - _WINDOW:
                    break  # its window is not all here yet
                lo = max(0, h - _WINDOW, taken_upto - consumed)
                hi = min(line_end, h + _WINDOW)
                windows.append(buf[lo:hi])
                taken_upto = consumed + hi
            if last_piece:
                return b" \xe2\x80\xa6 ".join(windows), buf[nl + 1:] if nl >= 0 else b""
            keep = min(len(buf), 2 * _WINDOW)
            consumed += len(buf) - keep
            data = stream.read(CHUNK)
            self.stats.bytes += len(data)
            if not self.stats.nul_bytes and b"\x00" in data:
                self.stats.nul_bytes = True
            eof = not data
            buf = buf[len(buf) - keep:] + data


def _readinto(stream: BinaryIO) -> Callable[[memoryview], int | None]:
    """The stream's readinto, or one built on read() for a stream that has none."""
    method = getattr(stream, "readinto", None)
    if method is not None:
        return method  # type: ignore[no-any-return]

    def readinto(target: memoryview) -> int:
        data = stream.read(len(target))
        target[:len(data)] = data
        return len(data)

    return readinto


def scan_stream(stream: BinaryIO, watcher: LogWatcher) -> ScanStats:
    """Feed the interesting lines of a binary stream to ``watcher``.

    One buffer is allocated and read into again and again: a fresh 4 MiB object per chunk costs
    more in page faults than the scan itself."""
    scanner = _Scanner(watcher)
    stats = scanner.stats
    lineno = 1
    buf = bytearray(CHUNK + 2 * _SLACK)
    view = memoryview(buf)
    filled = 0
    readinto = _readinto(stream)
    try:
        while True:
            got = readinto(view[filled:CHUNK + _SLACK]) or 0
            stats.bytes += got
            if not stats.nul_bytes and buf.find(b"\x00", filled, filled + got) >= 0:
                stats.nul_bytes = True
            filled += got
            if got == 0:
                lineno += scanner.region(buf, filled, lineno, final=True)
                break
            end = buf.rfind(b"\n", 0, filled) + 1
            if filled - end >= MAX_LINE or (end == 0 and filled >= CHUNK):
                # A line too long to hold: complete lines first, then that line in windows.
                lineno += scanner.region(buf, end, lineno, final=False)
                windows, rest = scanner.long_line(bytes(buf[end:filled]), stream)
                scanner._feed(lineno, windows, scanner._context(b"", 0, lineno))
                scanner.tail.append((lineno, windows[:_CTX_BYTES]))
                lineno += 1
                while len(rest) > CHUNK + _SLACK:  # more than one line read past the long one
                    cut = rest.rfind(b"\n", 0, CHUNK) + 1 or CHUNK
                    lineno += scanner.region(rest, cut, lineno, final=False)
                    rest = rest[cut:]
                buf[:len(rest)] = rest
                filled = len(rest)
                continue
            if end == 0:
                continue  # no complete line yet: read more
            lineno += scanner.region(buf, end, lineno, final=False)
            buf[:filled - end] = bytes(view[end:filled])  # a copy: the two ranges may overlap
            filled -= end
    finally:
        view.release()
    stats.lines = lineno - 1
    return stats


def explain_stream(stream: BinaryIO, platform: str | None = None, *,
                   capped: bool = False) -> Diagnosis:
    """Classify a binary stream; ``platform`` and ``capped`` as :class:`LogWatcher` takes them."""
    watcher = LogWatcher(platform=platform, capped=capped)
    stats = scan_stream(stream, watcher)
    diagnosis = watcher.result()
    notes = []
    if stats.bytes == 0:
        notes.append("the log is empty")
    if stats.nul_bytes:
        notes.append("the log has binary content (NUL bytes); text around it was read")
    if stats.longest_cut:
        notes.append(f"lines over {MAX_LINE >> 20} MiB were read in windows around the hits")
    if notes:
        note = "; ".join(notes if not diagnosis.note else [diagnosis.note, *notes])
        diagnosis = dataclasses.replace(diagnosis, note=note)
    return diagnosis


def explain_file(path_or_dash: str, platform: str | None = None, *,
                 capped: bool = False) -> Diagnosis:
    """Classify a log file (``-`` reads standard input), streaming it in bounded memory.

    Bytes that are not UTF-8 are replaced, NUL bytes and lines of hundreds of megabytes are fine;
    an empty log or one with no failure gives ``failure == "none"``. A missing or unreadable file
    raises OSError (the CLI turns it into a usage error).
    """
    if path_or_dash == "-":
        return explain_stream(sys.stdin.buffer, platform, capped=capped)
    with open(path_or_dash, "rb") as stream:
        return explain_stream(stream, platform, capped=capped)


def explain_lines(lines: Iterable[str], platform: str | None = None, *,
                  capped: bool = False) -> Diagnosis:
    """Classify a log given as lines (a list, a generator over a provider's log stream)."""
    watcher = LogWatcher(platform=platform, capped=capped)
    for line in lines:
        watcher.feed(line)
    return watcher.result()
