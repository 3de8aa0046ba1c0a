"""The sequence traced: build, step 1, the steady step and the micro-batches, and the fallbacks.

``run`` answers one trace request: it decides how the target device is traced
(``configure_device``: a CUDA estimate on a machine without one emulates CUDA on the CPU), loads
the recipe, and traces the step (``_trace_step``) under the tracker (``_tracker``) at every
requested size (``_trace``), at two depths of a repeated stack when asked (``_scaled_trace``).
When fake tensors cannot size a data-dependent op it reruns on real tensors (small models) or
with the largest possible outputs (an upper bound). The raw timelines go back to the parent,
which fits them (``launcher.estimate._answer``).
"""

from __future__ import annotations

import contextlib
import functools
import resource
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

from launcher import strategies
from launcher.estimate._blocks import SCALED_DEPTHS, SHARDED_DEPTHS
from launcher.estimate.child import _fast_fake, _script
from launcher.estimate.child._trace_step import (
    RecipeError,
    build,
    describe_error,
    first_optimizer_step,
    load_recipe,
    shaped_batches,
    strategy_name,
)
from launcher.estimate.child._tracker import (
    ScratchProbe,
    TimelineTracker,
    UpperBoundShapes,
    install_cuda_rounding,
)
from launcher.estimate.trace_result import PHASES

#: Below this many bytes of weights a model with data-dependent shapes is rerun on real tensors.
DEFAULT_REAL_RUN_LIMIT = 2 * 2**30


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


def _fake_swap() -> None:
    """A recipe that casts or moves its own model (``model.to(torch.bfloat16)``, ``.half()``,
    ``.to(device)`` in ``build_model``, as many do) failed to trace: ``Module._apply`` always
    swaps a fake parameter for its converted copy (``torch.utils.swap_tensors``), which refuses
    a tensor with a weak reference, and a fake tensor whose op missed the fake tensor's cache
    has one (the fake mode's memo): the parameter, or, when the parameter's own op was a cache
    hit (a second build, or entries from an earlier worker), the converted copy.
    Where it would refuse, the parameter takes the converted data instead (``.data =``: what
    ``Module.to`` does with real tensors, and ``_trace_step._fake_to`` with the templates'
    own cast): the same object, the new dtype and device. Real tensors, and swaps it allows,
    are untouched."""
    import weakref

    import torch.utils
    from torch._subclasses.fake_tensor import FakeTensor

    real = torch.utils.swap_tensors
    if getattr(real, "_launch_fake_aware", False):
        return

    def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
        if isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor) and (
                weakref.getweakrefs(t1) or weakref.getweakrefs(t2)):
            with torch.no_grad():
                t1.data = t2.detach()
            return
        real(t1, t2)

    swap_tensors._launch_fake_aware = True  # type: ignore[attr-defined]
    torch.utils.swap_tensors = swap_tensors


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


#: The timeline's phase codes (``trace_result.PHASES``, where the parent reads them).
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
        _fake_swap()
        _fast_fake.install()
    probe = ScratchProbe(device) if request["device"] == device.type else None
    if request.get("probes") is False:
        probe = None
    tracker = TimelineTracker(device.type, probe)
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

        launch = step.script.launch  # the script's machinery
        launch.seed_all(launch.derive_seed(seed, "train", step.runtime.rank))
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
        # the raw timelines; the parent fits them (launcher.estimate._answer)
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

    The first trace (at ``SCALED_DEPTHS[0]``, ``SHARDED_DEPTHS[0]`` for a sharded rank) finds
    the stack while building; a model without
    one is traced whole by that same call, and its answer is the ordinary one. Otherwise the
    answer holds both traces (``by_depth``) and the parent extrapolates them to the real depth
    (``launcher.estimate._answer.scale``). If a truncated model cannot run (its forward indexes
    blocks that are gone), the whole model is traced instead, with a note.
    """
    if not request.get("scale_depth"):
        return _trace(request, recipe, mode)
    strategy = (request.get("strategy") or {}).get("name")
    scaled_rank = strategy is not None and strategies.get(strategy).rank_trace == "depth_scaled"
    shallow, deep = SHARDED_DEPTHS if scaled_rank else SCALED_DEPTHS
    # A trace split over two processes by depth (``traced._forking``) traces one of them here;
    # the parent joins the two answers' ``by_depth``.
    part = request.get("depth_part")
    depths = (shallow, deep) if part is None else ((shallow, deep)[part],)
    traced: dict[str, dict[str, Any]] = {}
    try:
        # At depth 2 the step process (one full step) has less to do than the micro process
        # (two sizes): it takes the smallest size too, for even halves. A sharded rank's
        # first step at 4 and 6 blocks is already the longer half (the 7B at 8 ranks: 2.0
        # against 1.2 s; 1.7 against 1.5 with the size left to the micro process).
        sizes = sorted(set(request["micro_batch_sizes"]))
        for depth in depths:
            answer = _trace({**request, "depth": depth,
                             "step_sizes": sizes[:1] if depth == SCALED_DEPTHS[0] else []},
                            recipe, mode)
            if "blocks" not in answer:
                return answer  # nothing to scale: that was the whole model
            traced[str(depth)] = answer
    except BaseException as exc:  # noqa: BLE001
        if _data_dependent(exc):
            raise  # the caller's fallbacks (real run, bound) apply to the whole model
        notes.append(f"tracing {' and '.join(map(str, depths))} blocks of the stack failed "
                     f"({type(exc).__name__}): traced the whole model")
        return _trace({**request, "depth": None}, recipe, mode)
    last = traced[str(depths[-1])]
    return {
        "by_depth": traced,
        "blocks": last["blocks"],
        "categories": last["categories"],
        **({"substituted": last["substituted"]} if last.get("substituted") else {}),
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


def configure_device(request: dict[str, Any]) -> list[str]:
    """Decide how the target device is traced; return notes that say what was emulated."""
    notes: list[str] = []
    target = request["device"]
    if target == "cpu":
        request["trace_device"] = "cpu"
        return notes
    # Always on the CPU, emulating CUDA, also where this machine has a GPU: the plan is for the
    # target's GPU generation (its attention kernels), not this machine's, and a plan must not
    # depend on where it was computed. A worker forked from a process that asked CUDA anything
    # (``torch.cuda.is_available()`` poisons fork; transformers' imports ask) cannot touch CUDA
    # at all: every row of bench/gpu_validate.py failed so on an H200 before this. Fake CUDA
    # tensors cannot run backward in a CPU-only build either (the autograd engine asks for a
    # CUDA stream). What differs in memory is emulated: 512-byte allocator rounding, the
    # foreach optimizer default, autocast's CUDA lists and CUDA's attention kernels.
    request["trace_device"] = "cpu"
    install_cuda_rounding()
    from torch.optim import optimizer as optim_module

    devices = optim_module._get_foreach_kernels_supported_devices()
    optim_module._get_foreach_kernels_supported_devices = lambda: [*devices, "cpu"]
    from launcher.estimate.child import _autocast_cuda, _sdpa_cuda

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
    notes = configure_device(request)
    try:
        # the script seeds every rank before it imports the recipe (random numbers at import)
        _script.load(strategy_name(request))[0].launch.seed_all(request.get("seed", 0))
        recipe = load_recipe(recipe_file)
        _check_loss(recipe)
        if request.get("batch_shapes"):  # the shapes a job ran out of memory at
            recipe.example_batch = shaped_batches(request["batch_shapes"])
        _fake_grouped_mm()
    except RecipeError as exc:
        return {"ok": False, "error": describe_error(exc, recipe_file)}
    except BaseException as exc:  # noqa: BLE001 - anything the user's import raises
        return {"ok": False, "error": describe_error(exc, recipe_file)}
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
            return {"ok": False, "error": describe_error(exc, recipe_file), "attempts": attempts}
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


def _check_loss(recipe: ModuleType) -> None:
    """Make the recipe's ``training_step`` say, in one line with its file and line, that it
    returned no loss tensor (None, say: a missing ``return``), instead of the script's
    ``micro_loss / accum`` failing on it with a TypeError that names neither."""
    from launcher.recipe import not_a_loss

    real = recipe.training_step
    code = getattr(real, "__code__", None)

    @functools.wraps(real)
    def training_step(*args: Any, **kwargs: Any) -> Any:
        loss = real(*args, **kwargs)
        if not isinstance(loss, torch.Tensor):
            raise RecipeError(not_a_loss(loss), code.co_filename if code else None,
                              code.co_firstlineno if code else None, "contract")
        return loss

    recipe.training_step = training_step  # type: ignore[attr-defined]


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
