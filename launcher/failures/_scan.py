"""Reading a whole log file fast and in bounded memory.

A 1 GiB multi-rank log is almost all metrics lines. Handing every line to Python would cost a
microsecond or more each; instead the file is read in 4 MiB chunks, each chunk is searched for a
few anchors at C speed (``bytes.find`` of a rare first byte is memchr), and only the lines around
a hit (the traceback before it, the chained one after it) are decoded and fed to the
:class:`~launcher.failures._watch.LogWatcher`, which applies the full rules.

The anchors are chosen so that every failure *ends* with at least one of them: an exception line
("...Error:"), an exit status, "Killed", SIGxxx, NCCL's watchdog, an abort, a preemption notice,
CUDA's and the CPU allocator's own words, the launcher's ``oom`` line. A rule's message more than
a context window away from any anchor would be seen by :func:`launcher.failures.explain_lines` but
not here; no log the tests know has one (the tests check that both agree on every fixture).

A line longer than :data:`MAX_LINE` (a flattened log, a binary file) is never held whole: it is
scanned piecewise and only the 4 KiB around each hit (64 at most) is kept.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import deque
from collections.abc import Callable, Iterable
from typing import BinaryIO

from launcher.failures._anchors import anchor_hits
from launcher.failures._diagnosis import Diagnosis
from launcher.failures._watch import AFTER_LINES, CONTEXT_LINES, MAX_LINE, LogWatcher

CHUNK = 4 << 20
_WINDOW = 2048  # bytes kept either side of a hit inside an over-long line
_MAX_WINDOWS = 64
_TAIL_BYTES = 4096  # a context line kept from the previous chunk is cut to this
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
        self.fed_upto = 0  # the last line number handed to the watcher
        self.feed_until = 0  # lines up to this number must be fed (the context after a hit)
        self.tail: deque[tuple[int, bytes]] = deque(maxlen=CONTEXT_LINES)

    def _feed(self, lineno: int, raw: bytes | bytearray) -> None:
        if lineno <= self.fed_upto:
            return
        self.fed_upto = lineno
        self.stats.lines_fed += 1
        self.watcher.feed_numbered(lineno, raw.decode("utf-8", "replace"))

    def region(self, buf: bytearray | bytes, end: int, first: int, final: bool) -> int:
        """Handle the complete lines in ``buf[:end]`` (line ``first`` starts at offset 0);
        returns the number of lines in it."""
        n_lines = buf.count(b"\n", 0, end)
        if final and end and buf[end - 1] != 0x0A:
            n_lines += 1
        if n_lines == 0:
            return 0
        last = first + n_lines - 1
        # Line numbers and start offsets of the lines with a hit (one entry per line).
        hit_lines: list[tuple[int, int]] = []
        pos, line, line_end = 0, first, -1
        for h in anchor_hits(buf, 0, end):
            if h < line_end:
                continue
            start = buf.rfind(b"\n", 0, h) + 1
            line += buf.count(b"\n", pos, start)
            pos = start
            nl = buf.find(b"\n", h, end)
            line_end = end if nl < 0 else nl + 1
            hit_lines.append((line, start))
        # Lines still owed from a hit near the end of the previous chunk.
        if self.feed_until >= first:
            self._walk(buf, end, first, 0, min(self.feed_until, last))
        for line, start in hit_lines:
            lo = line - CONTEXT_LINES
            while self.tail and self.tail[0][0] < lo:
                self.tail.popleft()
            for t_line, t_raw in self.tail:  # context from the previous chunk
                self._feed(t_line, t_raw)
            self.tail.clear()
            # Back up to the start of the context window (or the last line already fed).
            back_line, back_start = line, start
            while back_line > max(lo, first, self.fed_upto + 1) and back_start > 0:
                back_start = buf.rfind(b"\n", 0, back_start - 1) + 1
                back_line -= 1
            self._walk(buf, end, back_line, back_start, min(line + AFTER_LINES, last))
            self.feed_until = max(self.feed_until, line + AFTER_LINES)
        # Keep the last lines as context for a hit early in the next chunk.
        stop, line = end, last
        kept: list[tuple[int, bytes]] = []
        while len(kept) < CONTEXT_LINES and stop > 0 and line > self.fed_upto:
            start = buf.rfind(b"\n", 0, stop - 1) + 1 if stop > 1 else 0
            kept.append((line, bytes(buf[start:min(stop, start + _TAIL_BYTES)])))
            stop, line = start, line - 1
        self.tail.extend(reversed(kept))
        return n_lines

    def _walk(self, buf: bytearray | bytes, end: int, line: int, start: int, until: int) -> None:
        """Feed lines ``line``..``until`` of ``buf[:end]``, the first starting at ``start``."""
        while line <= until and start < end:
            nl = buf.find(b"\n", start, end)
            nl = end if nl < 0 else nl
            if line > self.fed_upto:
                self._feed(line, buf[start:nl])
            start, line = nl + 1, line + 1

    def long_line(self, head: bytes, stream: BinaryIO) -> tuple[bytes, bytes]:
        """Consume a line of ``MAX_LINE`` bytes or more that starts with ``head``; returns the
        windows kept around its hits and the bytes read past its end.

        The line is read in pieces that overlap by two windows; a hit too close to the end of a
        piece for its window waits for the next piece, so a message is never cut at a seam."""
        self.stats.longest_cut = True
        windows: list[bytes] = []
        buf = head
        consumed = 0  # offset in the whole line of buf[0]
        taken_upto = 0  # offsets of the line before this are already in a window
        eof = False
        while True:
            nl = buf.find(b"\n")
            last_piece = nl >= 0 or eof
            line_end = nl if nl >= 0 else len(buf)
            for h in anchor_hits(buf, 0, line_end):
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
                if windows:
                    scanner._feed(lineno, windows)
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


def explain_stream(stream: BinaryIO, platform: str | None = None) -> Diagnosis:
    watcher = LogWatcher(platform=platform)
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


def explain_file(path_or_dash: str, platform: str | None = None) -> Diagnosis:
    """Classify a log file (``-`` reads standard input), streaming it in bounded memory.

    Bytes that are not UTF-8 are replaced, NUL bytes and lines of hundreds of megabytes are fine;
    an empty log or one with no failure gives ``failure == "none"``. A missing or unreadable file
    raises OSError (the CLI turns it into a usage error).
    """
    if path_or_dash == "-":
        return explain_stream(sys.stdin.buffer, platform)
    with open(path_or_dash, "rb") as stream:
        return explain_stream(stream, platform)


def explain_lines(lines: Iterable[str], platform: str | None = None) -> Diagnosis:
    """Classify a log given as lines (a list, a generator over a provider's log stream)."""
    watcher = LogWatcher(platform=platform)
    for line in lines:
        watcher.feed(line)
    return watcher.result()
