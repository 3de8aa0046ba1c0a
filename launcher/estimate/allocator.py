"""A replay of PyTorch's CUDA caching allocator, for ``max_memory_reserved`` without a GPU.

The traced estimate counts what tensors hold (``max_memory_allocated``); a GPU job needs what
the caching allocator has taken from the driver (``max_memory_reserved``), which is more: sizes
are rounded, small blocks are packed into 2 MiB segments, mid-sized ones are carved out of
20 MiB segments, and a freed block stays cached in its segment, reusable only by a request it
fits. How much more depends on the mix and order of sizes, so no fixed ratio is right for every
model. This module replays an allocation sequence (``alloc`` of n bytes, ``free`` of an earlier
allocation) through the allocator's own rules and reports both peaks.

The rules are those of ``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.x; read at
github.com/pytorch/pytorch, ``DeviceCachingAllocator``), for one device and one stream:

- ``round_size``: every request is rounded up to ``kMinBlockSize`` = 512 bytes (or, with
  ``roundup_power2_divisions``, to the next of N divisions between two powers of two);
- ``get_pool``: requests of at most ``kSmallSize`` = 1 MiB go to the small pool, others to the
  large pool; the pools never share blocks;
- ``get_free_block``: best fit, the smallest cached block of at least the size (ties: the lowest
  address, ``BlockComparatorSize``); with ``max_split_size_mb`` a request below it never takes a
  block at or above it, and a request above it takes one only within ``kLargeBuffer`` of its
  size;
- ``get_allocation_size``: without a fitting cached block, a new segment is ``cudaMalloc``'ed:
  ``kSmallBuffer`` = 2 MiB for a small request, ``kLargeBuffer`` = 20 MiB for one under
  ``kMinLargeAlloc`` = 10 MiB, else the size rounded up to ``kRoundLarge`` = 2 MiB;
- ``should_split``: the block handed out is cut to the request when the remainder is at least
  512 bytes (small pool, and every pool under expandable segments) or more than 1 MiB (large
  pool, and only for requests under ``max_split_size``); an uncut block counts whole in
  ``allocated_bytes`` (``alloc_found_block`` adds ``block->size``);
- ``free_block``: a freed block merges with free neighbours of its segment and is cached; a
  segment is returned to the driver only by ``empty_cache`` or when a ``cudaMalloc`` fails,
  neither of which a replay of one fitting training step meets, so reserved bytes only grow;
- ``expandable_segments:True`` (``ExpandableSegment``, ``try_allocate_expandable_block``): one
  segment per pool and stream whose address space is reserved up front and backed by pages as
  needed, 2 MiB pages for the small pool and 20 MiB for the large; a request that fits no
  cached block maps the pages it needs at the segment's end (joined to a free block there), and
  best fit prefers a block inside the segment to that growing end.

Not modelled: other streams (a block freed on one stream is reused on another only after an
event), CUDA graph pools, ``garbage_collection_threshold``, the release of cached blocks when
the device is full. Pure Python, no torch: the planner's process runs it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MiB = 1024**2
#: CUDACachingAllocator.cpp's constants (names as there).
K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1 * MiB
K_SMALL_BUFFER = 2 * MiB
K_LARGE_BUFFER = 20 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB
_UNLIMITED = 2**63  # max_split_size's default (SIZE_MAX): no limit


@dataclass(frozen=True)
class AllocatorConfig:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` options that change what is reserved."""

    expandable_segments: bool = False
    max_split_size: int | None = None  # bytes (max_split_size_mb * MiB); None: unlimited
    roundup_power2_divisions: int = 0  # 0 or 1: plain 512-byte rounding


@dataclass(frozen=True)
class Replay:
    """The allocator's peaks over a replayed sequence, in bytes.

    ``peak_requested`` is the peak of the live requests rounded to 512 bytes (what the traced
    estimate counts); ``peak_allocated`` the peak of the blocks handed out, as
    ``torch.cuda.max_memory_allocated`` reports it (an uncut block counts whole);
    ``peak_reserved`` the peak of the segments (``max_memory_reserved``); ``segments`` how many
    ``cudaMalloc`` calls (or page mappings under expandable segments) were made.
    """

    peak_requested: int
    peak_allocated: int
    peak_reserved: int
    segments: int

    @property
    def reserve_ratio(self) -> float:
        """Reserved per requested byte at the peaks: what multiplies a traced peak."""
        return self.peak_reserved / self.peak_requested if self.peak_requested else 1.0


def round_size(size: int, divisions: int = 0) -> int:
    """``round_size``: up to 512 bytes, or to the next of ``divisions`` steps between powers of
    two (``roundup_power2_next_division``) when that option is set and the size exceeds
    512 x divisions."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (divisions.bit_length() - 1)
        if step == 0:
            return floor << 1
        low = size & ~(step - 1)
        return size if low == size else low + step
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment ``cudaMalloc``'ed for a (rounded) request that no
    cached block fits."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


class _Block:
    __slots__ = ("addr", "size", "prev", "next", "allocated")

    def __init__(self, addr: int, size: int) -> None:
        self.addr, self.size = addr, size
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.allocated = False


class _Pool:
    """One pool's cached free blocks, sorted by (size, address) as ``BlockComparatorSize``."""

    __slots__ = ("small", "free", "blocks", "last", "end", "page")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.free: list[tuple[int, int]] = []
        self.blocks: dict[int, _Block] = {}  # free blocks by address
        # Expandable segments: the segment's last block (free or not) and its mapped end.
        self.last: _Block | None = None
        self.end: int | None = None
        self.page = K_SMALL_BUFFER if small else K_LARGE_BUFFER

    def insert(self, block: _Block) -> None:
        insort(self.free, (block.size, block.addr))
        self.blocks[block.addr] = block

    def remove(self, block: _Block) -> None:
        i = bisect_left(self.free, (block.size, block.addr))
        del self.free[i]
        del self.blocks[block.addr]


class CachingAllocator:
    """One device's allocator state; ``malloc`` and ``free`` as the C++ does them."""

    def __init__(self, config: AllocatorConfig | None = None) -> None:
        self.config = config or AllocatorConfig()
        self.max_split = self.config.max_split_size or _UNLIMITED
        self.pools = (_Pool(small=True), _Pool(small=False))
        self.next_addr = 0
        self.requested = self.allocated = self.reserved = 0
        self.peak_requested = self.peak_allocated = self.peak_reserved = 0
        self.segments = 0

    # -- malloc ----------------------------------------------------------------------------

    def malloc(self, nbytes: int) -> tuple[_Block, int]:
        """Hand out a block for ``nbytes``; returns it and the rounded request."""
        size = round_size(nbytes, self.config.roundup_power2_divisions)
        pool = self.pools[0] if size <= K_SMALL_SIZE else self.pools[1]
        block = self._free_block(pool, size)
        if block is None:
            block = self._new_segment(pool, size)
        remaining = block.size - size
        expandable = self.config.expandable_segments
        split = (remaining >= K_MIN_BLOCK_SIZE if pool.small or expandable
                 else size < self.max_split and remaining > K_SMALL_SIZE)
        if split:
            rest = _Block(block.addr + size, remaining)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            if pool.last is block:
                pool.last = rest
            pool.insert(rest)
        block.allocated = True
        self.requested += size
        self.allocated += block.size
        self.peak_requested = max(self.peak_requested, self.requested)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block, size

    def _free_block(self, pool: _Pool, size: int) -> _Block | None:
        """``get_free_block``: the best-fitting cached block, or None."""
        i = bisect_left(pool.free, (size, -1))
        if i == len(pool.free):
            return None
        block = pool.blocks[pool.free[i][1]]
        if block is pool.last and i + 1 < len(pool.free):
            # expandable segments: the growing end counts as large as it can grow, so any other
            # block that fits is the better fit (the C++ loop over ``expandable_size``)
            block = pool.blocks[pool.free[i + 1][1]]
        if size < self.max_split <= block.size:
            return None  # do not hand an oversize block to a smaller request
        if size >= self.max_split and block.size >= size + K_LARGE_BUFFER:
            return None  # an oversize block serves only requests within 20 MiB of it
        pool.remove(block)
        return block

    def _new_segment(self, pool: _Pool, size: int) -> _Block:
        if not self.config.expandable_segments:
            grant = allocation_size(size)
            block = _Block(self.next_addr, grant)
            self.next_addr += grant + K_LARGE_BUFFER  # segments are never adjacent
            self._reserve(grant)
            return block
        # ``try_allocate_expandable_block``: map pages at the segment's end, joined to the free
        # block there if there is one.
        if pool.end is None:
            pool.end = self.next_addr
            self.next_addr += 1 << 50  # the segment's address space (1.125 x the GPU's memory)
        tail = pool.last
        if tail is not None and not tail.allocated:
            pool.remove(tail)
        else:
            fresh = _Block(pool.end, 0)
            fresh.prev = tail
            if tail is not None:
                tail.next = fresh
            tail = pool.last = fresh
        grant = max(0, -(-(size - tail.size) // pool.page) * pool.page)
        self._reserve(grant)
        tail.size += grant
        pool.end += grant
        return tail

    def _reserve(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.segments += 1
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    # -- free ------------------------------------------------------------------------------

    def free(self, block: _Block, size: int) -> None:
        """``free_block``: cache the block, merged with its free neighbours."""
        pool = self.pools[0] if size <= K_SMALL_SIZE else self.pools[1]
        self.requested -= size
        self.allocated -= block.size
        block.allocated = False
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            pool.remove(prev)
            block.addr, block.size, block.prev = prev.addr, prev.size + block.size, prev.prev
            if block.prev is not None:
                block.prev.next = block
        if nxt is not None and not nxt.allocated:
            pool.remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if pool.last is nxt:
                pool.last = block
            if block.next is not None:
                block.next.prev = block
        pool.insert(block)


def replay(events: Iterable[int], config: AllocatorConfig | None = None) -> Replay:
    """Replay a compact event sequence: ``n >= 0`` allocates ``n`` bytes (the k-th such entry
    is allocation ``k``), ``~k`` (negative) frees allocation ``k``. Zero-byte allocations take
    an id and no memory (the allocator returns a null pointer for them). Frees of unknown or
    already freed ids are ignored: a trace's window may end or start mid-life."""
    alloc = CachingAllocator(config)
    live: dict[int, tuple[_Block, int]] = {}
    next_id = 0
    for e in events:
        if e >= 0:
            if e:
                live[next_id] = alloc.malloc(e)
            next_id += 1
        else:
            held = live.pop(~e, None)
            if held is not None:
                alloc.free(*held)
    return Replay(peak_requested=alloc.peak_requested, peak_allocated=alloc.peak_allocated,
                  peak_reserved=alloc.peak_reserved, segments=alloc.segments)


def compact(events: Sequence[tuple]) -> list[int]:
    """``("alloc", id, nbytes)`` / ``("free", id)`` tuples (ids of any hashable kind) as the
    compact sequence ``replay`` takes."""
    ids: dict[object, int] = {}
    out: list[int] = []
    count = 0
    for event in events:
        if event[0] == "alloc":
            ids[event[1]], count = count, count + 1
            out.append(int(event[2]))
        elif event[0] == "free":
            out.append(~ids[event[1]])
        else:
            raise ValueError(f"not an allocator event: {event!r}")
    return out
