"""Parsing and printing sizes and counts the way people write them ("2GiB", "30B", "1.5e9")."""

from __future__ import annotations

import re

_BYTES = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_COUNT = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``"2GiB"`` -> 2147483648. Decimal units (GB) are powers of 1000, binary (GiB) of 1024."""
    match = _NUMBER.match(text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _BYTES:
        raise ValueError(f"not a size: {text!r} (write it like 2GiB, 512MiB or 8GB)")
    return int(float(match.group(1)) * _BYTES[unit])


def parse_count(text: str) -> int:
    """``"30B"`` -> 30_000_000_000; ``"125M"``, ``"1.3e9"`` and plain integers work too."""
    match = _NUMBER.match(text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _COUNT:
        raise ValueError(f"not a count: {text!r} (write it like 30B, 125M or 1.3e9)")
    return int(round(float(match.group(1)) * _COUNT[unit]))


def format_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_count(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)
