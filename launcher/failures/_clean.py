"""Turning one physical log line into the messages it carries.

A line from a real job is rarely just the message: ANSI colour codes, a timestamp, torchrun's
``[default3]:``, PyTorch's ``[rank3]:``, mpirun's ``[1,3]<stderr>:``, a pdsh host (``gpu-q-13:``),
a Cloud Logging or CloudWatch JSON entry with the text inside (``\\n`` escaped), several messages
glued together by ``\\r`` progress bars. :func:`segments` peels all of that off and returns the
messages with the rank or host that printed them. It never raises: a line it cannot make sense of
comes back as it was.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from launcher.events import parse_event

MAX_SEGMENT = 8192  # a message longer than this is kept around its interesting part only

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SPLIT = re.compile(r"\r|\\r\\n|\\n|\n|(?<=\S)(?=\[(?:rank|default)\d+\]:)")

# Prefixes, tried repeatedly at the start of a message (the order of a real line varies).
_RANK_PREFIX = re.compile(r"\[(?:rank|default|trainer|worker)(\d+)\]:?\s*")
# mpirun: "[1,3]<stderr>:"; SageMaker's smdistributed: "[1,mpirank:3,algo-1]<stderr>:".
_MPI_PREFIX = re.compile(r"\[\d+,(?:mpirank:)?(\d+)(?:,([\w.-]+))?\]<std(?:out|err)>:\s*")
# NCCL's own lines: "node-2:48213:49001 [3] NCCL WARN ..." (host:pid:tid [device]).
_NCCL_PREFIX = re.compile(r"([A-Za-z][\w.-]*):\d+:\d+ \[\d+\] ")
_HOST_PREFIX = re.compile(r"((?:[A-Za-z][\w.]*-)+\d+):\s+")
_NOISE_PREFIX = re.compile(
    r"(?:"
    r"\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2}| ?UTC)?\]?:?"
    r"|\[?\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\]?"
    r"|[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} [\w.-]+ [\w./-]+(?:\[\d+\])?:"  # syslog
    r"|\[\s*\d+\.\d+\]"  # dmesg
    r"|[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+\d+\s+[\w./-]+:\d+\]"  # glog
    r"|[IWEF] [\w./-]+\.(?:cc|cpp|h|py):\d+\]"  # TensorFlow's "E tensorflow/...cc:828]"
    r"|\[?(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL|NOTICE)\]?(?=[\s:|])[:|]?"
    r"|<std(?:out|err)>:"
    r"|\[[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\]"
    r"|\[[^\[\]]{0,60}\(pid \d+\)\]"
    r"|\|"
    r")\s*"
)
# "message:  "..."" as printed by `gcloud logging read` (case 077) or YAML dumps.
_KEY_VALUE = re.compile(r'^\s*"?(?:textPayload|message|msg|log|errorMessage|FailureReason)"?\s*'
                        r'[:=]\s*(?:chr\s+)?"(.*)"\s*,?\s*$')
_TEXT_RANK = re.compile(r"\[Rank (\d+)\]|\brank[ =:#]{1,3}(\d+)\b|\bglobal_rank[ =:]+(\d+)", re.I)
_MESSAGE_KEYS = ("textPayload", "message", "msg", "log", "MESSAGE", "FailureReason", "error",
                 "errorMessage")


@dataclass
class Segment:
    """One message: its text (cleaned), and who printed it where the line says."""

    text: str
    rank: int | None = None
    host: str | None = None
    event: dict[str, Any] | None = None  # the launcher's own {"launch": ...} object


def _rank(digits: str) -> int | None:
    """A rank number; None for a run of digits no rank has (random or binary text)."""
    return int(digits) if len(digits) <= 9 else None


def strip_prefixes(text: str) -> tuple[str, int | None, str | None]:
    rank: int | None = None
    host: str | None = None
    for _ in range(10):
        match = _RANK_PREFIX.match(text)
        if match:
            rank = _rank(match.group(1))  # the innermost prefix is the global [rankN] one
            text = text[match.end():]
            continue
        match = _MPI_PREFIX.match(text)
        if match:
            rank = _rank(match.group(1))
            host = match.group(2) or host
            text = text[match.end():]
            continue
        match = _NOISE_PREFIX.match(text)
        if match and match.end() > 0:
            text = text[match.end():]
            continue
        match = _NCCL_PREFIX.match(text) or _HOST_PREFIX.match(text)
        if match and host is None:
            host = match.group(1)
            text = text[match.end():]
            continue
        break
    return text, rank, host


def _payload(obj: Any) -> tuple[str | None, int | None]:
    """The message text (and rank) of a structured log entry: Cloud Logging (textPayload or
    jsonPayload.message), CloudWatch (message), Docker (log), journald (MESSAGE)."""
    if not isinstance(obj, dict):
        return None, None
    rank = obj.get("rank") if isinstance(obj.get("rank"), int) else None
    for key in _MESSAGE_KEYS:
        value = obj.get(key)
        if isinstance(value, str):
            return value, rank
    for key in ("jsonPayload", "payload", "data", "detail"):
        inner, inner_rank = _payload(obj.get(key))
        if inner is not None:
            return inner, rank if rank is not None else inner_rank
    return None, rank


def _unescape(inner: str) -> str:
    try:
        return json.loads('"' + inner + '"')
    except ValueError:
        return inner.replace('\\"', '"')


def segments(line: str) -> list[Segment]:
    """The messages in one physical line, cleaned, with the rank/host that printed each."""
    if "\x1b" in line:
        line = ANSI.sub("", line)
    line = _CONTROL.sub(" ", line.rstrip("\r\n"))
    outer, outer_rank, outer_host = strip_prefixes(line)
    texts: list[str]
    event = parse_event(outer)  # the one parser of the templates' lines (launcher/events.py)
    if event is not None:
        rank = event.get("rank") if isinstance(event.get("rank"), int) else outer_rank
        return [Segment(outer.strip(), rank, outer_host, event)]
    stripped = outer.strip()
    if stripped.startswith("{") and stripped.endswith("}") and '":' in stripped:
        try:
            text, json_rank = _payload(json.loads(stripped))
        except ValueError:
            text, json_rank = None, None
        if text is not None:
            inner = segments(text)  # the payload may itself be a launch event or prefixed
            for seg in inner:
                if seg.rank is None:
                    seg.rank = json_rank if json_rank is not None else outer_rank
                seg.host = seg.host or outer_host
            return inner
    match = _KEY_VALUE.match(outer)
    if match:
        outer = _unescape(match.group(1))
    texts = _SPLIT.split(outer) if ("\r" in outer or "\\n" in outer or "\n" in outer
                                    or "]:" in outer) else [outer]
    result = []
    for text in texts:
        text, rank, host = strip_prefixes(text)
        text = text.strip()
        if not text:
            continue
        if rank is None:
            rank = outer_rank
        result.append(Segment(text, rank, host or outer_host))
    return result


def text_rank(text: str) -> int | None:
    """A rank named in the message itself: "[Rank 3] Watchdog caught ...", "on rank 3"."""
    match = _TEXT_RANK.search(text)
    if not match:
        return None
    return _rank(next(g for g in match.groups() if g is not None))
