"""Finding the lines some rule could read: the rules' needles, searched for a block at a time.

Every rule in :mod:`._rules` names its needles (strings one of which each message it reports
contains, matched without regard to case); so do the generic readings and the launcher's own
lines. A line is a *candidate* when it holds a needle of a category the watcher still needs
(:meth:`launcher.failures._watch.LogWatcher.needed`): once an out-of-memory error is found, say,
the needles of NCCL timeouts no longer matter and are no longer searched for. The watcher tests
each line it is given with :meth:`NeedleSet.search_line`; the file scanner finds the same lines in
blocks with :meth:`NeedleSet.hits`, so both read exactly the same lines.

A block has to be searched for about a hundred strings at C speed whatever the text is, and
CPython has no multi-string search. It has two fast primitives for one thing at a time:
``bytes.find`` of a byte (memchr: tens of GB/s, plus a Python step at each place it is found) and a
regular expression that starts with a literal byte (the engine skips to it in C, about 2 GB/s, and
runs the rest of the expression there, in C too). So the block is lowered once, and each needle is
searched for through one of its bytes, its *key*:

- keys are chosen from a sample of the text (again every 32 MiB) as a weighted set cover: a few
  bytes such that every needle holds one, as cheap as possible for this text (an underscore or a
  digit in prose, an ``x`` or a ``q`` in a JSON metrics log, whatever random text favours least);
- a key expected a few hundred times at most is found with ``find`` and its needles are checked
  there with ``startswith``;
- a frequent key gets one compiled expression, the key then a trie of the rest of its needles,
  the parts before the key checked by look-behinds that are a trie too
  (``m(?:ory(?<=out of mem...)|(?<=om)(?:(?<= oom)|(?<=:oom))|...)``): one or two byte
  comparisons reject most places, so a pass costs one to three milliseconds per 4 MiB.

After a hit the search jumps to the end of its line, so a block full of candidates costs one step
per line, not one per needle occurrence. Keys and expressions are cached per needle set.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

from launcher.failures._rules import NEEDLE_CATEGORIES, NeedleIndex

_SAMPLE = 8192  # bytes of a block sampled to count the candidate keys
_FIND_MAX = 300  # keys expected at most this many times in a block are found with find()
_FIND_GIVE_UP = 4 * _FIND_MAX  # a find() key that turns out this frequent switches to the regex
_REGEXES_KEPT = 256
_REPLAN_BYTES = 32 << 20  # the keys are chosen afresh after this much text
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


class NeedleSet:
    """Lower-case needles: does a line hold one (in any case), and where are they in a block."""

    def __init__(self, needles: Iterable[str]) -> None:
        unique = sorted({n.lower() for n in needles}, key=lambda n: (len(n), n))
        kept: list[str] = []
        for needle in unique:  # a needle that contains another is redundant
            if not any(other in needle for other in kept):
                kept.append(needle)
        self.needles = tuple(kept)
        self._bytes = tuple(n.encode("utf-8") for n in kept)
        self._index = NeedleIndex(kept)
        # Candidate keys: each byte of a needle, with the needles (a bit mask) that hold it.
        # (Longer keys meet the matcher less often but cover fewer needles: more passes, slower.)
        keys: dict[bytes, int] = {}
        for i, needle in enumerate(self._bytes):
            for byte in set(needle):
                key = bytes([byte])
                keys[key] = keys.get(key, 0) | 1 << i
        self._keys = keys
        self._plan_cache: tuple[int, list[tuple[bytes, list[tuple[bytes, int]], float]]] | None = (
            None)
        self._planned_bytes = 0
        self._regexes: dict[tuple[bytes, frozenset[tuple[bytes, int]]], re.Pattern[bytes]] = {}

    def __bool__(self) -> bool:
        return bool(self.needles)

    def search_line(self, text: str) -> bool:
        """Whether ``text`` holds one of the needles, in any case (of ASCII letters only, as the
        block search lowers bytes: the Kelvin sign is not a "k" here either)."""
        return self._index.any(text.lower() if text.isascii() else text.translate(_ASCII_LOWER))

    def find_text(self, text: str, limit: int, skip: int) -> list[int]:
        """Offsets of the first ``limit`` needles in ``text``, ``skip`` characters apart at least
        (for cutting a long message)."""
        raw = text.encode("utf-8", "replace").lower()
        hits = self.hits(raw, lowered=True, limit=limit, skip=skip)
        if raw.isascii():
            return hits
        return [len(raw[:h].decode("utf-8", "ignore")) for h in hits]

    # -- blocks ----------------------------------------------------------------------------

    def hits(self, buf: bytes | bytearray, start: int = 0, end: int | None = None, *,
             lowered: bool = False, limit: int = 0, skip: int = 1) -> list[int]:
        """Sorted offsets in ``buf[start:end]``, one in each line that holds a needle in any case
        (where some needle of it starts, or its key). ``lowered``: ``buf`` is in lower case
        already (the scanner lowers each block once). With ``limit``, not one a line but the
        first ``limit`` needles, each at least ``skip`` bytes after the one before (the windows
        kept of an over-long line)."""
        end = len(buf) if end is None else end
        if not self._bytes or end <= start:
            return []
        if not lowered:
            buf, end, offset = buf[start:end].lower(), end - start, start
            start = 0
        else:
            offset = 0
        found: set[int] = set()
        # (The windows of one long line are planned for that line alone: its text says little
        # about the rest of the log, whose plan is kept.)
        plan = self._plan(buf, start, end) if limit else self._plan_for(buf, start, end)
        for key, group, expected in plan:
            if expected <= _FIND_MAX:
                pos = self._find_hits(buf, start, end, key[0], group, found, limit, skip)
                if pos < end:  # the key was frequent after all
                    self._regex_hits(buf, pos, end, key, group, found, limit, skip)
            else:
                self._regex_hits(buf, start, end, key, group, found, limit, skip)
        hits = sorted(h + offset for h in found)
        return hits[:limit] if limit else hits

    def _plan_for(self, buf: bytes | bytearray, start: int, end: int
                  ) -> list[tuple[bytes, list[tuple[bytes, int]], float]]:
        """The plan for this block: made afresh from a sample of it now and then (every
        ``_REPLAN_BYTES``), else the last one with its expected counts scaled."""
        length = end - start
        if self._plan_cache is None or self._planned_bytes + length > _REPLAN_BYTES or (
                length >= _SAMPLE and self._plan_cache[0] < _SAMPLE):
            self._plan_cache = (length, self._plan(buf, start, end))
            self._planned_bytes = 0
        self._planned_bytes += length
        planned_length, plan = self._plan_cache
        scale = length / max(1, planned_length)
        return [(key, group, expected * scale) for key, group, expected in plan]

    def _plan(self, buf: bytes | bytearray, start: int, end: int
              ) -> list[tuple[bytes, list[tuple[bytes, int]], float]]:
        """Keys for a block: [(key, [(needle, offset of the key in it)], expected count)], a
        greedy weighted set cover of the needles by their bytes, each found with memchr where
        rare and with one regular expression (the byte, then a trie of the needles) elsewhere."""
        length = end - start
        piece = _SAMPLE // 4  # from four places, so that one odd stretch does not decide
        step = max(piece, (length - piece) // 3)
        sample = b"".join(bytes(buf[at:min(end, at + piece)])
                          for at in range(start, max(start + 1, end - piece + 1), step)[:4])
        scale = length / max(1, len(sample))
        blocks = length / (4 << 20)
        candidates = []  # (key, mask of the needles holding it, cost in ms, expected count)
        for key, mask in self._keys.items():
            occ = sample.count(key) * scale if sample else 0.0
            if occ <= _FIND_MAX:
                cost = 0.02 + occ * 0.0005  # memchr, then Python at each place
            else:
                # A regex pass: the engine's scan for the key (about 2 ms a 4 MiB block of
                # letters), then at each place a trie whose first level is tried in turn.
                width = min(mask.bit_count(), 24)
                cost = 2.0 * blocks + occ * (0.00001 + 0.000001 * width)
            candidates.append((key, mask, cost, occ))
        left = (1 << len(self._bytes)) - 1
        plan = []
        while left:
            best = None
            best_score = -1.0
            for candidate in candidates:
                cover = candidate[1] & left
                if cover:
                    score = cover.bit_count() / candidate[2]
                    if score > best_score:
                        best, best_score = candidate, score
            assert best is not None
            key, mask, _, occ = best
            cover = mask & left
            left &= ~cover
            group = [(self._bytes[i], self._bytes[i].index(key))
                     for i in range(len(self._bytes)) if cover >> i & 1]
            plan.append((key, group, occ))
        return plan

    def _regex(self, key: bytes, group: list[tuple[bytes, int]]) -> re.Pattern[bytes]:
        cache_key = (key, frozenset(group))
        rx = self._regexes.get(cache_key)
        if rx is None:
            items = [(needle[offset + len(key):], needle[:offset]) for needle, offset in group]
            rx = re.compile(re.escape(key) + _trie(items, key))
            if len(self._regexes) >= _REGEXES_KEPT:
                self._regexes.clear()
            self._regexes[cache_key] = rx
        return rx

    @staticmethod
    def _find_hits(buf: bytes | bytearray, start: int, end: int, key: int,
                   group: list[tuple[bytes, int]], found: set[int], limit: int = 0,
                   skip: int = 1) -> int:
        """Find ``key`` with memchr and check the needles there; returns where it stopped (end,
        or earlier if the key proved too frequent)."""
        by_offset: dict[int, tuple[bytes, ...]] = {}
        for needle, offset in group:
            by_offset[offset] = (*by_offset.get(offset, ()), needle)
        checks = sorted(by_offset.items())
        find, startswith = buf.find, buf.startswith
        pos, seen, taken = start, 0, 0
        while pos < end:
            i = find(key, pos, end)
            if i < 0:
                return end
            seen += 1
            if seen > _FIND_GIVE_UP:
                return i
            for offset, needles in checks:
                at = i - offset
                if at >= start and startswith(needles, at, end):
                    found.add(at)
                    if limit:
                        taken += 1
                        if taken >= limit:
                            return end
                        i = at + skip - 1
                        break
                    nl = find(10, i, end)  # on to the next line
                    i = end if nl < 0 else nl
                    break
            pos = i + 1
        return end

    def _regex_hits(self, buf: bytes | bytearray, start: int, end: int, key: bytes,
                    group: list[tuple[bytes, int]], found: set[int], limit: int = 0,
                    skip: int = 1) -> None:
        search = self._regex(key, group).search
        if limit:
            pos, taken = start, 0
            while taken < limit and pos < end:
                m = search(buf, pos, end)
                if m is None:
                    return
                found.add(m.start())
                taken += 1
                pos = max(m.start() + skip, m.start() + 1)
            return
        find = buf.find
        pos = start
        while pos < end:
            m = search(buf, pos, end)
            if m is None:
                return
            found.add(m.start())
            nl = find(10, m.end(), end)
            if nl < 0:
                return
            pos = nl + 1


def _trie(items: list[tuple[bytes, bytes]], matched: bytes) -> bytes:
    """An expression for what follows the key: each item is (the rest of a needle after the key,
    the part of it before the key), ``matched`` what the expression has matched so far (the key
    and any common continuation). Factored by common prefixes so that one byte comparison rejects
    many needles; the parts before the key are checked by look-behinds, factored from their end
    (:func:`_behind`)."""
    befores = [before for rest, before in items if not rest]
    alts: list[bytes] = []
    by_first: dict[int, list[tuple[bytes, bytes]]] = {}
    for rest, before in items:
        if rest:
            by_first.setdefault(rest[0], []).append((rest[1:], before))
    for first, sub in sorted(by_first.items()):
        alts.append(re.escape(bytes([first])) + _trie(sub, matched + bytes([first])))
    if befores:
        behind = _behind(befores, matched)
        if not behind:
            return b""  # a needle ends here and starts at the key: nothing more to check
        alts.append(behind)  # last: a look-behind is dearer than a byte comparison
    if len(alts) == 1:
        return alts[0]
    return b"(?:" + b"|".join(alts) + b")"


def _behind(befores: list[bytes], tail: bytes) -> bytes:
    """Look-behinds that hold where one of ``befores`` ends just before ``tail`` (which ends at
    the current position), as a trie on their last bytes: ``(?<=ot)(?:(?<=rot)|(?<=oot))``."""
    if b"" in befores:
        return b""
    by_last: dict[bytes, list[bytes]] = {}
    for before in befores:
        by_last.setdefault(before[-1:], []).append(before[:-1])
    alts = []
    for last, rests in sorted(by_last.items()):
        seen = last + tail
        alts.append(b"(?<=" + re.escape(seen) + b")" + _behind(rests, seen))
    if len(alts) == 1:
        return alts[0]
    return b"(?:" + b"|".join(alts) + b")"


_SETS: dict[frozenset[str], NeedleSet] = {}


def needles_for(categories: frozenset[str]) -> NeedleSet:
    """The needles of the rules (and other readings) whose findings fall in ``categories``."""
    needle_set = _SETS.get(categories)
    if needle_set is None:
        needle_set = NeedleSet(n for n, cats in NEEDLE_CATEGORIES.items() if cats & categories)
        _SETS[categories] = needle_set
    return needle_set


ALL_NEEDLES = needles_for(frozenset(c for cats in NEEDLE_CATEGORIES.values() for c in cats))
