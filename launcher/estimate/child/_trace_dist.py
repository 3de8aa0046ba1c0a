"""Distributed strategies in the trace child: one process stands for one rank of a real world.

Imported only in the trace child (``_trace_step``, ``_measure``, ``_script``) and the
benchmark's real runs, so torch is allowed here; ``torch.distributed`` itself is imported inside
the functions, because a plain single-device trace must not pay for DTensor's import.

``setup_world(N)`` joins a *fake* process group of ``N`` ranks as rank 0
(``torch.testing._internal.distributed.fake_pg``: every collective returns at once and moves no
data). The rendered script's own ``wrap_model`` then wraps the model
(``launcher.estimate.child._script``: DDP, FSDP2, hybrid sharding exactly as a job does), with two
pieces of transport from here: ``data_parallel`` (DDP's constructor in a fake world) and
``init_device_mesh`` (the mesh built outside the trace's modes). So the tracker sees the memory of
rank 0 of that world: DDP's gradient buckets, FSDP's shards, all-gathered blocks and reduce-scatter
buffers, each at its real size for that world size.

Rank 0 is traced. DDP ranks are identical. FSDP2 pads every parameter's shard to the same size
on every rank (``ceil(dim0 / shards)`` rows), so parameters, gradients and the all-gather and
reduce-scatter buffers are the same on all ranks; only the optimizer state, which follows the
*unpadded* local shard, can be smaller on the last ranks when a first dimension does not divide
by the shard count. Rank 0 holds the largest shard, so its peak is the largest.

Under a real process group (``torch.distributed`` already initialised, e.g. gloo in the
benchmark's reference runs) the same script functions run over that group unchanged: the same
code wraps the traced and the measured model.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

_MESHES: dict[tuple[Any, ...], Any] = {}


def _no_modes() -> contextlib.AbstractContextManager:
    """Run without any dispatch mode (neither the fake mode nor the tracker): the process group
    and the device mesh hold real, tiny tensors that are not part of any rank's memory."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def preimport() -> None:
    """Import what a rank's trace imports first (the fake process group, FSDP2, DTensor: about
    half a second): the trace child calls this before it forks a rank's workers, which then
    share it, instead of each of the two paying it, at every rank the planner asks for."""
    import torch.distributed  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor  # noqa: F401
    from torch.testing._internal.distributed import fake_pg  # noqa: F401


def is_fake_world() -> bool:
    import torch.distributed as dist

    return dist.is_initialized() and dist.get_backend() == "fake"


def setup_world(world_size: int) -> None:
    """Join a fake process group of ``world_size`` ranks as rank 0 (idempotent).

    A fake world of another size is torn down first (``trace_recipe_configs`` may trace several
    world sizes in one process). A real group already in place is left alone.
    """
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    with _no_modes():
        if dist.is_initialized():
            if not is_fake_world() or dist.get_world_size() == world_size:
                return
            dist.destroy_process_group()
            _MESHES.clear()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def device_mesh(device_type: str, shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    """``init_device_mesh`` as the templates call it, once per shape (outside the fake mode: a
    mesh's rank table must be real)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    key = (device_type, shape, names, dist.get_world_size(), dist.get_backend())
    if key not in _MESHES:
        with _no_modes():
            _MESHES[key] = init_device_mesh(device_type, shape, mesh_dim_names=names)
    return _MESHES[key]


def world() -> tuple[int, int]:
    """(world size, rank) of the process group this process is in."""
    import torch.distributed as dist

    return dist.get_world_size(), dist.get_rank()


def init_device_mesh(device_type: str, mesh_shape: tuple[int, ...], *,
                     mesh_dim_names: tuple[str, ...]) -> Any:
    """The script's ``init_device_mesh``, built outside the trace's modes, once per shape."""
    return device_mesh(device_type, tuple(mesh_shape), tuple(mesh_dim_names))


# ----------------------------------------------------------------------------------------------
# DDP (trainer_templates/ddp.py.j2)


def data_parallel(module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
    """The script's ``DistributedDataParallel``, with the script's own arguments: as it is under
    a real group; in a fake world without the constructor's cross-rank check, with the default
    all-reduce as a hook whose future holds the bucket, and without the one-time bucket rebuild
    (each explained below: none changes what DDP allocates)."""
    from torch.nn.parallel import DistributedDataParallel

    if not is_fake_world():
        return DistributedDataParallel(module, *args, **kwargs)
    with _fake_ddp_init():
        ddp = DistributedDataParallel(module, *args, **kwargs)
    _fake_allreduce(ddp)
    _skip_bucket_rebuild(ddp)
    return ddp


@contextlib.contextmanager
def _fake_ddp_init() -> Iterator[None]:
    """DDP's constructor checks that every rank has the same parameter shapes by all-gathering
    them and reading the result in C++: fake tensors have no data to read, and in a world of one
    process there is nothing to compare. The check allocates nothing that lasts."""
    import torch.nn.parallel.distributed as ddp_module

    verify = ddp_module._verify_param_shape_across_processes
    ddp_module._verify_param_shape_across_processes = lambda *args, **kwargs: None
    try:
        yield
    finally:
        ddp_module._verify_param_shape_across_processes = verify


def _fake_allreduce(ddp: torch.nn.Module) -> None:
    """DDP's default all-reduce, as a comm hook whose future holds the bucket.

    The fake process group's work completes with an empty future; the reducer needs the bucket
    back. The default C++ hook divides the bucket in place and all-reduces it in place (after
    copying each gradient into its bucket view as ``grad * (1/N)``; with a Python hook the copy
    is a plain ``copy_`` and the division follows on the whole bucket): no allocation either way.
    """
    import torch.distributed as dist

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks real annotations
        buffer = bucket.buffer()
        buffer.div_(dist.get_world_size())
        dist.all_reduce(buffer)
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(buffer)
        return future

    ddp.register_comm_hook(None, hook)  # type: ignore[operator]


class _NoRebuild:
    """The reducer, with its one-time bucket rebuild skipped (see ``_skip_bucket_rebuild``)."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


def _skip_bucket_rebuild(ddp: Any) -> None:
    """DDP re-partitions its buckets once, at the second forward, in the order gradients became
    ready; it broadcasts rank 0's partition and reads it in C++, which fake tensors cannot do.
    Skipped in the trace: the buckets hold the same gradients either way (same total bytes), and
    the rebuild frees the old buckets before it allocates the new ones (the gradients, their
    views, are None after ``zero_grad(set_to_none=True)``), so it adds no peak."""
    pre_forward = ddp._pre_forward

    def _pre_forward(*args: Any, **kwargs: Any) -> Any:
        reducer = ddp.reducer
        ddp.reducer = _NoRebuild(reducer)
        try:
            return pre_forward(*args, **kwargs)
        finally:
            ddp.reducer = reducer

    ddp._pre_forward = _pre_forward


def put_zero_grads(model: torch.nn.Module, on_grad: Callable[[torch.Tensor], None]) -> bool:
    """Step 1 of the trace puts zero gradients in place instead of running micro-batches. Under
    DDP with ``gradient_as_bucket_view`` the gradients a real backward leaves are views into the
    reducer's buckets, which exist anyway: a separate zero tensor per parameter would count the
    gradients twice. Here the gradients are produced the way a backward produces them: a
    backward of ``sum(p * 0)`` through the reducer's hooks, which copy each gradient into its
    bucket and make ``.grad`` a view of it. Returns False (nothing done) for other models."""
    ddp_module = sys.modules.get("torch.nn.parallel.distributed")  # no DDP without it
    if ddp_module is None or not isinstance(model, ddp_module.DistributedDataParallel):
        return False
    params = [p for p in model.parameters() if p.requires_grad]
    model.reducer.prepare_for_backward([])
    loss = sum((p * 0).sum() for p in params)
    loss.backward()  # type: ignore[union-attr]
    for p in params:
        if p.grad is not None:
            on_grad(p.grad)
    return True


# ----------------------------------------------------------------------------------------------
# One rank of a real (gloo) world, for the reference measurements


def exact_cpu_accounting() -> None:
    """Make the CPU allocator's running total exact across threads.

    c10's ``ProfiledCPUMemoryReporter`` updates its total (``total_allocated`` in the profiler's
    events) only on threads where the profiler is active, unless the c10 flag
    ``caffe2_report_cpu_memory_usage`` is set. A block freed on one of gloo's worker threads
    (the last reference to a tensor was a collective's work object) is then never subtracted,
    and the total drifts upwards for the rest of the run. The flag has no Python setter; it is
    an exported variable of libc10, set here through ctypes. Its only other effect is an
    INFO-level log line per allocation, below c10's default log level.
    """
    import ctypes
    from pathlib import Path

    libc10 = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
    ctypes.c_bool.in_dll(libc10, "FLAGS_caffe2_report_cpu_memory_usage").value = True


def peak_without_backend(prof: Any) -> dict[str, int]:
    """The CPU allocator's peak in a finished ``torch.profiler`` run, and the same without the
    collectives' own buffers.

    gloo allocates inside its collectives, where no dispatch mode sees it: ``_allgather_base_``
    copies through a temporary of the output's size, and its worker threads allocate their own
    while the work runs (when they free them depends on thread timing, so ranks differ from run
    to run). NCCL writes into the given tensors and allocates nothing from PyTorch's allocator,
    so a GPU job never has those bytes: they are the CPU backend's, not the training step's.

    Left out: every allocation made inside a ``c10d::`` op or on another thread than the one that
    allocated most (the training thread), and its free. Frees are matched to allocations by
    address (the events' ``allocation_id`` is not filled in). A free on a thread where the
    profiler is not active is not recorded at all (gloo's worker threads, when a collective's
    work object held the last reference): with ``exact_cpu_accounting`` on, the allocator's
    total still drops at that moment, so at every event the blocks known to be live are
    compared with the total, and a shortfall is matched to the live blocks whose free is never
    recorded (same size first, else the largest that fit). What cannot be matched stays live
    until its address is reused, an upper bound (``unmatched_bytes``).

    Returns ``peak`` (without the backend), ``raw_peak`` (the allocator's own total, less what
    was allocated before the profiler started), ``backend_bytes_at_raw_peak``, ``late_frees``.
    """
    from torch._C._profiler import _EventType

    events: list[tuple[int, int, int, int, int, bool, int]] = []
    stack = [(node, False) for node in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, in_c10d = stack.pop()
        in_c10d = in_c10d or node.name.startswith("c10d::")
        if node.typed[0] == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            f = node.extra_fields
            events.append((node.start_time_ns, f.id or 0, f.alloc_size, f.ptr, node.start_tid,
                           in_c10d, f.total_allocated))
        stack.extend((child, in_c10d) for child in node.children)
    events.sort(key=lambda e: (e[0], e[1]))
    if not events:
        return {"peak": 0, "raw_peak": 0, "backend_bytes_at_raw_peak": 0, "late_frees": 0,
                "unmatched_bytes": 0, "threads": 0}
    per_thread: dict[int, int] = {}
    for e in events:
        per_thread[e[4]] = per_thread.get(e[4], 0) + 1
    main = max(per_thread, key=lambda tid: per_thread[tid])
    # which allocations never see their free recorded (the next event at the address is another
    # allocation, or there is none)
    orphan: set[int] = set()
    last_alloc: dict[int, int] = {}
    for i, e in enumerate(events):
        if e[2] > 0:
            if e[3] in last_alloc:
                orphan.add(last_alloc[e[3]])
            last_alloc[e[3]] = i
        else:
            last_alloc.pop(e[3], None)
    orphan.update(last_alloc.values())

    blocks: dict[int, tuple[int, bool, bool]] = {}  # address -> (bytes, backend, orphan)
    known = live = 0  # bytes of all known blocks, of the training thread's
    baseline = events[0][6] - events[0][2]  # allocated before the profiler started
    peak = raw_peak = backend_at_raw_peak = late = unmatched = 0

    def drop(ptr: int) -> None:
        nonlocal known, live
        nbytes, backend, _ = blocks.pop(ptr)
        known -= nbytes
        live -= 0 if backend else nbytes

    for i, (_, _, nbytes, ptr, tid, in_c10d, total) in enumerate(events):
        if nbytes > 0:
            if ptr in blocks:  # freed unseen and not matched below: it lived at most until now
                unmatched += blocks[ptr][0]
                drop(ptr)
            backend = in_c10d or tid != main
            blocks[ptr] = (nbytes, backend, i in orphan)
            known += nbytes
            live += 0 if backend else nbytes
        elif ptr in blocks:
            drop(ptr)
        else:
            baseline += nbytes  # a block from before the profiler
        shortfall = baseline + known - total
        if shortfall > 0:  # freed on a thread the profiler does not see: which blocks?
            candidates = sorted(((n, p) for p, (n, _, o) in blocks.items() if o), reverse=True)
            exact = [p for n, p in candidates if n == shortfall]
            for n, p in ([(shortfall, exact[0])] if exact else candidates):
                if n <= shortfall:
                    late += 1
                    shortfall -= n
                    drop(p)
                if shortfall <= 0:
                    break
        peak = max(peak, live)
        if total - baseline > raw_peak:
            raw_peak, backend_at_raw_peak = total - baseline, total - baseline - live
    return {"peak": peak, "raw_peak": raw_peak, "backend_bytes_at_raw_peak": backend_at_raw_peak,
            "late_frees": late, "unmatched_bytes": unmatched, "threads": len(per_thread)}
