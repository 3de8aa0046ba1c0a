"""Reading a log line by line: :class:`LogWatcher` keeps what it needs to find the root cause.

It holds a bounded window of recent lines (the traceback an error ends, for its phase), the first
findings of each kind, and at most one message still being joined across lines. Memory does not
grow with the log.

Only *candidate* lines are classified: lines that hold a needle (:mod:`._anchors`) of a finding
that could still change the answer. The first out-of-memory error settles the root cause, so
after it only other out-of-memory messages (for their figures, the first 64) and the launcher's
own lines are looked for; a tier-1 failure makes the exceptions, cascades and exits after it
irrelevant, and so on (:meth:`LogWatcher.needed`). The other lines are kept as they came, and
cleaned only when a finding asks for the traceback before it. A log full of failure words, every
line an exception, therefore costs a few classified lines and then a needle search.

Over 600 lines on purpose: the watcher's state machine (the window, the findings, the weighing of
weak evidence at the end) is one unit whose parts read each other's fields.
"""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from collections.abc import Callable
from typing import Any

from launcher.failures._anchors import NeedleSet, needles_for
from launcher.failures._clean import ANSI, MAX_SEGMENT, Segment, segments, strip_prefixes, text_rank
from launcher.failures._diagnosis import (
    PROBABLE_NOTES,
    Diagnosis,
    advice,
    gpu_cause,
    host_cause,
)
from launcher.failures._phases import TEMPLATE_PHASES, phase_of
from launcher.failures._rules import (
    GPU_OOM,
    HOST_OOM,
    OTHER,
    SIGKILL,
    Finding,
    classify,
    generic,
    managed_platform,
    names_platform,
    torch_message_complete,
)
from launcher.failures._sizes import Figures, torch_figures

MAX_LINE = 1 << 20  # longer lines are cut down to the windows around what may matter
CONTEXT_LINES = 48  # how far back a traceback is read for the phase
AFTER_LINES = 30  # how far a chained traceback ("During handling ...") is read after an error
JOIN_LINES = 3  # how many following lines a cut allocator message may continue on
EXCERPT_CHARS = 600
_KEEP = 64  # findings kept per kind: the root cause is among the first

_CHAIN = re.compile(r"During handling of the above exception|The above exception was the direct")
_NEW_MESSAGE = re.compile(
    r"^(?:Traceback|File \"|During handling|The above exception|frame #|"
    r"[\w.]*(?:Error|Exception|Warning)\b|\{)"
)
_TF_CPU = re.compile(r"device:CPU|cpu_bfc|\bon cpu\b|mklcpu", re.IGNORECASE)
# A SIGKILL, bare or as the shell reports it: no traceback says what was being allocated.
_KILLS = frozenset({"sigkill", "shell_killed"})
# Host-memory readings that are a guess unless something else in the log bears them out; none of
# them bears out another.
_PROBABLE = frozenset({*_KILLS, "onednn_primitive"})
# Next to oneDNN's "could not create a primitive" (its own line and the 48 before it): words that
# say memory was capped or short, which no rule reads as a failure of its own (a cap, oneDNN's
# verbose status, a scratchpad's size).
_MEMORY_PRESSURE = re.compile(
    r"\bRLIMIT_AS\b|\bulimit -[vm]\b|memory\.max\b|memory[-_ ]limit|address[- ]space|"
    r"\bout_of_memory\b|scratchpad|Cannot allocate memory|\bENOMEM\b", re.IGNORECASE)
_SHM_TRACE = re.compile(r"/dev/shm|multiprocessing/(?:queues|reduction)|torch/multiprocessing/|"
                        r"storage_share|share_memory_|DataLoader worker|_worker_loop")


def cut_long_line(line: str, needles: NeedleSet) -> str:
    """A line of a megabyte or more, cut down to the stretches around what may matter.

    The cut keeps 2 KiB either side of each needle hit (at most 64 of them), the same stretches
    the file scanner keeps, so a message in the middle of a flattened log survives while the
    memory kept stays bounded.
    """
    raw = line.encode("utf-8", "replace")
    pieces: list[bytes] = []
    last_end = 0
    for hit in needles.hits(raw, limit=64, skip=2048):
        if len(pieces) >= 64:
            break
        if hit < last_end:
            continue
        start, end = max(hit - 2048, last_end), min(hit + 2048, len(raw))
        pieces.append(raw[start:end])
        last_end = end
    return " \u2026 ".join(p.decode("utf-8", "replace") for p in pieces)


_SEGMENT_WINDOW = 1024  # characters kept either side of a needle in an over-long message
_SEGMENT_WINDOWS = 8


def cut_segment(text: str, needles: NeedleSet) -> str:
    """A message longer than MAX_SEGMENT (a flattened log, a progress bar's thousand updates),
    cut to the stretches around its needles, so that no rule runs over more than a few KiB."""
    pieces: list[str] = []
    last_end = 0
    for hit in needles.find_text(text, _SEGMENT_WINDOWS, _SEGMENT_WINDOW):
        if len(pieces) >= _SEGMENT_WINDOWS:
            break
        if hit < last_end:
            continue
        start, end = max(hit - _SEGMENT_WINDOW, last_end), min(hit + _SEGMENT_WINDOW, len(text))
        pieces.append(text[start:end])
        last_end = end
    return " \u2026 ".join(pieces) if pieces else text[:MAX_SEGMENT]


# One line kept for context: (line number, rank, text) once cleaned; a line that was not
# classified is kept raw, (line number, None, None, raw line), and cleaned only if a finding reads
# the traceback before it.
_Context = tuple[int, int | None, str | None, str | None]
# A function the file scanner lends while it feeds a line: the raw lines from a line number up to
# the line being fed (those it did not feed), for the traceback before a finding.
ContextSource = Callable[[int], list[tuple[int, str]]]


def _clean_context(line: str) -> tuple[int | None, str]:
    if "\x1b" in line:
        line = ANSI.sub("", line)
    text, rank, _ = strip_prefixes(line.strip())
    return rank, text[:2000]


class LogWatcher:
    """Classifies a log as it arrives, one line at a time.

    ``feed`` returns a :class:`Diagnosis` the first time a memory failure is recognised (the
    supervisor stops the job at once); ``result`` gives the best diagnosis of everything fed so
    far: the root cause (the first genuine out-of-memory error, the launcher's own ``oom`` line
    settling failure and phase), not the cascade after it.

    ``platform`` is the provider the log comes from ("local", "vertex", "sagemaker"): on a managed
    platform a bare SIGKILL / exit 137 is the kernel's out-of-memory kill (the platform reports its
    own stops in words); on a local run, or one from nowhere known, it is a *probable* one (the
    kernel's OOM killer sends most, a user's ``kill -9`` or a scheduler some), said so in the note
    and the advice with what would confirm it. ``capped``: the run was under a memory cap
    (``--memory-limit``'s RLIMIT_AS, a cgroup limit), where oneDNN's "could not create a
    primitive" is its allocation failing; without one, and with nothing in the log showing memory
    pressure, that reading is probable too.
    """

    def __init__(self, platform: str | None = None, *, capped: bool = False) -> None:
        self._platform = managed_platform(platform)
        self._capped = capped
        self._platform_seen = False
        self._lineno = 0
        self._context: deque[_Context] = deque(maxlen=CONTEXT_LINES)
        # The numbers of the last lines fed: a line fed that left no context entry (a message's
        # continuation, an empty line) is not read back from the scanner's buffer.
        self._fed: deque[int] = deque(maxlen=CONTEXT_LINES + 1)
        self._source: ContextSource | None = None
        self._oom: list[Finding] = []
        self._events: list[Finding] = []
        self._weak: Finding | None = None
        self._others: dict[int, Finding] = {}
        self._pending: Finding | None = None
        self._pending_left = 0
        self._pending_raw: list[str] = []
        self._after: Finding | None = None
        self._after_left = 0
        self._after_chained = False
        self._reported = False
        self._done_line: int | None = None  # the first {"launch": "done"} line
        self._ignored_until = 0  # "Exception ignored in ...": interpreter-shutdown noise
        self._platform_left = 0  # lines after a SIGKILL still read for platform words
        self.version = 0  # bumped whenever ``needles`` changes
        self.needles: NeedleSet = needles_for(self.needed())

    # -- what is still worth reading -------------------------------------------------------

    def needed(self) -> frozenset[str]:
        """The categories of findings (``._rules.CATEGORIES``) that could still change the result.

        The root cause is the launcher's oom line, else the first out-of-memory message, else the
        other failure of the lowest tier (the first of it), a bare SIGKILL counting as tier 3; and
        only the first finding of each tier is kept. So once an out-of-memory message is in, only
        more of them (their figures, up to 64) and the launcher's lines matter; a tier is no
        longer needed once it is taken or a lower one is in. Each set only ever shrinks."""
        need = {"event"}
        if len(self._oom) < _KEEP:
            need.add("oom")
        if self._events or self._oom:
            return frozenset(need)
        if self._done_line is None:
            need.add("done")
        done = self._done_line
        tiers = [t for t, f in self._others.items() if done is None or f.line < done]
        if self._weak is not None:
            tiers.append(self._weak.tier)
        best = min(tiers, default=99)
        for tier in (1, 2, 3, 4):
            if tier < best and tier not in self._others:
                need.add(f"t{tier}")
        if self._weak is None and best > 3:
            need.add("weak")
        return frozenset(need)

    @property
    def last_line(self) -> int:
        """The number of the last line fed."""
        return self._lineno

    def wants_next(self) -> bool:
        """Whether the next line must be fed whatever it holds: it may continue a message cut at
        the end of the last one, be the traceback chained after an error, or name the platform
        that killed the job."""
        return self._pending is not None or self._after is not None or self._platform_left > 0

    def _update_needles(self) -> None:
        needles = needles_for(self.needed())
        if needles is not self.needles:
            self.needles = needles
            self.version += 1

    # -- input -----------------------------------------------------------------------------

    def feed(self, line: str) -> Diagnosis | None:
        """Take the next line; returns a Diagnosis the first time a memory failure shows."""
        return self.feed_numbered(self._lineno + 1, line)

    def feed_numbered(self, lineno: int, line: str, context: ContextSource | None = None,
                      candidate: NeedleSet | None = None) -> Diagnosis | None:
        """Take line number ``lineno`` (1-based). Numbers may skip lines (the file scanner feeds
        only candidate lines and the lines that continue them); a skip ends any message being
        joined. ``context`` gives the skipped lines before this one, should a finding here need
        its traceback; ``candidate``: the needle set with which the caller found a needle in
        this line (the test is not repeated if it is still the watcher's)."""
        if lineno != self._lineno + 1:
            self._finish_pending()
            self._after = None
        self._lineno = lineno
        self._fed.append(lineno)
        if len(line) > MAX_LINE:
            line = cut_long_line(line, self.needles)
        hit = candidate is self.needles or self.needles.search_line(line)
        if self._platform_left > 0:
            self._platform_left -= 1
            if names_platform(line):
                self._platform_seen, self._platform_left = True, 0
        elif hit and not self._platform_seen and names_platform(line):
            self._platform_seen = True
        if not hit and self._pending is None and self._after is None:
            self._context.append((lineno, None, None, line))
            return None
        self._source = context
        try:
            first_new = self._segments(lineno, line, hit)
        finally:
            self._source = None
        if first_new is not None and not self._reported:
            self._reported = True
            return self.result()
        return None

    def _segments(self, lineno: int, line: str, hit: bool) -> Finding | None:
        first_new: Finding | None = None
        segs = segments(line)
        several = len(segs) > 1
        for seg in segs:
            if len(seg.text) > MAX_SEGMENT and seg.event is None:
                seg.text = cut_segment(seg.text, self.needles)
            if self._pending is not None and self._continue_pending(seg):
                continue
            if self._after is not None:
                self._follow_after(seg)
            # A line of many messages (a progress bar's updates, an escaped traceback): only
            # those that hold a needle still needed are read.
            read = hit and (not several or seg.event is not None
                            or self.needles.search_line(seg.text))
            finding = self._classify(seg, lineno) if read else None
            self._context.append((lineno, seg.rank, seg.text[:2000], None))
            if finding is None:
                continue
            self._record(finding)
            if finding.is_oom and first_new is None:
                first_new = finding
        return first_new

    def _window(self, line: int) -> list[tuple[int, int | None, str]]:
        """The context of a finding on ``line``: the last CONTEXT_LINES entries from the lines
        before it (and the messages of its own line before it), cleaned."""
        lo = line - CONTEXT_LINES
        entries = [e for e in self._context if e[0] >= lo]
        if self._source is not None:
            have = set(self._fed)
            extra = [(n, None, None, raw) for n, raw in self._source(lo) if n not in have]
            if extra:
                entries = sorted([*entries, *extra], key=lambda e: e[0])  # stable
        out = []
        for lineno, rank, text, raw in entries[-CONTEXT_LINES:]:
            if raw is not None:
                rank, text = _clean_context(raw)
            out.append((lineno, rank, text or ""))
        return out

    # -- one message -----------------------------------------------------------------------

    def _classify(self, seg: Segment, lineno: int) -> Finding | None:
        if seg.event is not None:
            return self._event_finding(seg, lineno)
        text = seg.text
        if text.startswith("Exception ignored in"):
            # Python printing an exception it ignored (a destructor at interpreter exit): what
            # follows is not the job failing.
            self._ignored_until = lineno + 12
            return None
        rule, match, signature = classify(text)
        rank = seg.rank if seg.rank is not None else text_rank(text)
        if rule is None or match is None:
            found = generic(text) if lineno > self._ignored_until else None
            if found is None:
                return None
            signature, tier, start = found
            return Finding(OTHER, tier, signature, text, lineno, rank, seg.host, start)
        figures = rule.figures(text) if rule.figures is not None else Figures()
        finding = Finding(rule.kind, rule.tier, signature, text, lineno, rank, seg.host,
                          match.start(), figures, rule.cause)
        if figures.impossible:
            finding.kind, finding.tier = OTHER, 4
            finding.signature = "impossible_allocation_size"
        elif rule.signature in ("tensorflow_oom", "xla_resource_exhausted") and _TF_CPU.search(
                text):
            finding.kind = HOST_OOM
        elif rule.signature == "disk_full" and any(
                _SHM_TRACE.search(t) for _, _, t in self._window(lineno)):
            finding.kind, finding.tier, finding.cause = HOST_OOM, 0, "shared_memory"
            finding.signature = "shm_exhausted"
        elif rule.signature == "torch.OutOfMemoryError" and not torch_message_complete(text):
            finding.complete = False
        elif rule.signature == "onednn_primitive":
            finding.evidence = self._memory_pressure(text, lineno)
        # (The phase of one not kept is moot; a kill leaves no traceback to read one from.)
        if finding.is_oom and len(self._oom) < _KEEP and signature not in _KILLS:
            finding.phase = self._phase_before(finding)
        return finding

    def _memory_pressure(self, text: str, lineno: int) -> str:
        """Where the message, or the lines before it, say memory was capped or short: "" if
        nowhere. (Only read for a oneDNN failure, which is rare: no cost on other lines.)"""
        nearest_first = [(lineno, text), *((n, t) for n, _, t in reversed(self._window(lineno)))]
        for n, t in nearest_first:
            match = _MEMORY_PRESSURE.search(t)
            if match:
                return f"line {n} says {match.group(0)!r}"
        return ""

    def _event_finding(self, seg: Segment, lineno: int) -> Finding | None:
        event = seg.event or {}
        kind = event.get("launch")
        if kind == "done":
            if self._done_line is None:
                self._done_line = lineno
                self._update_needles()
            return None
        if kind != "oom":
            return None
        message = str(event.get("message") or "")
        fig = torch_figures(message)
        fig.requested = _int(event.get("requested_bytes"), fig.requested)
        for name in ("allocated", "reserved", "capacity", "free"):
            setattr(fig, name, _int(event.get(f"{name}_bytes"), getattr(fig, name)))
        device = str(event.get("device") or "cuda").lower()
        phase = event.get("phase") if event.get("phase") in TEMPLATE_PHASES else None
        finding = Finding(GPU_OOM if device != "cpu" else HOST_OOM, 0, "launch_oom_event",
                          seg.text, lineno, seg.rank, seg.host, 0, fig, event=event)
        finding.phase = phase
        return finding

    def _record(self, finding: Finding) -> None:
        if finding.event is not None:
            if len(self._events) < _KEEP:
                self._events.append(finding)
        elif finding.is_oom:
            if len(self._oom) < _KEEP:
                self._oom.append(finding)
            if not finding.complete and self._pending is None:
                self._pending, self._pending_left = finding, JOIN_LINES
                self._pending_raw = [finding.text]
            if finding.phase is None and finding.signature not in _KILLS:
                self._after, self._after_left, self._after_chained = finding, AFTER_LINES, False
        elif finding.kind == SIGKILL:
            if self._weak is None:
                self._weak = finding
                if not self._platform and not self._platform_seen:
                    # A managed platform reports its kills in words next to the exit status.
                    if any(names_platform(t) for _, _, t in self._window(finding.line)):
                        self._platform_seen = True
                    else:
                        self._platform_left = AFTER_LINES
        elif finding.tier not in self._others:
            self._others[finding.tier] = finding
        self._update_needles()

    # -- messages over several lines ------------------------------------------------------

    def _continue_pending(self, seg: Segment) -> bool:
        """Join ``seg`` to the allocator message cut at the end of the previous line, if it reads
        as its continuation. Returns True when ``seg`` was consumed."""
        pending = self._pending
        assert pending is not None
        if seg.rank is not None and pending.rank is not None and seg.rank != pending.rank:
            return False  # another rank's line interleaved: not this message
        if _NEW_MESSAGE.match(seg.text) or "ried to allocate" in seg.text:
            self._finish_pending()
            return False
        self._pending_raw.append(seg.text)
        spaced = " ".join(self._pending_raw)
        glued = "".join(self._pending_raw)
        fig_spaced, fig_glued = torch_figures(spaced), torch_figures(glued)
        # A terminal wraps mid-word ("total capa" / "city"); a logger wraps at spaces. Keep the
        # reading that recovers more figures.
        if fig_glued.count() > fig_spaced.count():
            pending.text, pending.figures = glued, fig_glued
        else:
            pending.text, pending.figures = spaced, fig_spaced
        self._pending_left -= 1
        if torch_message_complete(pending.text) or self._pending_left <= 0:
            self._finish_pending()
        return True

    def _finish_pending(self) -> None:
        if self._pending is not None:
            self._pending.complete = True
        self._pending, self._pending_raw = None, []

    def _follow_after(self, seg: Segment) -> None:
        """Read the traceback chained after an error ("During handling of the above exception")
        for its phase: a handler in an evaluation loop tells where the error happened."""
        finding = self._after
        assert finding is not None
        self._after_left -= 1
        if _CHAIN.search(seg.text):
            self._after_chained = True
        elif self._after_chained and finding.phase is None:
            if seg.rank is None or finding.rank is None or seg.rank == finding.rank:
                finding.phase = phase_of([seg.text])
        if self._after_left <= 0 or finding.phase is not None:
            self._after = None

    def _phase_before(self, finding: Finding) -> str | None:
        lines = [
            text for _, rank, text in self._window(finding.line)
            if rank is None or finding.rank is None or rank == finding.rank
        ]
        # Only the traceback this error ends: from its last "Traceback" header on.
        for i in range(len(lines) - 1, -1, -1):
            if lines[i].startswith("Traceback"):
                lines = lines[i:]
                break
        return phase_of([*lines, finding.text])

    # -- output ----------------------------------------------------------------------------

    def result(self) -> Diagnosis:
        """The root cause of everything fed so far."""
        root = self._root()
        if root is None:
            note = "the run reported it finished" if self._done_line is not None else ""
            return Diagnosis("none", None, advice=advice("none", None, None, "", ""), note=note)
        return self._diagnose(root)

    def _root(self) -> Finding | None:
        if self._events:
            return self._events[0]
        if self._oom:
            return self._oom[0]
        others = dict(self._others)
        if self._done_line is not None:
            # The run reported it finished: errors after that (shutdown noise) are not a failure.
            others = {t: f for t, f in others.items() if f.line < self._done_line}
        candidates = [f for t, f in others.items() if t <= 2]
        if candidates:
            return min(candidates, key=lambda f: (f.tier, f.line))
        late = [f for t, f in others.items() if t > 2]
        if self._weak is not None:
            late.append(self._weak)
        return min(late, key=lambda f: (f.tier, f.line)) if late else None

    def _backing(self, root: Finding) -> Finding | None:
        """Another host-memory finding that bears out a probable one (the kernel's "Killed
        process" after the shell's "Killed"): one that is not itself a guess."""
        for other in self._oom:
            if other is not root and other.kind == HOST_OOM and other.signature not in _PROBABLE:
                return other
        return None

    def _diagnose(self, root: Finding) -> Diagnosis:
        fig = dataclasses.replace(root.figures)
        phase = root.phase
        rank = root.rank
        # The same failure, reported again (the launcher's oom line after PyTorch's message, a
        # rank's error repeated in torchrun's summary): take the figures and phase it lacks.
        for other in self._oom:
            if other is root or other.kind != root.kind:
                continue
            if rank is not None and other.rank is not None and other.rank != rank:
                continue
            fig.fill_from(other.figures)
            if phase is None and other.phase is not None and root.event is None:
                phase = other.phase
        if rank is None:
            # A library's own line (NCCL's "host:pid:tid [dev]") names no rank; the same failure
            # re-raised just after by one rank does.
            near = {o.rank for o in self._oom if o is not root and o.kind == root.kind
                    and root.line <= o.line <= root.line + CONTEXT_LINES and o.rank is not None}
            if len(near) == 1:
                rank = near.pop()
        failure = root.kind
        note = ""
        signature = root.signature
        cause: str | None
        reason = ""
        micro_batch = _int((root.event or {}).get("micro_batch_size"), None)
        probable = ""
        if signature in _KILLS:
            # A bare SIGKILL (weak evidence) or the shell's report of one: host memory, certain
            # where nothing but the kernel's OOM killer sends it unannounced or another line
            # reports host memory, probable elsewhere.
            failure, cause = HOST_OOM, "unknown"
            backing = self._backing(root)
            if self._platform or self._platform_seen:
                note = ("killed by SIGKILL on a managed platform with no other error: the "
                        "kernel's out-of-memory killer is what sends it there (the platform "
                        "reports its own stops in words)")
            elif backing is not None:
                note = (f"killed by SIGKILL, and line {backing.line} reports host memory "
                        f"({backing.signature})")
            else:
                probable, note = "kill", PROBABLE_NOTES["kill"]
        elif failure == GPU_OOM:
            cause, reason = gpu_cause(fig, phase)
        elif failure == HOST_OOM:
            device = (root.event or {}).get("device")
            cause = host_cause(signature, root.cause, phase, device)
            if signature == "onednn_primitive":
                backing = self._backing(root)
                evidence = root.evidence  # a cap or a shortage named near it
                if self._capped:
                    evidence = "the run is under a memory cap"
                elif not evidence and backing is not None:
                    evidence = f"line {backing.line} reports host memory ({backing.signature})"
                if evidence:
                    note = (f"oneDNN could not create a primitive with host memory short "
                            f"({evidence}): creating one allocates its scratchpad, and a failed "
                            "allocation is reported so")
                else:
                    probable, note = "onednn", PROBABLE_NOTES["onednn"]
        else:
            cause = None
        if failure == OTHER:
            fig = Figures(requested=fig.requested) if fig.requested is not None else Figures()
        text = _excerpt(root)
        return Diagnosis(
            failure=failure,  # type: ignore[arg-type]
            cause=cause,  # type: ignore[arg-type]
            requested_bytes=fig.requested,
            capacity_bytes=fig.capacity,
            allocated_bytes=fig.allocated,
            reserved_bytes=fig.reserved,
            free_bytes=fig.free,
            rank=rank,
            line=root.line,
            excerpt=text,
            advice=advice(failure, cause, phase, signature, reason, micro_batch, probable),
            phase=phase,
            signature=signature,
            host=root.host,
            note=note or root.note,
        )


def _int(value: Any, default: int | None) -> int | None:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return default


_RUN = re.compile(r"(.)\1{11,}")


def _excerpt(finding: Finding) -> str:
    """The root-cause message, at most EXCERPT_CHARS, runs of one character (progress bars)
    shortened."""
    text = finding.text
    if _RUN.search(text):
        text = _RUN.sub(lambda m: m.group(1) * 3 + "\u2026", text)
        return text if len(text) <= EXCERPT_CHARS else text[-EXCERPT_CHARS:]
    if len(text) <= EXCERPT_CHARS:
        return text
    start = max(0, finding.start - 80)
    end = start + EXCERPT_CHARS - 2
    return ("\u2026" if start else "") + text[start:end] + ("\u2026" if end < len(text) else "")
