"""Parsing and printing sizes, counts and durations the way people write them ("2GiB", "30B",
"1.5e9", "90m")."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

_BYTES = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_COUNT = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)", re.IGNORECASE)


def parse_bytes(text: str | int | float) -> int:
    """``"2GiB"`` -> 2147483648. Decimal units (GB) are powers of 1000, binary (GiB) of 1024.
    A number (a config file's ``memory_limit = 2147483648``) is a count of bytes."""
    return _scaled(text, _BYTES, "size", "2GiB, 512MiB or 8GB", int)


def parse_count(text: str | int | float) -> int:
    """``"30B"`` -> 30_000_000_000; ``"125M"``, ``"1.3e9"`` and plain integers work too."""
    return _scaled(text, _COUNT, "count", "30B, 125M or 1.3e9", round)


def _scaled(text: object, units: dict[str, int], what: str, example: str,
            whole: Callable[[float], int]) -> int:
    """A number and a unit of ``units``; ValueError (one line) for anything else, a number too
    large for a float (``1e999``) included."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        try:
            number, unit = float(text), ""
        except OverflowError:  # an int no float holds
            raise ValueError(f"not a {what}: {_short(text)} is too large") from None
    else:
        match = _NUMBER.match(text) if isinstance(text, str) else None
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in units:
            raise ValueError(f"not a {what}: {_short(text)} (write it like {example})")
        number = float(match.group(1))
    value = number * units[unit]
    if value < 0:
        raise ValueError(f"not a {what}: {_short(text)} is negative")
    if math.isnan(value):
        raise ValueError(f"not a {what}: {_short(text)} (write it like {example})")
    if math.isinf(value):
        raise ValueError(f"not a {what}: {_short(text)} is too large")
    return int(whole(value))


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_duration(text: object) -> int:
    """``"90m"`` -> 5400: whole seconds from a number of seconds, or a number with s, m, h or d.
    Used for every provider's ``--timeout``; each provider checks its own bounds."""
    match = _DURATION.fullmatch(str(text).strip())
    if match is None or isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r} (write it like 3600, 90m, 12h or 2d)")
    return int(round(float(match.group(1)) * _SECONDS[match.group(2).lower()]))


def format_bytes(n: int | None, digits: int = 1) -> str:
    """Bytes in binary units: ``8.1 GiB`` (plans), ``8.06 GiB`` with ``digits=2`` (the way
    PyTorch's allocator prints them, for a diagnosis quoting its figures)."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.{digits}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_count(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)
