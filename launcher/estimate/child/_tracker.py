"""The tracker: live bytes per category after every op of a traced step, and what fake tensors miss.

``TimelineTracker`` is a ``TorchDispatchMode`` with the accounting of PyTorch's ``MemTracker``
that records a timeline (a point per ATen op), counts training FLOPs and, for a CUDA estimate,
the caching allocator's requests (``launcher.estimate.allocator`` replays them in the parent).
``ScratchProbe`` runs selected ops once for real to see memory a kernel allocates inside itself;
``UpperBoundShapes`` sizes data-dependent outputs at their maximum. ``_trace_run`` drives them.

The tracker was once a class built inside a factory function, to import torch's dispatch-mode
machinery lazily; ``import torch`` loads all of it anyway, so it is a plain class here, its
device and probe passed to its constructor. Imported only in the trace child and its workers.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from launcher.estimate.child._measure import allocator_peak
from launcher.estimate.trace_result import MICRO_PHASES

#: The caching allocator of CUDA rounds every block up to 512 bytes (c10/cuda/CUDACachingAllocator).
CUDA_ROUND = 512


_ROUND = 1  # bytes a storage is rounded up to (512 when emulating the CUDA caching allocator)
#: The most allocator events a trace records (about 8 bytes each on the pipe, as JSON); a 7B
#: model's full-depth steady step takes tens of thousands. Past it the parent keeps the
#: default reserve ratio.
ALLOCATOR_EVENTS_CAP = 2_000_000


def _alloc_bytes(nbytes: int) -> int:
    return -(-nbytes // _ROUND) * _ROUND


def install_cuda_rounding() -> None:
    """Count every storage as the CUDA caching allocator would: rounded up to 512 bytes (as
    MemTracker does for cuda tensors), for a CUDA estimate traced on the CPU."""
    global _ROUND
    _ROUND = CUDA_ROUND


class ScratchProbe:
    """Run selected ops once for real, at their traced shapes, to see what the fake run cannot.

    Two things escape a ``TorchDispatchMode``: memory a kernel allocates and frees inside itself
    (oneDNN convolution and LSTM scratch, batch-norm backward buffers, the unreduced loss the CPU
    ``mse_loss`` computes before its mean), and outputs whose real
    size the meta kernel gets wrong (the CPU LSTM's oneDNN workspace is 0 bytes on meta, 4 MB for
    real, and it is saved for the backward pass). For the ops in ``ops``, the probe allocates
    zero-filled inputs of the traced shapes, runs the kernel under the allocator's own accounting
    and returns (scratch bytes, real bytes of each output). Results are cached per signature, so
    a network of identical blocks is probed once per distinct shape. Inputs plus outputs over
    ``limit_bytes`` are not probed (and counted in ``skipped``): a probe must stay cheap.

    Probes only make sense on the device being estimated: a CPU kernel's scratch says nothing about
    cuDNN's, so a CUDA estimate emulated on the CPU runs without them.
    """

    CPU_OPS = frozenset({
        "convolution", "convolution_backward", "native_batch_norm", "native_batch_norm_backward",
        "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
        "mkldnn_rnn_layer", "mkldnn_rnn_layer_backward", "embedding_dense_backward",
        "_embedding_bag", "_embedding_bag_backward", "_embedding_bag_dense_backward",
        "mse_loss",
    })

    def __init__(self, device: torch.device, limit_bytes: int = 256 * 2**20) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self.device, self.limit = device, limit_bytes
        self.ops = self.CPU_OPS if device.type == "cpu" else frozenset()
        self.cache: dict[Any, Measured | None] = {}
        # fake storage -> the real geometry of the tensor the meta kernel sized wrongly, so that
        # the op consuming it (LSTM backward takes the forward's workspace) is probed with it
        self.real_geometry: Any = WeakIdKeyDictionary()
        self.skipped: dict[str, int] = {}
        self.probed = 0

    def _geometry(self, x: torch.Tensor) -> tuple[Any, ...]:
        known = self.real_geometry.get(x.untyped_storage())
        if known is not None:
            return known
        return (tuple(x.shape), tuple(x.stride()), x.storage_offset(), x.dtype)

    def measure(self, func: Any, args: tuple, kwargs: dict) -> Measured | None:
        from torch.utils._pytree import tree_flatten

        flat, _ = tree_flatten((args, kwargs))
        key = (func, torch.is_grad_enabled(), tuple(
            self._geometry(x) if isinstance(x, torch.Tensor) else repr(x) for x in flat
        ))
        if key not in self.cache:
            self.cache[key] = self._run(func, args, kwargs)
        return self.cache[key]

    def remember(self, fake_out: torch.Tensor, geometry: tuple[Any, ...]) -> None:
        self.real_geometry[fake_out.untyped_storage()] = geometry

    def _run(self, func: Any, args: tuple, kwargs: dict) -> Measured | None:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.utils._pytree import tree_flatten, tree_map_only

        flat, _ = tree_flatten((args, kwargs))
        geometries = [self._geometry(x) for x in flat if isinstance(x, torch.Tensor)]
        need = sum(_span(shape, stride, offset) * torch.empty((), dtype=dtype).element_size()
                   for shape, stride, offset, dtype in geometries)
        if need > self.limit:
            self.skipped[str(func)] = self.skipped.get(str(func), 0) + 1
            return None

        def real(x: torch.Tensor) -> torch.Tensor:
            shape, stride, offset, dtype = self._geometry(x)
            base = torch.zeros(max(_span(shape, stride, offset), 1), dtype=dtype,
                               device=self.device)
            return base.as_strided(shape, stride, offset)

        # Same grad mode as the traced call: some kernels (oneDNN LSTM) allocate their backward
        # workspace only when gradients are enabled. Zero inputs never require grad, so no
        # autograd graph is built either way.
        with unset_fake_temporarily():
            rargs, rkwargs = tree_map_only(torch.Tensor, real, (args, kwargs))
            inputs = {x.untyped_storage().data_ptr() for x in tree_flatten((rargs, rkwargs))[0]
                      if isinstance(x, torch.Tensor)}
            call = functools.partial(func, *rargs, **rkwargs)
            peak, net, out = allocator_peak(self.device, call)
            outputs: list[tuple[int, tuple[Any, ...]] | None] = []
            for o in tree_flatten(out)[0]:
                if not isinstance(o, torch.Tensor):
                    continue
                st = o.untyped_storage()
                outputs.append(None if st.data_ptr() in inputs and st.nbytes() else (
                    st.nbytes(), (tuple(o.shape), tuple(o.stride()), o.storage_offset(), o.dtype)
                ))
            del out, call, rargs, rkwargs
        self.probed += 1
        return Measured(max(0, peak - net), outputs)


class Measured:
    """What a probe saw: scratch bytes, and per output (None when it aliases an input) its real
    storage bytes and geometry."""

    def __init__(self, scratch: int, outputs: list[tuple[int, tuple[Any, ...]] | None]) -> None:
        self.scratch, self.outputs = scratch, outputs


def _span(shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> int:
    """Elements of storage a strided tensor reaches."""
    if any(s == 0 for s in shape):
        return 0
    return offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True))


_PRIM_DEVICE = torch.ops.prim.device.default
_LOCAL_SCALAR_DENSE = torch.ops.aten._local_scalar_dense.default
#: Optimizers whose step reads ``.item()`` only into scalar factors of its update, never into a
#: shape or a branch that allocates: torch's Adafactor (``p.norm().item()`` for its relative step
#: size, ``update.norm().item()`` for its update clipping, in the for-loop and foreach
#: implementations alike). On fake tensors those values do not exist; the tracker answers them
#: with a placeholder (``_placeholder``) during these optimizers' steps only, where the bytes
#: cannot depend on them, instead of failing into the real-run or upper-bound fallback.
_ITEM_ONLY_SCALES: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.Adafactor,)


def _placeholder(t: torch.Tensor) -> bool | int | float | complex:
    """A value of ``t.item()``'s Python type, for a fake tensor that has none."""
    if t.dtype == torch.bool:
        return True
    if t.is_complex():
        return 1.0 + 0j
    return 1.0 if t.is_floating_point() else 1


CATEGORIES = ("PARAM", "BUFFER", "GRAD", "ACT", "TEMP", "OPT", "OTH")
_PARAM, _BUFFER, _GRAD, _ACT, _TEMP, _OPT, _OTH = range(7)


class _Storage:
    """What the tracker knows about one live storage: its device, category and counted bytes,
    and its allocation's number in the tracker's allocator events (-1: none recorded)."""

    __slots__ = ("device", "category", "nbytes", "eid", "__weakref__")

    def __init__(self, device: str, category: int, nbytes: int) -> None:
        self.device, self.category, self.nbytes = device, category, nbytes
        self.eid = -1


@functools.cache
def _flop_registry() -> dict[Any, Callable[..., int]]:
    from torch.utils.flop_counter import flop_registry

    return dict(flop_registry)


_FAKE_KEY = torch._C._TorchDispatchModeKey.FAKE
_get_mode = torch._C._get_dispatch_mode
_graph_task = torch._C._current_graph_task_id


def _storages(t: torch.Tensor) -> list[Any]:
    """The storages a tensor's bytes live in: its own, or a wrapper subclass's inner tensors'."""
    if not is_traceable_wrapper_subclass(t):
        return [t.untyped_storage()]
    out, todo = [], [t]
    while todo:
        x = todo.pop()
        if is_traceable_wrapper_subclass(x):
            todo.extend(v for v in (getattr(x, a) for a in x.__tensor_flatten__()[0])
                        if isinstance(v, torch.Tensor))
        else:
            out.append(x.untyped_storage())
    return out


class TimelineTracker(TorchDispatchMode):
    """MemTracker's accounting that records, after every op, the live bytes per category on
    one device (``device_type``), plus the op's scratch (from ``probe``) in a ``SCRATCH`` column.

    It does what ``torch.distributed._tools.mem_tracker.MemTracker`` does for a single device,
    with the same categories (PARAM, BUFFER, GRAD, ACT, TEMP, OPT, OTH), the same weak references
    to storages, the same 512-byte CUDA rounding, the same optimizer-step and gradient hooks and
    ``resize_`` patch; docs/estimator.md explains MemTracker. It is a re-implementation and not a
    subclass for speed, on every one of a 7B trace's ~20k ops: importing MemTracker imports DTensor
    (2.5 s of CPU); its ``ModTracker`` module hooks deep-copy a snapshot at every module
    boundary; it walks every op's outputs with pytree and calls through ``torch._disable_dynamo``.
    What those hooks provided is done directly: weights are tagged and gradient hooks installed
    once (``track_model``), and "in backward" is the autograd engine's graph-task id (which is all
    ``ModTracker.is_bw`` reads). Activations recomputed by checkpointing during backward count as
    ``TEMP`` (MemTracker calls its own attribution there approximate); totals are unaffected.
    """

    def __init__(self, device_type: str, probe: ScratchProbe | None) -> None:
        super().__init__()
        self.device_type, self.probe = device_type, probe
        self.categories = [*CATEGORIES, "SCRATCH"]
        self.segment: list[tuple[int, tuple[int, ...]]] | None = None
        self.ops: list[Any] | None = None
        self.phase = 0
        self.live = [0] * len(CATEGORIES)  # bytes per category on the traced device
        self._known: Any = WeakIdKeyDictionary()  # storage -> (_Storage, weakref)
        self._in_opt = False
        self._placeholder_items = False  # in a step of an _ITEM_ONLY_SCALES optimizer
        self._hooks: list[Any] = []
        self._fake_on_entry: Any = None
        self._orig_resize = torch.UntypedStorage.resize_
        self._uncounted = 0  # > 0 while DTensor propagates shardings (see _skip_propagation)
        self._propagator: Any = None  # (ShardingPropagator, its original method) once patched
        # Training FLOPs of forward and backward while not None (see count_flops in _trace):
        # PyTorch's own per-op formulas (FlopCounterMode's registry), without its module
        # tracking, on the ops the tracker sees anyway.
        self.flops: float | None = None
        # The caching allocator's view while not None: every allocation and free on the
        # traced device, in order, in the compact form ``launcher.estimate.allocator.replay``
        # takes (n >= 0: allocate n bytes, the k-th allocation; ~k: free allocation k).
        self.events: list[int] | None = None
        self._allocations = 0

    # -- accounting ----------------------------------------------------------------------

    def _add(self, info: _Storage, sign: int) -> None:
        if info.device == self.device_type:
            self.live[info.category] += sign * info.nbytes

    def start_events(self) -> None:
        """Record allocator events from now on, starting with one allocation for each
        storage alive now (in the order they were first seen)."""
        self.events = []
        for info, _ref in list(self._known.values()):
            if info.nbytes:
                self._allocated(info)

    def _allocated(self, info: _Storage) -> None:
        if self.events is not None and info.device == self.device_type:
            if len(self.events) >= ALLOCATOR_EVENTS_CAP:
                self.events = None  # too long to ship: the parent keeps the default ratio
                return
            info.eid, self._allocations = self._allocations, self._allocations + 1
            self.events.append(info.nbytes)

    def _released(self, info: _Storage) -> None:
        if info.eid >= 0:
            if self.events is not None:
                self.events.append(~info.eid)
            info.eid = -1

    def _freed(self, info: _Storage, _ref: Any) -> None:
        self._add(info, -1)
        self._released(info)

    def tag(self, t: torch.Tensor, category: int, retag: bool = True) -> None:
        for st in _storages(t):
            known = self._known.get(st)
            if known is not None:
                info = known[0]
                if retag and info.category != category:
                    self._add(info, -1)
                    info.category = category
                    self._add(info, +1)
                elif not retag and info.nbytes != _alloc_bytes(st.nbytes()):
                    self.resized(info, _alloc_bytes(st.nbytes()))
                continue
            info = _Storage(t.device.type, category, _alloc_bytes(st.nbytes()))
            self._known[st] = (info, weakref.ref(st, functools.partial(self._freed, info)))
            self._add(info, +1)
            self._allocated(info)

    def resized(self, info: _Storage, nbytes: int) -> None:
        old = info.nbytes
        self._add(info, -1)
        info.nbytes = nbytes
        self._add(info, +1)
        if nbytes != old:
            # to the allocator a resize is a free and a new block (FSDP's resize_(0), refill)
            self._released(info)
            if nbytes:
                self._allocated(info)

    def current(self) -> tuple[int, ...]:
        return (*self.live, 0)

    def track_as_gradient(self, grad: torch.Tensor) -> None:
        self.tag(grad, _GRAD)

    def track_model(self, model: torch.nn.Module) -> None:
        """Tag weights and buffers, and hook their gradients (MemTracker does both at each
        module's first forward; step 1's optimizer phase runs before any forward). A frozen
        weight (``requires_grad=False``: Whisper's encoder positions, a frozen backbone)
        never has a gradient, and torch refuses a gradient hook on it: tagged, not hooked."""
        for p in model.parameters():
            self.tag(p, _PARAM)
            if not p.requires_grad:
                continue
            self._hooks.append(p.register_hook(self._grad_hook))
            self._hooks.append(p.register_post_accumulate_grad_hook(
                lambda q: self.tag(q.grad, _GRAD)))
        for b in model.buffers():
            self.tag(b, _BUFFER)

    def _grad_hook(self, grad: torch.Tensor) -> None:
        self.tag(grad, _GRAD)

    def reset_mod_stats(self) -> None:
        """MemTracker's per-module statistics: this tracker keeps none."""

    # -- segments ------------------------------------------------------------------------

    def start_segment(self) -> tuple[list[tuple[int, tuple[int, ...]]], list[Any]]:
        self.segment, self.ops = [], []
        return self.segment, self.ops

    def stop_segment(self) -> None:
        self.segment = self.ops = None

    # -- mode ----------------------------------------------------------------------------

    def __enter__(self) -> TimelineTracker:
        self._fake_on_entry = _get_mode(_FAKE_KEY)

        def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
            # FSDP sets its sharded gradients itself (no gradient hook sees them): tag every
            # gradient the optimizer is about to read as one
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self.tag(p.grad, _GRAD)
            self._in_opt = True
            self._placeholder_items = isinstance(optimizer, _ITEM_ONLY_SCALES)

        def post(optimizer: Any, args: Any, kwargs: Any) -> None:
            for state in optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        self.tag(value, _OPT)
            self._in_opt = False
            self._placeholder_items = False

        self._hooks += [register_optimizer_step_pre_hook(pre),
                        register_optimizer_step_post_hook(post)]
        orig, tracker = self._orig_resize, self

        @functools.wraps(orig)
        def resize_(st: torch.UntypedStorage, size: int) -> None:
            # resize_ is not an op the dispatch mode sees (FSDP frees and refills storages)
            orig(st, size)
            known = tracker._known.get(st)
            if known is not None:
                tracker.resized(known[0], _alloc_bytes(st.nbytes()))

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *args: Any) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]
        if self._propagator is not None:
            cls, original = self._propagator
            cls._propagate_tensor_meta_non_cached = original
            self._propagator = None
        super().__exit__(*args)

    def _skip_propagation(self) -> None:
        """Count nothing DTensor's sharding propagation allocates.

        To learn an op's output shape DTensor runs the op on fake tensors of the *global*
        (unsharded) shapes (``ShardingPropagator._propagate_tensor_meta_non_cached``), under
        the active fake mode, which here is the trace's: MemTracker's test (another fake
        mode than the one at entry) cannot tell those ops from real ones, and a foreach op
        propagates its whole list at once, so a foreach optimizer step under FSDP counted
        several unsharded copies of the model (docs/estimator.md). Those tensors exist only
        on the meta device of a real run too; the local op that follows is counted. Patched
        at the first DTensor op (DTensor is imported by then), undone at exit.
        """
        if self._propagator is not None:
            return
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        original = ShardingPropagator._propagate_tensor_meta_non_cached
        tracker = self

        @functools.wraps(original)
        def propagate(*args: Any, **kwargs: Any) -> Any:
            tracker._uncounted += 1
            try:
                return original(*args, **kwargs)
            finally:
                tracker._uncounted -= 1

        ShardingPropagator._propagate_tensor_meta_non_cached = propagate  # type: ignore[method-assign]
        self._propagator = (ShardingPropagator, original)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is _PRIM_DEVICE:
            # C++ asks a fake tensor for its device through this op, twice as often as all
            # other ops together; answer it here (as FakeTensor does).
            t = args[0]
            if isinstance(t, FakeTensor) and not t.fake_mode.in_kernel_invocation:
                return t.fake_device
            return func(*args, **(kwargs or {}))
        if any(ty.__name__ == "DTensor" for ty in types):
            self._skip_propagation()
            return NotImplemented  # let DTensor desugar into local ops first (as MemTracker)
        try:
            res = func(*args, **(kwargs or {}))
        except DataDependentOutputException:
            if func is not _LOCAL_SCALAR_DENSE or not self._placeholder_items:
                raise
            res = _placeholder(args[0])  # a scalar factor of the update: no byte depends on it
        if self._uncounted or _get_mode(_FAKE_KEY) is not self._fake_on_entry:
            return res  # DTensor's propagation (global shapes) or another fake mode's ops
        category = _OPT if self._in_opt else (_TEMP if _graph_task() != -1 else _ACT)
        if self.flops is not None and self.phase in MICRO_PHASES:  # training FLOPs
            formula = _flop_registry().get(func._overloadpacket)
            if formula is not None:
                self.flops += formula(*args, **(kwargs or {}), out_val=res)
        if isinstance(res, torch.Tensor):
            self.tag(res, category, retag=False)
        elif isinstance(res, (tuple, list)):
            for x in tree_flatten(res)[0]:
                if isinstance(x, torch.Tensor):
                    self.tag(x, category, retag=False)
        if self.segment is not None:
            scratch = 0
            if self.probe is not None and func._opname in self.probe.ops:
                scratch = self._probe(func, args, kwargs or {}, res)
            values = self.current()
            if scratch:
                values = values[:-1] + (_alloc_bytes(scratch),)
                if self.events is not None:  # the kernel's scratch: allocated, then freed
                    self.events += [_alloc_bytes(scratch), ~self._allocations]
                    self._allocations += 1
            self.segment.append((self.phase, values))
            self.ops.append(func)  # type: ignore[union-attr]
        return res

    def _probe(self, func: Any, args: tuple, kwargs: dict, res: Any) -> int:
        measured = self.probe.measure(func, args, kwargs)  # type: ignore[union-attr]
        if measured is None:
            return 0
        outs = [o for o in tree_flatten(res)[0] if isinstance(o, torch.Tensor)]
        for out, real in zip(outs, measured.outputs, strict=False):
            if real is None:
                continue
            nbytes, geometry = real
            for st in _storages(out):
                known = self._known.get(st)
                if known is not None and known[0].nbytes != _alloc_bytes(nbytes):
                    self.resized(known[0], _alloc_bytes(nbytes))
                    self.probe.remember(out, geometry)  # type: ignore[union-attr]
        return measured.scratch


class UpperBoundShapes:
    """Give data-dependent ops their largest possible output instead of failing.

    ``nonzero`` selects at most every element, ``masked_select`` at most every element of the
    broadcast mask. Memory computed with these outputs can only be larger than any real run's, so
    the result is labelled an upper bound. Ops whose output feeds Python control flow (``.item()``)
    still fail: there is no safe value to return.
    """

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                from torch._subclasses.fake_tensor import DynamicOutputShapeException

                kwargs = kwargs or {}
                try:
                    return func(*args, **kwargs)
                except DynamicOutputShapeException:
                    out = outer.substitute(func, args, kwargs)
                    if out is None:
                        raise
                    outer.substituted[str(func)] = outer.substituted.get(str(func), 0) + 1
                    return out

        self.mode = Mode()
        self.substituted: dict[str, int] = {}

    @staticmethod
    def substitute(func: Any, args: tuple, kwargs: dict) -> Any:
        aten = torch.ops.aten
        x = args[0]
        if func is aten.nonzero.default:
            return torch.empty((x.numel(), x.dim()), dtype=torch.long, device=x.device)
        if func is aten.masked_select.default:
            shape = torch.broadcast_shapes(x.shape, args[1].shape)
            return torch.empty((math.prod(shape),), dtype=x.dtype, device=x.device)
        return None
