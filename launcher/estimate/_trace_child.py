"""The child process of the traced estimator: runs the user's recipe on fake tensors.

``launcher.estimate.traced`` starts ``python -m launcher.estimate._trace_child``, writes one JSON
request to its stdin and reads one JSON answer from its stdout. Everything that imports torch or
the user's code lives here, so the parent stays light and a crash, a hang or an import-time side
effect of the user's script cannot take the CLI down with it.

What the child does (docs/estimator.md explains why each step is there):

1. Import the recipe and the training script ``launch`` renders for the strategy
   (``_script``), and build the model, its wrapping and the optimizer with the script's own
   functions, all under ``FakeTensorMode``: every tensor is a shape and a dtype, no memory is
   used, so a 7B model costs nothing.
2. Run the script's ``optimizer_step`` under a tracker with the accounting of PyTorch's
   ``MemTracker`` that records, after every ATen op, the live bytes of every category
   (parameters, buffers, gradients, activations, backward temporaries, optimizer state): step 1
   (optimizer state is created), the steady-state step at one size, and the micro-batches alone
   at the other sizes (the two parts in two worker processes, ``_workers``).
3. Send the raw timelines back. The parent fits every point linearly in the micro-batch size
   (``launcher.estimate.traced._fit``).

Data-dependent shapes (``nonzero``, MoE routing) have no fake output size. The child then either
reruns the same procedure on real CPU tensors (small models: exact for the example batch) or
substitutes the largest possible output (every element selected) and labels the result an upper
bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import math
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from launcher.estimate import _script, _workers
from launcher.estimate.traced import MICRO_PHASES, PHASES
from launcher.plan.plan import checkpointing_mode

PRECISIONS = ("fp32", "bf16_mixed", "bf16")
OPTIMIZERS = ("adamw", "sgd", "adafactor", "adam8bit")
#: The caching allocator of CUDA rounds every block up to 512 bytes (c10/cuda/CUDACachingAllocator).
CUDA_ROUND = 512
#: Below this many bytes of weights a model with data-dependent shapes is rerun on real tensors.
DEFAULT_REAL_RUN_LIMIT = 2 * 2**30


class RecipeError(Exception):
    """An error in the user's code, already reduced to one line and the user's file:line."""

    def __init__(self, message: str, file: str | None, line: int | None, kind: str) -> None:
        super().__init__(message)
        self.message, self.file, self.line, self.kind = message, file, line, kind


# ----------------------------------------------------------------------------------------------
# The training step: the rendered script's own (``_script``); what is traced is what runs.


def load_recipe(recipe_file: str) -> ModuleType:
    """Import the recipe from its path, its directory first on sys.path (as the templates do)."""
    path = Path(recipe_file).resolve()
    sys.path.insert(0, str(path.parent))
    name = path.stem if path.stem not in sys.modules else "launch_recipe"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    recipe = importlib.util.module_from_spec(spec)
    sys.modules[name] = recipe
    spec.loader.exec_module(recipe)
    for hook in ("build_model", "example_batch", "training_step"):
        if not callable(getattr(recipe, hook, None)):
            raise RecipeError(f"{path.name} defines no {hook}()", str(path), None, "contract")
    return recipe


def shaped_batches(shapes: Any) -> Callable[[int], Any]:
    """An ``example_batch`` that makes batches of the structure, shapes and dtypes an
    out-of-memory report recorded (the templates' ``batch_shapes``), with the micro-batch as the
    leading dimension of every tensor: the step re-traced at the data that failed, not at the
    example the plan was sized on. Integer tensors are zeros (valid token ids and labels)."""

    def make(node: Any, batch_size: int) -> Any:
        if "shape" in node:
            shape = [batch_size, *node["shape"][1:]] if node["shape"] else []
            dtype = getattr(torch, str(node.get("dtype", "float32")), torch.float32)
            if dtype.is_floating_point or dtype.is_complex:
                return torch.randn(shape, dtype=dtype)
            return torch.zeros(shape, dtype=dtype)
        if "dict" in node:
            return {key: make(value, batch_size) for key, value in node["dict"].items()}
        if "list" in node:
            return [make(value, batch_size) for value in node["list"]]
        return node.get("value")

    return lambda batch_size: make(shapes, batch_size)


#: A stack needs at least this many identical blocks before tracing a few of them pays off.
MIN_SCALED_BLOCKS = 8
#: The depths traced when scaling a stack of identical blocks: two, so that every point is
#: linear in the depth; both even, so that a pattern alternating every other layer (sliding
#: window / global attention) is covered by whole periods; both above 1, so that the first and
#: the last block are distinct blocks at each.
SCALED_DEPTHS = (2, 4)


def _signature(module: torch.nn.Module) -> tuple[Any, ...]:
    """What makes two blocks interchangeable for memory: their module types, and the names,
    shapes, dtypes and trainability of their parameters and buffers."""
    return (
        tuple(type(m).__qualname__ for m in module.modules()),
        tuple((n, tuple(t.shape), t.dtype, t.requires_grad) for n, t in module.named_parameters()),
        tuple((n, tuple(t.shape), t.dtype) for n, t in module.named_buffers()),
    )


def repeated_blocks(model: torch.nn.Module) -> tuple[str, torch.nn.Module, int] | None:
    """The model's largest stack of identical blocks: a ``ModuleList`` or ``Sequential`` of at
    least ``MIN_SCALED_BLOCKS`` children of one type and one parameter signature (a transformer's
    layers). Returns (its path, the container, how many blocks), or None.

    Memory at every moment of a training step grows by the same bytes with every block of such a
    stack (its weights, gradients, optimizer state, saved activations), so tracing two depths and
    extrapolating linearly gives the whole model's timeline at a fraction of the tracing time.
    """
    best: tuple[str, torch.nn.Module, int, int] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        children = list(module.children())
        if len(children) < MIN_SCALED_BLOCKS or len(children) != len(module):
            continue  # a module listed twice (shared weights) is not a stack
        first = children[0]
        signature = _signature(first)
        if any(type(c) is not type(first) or _signature(c) != signature for c in children[1:]):
            continue
        size = sum(p.numel() for p in module.parameters())
        if best is None or size > best[3]:
            best = (name, module, len(children), size)
    return None if best is None else best[:3]


def truncate_blocks(model: torch.nn.Module, depth: int) -> dict[str, Any] | None:
    """Keep the first ``depth`` blocks of the model's repeated stack; say what was cut."""
    found = repeated_blocks(model)
    if found is None:
        return None
    name, container, count = found
    if count <= depth:
        return None
    del container[depth:]
    return {"path": name or "<root>", "count": count, "depth": depth}


def build(request: dict[str, Any], recipe: ModuleType, device: torch.device, fake: bool,
          blocks: dict[str, Any] | None = None) -> Step:
    """The model and optimizer of the rendered script for ``request``, built by its own
    ``build_model``, ``wrap_model`` and ``build_optimizer`` (``_script``).

    The tracer makes the recipe's model itself and hands it over (``_script.Recipe``): with
    ``depth`` (depth scaling) only the first ``depth`` blocks of its repeated stack are kept,
    right after it is built, and ``blocks`` receives what was cut; on fake tensors it is moved to
    the device and dtype first (``_fake_to``), since ``Module.to`` refuses fake parameters. A
    ``strategy`` (DDP, FSDP, hybrid sharding at a world size) joins a fake process group of that
    size as rank 0 (a real group, under ``_trace_dist``'s reference runs, is kept).
    """
    strategy = request.get("strategy")
    script, digest = _script.load(_strategy_name(request))
    world, rank = 1, 0
    if strategy:
        from launcher.estimate import _trace_dist

        _trace_dist.setup_world(strategy["world_size"])
        world, rank = _trace_dist.world()
    runtime = script.Runtime(rank=rank, local_rank=rank, world_size=world, device=device)
    plan = script_plan(request)
    script.seed_all(plan["seed"])  # as the script seeds every rank before building
    model = recipe.build_model()
    if not isinstance(model, torch.nn.Module):
        raise RecipeError(f"build_model() must return a torch.nn.Module, not "
                          f"{type(model).__name__}", request["recipe_file"], None, "contract")
    if request.get("depth") is not None:
        cut = truncate_blocks(model, request["depth"])
        if blocks is not None and cut is not None:
            blocks.update(cut)
    if fake:
        _fake_to(model, device, script.param_dtype(plan["precision"]))
        model.to = lambda *args, **kwargs: model  # done just above; Module.to would refuse
    proxy = _script.Recipe(recipe, model)
    model = script.build_model(proxy, plan, runtime)
    model.__dict__.pop("to", None)
    model = script.wrap_model(model, proxy, plan, runtime)
    saved = sys.modules.get("bitsandbytes")  # no CPU or fake kernels: the stand-in's state
    sys.modules["bitsandbytes"] = _script.bitsandbytes_stand_in()
    try:
        optimizer = script.build_optimizer(proxy, plan, model)
    finally:
        if saved is None:
            del sys.modules["bitsandbytes"]
        else:
            sys.modules["bitsandbytes"] = saved
    if request.get("foreach") is not None and "foreach" in optimizer.defaults:
        # the benchmark measures each implementation; a job uses torch's default
        optimizer.defaults["foreach"] = request["foreach"]
        for group in optimizer.param_groups:
            group["foreach"] = request["foreach"]
    return Step(script=script, digest=digest, recipe=proxy, plan=plan, runtime=runtime,
                model=model, optimizer=optimizer)


def _strategy_name(request: dict[str, Any]) -> str:
    return (request.get("strategy") or {}).get("name", "single")


def script_plan(request: dict[str, Any]) -> dict[str, Any]:
    """The ``plan.json`` values the script's functions read, from a trace request."""
    strategy = request.get("strategy") or {}
    world = strategy.get("world_size", 1)
    replicas = strategy.get("replicas", 1)
    return {
        "precision": request["precision"],
        "activation_checkpointing": bool(request["activation_checkpointing"]),
        "checkpointing": checkpointing_mode(request["activation_checkpointing"]),
        "optimizer": request.get("optimizer") or "adamw",
        "lr": request.get("lr", 3e-4),
        "weight_decay": request.get("weight_decay", 0.0),
        "max_grad_norm": request.get("max_grad_norm"),
        "grad_accum_steps": int(request["grad_accum_steps"]),
        "micro_batch_size": 1,
        "seed": request.get("seed", 0),
        "strategy": strategy.get("name", "single"),
        "nodes": replicas,
        "gpus_per_node": world // replicas,
        "hybrid_shard_degree": world // replicas,
        "reshard_after_forward": strategy.get("reshard_after_forward", True),
    }


@dataclasses.dataclass
class Step:
    """What the rendered script built for one trace: its module and the objects it made."""

    script: ModuleType
    digest: str
    recipe: Any
    plan: dict[str, Any]
    runtime: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer

    def run(self, micro_batch: int, start: int, on_phase: Callable[[str, int], None],
            update: bool = True) -> None:
        """One optimizer step of the script (``optimizer_step``) at ``micro_batch``, its data the
        script's own synthetic stream from micro-batch ``start``. ``update=False`` stops where
        the optimizer would start and drops the gradients instead."""
        plan = {**self.plan, "micro_batch_size": micro_batch}
        batches = self.script.synthetic_stream(self.recipe, micro_batch, plan["seed"],
                                               self.runtime, start)
        progress = _script.Progress(on_phase, stop_at_optimizer=not update)
        on_phase("forward", 1)  # the step's loss accumulator belongs to the step
        with contextlib.suppress(_script.StopStep):
            self.script.optimizer_step(self.model, self.optimizer, batches, self.recipe, plan,
                                       self.runtime, progress)
        del batches
        if not update:
            on_phase("zero_grad", 0)
            self.optimizer.zero_grad(set_to_none=True)


def _fake_to(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None) -> None:
    """``model.to(device, dtype)`` for a model of fake tensors, plus one repair.

    ``Module._apply`` always swaps FakeTensor parameters (``torch.utils.swap_tensors``), which
    refuses tensors with weak references, and every fake ``Parameter`` has one. Assigning
    ``.data`` instead is what ``Module.to`` does for real tensors: the Parameter objects stay the
    same, so modules that keep their own references (``nn.LSTM._flat_weights``) stay valid.

    The repair: a fake tensor made by ``copy.deepcopy`` (``nn.TransformerEncoder`` clones its
    layer that way) hands out a new storage object for each of its views. MemTracker keys storages
    by object, so every ``weight.t()`` of such a weight counted as a new allocation (+11% on an
    encoder-decoder). Such tensors are replaced by fresh ones (through ``setattr``, which
    ``nn.RNNBase`` also watches); tied weights stay tied.
    """
    replaced: dict[int, torch.Tensor] = {}

    def broken(t: torch.Tensor) -> bool:
        return t.untyped_storage() is not t.detach().untyped_storage()

    def fresh(t: torch.Tensor, cast: torch.dtype | None) -> torch.Tensor:
        return torch.empty_strided(t.size(), t.stride(), dtype=cast or t.dtype, device=device)

    for module in model.modules():
        for kind in ("_parameters", "_buffers"):
            for name, t in list(getattr(module, kind).items()):
                if t is None:
                    continue
                if id(t) in replaced:
                    setattr(module, name, replaced[id(t)])
                    continue
                floating = t.is_floating_point() or t.is_complex()
                cast = dtype if dtype is not None and floating else None
                if broken(t):
                    new = fresh(t, cast)
                    if isinstance(t, torch.nn.Parameter):
                        new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
                    replaced[id(t)] = new
                    setattr(module, name, new)
                elif t.device != device or (cast is not None and t.dtype != cast):
                    with torch.no_grad():
                        t.data = t.data.to(device=device, dtype=cast)
    replaced.clear()


class Adam8bitStandIn(torch.optim.Optimizer):
    """The memory of bitsandbytes' ``AdamW8bit`` without its CUDA kernels.

    bitsandbytes cannot run on fake (or CPU) tensors, so the trace holds the same state it would:
    per parameter of 4096 elements or more, two uint8 moments and one fp32 absmax per 256-element
    block for each; smaller parameters keep two fp32 moments (bitsandbytes' ``min_8bit_size``). Its
    update is one fused kernel with no temporaries, so the stand-in's update allocates nothing.
    The arithmetic is not Adam's: only the bytes matter here.
    """

    BLOCK = 256
    MIN_8BIT_SIZE = 4096

    def __init__(self, params: Any, lr: float = 1e-3, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    if p.numel() >= self.MIN_8BIT_SIZE:
                        blocks = math.ceil(p.numel() / self.BLOCK)
                        for i in (1, 2):
                            state[f"state{i}"] = torch.zeros_like(p, dtype=torch.uint8)
                            state[f"absmax{i}"] = torch.zeros(
                                blocks, dtype=torch.float32, device=p.device
                            )
                    else:
                        state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                        state["state2"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"].add_(1)
                p.add_(p.grad, alpha=-group["lr"])


def first_optimizer_step(
    step: Step,
    *,
    on_phase: Callable[[str, int], None] = lambda phase, micro: None,
    on_grad: Callable[[torch.Tensor], None] = lambda grad: None,
) -> None:
    """The first optimizer step (its state gets created) with zero gradients put in place.

    The micro-batches of step 1 see the memory of step 2's minus the optimizer state, so tracing
    them again adds nothing to the peak; only step 1's optimizer phase can differ from step 2's
    (state is allocated while gradients are alive), and for that only the gradients matter.
    The clipping, update and ``zero_grad`` are the script's (``optimizer_step``'s tail).
    """
    from launcher.estimate import _trace_dist  # cheap: imports no torch.distributed

    model, optimizer = step.model, step.optimizer
    if not _trace_dist.put_zero_grads(model, on_grad):  # DDP: views into its buckets
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                on_grad(p.grad)
    on_phase("optimizer", 0)
    if step.plan["max_grad_norm"] is not None:
        step.script.clip_gradients(model, step.plan["max_grad_norm"])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------------------------
# The tracker: MemTracker's accounting with a timeline, and probes for what fake tensors miss.

_ROUND = 1  # bytes a storage is rounded up to (512 when emulating the CUDA caching allocator)
#: The most allocator events a trace records (about 8 bytes each on the pipe, as JSON); a 7B
#: model's full-depth steady step takes tens of thousands. Past it the parent keeps the
#: default reserve ratio.
ALLOCATOR_EVENTS_CAP = 2_000_000


def _alloc_bytes(nbytes: int) -> int:
    return -(-nbytes // _ROUND) * _ROUND


def _install_cuda_rounding() -> None:
    """Count every storage as the CUDA caching allocator would: rounded up to 512 bytes (as
    MemTracker does for cuda tensors), for a CUDA estimate traced on the CPU."""
    global _ROUND
    _ROUND = CUDA_ROUND


class ScratchProbe:
    """Run selected ops once for real, at their traced shapes, to see what the fake run cannot.

    Two things escape a ``TorchDispatchMode``: memory a kernel allocates and frees inside itself
    (oneDNN convolution and LSTM scratch, batch-norm backward buffers), and outputs whose real
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
            peak, net, out = _allocator_peak(self.device, call)
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


def _allocator_peak(device: torch.device, fn: Callable[[], Any]) -> tuple[int, int, Any]:
    """(peak bytes above the start, net bytes at the end, result) of ``fn`` per the allocator."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start, torch.cuda.memory_allocated() - start, out
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    live = peak = 0
    for event in cpu_allocation_events(prof):
        live += event.alloc_size
        peak = max(peak, live)
    return peak, live, out


def cpu_allocation_events(prof: Any) -> list[Any]:
    """The CPU allocator's own events of a finished ``torch.profiler.profile``, in order.

    Each has ``alloc_size`` (negative for a free) and ``total_allocated``, the allocator's running
    count of live bytes allocated while the profiler was recording (c10's ProfiledCPUMemoryReporter
    counts only what it saw being allocated, so frees of older blocks do not distort it).
    """
    from torch._C._profiler import _EventType

    events: list[Any] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.id, node.extra_fields))
        stack.extend(node.children)
    events.sort(key=lambda e: (e[0], e[1]))
    return [e[2] for e in events]


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


def _make_tracker(device_type: str, probe: ScratchProbe | None) -> Any:
    """A tracker with MemTracker's accounting that records, after every op, the live bytes per
    category on one device, plus the op's scratch (from ``probe``) in a ``SCRATCH`` column.

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
    import weakref

    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )
    from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    fake_key = torch._C._TorchDispatchModeKey.FAKE
    get_mode = torch._C._get_dispatch_mode
    graph_task = torch._C._current_graph_task_id

    def storages(t: torch.Tensor) -> list[Any]:
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
        def __init__(self) -> None:
            super().__init__()
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
            if info.device == device_type:
                self.live[info.category] += sign * info.nbytes

        def start_events(self) -> None:
            """Record allocator events from now on, starting with one allocation for each
            storage alive now (in the order they were first seen)."""
            self.events = []
            for info, _ref in list(self._known.values()):
                if info.nbytes:
                    self._allocated(info)

        def _allocated(self, info: _Storage) -> None:
            if self.events is not None and info.device == device_type:
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
            for st in storages(t):
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
            self._fake_on_entry = get_mode(fake_key)

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
            if self._uncounted or get_mode(fake_key) is not self._fake_on_entry:
                return res  # DTensor's propagation (global shapes) or another fake mode's ops
            category = _OPT if self._in_opt else (_TEMP if graph_task() != -1 else _ACT)
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
                if probe is not None and func._opname in probe.ops:
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
            measured = probe.measure(func, args, kwargs)  # type: ignore[union-attr]
            if measured is None:
                return 0
            outs = [o for o in tree_flatten(res)[0] if isinstance(o, torch.Tensor)]
            for out, real in zip(outs, measured.outputs, strict=False):
                if real is None:
                    continue
                nbytes, geometry = real
                for st in storages(out):
                    known = self._known.get(st)
                    if known is not None and known[0].nbytes != _alloc_bytes(nbytes):
                        self.resized(known[0], _alloc_bytes(nbytes))
                        probe.remember(out, geometry)  # type: ignore[union-attr]
            return measured.scratch

    return TimelineTracker()


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


# ----------------------------------------------------------------------------------------------
# The trace.


def _data_dependent(exc: BaseException) -> bool:
    """Is this the fake tensor saying an output size (or a value) depends on data?"""
    names = {type(e).__name__ for e in _chain(exc)}
    known = {
        "DynamicOutputShapeException", "DataDependentOutputException",
        "GuardOnDataDependentSymNode",
    }
    if names & known:
        return True
    text = " ".join(str(e) for e in _chain(exc)).lower()
    return "data-dependent" in text or "dynamic output shape" in text


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _allow_fake_foreach() -> None:
    """Let foreach kernels take fake tensors, as they take real ones.

    ``clip_grad_norm_`` and the optimizers pick their foreach (multi-tensor) path only for
    tensors whose type is exactly ``Tensor`` or ``Parameter``; a FakeTensor gradient is neither,
    so a fake step took the for-loop path where the real step takes foreach.
    """
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.optim import optimizer as optim_module
    from torch.utils import _foreach_utils

    for types in (optim_module._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if FakeTensor not in types:
            types.append(FakeTensor)


def _fake_trunc_normal() -> None:
    """``nn.init.trunc_normal_`` (ViT's, Swin's, ConvNeXt's initialiser in transformers) redraws
    until every value is inside its bounds, reading ``mask.any()``: a value a fake tensor does not
    have, so the whole trace fell back to real tensors (or, above the real-run limit, failed).
    Like a meta tensor, which torch's own initialiser already skips, a fake tensor has no values
    to draw: it is returned as it is. Initial values never change a step's memory, and the
    rejection sampling's temporaries live in host memory while the model is built."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.nn import init

    real = init._no_grad_trunc_normal_
    if getattr(real, "_launch_fake_aware", False):
        return

    def trunc_normal(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if isinstance(tensor, FakeTensor):
            return tensor
        return real(tensor, *args, **kwargs)

    trunc_normal._launch_fake_aware = True  # type: ignore[attr-defined]
    init._no_grad_trunc_normal_ = trunc_normal


def _fake_grouped_mm() -> None:
    """transformers' mixture-of-experts layers (Mixtral, Qwen2-MoE...) call torch's grouped_mm,
    whose meta kernel (what fake tensors run) accepts only bf16 where the real kernels take fp32
    too: an fp32 or bf16_mixed trace failed where the real step runs. For fake weights that are
    not bf16 the layers take transformers' own grouped-matmul op instead (what it does under
    torch.compile for the same reason): the same output and saved tensors, and a fake kernel.
    Applied once the recipe has imported transformers; real tensors are untouched."""
    if "transformers" not in sys.modules:
        return
    try:
        from transformers.integrations import moe
    except ImportError:
        return
    real = getattr(moe, "_can_use_grouped_mm", None)
    if real is None or getattr(real, "_launch_fake_aware", False):
        return
    from torch._subclasses.fake_tensor import FakeTensor

    def can_use_grouped_mm(input: Any, weight: Any, offs: Any) -> bool:
        if isinstance(weight, FakeTensor) and weight.dtype != torch.bfloat16:
            return False
        return real(input, weight, offs)

    can_use_grouped_mm._launch_fake_aware = True  # type: ignore[attr-defined]
    moe._can_use_grouped_mm = can_use_grouped_mm


#: The timeline's phase codes (``launcher.estimate.traced.PHASES``, where the parent reads them).
_PHASE_CODES = {name: code for code, name in PHASES.items()}
#: The script's ``Progress`` phases, as timeline phases.
_SCRIPT_PHASES = {"data": "forward", "forward": "forward", "backward": "backward",
                  "optimizer": "optimizer", "zero_grad": "zero_grad"}


def _trace(request: dict[str, Any], recipe: ModuleType, mode: str) -> dict[str, Any]:
    """Trace (mode "fake" or "bound") or measure (mode "real") every requested size.

    One tracker sees everything from the first weight on, in this order:

    - build: the model, its dtype cast, checkpoint wrappers and the optimizer;
    - step 1: the first optimizer step (state is created), see ``first_optimizer_step``;
    - the steady-state step at ``b0`` (the second smallest size, the smallest is often special:
      a size-1 batch turns some copies into views), with its optimizer phase;
    - the micro-batches alone (no optimizer phase) at every other size.

    The optimizer phase does not depend on the micro-batch except through what is alive when it
    starts (the gradients, whatever the training step left behind): that boundary is recorded at
    every size, and the optimizer phase at another size is the one at ``b0`` shifted by it.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    device = torch.device(request["trace_device"])
    traced_accum = min(request["grad_accum_steps"], 2)  # micro-steps 3..k see what 2 sees
    seed = request.get("seed", 0)
    sizes = sorted(set(request["micro_batch_sizes"]))
    verify = sorted({b for b in request.get("verify_sizes", []) if b not in sizes})
    b0 = request.get("b0") or (sizes[1] if len(sizes) > 1 else sizes[0])
    # "step": build, step 1, the steady step at b0. "micro": build, micro-batches at the other
    # sizes. Both by default; the parent may run them in two processes (two cores).
    parts = set(request.get("parts") or ("step", "micro"))
    micro_sizes = [x for x in sizes + verify if x != b0] if "micro" in parts else []
    # A split trace may move some micro-batch sizes to the "step" process, to even out the two
    # processes' work (``_scaled_trace``); the other process then leaves them out.
    moved = [x for x in request.get("step_sizes", []) if x != b0 and x in sizes + verify]
    if parts == {"step"}:
        micro_sizes = moved
    elif parts == {"micro"}:
        micro_sizes = [x for x in micro_sizes if x not in moved]

    if mode in ("fake", "bound"):
        _allow_fake_foreach()
        _fake_trunc_normal()
    probe = ScratchProbe(device) if request["device"] == device.type else None
    if request.get("probes") is False:
        probe = None
    tracker = _make_tracker(device.type, probe)
    # A CUDA estimate records what the caching allocator would be asked for, from the end of
    # the build to the end of the steady step (launcher.estimate.allocator replays it). Not
    # from the start: the recipe builds the model in host memory (the whole stack, before a
    # depth-scaled trace cuts it; the whole model, before FSDP shards it), which on this CPU
    # is the traced device too; on the GPU the story starts with what the build left there.
    allocator_events: list[int] | None = None
    record = request["device"] == "cuda" and "step" in parts
    fake = FakeTensorMode(allow_non_fake_inputs=True) if mode in ("fake", "bound") else None
    bound = UpperBoundShapes() if mode == "bound" else None
    boundary: dict[str, tuple[int, ...]] = {}
    label = "build"
    phase_cpu: dict[str, float] = {}
    clock = [time.process_time(), "build"]

    def on_phase(name: str, micro_step: int = 0) -> None:
        name = _SCRIPT_PHASES.get(name, name)
        if micro_step > 1 and name in ("forward", "backward"):
            name = f"accum_{name}"
        now = time.process_time()
        phase_cpu[clock[1]] = phase_cpu.get(clock[1], 0.0) + now - clock[0]  # type: ignore[index]
        clock[:] = [now, name]
        tracker.phase = _PHASE_CODES[name]
        if name == "optimizer":
            boundary[label] = tracker.current()

    segments: dict[str, tuple[list, list]] = {}
    facts: dict[str, Any] = {}
    blocks: dict[str, Any] = {}
    timings: dict[str, float] = {}
    cats: list[str] = tracker.categories
    with contextlib.ExitStack() as stack:
        if fake is not None:
            stack.enter_context(fake)
        stack.enter_context(tracker)
        if bound is not None:
            stack.enter_context(bound.mode)
        t0 = time.perf_counter()
        segments[label] = tracker.start_segment()
        tracker.phase = 0
        step = build({**request, "grad_accum_steps": traced_accum}, recipe, device,
                     fake=fake is not None, blocks=blocks)
        model, optimizer, digest = step.model, step.optimizer, step.digest
        tracker.track_model(model)
        params = list(model.parameters())
        facts["parameters"] = sum(p.numel() for p in params)
        facts["trainable_parameters"] = sum(p.numel() for p in params if p.requires_grad)
        facts["parameter_bytes"] = sum(p.numel() * p.element_size() for p in params)
        facts["buffer_bytes"] = sum(b.numel() * b.element_size() for b in model.buffers())
        facts["optimizer_class"] = type(optimizer).__name__
        facts["foreach"] = _foreach(optimizer, params)
        tracker.stop_segment()
        timings["build_s"] = time.perf_counter() - t0
        if record:
            tracker.start_events()
        model.train()

        if "step" in parts:
            t0 = time.perf_counter()
            label = "step1"
            segments[label] = tracker.start_segment()
            first_optimizer_step(step, on_phase=on_phase, on_grad=tracker.track_as_gradient)
            tracker.stop_segment()
            timings["step1_s"] = time.perf_counter() - t0
            # Exact model-state bytes as counted (rounding included): gradients just before
            # the first optimizer step, optimizer state right after it.
            facts["gradient_bytes"] = boundary["step1"][cats.index("GRAD")]
            facts["optimizer_state_bytes"] = tracker.current()[cats.index("OPT")]

        step.script.seed_all(step.script.derive_seed(seed, "train", step.runtime.rank))
        index = 0
        # the script's optimizer step ends in zero_grad right after the update
        zero_grad = optimizer.register_step_post_hook(lambda *_: on_phase("zero_grad"))
        for b in ([b0] if "step" in parts else []) + micro_sizes:
            t0, c0 = time.perf_counter(), time.process_time()
            label = f"b{b}"
            start, index = index, index + traced_accum
            segments[label] = tracker.start_segment()
            # Training FLOPs (count_flops): forward and backward of the steady step's
            # micro-batches, per sample (matmul and attention FLOPs are linear in the batch).
            count = bool(request.get("count_flops")) and b == b0 and "step" in parts
            tracker.flops = 0.0 if count else None
            step.run(b, start, on_phase, update=b == b0 and "step" in parts)
            if count:
                facts["flops_per_sample"] = (tracker.flops or None) and (
                    tracker.flops / (traced_accum * b0))
                tracker.flops = None
            tracker.stop_segment()
            timings[f"{label}_s"] = time.perf_counter() - t0
            timings[f"{label}_cpu_s"] = time.process_time() - c0
            if b == b0 and tracker.events is not None:
                allocator_events = tracker.events
                tracker.events = None
        on_phase("build")  # close the last phase's clock
        zero_grad.remove()
        del model, optimizer, params, step
    timings.update({f"{k}_cpu_s": v for k, v in phase_cpu.items() if k != "build"})
    result: dict[str, Any] = {
        "categories": cats,
        "b0": b0,
        "traced_accum": traced_accum,
        "script_sha256": digest,
        "facts": facts,
        "timings": timings,
        "boundary": {k: list(v) for k, v in boundary.items()},
        # the raw timelines; the parent fits them (launcher.estimate.traced)
        "segments": {
            k: {"points": [[p, *v] for p, v in points], "ops": [str(op) for op in ops]}
            for k, (points, ops) in segments.items()
        },
    }
    if blocks:
        result["blocks"] = blocks
    if allocator_events is not None:
        result["allocator_events"] = allocator_events
    if bound is not None and bound.substituted:
        result["substituted"] = bound.substituted
    if probe is not None:
        result["probes"] = {"probed": probe.probed, "skipped": probe.skipped}
    return result


def _scaled_trace(request: dict[str, Any], recipe: ModuleType, mode: str,
                  notes: list[str]) -> dict[str, Any]:
    """``_trace``, at two depths of the model's repeated blocks when ``scale_depth`` asks for it.

    The first trace (at ``SCALED_DEPTHS[0]``) finds the stack while building; a model without
    one is traced whole by that same call, and its answer is the ordinary one. Otherwise the
    answer holds both traces (``by_depth``) and the parent extrapolates them to the real depth
    (``launcher.estimate.traced._scale``). If a truncated model cannot run (its forward indexes
    blocks that are gone), the whole model is traced instead, with a note.
    """
    if not request.get("scale_depth"):
        return _trace(request, recipe, mode)
    shallow, deep = SCALED_DEPTHS
    try:
        # At the shallow depth the step process (one full step) has less to do than the micro
        # process (two sizes): it takes the smallest size too, for even halves.
        sizes = sorted(set(request["micro_batch_sizes"]))
        first = _trace({**request, "depth": shallow, "step_sizes": sizes[:1]}, recipe, mode)
        if "blocks" not in first:
            return first  # nothing to scale: that was the whole model
        second = _trace({**request, "depth": deep}, recipe, mode)
    except BaseException as exc:  # noqa: BLE001
        if _data_dependent(exc):
            raise  # the caller's fallbacks (real run, bound) apply to the whole model
        notes.append(f"tracing {shallow} and {deep} blocks of the stack failed "
                     f"({type(exc).__name__}): traced the whole model")
        return _trace({**request, "depth": None}, recipe, mode)
    return {
        "by_depth": {str(shallow): first, str(deep): second},
        "blocks": second["blocks"],
        "categories": second["categories"],
        **({"substituted": second["substituted"]} if second.get("substituted") else {}),
    }


def _foreach(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> bool | None:
    """Whether the optimizer will run its foreach (multi-tensor) implementation.

    It matters for memory: foreach AdamW materialises intermediates for a whole parameter group
    at once (``exp_avg_sq.sqrt()`` of every parameter), the for-loop one tensor at a time.
    """
    if "foreach" not in optimizer.defaults:
        return None
    if optimizer.defaults["foreach"] is not None:
        return bool(optimizer.defaults["foreach"])
    if optimizer.defaults.get("fused"):
        return False
    from torch.optim.optimizer import _default_to_fused_or_foreach

    return _default_to_fused_or_foreach(params, False, False)[1]


# ----------------------------------------------------------------------------------------------
# Errors: one line, the user's file and line.


def _user_frame(
    exc: BaseException, recipe_file: str
) -> tuple[str | None, int | None, str | None]:
    """The innermost frame of the user's code: the recipe file, else a file next to it."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return exc.filename, exc.lineno, None
    recipe_path = str(Path(recipe_file).resolve())
    recipe_dir = str(Path(recipe_file).resolve().parent)
    frames = traceback.extract_tb(exc.__traceback__)
    for pick in (
        lambda f: f == recipe_path,
        lambda f: f.startswith(recipe_dir) and "site-packages" not in f,
    ):
        for frame in reversed(frames):
            if pick(str(Path(frame.filename).resolve()) if frame.filename else ""):
                return frame.filename, frame.lineno, frame.name
    return None, None, None


def _describe(exc: BaseException, recipe_file: str) -> dict[str, Any]:
    if isinstance(exc, RecipeError):
        return {"message": exc.message, "file": exc.file, "line": exc.line, "kind": exc.kind}
    file, line, function = _user_frame(exc, recipe_file)
    first = (str(exc).strip().splitlines() or [""])[0]
    kind = "syntax" if isinstance(exc, SyntaxError) else "user_code"
    if isinstance(exc, SyntaxError):
        first = exc.msg
    message = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    if function and function != "<module>":
        message = f"in {function}(): {message}"
    return {"message": message, "file": file, "line": line, "kind": kind}


# ----------------------------------------------------------------------------------------------
# Entry point.


def _configure_device(request: dict[str, Any]) -> list[str]:
    """Decide how the target device is traced; return notes that say what was emulated."""
    notes: list[str] = []
    target = request["device"]
    if target == "cpu":
        request["trace_device"] = "cpu"
        return notes
    if torch.cuda.is_available():
        request["trace_device"] = "cuda"
        return notes
    # No GPU here (or a CPU-only torch): fake CUDA tensors cannot run backward in a CPU-only
    # build (the autograd engine asks for a CUDA stream). Trace on the CPU and emulate what
    # differs in memory: 512-byte allocator rounding and the foreach optimizer default.
    request["trace_device"] = "cpu"
    _install_cuda_rounding()
    from torch.optim import optimizer as optim_module

    devices = optim_module._get_foreach_kernels_supported_devices()
    optim_module._get_foreach_kernels_supported_devices = lambda: [*devices, "cpu"]
    from launcher.estimate import _autocast_cuda, _sdpa_cuda

    _autocast_cuda.install()  # CUDA's autocast op lists, on the CPU's autocast key
    # CUDA's attention kernels (flash / memory-efficient / math, chosen by PyTorch's own rules
    # for the plan's GPU generation) and dropout's bool mask, for fake tensors
    major, minor = _sdpa_cuda.install(_sdpa_cuda.capability_of(request.get("gpu_generation")))
    notes.append(
        "traced on the CPU emulating CUDA: storages rounded to 512 bytes, optimizers default to "
        "foreach, autocast casts as on CUDA, attention and dropout run CUDA's kernels "
        f"(sm{major}{minor})"
    )
    return notes


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Answer one request (see ``launcher.estimate.traced.trace_recipe``)."""
    started = time.perf_counter()
    recipe_file = request["recipe_file"]
    notes = _configure_device(request)
    try:
        # the script seeds every rank before it imports the recipe (random numbers at import)
        _script.load(_strategy_name(request))[0].seed_all(request.get("seed", 0))
        recipe = load_recipe(recipe_file)
        if request.get("batch_shapes"):  # the shapes a job ran out of memory at
            recipe.example_batch = shaped_batches(request["batch_shapes"])
        _fake_grouped_mm()
    except RecipeError as exc:
        return {"ok": False, "error": _describe(exc, recipe_file)}
    except BaseException as exc:  # noqa: BLE001 - anything the user's import raises
        return {"ok": False, "error": _describe(exc, recipe_file)}
    policy = request.get("data_dependent", "auto")
    modes = {"auto": ["fake"], "real": ["real"], "bound": ["bound"]}[policy]
    if request.get("force_real"):
        modes = ["real"]
    result: dict[str, Any] | None = None
    attempts: list[str] = []
    while modes:
        mode = modes.pop(0)
        attempts.append(mode)
        try:
            result = _scaled_trace(request, recipe, mode, notes)
            result["kind"] = {"fake": "traced", "real": "real_run", "bound": "upper_bound"}[mode]
            break
        except BaseException as exc:  # noqa: BLE001
            if mode == "fake" and _data_dependent(exc):
                op = _data_dependent_op(exc)
                notes.append(f"data-dependent shapes ({op}): the fake run cannot size them")
                weights = _weights_bytes(recipe, request)
                limit = request.get("real_run_limit_bytes", DEFAULT_REAL_RUN_LIMIT)
                if weights is not None and weights <= limit:
                    notes.append(
                        f"reran on real CPU tensors ({weights} bytes of weights <= {limit}): exact"
                        " for the example batches, routing may differ on real data"
                    )
                    modes = ["real"]
                else:
                    notes.append("reran with the largest possible outputs: an upper bound")
                    modes = ["bound"]
                continue
            return {"ok": False, "error": _describe(exc, recipe_file), "attempts": attempts}
    assert result is not None
    if result.get("substituted"):
        ops = ", ".join(f"{op} x{n}" for op, n in result["substituted"].items())
        notes.append(f"upper bound: data-dependent outputs sized at their maximum ({ops})")
    result["ok"] = True
    result["notes"] = notes + result.get("notes", [])
    result["attempts"] = attempts
    result["trace_device"] = request["trace_device"]
    result["device"] = request["device"]
    result["torch_version"] = torch.__version__
    result["wall_s"] = time.perf_counter() - started
    result["host_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def measure(request: dict[str, Any]) -> dict[str, Any]:
    """A real step on the CPU, its peak read from the CPU allocator's own events.

    The reference the traced estimate is checked against (bench/bench_estimate_cpu.py, tests).
    ``torch.profiler`` with ``profile_memory=True`` records every allocation and free of the CPU
    allocator with the allocator's running total of live bytes (``total_allocated``); it is
    started before the model is built, so that total counts every byte of the run, and the peak
    is its maximum. Sequence: build, optimizer step 1 at ``micro_batch``, step 2 at it.
    """
    from torch.profiler import ProfilerActivity, profile

    started = time.perf_counter()
    recipe_file = request["recipe_file"]
    try:
        recipe = load_recipe(recipe_file)
    except BaseException as exc:  # noqa: BLE001
        return {"ok": False, "error": _describe(exc, recipe_file)}
    b, accum, seed = request["micro_batch"], request["grad_accum_steps"], request.get("seed", 0)
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step = build(request, recipe, torch.device("cpu"), fake=False)
            step.model.train()
            step.script.seed_all(step.script.derive_seed(seed, "train", step.runtime.rank))
            for index in (0, accum):
                step.run(b, index, lambda phase, micro: None)
            del step
    except BaseException as exc:  # noqa: BLE001
        return {"ok": False, "error": _describe(exc, recipe_file)}
    events = cpu_allocation_events(prof)
    live = running_peak = 0
    for event in events:
        live += event.alloc_size
        running_peak = max(running_peak, live)
    extra: dict[str, Any] = {}
    if request.get("strategy"):  # a rank of a real gloo world: also without gloo's own buffers
        from launcher.estimate import _trace_dist

        extra["without_backend"] = _trace_dist.peak_without_backend(prof)
    return {
        **extra,
        "ok": True,
        "peak_allocated": max((e.total_allocated for e in events), default=0),
        "running_sum_peak": running_peak,
        "events": len(events),
        "wall_s": time.perf_counter() - started,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def _data_dependent_op(exc: BaseException) -> str:
    for e in _chain(exc):
        func = getattr(e, "func", None)
        if func is not None:
            return str(func)
    return type(exc).__name__


def _weights_bytes(recipe: ModuleType, request: dict[str, Any]) -> int | None:
    """Bytes of the model's weights, from a build on the meta device (costs no memory)."""
    try:
        with torch.device("meta"):
            model = recipe.build_model()
        total = 0
        for t in list(model.parameters()) + list(model.buffers()):
            bf16 = request["precision"] == "bf16" and t.is_floating_point()
            total += t.numel() * (2 if bf16 else t.element_size())
        return total
    except Exception:  # noqa: BLE001 - no answer is an answer: fall back to the bound
        return None


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    """One configuration, in workers (``_workers``): its "step" and "micro" parts in two at once
    when the parent asked for the split, else all of it in one."""
    if request.get("fork_parts"):
        parts = [{**request, "parts": [part], "fork_parts": False} for part in ("step", "micro")]
        return {"ok": True, "split": _workers.run_all(parts, _work)}
    return _workers.run_all([request], _work)[0]


def _work(request: dict[str, Any]) -> dict[str, Any]:
    """What a worker process does with its request (it runs the user's code)."""
    if request.get("action") == "probe":
        # launcher.recipe's probe, as its own child would run it (in the script's folder)
        from launcher import recipe as loader

        script = Path(request["script"])
        os.chdir(script.parent)
        return loader.probe_answer(script, count_flops=request.get("count_flops", True))
    if request.get("action") == "measure":
        return measure(request)
    return run(request)


def _warm_up() -> None:
    """Import what the first fake op imports lazily (``torch._refs``, decompositions, the fake
    tensor machinery: about two seconds) by running a tiny step on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with contextlib.suppress(Exception), FakeTensorMode():
        model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.LayerNorm(4),
                                    torch.nn.Linear(4, 8))
        logits = model(torch.zeros(2, 3, dtype=torch.long))
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.zeros(6, dtype=torch.long)
                                          ).backward()
        torch.optim.AdamW(model.parameters()).step()


def main() -> None:
    if sys.argv[1:] == ["--worker"]:  # a worker spawned by ``_workers``: one request, one answer
        sys.stdout.write(json.dumps(_workers.work(json.loads(sys.stdin.read()), _work)))
        return
    # The protocol owns the real stdout; anything the user's code prints goes to stderr.
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _workers.prepare()  # before any op: this process forks the workers
    if os.environ.get("LAUNCH_TRACE_WARM") == "1":
        _warm_up()  # started ahead of its request: use the wait
        _workers.mark_baseline()
    # One JSON request per line, one answer line each, until end of input: a prestarted child
    # first loads the recipe for the CLI (``probe``), then traces it. A child started ahead
    # and never asked (the parent is gone, or did not need a trace) just reads the end.
    for line in sys.stdin:
        if line.strip():
            protocol.write(json.dumps(_serve(json.loads(line))) + "\n")
            protocol.flush()


def _serve(request: dict[str, Any]) -> dict[str, Any]:
    """One request of the line protocol. Everything that runs the user's code runs in workers;
    this process only imports the packages the recipe names, to share them with its workers."""
    try:
        recipe_file = request.get("script") or request.get("recipe_file") or next(
            (item.get("recipe_file") for item in request.get("batch", ())), None)
        if recipe_file:
            _workers.preimport(recipe_file)
        if request.get("action") == "probe":
            return _workers.run_all([request], _work)[0]
        if "batch" in request:
            # Several configurations of one recipe from one process: torch is imported once.
            common = {k: v for k, v in request.items() if k != "batch"}
            return {"ok": True, "batch": [_answer({**common, **item})
                                          for item in request["batch"]]}
        return _answer(request)
    except BaseException as exc:  # noqa: BLE001 - a bug here must still answer in JSON
        return {
            "ok": False,
            "error": {"message": f"{type(exc).__name__}: {exc}", "file": None, "line": None,
                      "kind": "internal", "traceback": traceback.format_exc()},
        }


if __name__ == "__main__":
    main()
