"""Reading the byte figures that allocators print into their out-of-memory messages.

Every size an allocator prints is a power of 1024, whatever the unit says:

- PyTorch's ``format_size`` has printed ``KiB/MiB/GiB`` since 1.x and its MPS allocator prints
  ``KB/MB/GB`` for the same powers of 1024;
- TensorFlow's ``HumanReadableNumBytes`` prints ``32.00M (33554432 bytes)`` (case 013: 32 * 2**20);
- XLA prints ``4.44GiB``, NumPy ``7.45 GiB``.

So ``KB/MB/GB/TB`` and bare ``K/M/G/T`` read as binary here (``launcher.units.parse_bytes`` is for
what a *person* types, where ``GB`` means 10**9; this module is for what a *program* printed). The
figures in ``cases.csv`` agree: every one is the printed number times a power of 1024, to the
0.5 % rounding of two decimals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KiB = 1024
MiB = 1024**2
GiB = 1024**3

_UNIT = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "k": KiB, "kb": KiB, "kib": KiB,
    "m": MiB, "mb": MiB, "mib": MiB,
    "g": GiB, "gb": GiB, "gib": GiB,
    "t": 1024**4, "tb": 1024**4, "tib": 1024**4,
    "p": 1024**5, "pb": 1024**5, "pib": 1024**5,
    "e": 1024**6, "eb": 1024**6, "eib": 1024**6,
}

# A printed size: "20.00 MiB", "0 bytes", "4.44GiB", "32.00M", "1,024 MB".
# (A number starts where no digit, comma or point comes before it: trying each digit of a long run
# as a start would take time quadratic in the run.)
SIZE = (r"(?<![\d,.])(\d[\d,]*(?:\.\d+)?)\s*"
        r"((?:[KMGTPE]i?B|[KMGTPE](?![A-Za-z])|bytes?|B)(?![A-Za-z]))?")
_SIZE_RE = re.compile(SIZE)

# A request no machine could ever serve: the allocator was handed a garbage size (NCCL's "more
# than 1EB" after a failed collective, a negative size wrapped to 2**64). Not a memory shortage.
IMPOSSIBLE_BYTES = 1024**5


# A figure longer than this many digits is garbage, not a size: read as this many bytes (which is
# impossible, so the message is not a memory shortage) rather than overflow.
_MAX_DIGITS = 30
_GARBAGE_BYTES = 1024**8


def to_bytes(number: str, unit: str | None) -> int:
    """``("8.06", "GiB")`` -> 8654358692. Rounds to the nearest byte (the printed number already
    lost more than that)."""
    digits = number.replace(",", "")
    if len(digits) > _MAX_DIGITS:
        return _GARBAGE_BYTES
    value = float(digits) * _UNIT[(unit or "").lower()]
    return int(round(value)) if value < _GARBAGE_BYTES else _GARBAGE_BYTES


def _count(digits: str) -> int:
    """A byte count printed in full ("(33554432 bytes)"), garbage-proof like :func:`to_bytes`."""
    return int(digits) if len(digits) <= _MAX_DIGITS else _GARBAGE_BYTES


def parse_size(text: str) -> int | None:
    """The first size in ``text``, in bytes, or None."""
    match = _SIZE_RE.search(text)
    return to_bytes(match.group(1), match.group(2)) if match else None


@dataclass
class Figures:
    """What an out-of-memory message says about memory, in bytes; None where it does not say.

    ``reserved`` is memory held by this process's caching allocator (PyTorch's "reserved in total",
    or allocated + "reserved but unallocated" in the 2.1+ wording); ``this_process`` is what the
    driver charges this process, CUDA context included; ``other_processes`` the other processes
    the 2.1+ wording lists on the same GPU.
    """

    requested: int | None = None
    capacity: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    free: int | None = None
    this_process: int | None = None
    other_processes: int | None = None
    gpu: int | None = None
    impossible: bool = False

    def count(self) -> int:
        return sum(
            v is not None
            for v in (self.requested, self.capacity, self.allocated, self.reserved, self.free)
        )

    def fill_from(self, other: Figures) -> None:
        """Take the figures this one lacks from ``other`` (the same failure reported twice)."""
        for name in ("requested", "capacity", "allocated", "reserved", "free", "this_process",
                     "other_processes", "gpu"):
            if getattr(self, name) is None and getattr(other, name) is not None:
                setattr(self, name, getattr(other, name))


def _one(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


# PyTorch, every era. Old (<= 2.0):
#   Tried to allocate 20.00 MiB (GPU 0; 4.00 GiB total capacity; 825.14 MiB already allocated;
#   2.35 GiB free; 850.00 MiB reserved in total by PyTorch)     [<= 1.4: "... 6.81 GiB cached)"]
# New (>= 2.1):
#   Tried to allocate 8.06 GiB. GPU 0 has a total capacity of 23.70 GiB of which 1.27 GiB is free.
#   Process 1940794 has 71.97 GiB memory in use. Including non-PyTorch memory, this process has
#   7.05 GiB memory in use. Of the allocated memory 12.62 GiB is allocated by PyTorch, and 8.65 GiB
#   is reserved by PyTorch but unallocated.
# 2.1 spelt "capacty"; HIP, XPU and MTIA print the same sentences.
_REQUESTED = _one(r"tried to allocate\s+" + SIZE)
_MORE_THAN = _one(r"tried to allocate more than\s+" + SIZE)
_GPU = _one(r"\((?:GPU|device)\s+(\d+);|\bGPU\s+(\d+)\s+has a total capac")
_CAPACITY = (_one(SIZE + r"\s+total capacity"), _one(r"total capac(?:i)?ty of\s+" + SIZE))
_ALLOCATED = (_one(SIZE + r"\s+already allocated"),
              _one(r"of the allocated memory\s+" + SIZE + r"\s+is allocated by"))
_FREE = (_one(SIZE + r"\s+free\b(?!\s+memory)"), _one(r"of which\s+" + SIZE + r"\s+is free"))
_RESERVED = (_one(SIZE + r"\s+reserved in total"), _one(SIZE + r"\s+cached\b"))
_UNALLOCATED = _one(SIZE + r"\s+is reserved by \w+ but unallocated")
_THIS_PROCESS = _one(r"this process has\s+" + SIZE + r"\s+memory in use")
_OTHER_PROCESS = _one(r"\bprocess\s+\d+\s+has\s+" + SIZE + r"\s+memory in use")
# Apple MPS: "MPS backend out of memory (MPS allocated: 17.18 GB, other allocations: 40.50 MB,
# max allowed: 18.13 GB). Tried to allocate 256 bytes on shared pool."
_MPS_ALLOCATED = _one(r"MPS allocated:\s*" + SIZE)
_MPS_MAX = _one(r"max allowed:\s*" + SIZE)
_MPS_OTHER = _one(r"other allocations:\s*" + SIZE)


def _first(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for pattern in patterns:
        match = pattern.search(text)
        if match:
            return to_bytes(match.group(1), match.group(2))
    return None


def torch_figures(text: str) -> Figures:
    """The figures of a PyTorch allocator message (CUDA, HIP, XPU, MPS), any era."""
    fig = Figures()
    match = _MORE_THAN.search(text)
    if match:
        fig.impossible = True
        fig.requested = to_bytes(match.group(1), match.group(2))
    else:
        match = _REQUESTED.search(text)
        if match:
            fig.requested = to_bytes(match.group(1), match.group(2))
    if fig.requested is not None and fig.requested >= IMPOSSIBLE_BYTES:
        fig.impossible = True
    match = _GPU.search(text)
    if match:
        gpu = _count(match.group(1) or match.group(2))
        fig.gpu = gpu if gpu < _GARBAGE_BYTES else None
    fig.capacity = _first(_CAPACITY, text)
    fig.allocated = _first(_ALLOCATED, text)
    fig.free = _first(_FREE, text)
    fig.reserved = _first(_RESERVED, text)
    if fig.reserved is None:
        match = _UNALLOCATED.search(text)
        if match and fig.allocated is not None:
            # Round each figure before adding, as cases.csv does: "12.62 GiB is allocated ...,
            # and 8.65 GiB is reserved ... but unallocated" -> reserved = 12.62 + 8.65 GiB.
            fig.reserved = fig.allocated + to_bytes(match.group(1), match.group(2))
    match = _THIS_PROCESS.search(text)
    if match:
        fig.this_process = to_bytes(match.group(1), match.group(2))
    others = [to_bytes(m.group(1), m.group(2)) for m in _OTHER_PROCESS.finditer(text)]
    if others:
        fig.other_processes = sum(others)
    if "MPS" in text:
        mps = _MPS_ALLOCATED.search(text)
        if mps:
            fig.allocated = to_bytes(mps.group(1), mps.group(2))
        mps = _MPS_MAX.search(text)
        if mps:
            fig.capacity = to_bytes(mps.group(1), mps.group(2))
        mps = _MPS_OTHER.search(text)
        if mps:
            fig.other_processes = to_bytes(mps.group(1), mps.group(2))
    return fig


# TensorFlow / XLA / JAX / NumPy / the CPU allocator: only the request, usually.
_EXACT_BYTES = (
    # TF stream executor: "failed to allocate 32.00M (33554432 bytes) from device"
    _one(r"failed to allocate\s+\S+\s+\((\d+) bytes\)"),
    # TF BFC: "ran out of memory trying to allocate 1.17GiB (rounded to 1258291200)"
    _one(r"trying to allocate\s+\S+\s+\(rounded to (\d+)\)"),
    # JAX: "Failed to allocate request for 1.23GiB (1320702464B) on device ordinal 0"
    _one(r"allocate request for\s+\S+\s+\((\d+)B\)"),
    # PyTorch CPU: "DefaultCPUAllocator: can't allocate memory: you tried to allocate 278528000
    # bytes" (also the Windows "not enough memory: you tried to allocate ...")
    _one(r"you tried to allocate\s+(\d+)\s*bytes"),
    # XLA: "Out of memory while trying to allocate 4770354232 bytes."
    _one(r"(?:trying to allocate|allocating)\s+(\d+)\s*bytes"),
)
_SIZED_REQUEST = (
    _one(r"(?:trying to allocate|while allocating|attempting to (?:allocate|reserve))\s+" + SIZE),
    _one(r"unable to allocate\s+" + SIZE + r"\s+for an array"),
    _one(r"allocate request for\s+" + SIZE),
)
_XLA_FREE = _one(r"There (?:are|is)\s+" + SIZE + r"\s+free")
_TF_SHAPE = re.compile(r"OOM when allocating tensor with shape\s*\[([\d,\s]*)\]\s*and type (\w+)")
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
    "int8": 1, "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "complex64": 8, "complex128": 16,
}


def other_figures(text: str) -> Figures:
    """The request (and, for XLA, the free bytes) of a non-PyTorch allocation failure."""
    fig = Figures()
    for pattern in _EXACT_BYTES:
        match = pattern.search(text)
        if match:
            fig.requested = _count(match.group(1))
            break
    if fig.requested is None:
        fig.requested = _first(_SIZED_REQUEST, text)
    if fig.requested is None:
        match = _TF_SHAPE.search(text)
        if match and match.group(2).lower() in _DTYPE_BYTES:
            # TF names the tensor, not its size: shape x element size is exact for a dense tensor.
            size = _DTYPE_BYTES[match.group(2).lower()]
            for dim in re.findall(r"\d+", match.group(1)):
                size = min(size * _count(dim), _GARBAGE_BYTES)
            fig.requested = size
    match = _XLA_FREE.search(text)
    if match:
        fig.free = to_bytes(match.group(1), match.group(2))
    if fig.requested is not None and fig.requested >= IMPOSSIBLE_BYTES:
        fig.impossible = True
    return fig
