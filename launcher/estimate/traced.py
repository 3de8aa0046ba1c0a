"""Traced estimate: the per-device memory of a recipe's training step, from a run on fake tensors.

``trace_recipe`` runs the user's ``train.py`` in a child process (``_trace_child``) with a time
limit. The child imports the training script ``launch`` renders for the strategy and runs its
own functions (model build, wrapping, optimizer, ``optimizer_step``: the program that will run)
on ``FakeTensorMode`` tensors under PyTorch's ``MemTracker``, so nothing is
allocated and a 7B model is traced on a laptop. It traces a few micro-batch sizes, fits every point
of the step's memory timeline linearly in the micro-batch size and keeps the upper envelope of
those lines: ``TraceResult.memory_at(b, accum)`` then answers for any micro-batch, with or
without accumulation, without another trace.

This module's one job is the estimator's API (docs/estimator.md): ``trace_recipe``,
``trace_recipe_configs`` and ``measure_recipe`` check a request, split it over the child's two
processes where that pays, and hand it to ``trace_process`` (which runs the child); ``_answer``
(with ``_fit``) reads the answer into a ``trace_result.TraceResult``. What they answer and raise
is importable from here too. This module does not import torch: the CLI imports it to plan, and
``launch --help`` must stay instant. docs/estimator.md has the method, its evidence and its
limits.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from launcher import strategies
from launcher.estimate._answer import join, per_depth, result, result_or_raise, scale
from launcher.estimate.trace_process import run_child
from launcher.estimate.trace_result import ScaledTrace, TraceError, TraceResult, TraceTimeout
from launcher.plan.plan import checkpointing_key

#: The documented API (docs/estimator.md): what ``trace_recipe`` answers and raises is
#: importable from here with it.
__all__ = ["DEFAULT_SIZES", "DEFAULT_TIMEOUT_S", "Measurement", "ScaledTrace", "TraceError",
           "TraceResult", "TraceTimeout", "measure_recipe", "trace_recipe",
           "trace_recipe_configs"]

DEFAULT_SIZES: tuple[int, ...] = (1, 2, 4)
DEFAULT_TIMEOUT_S = 300.0


def trace_recipe(
    recipe_file: str | os.PathLike[str],
    *,
    micro_batch_sizes: tuple[int, ...] | list[int] = DEFAULT_SIZES,
    precision: str = "fp32",
    optimizer: str | None = None,
    activation_checkpointing: bool | str = False,  # True: full; "selective"
    grad_accum_steps: int = 1,
    device: Literal["cuda", "cpu"] = "cuda",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_grad_norm: float | None = 1.0,
    lr: float = 3e-4,
    weight_decay: float = 0.0,
    seed: int = 0,
    verify_sizes: tuple[int, ...] | list[int] = (),
    data_dependent: Literal["auto", "real", "bound"] = "auto",
    real_run_limit_bytes: int | None = None,
    foreach: bool | None = None,
    scale_depth: bool = True,
    strategy: dict[str, Any] | None = None,
    count_flops: bool = False,
    gpu_generation: str | None = None,
    jobs: int = 2,
    python: str | None = None,
    batch_shapes: Any = None,
) -> TraceResult:
    """Trace ``recipe_file``'s optimizer step at each of ``micro_batch_sizes`` in a child process.

    ``batch_shapes``: trace at these batch shapes (an out-of-memory report's, the templates'
    ``batch_shapes``) instead of the recipe's ``example_batch``.

    The optimizer is the script's choice: the recipe's ``build_optimizer`` if it has one, else
    ``optimizer`` (adamw | sgd | adafactor | adam8bit; None is adamw). ``grad_accum_steps`` >= 2
    answers plans with and without accumulation alike (``TraceResult.for_accum``). ``device="cuda"``
    counts as a GPU would (512-byte blocks, foreach optimizers); on a machine without CUDA it
    is emulated on the CPU (see the result's ``notes``). ``verify_sizes`` are traced too but
    kept out of the fit, to check the prediction there. ``data_dependent`` chooses what to do
    with shapes that depend on values: ``auto`` reruns small models on real CPU tensors and
    bounds large ones. ``scale_depth`` traces a model with a stack of at least eight identical
    blocks (a transformer's layers) at two and four blocks and extrapolates to its real depth
    (a ``ScaledTrace``); it is several times faster on a deep model, exact when every block uses
    memory alike (docs/estimator.md). ``strategy`` traces one rank of a distributed job at its
    real world size in one process (a fake process group): ``{"name": "ddp" | "fsdp" |
    "hybrid_shard", "world_size": N, "replicas": R (hybrid: R replicas of N / R shards),
    "reshard_after_forward": bool}``; the result is rank 0's memory (docs/estimator.md).
    ``count_flops`` also counts one sample's training FLOPs (``flops_per_sample``).
    ``gpu_generation`` (a catalog generation: ampere, hopper, volta...) is the GPU whose attention
    kernels a CUDA trace emulated on the CPU picks by PyTorch's rules (default: Ampere or newer).

    Raises ``TraceError`` (with the user's file:line when the error is in their code) or
    ``TraceTimeout``.
    """
    request = _request(
        recipe_file, micro_batch_sizes=micro_batch_sizes, precision=precision,
        optimizer=optimizer, activation_checkpointing=activation_checkpointing,
        grad_accum_steps=grad_accum_steps, device=device, max_grad_norm=max_grad_norm, lr=lr,
        weight_decay=weight_decay, seed=seed, verify_sizes=verify_sizes,
        data_dependent=data_dependent, real_run_limit_bytes=real_run_limit_bytes,
        foreach=foreach, scale_depth=scale_depth, strategy=strategy, count_flops=count_flops,
        gpu_generation=gpu_generation,
    )
    if batch_shapes is not None:
        request["batch_shapes"] = batch_shapes
    python = python or sys.executable
    return _finish(run_child(_forking(request, jobs), timeout_s, python), request, timeout_s,
                   python)


def _forking(request: dict[str, Any], jobs: int) -> dict[str, Any]:
    """The request, asking the child to split it over two processes when that pays: the steady
    step at b0 (with step 1 and the optimizer) in one, the micro-batches of every other size in
    the other (the child forks once torch is imported). ``_finish`` joins their timelines as
    one process would have made them.

    A depth-scaled trace at one size has no other size to hand over, and a sharded rank's
    halves split that way are uneven (its first optimizer step, DTensor's, is most of its
    work: 4.6 against 2.0 s for the 7B at 8 ranks): each of the two depths goes to a process
    instead (4 and 6 blocks, 2.8 and 3.2 s there), and ``_finish`` joins them as the two
    depths of one trace. A single device's halves are evened out (``_trace_run.
    _scaled_trace``); its depths, 2 and 4 blocks, would not be."""
    b0 = _b0(request)
    others = [b for b in request["micro_batch_sizes"] + request["verify_sizes"] if b != b0]
    if jobs < 2:
        return request
    strategy = (request.get("strategy") or {}).get("name")
    if request["scale_depth"] and (not others or strategy is not None and strategies.get(
            strategy).rank_trace == "depth_scaled"):
        return {**request, "b0": b0, "fork_depths": True}
    if not others:
        return request
    return {**request, "b0": b0, "fork_parts": True}


def _finish(answer: dict[str, Any], request: dict[str, Any], timeout_s: float,
            python: str) -> TraceResult:
    """One configuration's answer as a ``TraceResult``: joined if the child split it (into the
    steady step and the other sizes, or into its two depths), scaled to the model's depth if it
    traced two depths. Raises the child's error as a ``TraceError``."""
    parts = (answer.get("split") or answer.get("depths")) if answer.get("ok") else None
    if not parts:
        return result_or_raise(answer, request)
    for part in parts:
        if not part.get("ok"):
            return result_or_raise(part, request)  # raises
    first, second = parts
    if first.get("kind") != second.get("kind") or (
            ("by_depth" in first) != ("by_depth" in second)):
        # one process fell back (data-dependent shapes, a truncated model that would not run)
        # and the other did not: start over in one
        return result_or_raise(run_child(request, timeout_s, python), request)
    wall = {"wall_s": max(first["wall_s"], second["wall_s"]),
            "host_peak_rss_bytes": first["host_peak_rss_bytes"]
            + second["host_peak_rss_bytes"]}
    if "depths" in answer:
        if "by_depth" not in first:
            return result_or_raise(first, request)  # no stack: both traced it whole
        # each process traced one depth: one answer of both, as one process makes it
        return result_or_raise({
            **first, **wall, "by_depth": {**first["by_depth"], **second["by_depth"]},
            "blocks": second["blocks"],
            "notes": [*first.get("notes", []),
                      *(n for n in second.get("notes", []) if n not in first.get("notes", []))]},
            request)
    if "by_depth" not in first:
        return result(join(first, second), request)
    steps, micros = per_depth(first), per_depth(second)
    return scale({d: result(join(steps[d], micros[d]), request) for d in steps}, wall,
                 first["blocks"])


def _b0(request: dict[str, Any]) -> int:
    """The size of the full steady step: the second smallest (a batch of 1 is often special)."""
    sizes = request["micro_batch_sizes"]
    return sizes[1] if len(sizes) > 1 else sizes[0]



def trace_recipe_configs(
    recipe_file: str | os.PathLike[str],
    configs: list[dict[str, Any]],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    python: str | None = None,
    jobs: int = 2,
    **common: Any,
) -> list[TraceResult | TraceError]:
    """Trace several configurations of one recipe in one child process (torch imported once).

    Each entry of ``configs`` overrides ``common``; both take ``trace_recipe``'s keyword
    arguments. A planner comparing precisions, optimizers and checkpointing asks this once.
    Errors come back in place (a ``TraceError`` per failed configuration); a timeout or a crash
    of the child raises for all of them. ``device`` must be the same for every entry.
    """
    requests = [_request(recipe_file, **{**common, **config}) for config in configs]
    if len({r["device"] for r in requests}) > 1:
        raise ValueError("one batch traces one device; split cuda and cpu configurations")
    python = python or sys.executable
    answer = run_child({"batch": [_forking(r, jobs) for r in requests]}, timeout_s, python)
    if not answer.get("ok"):
        return [result_or_raise(answer, requests[0])]  # raises
    results: list[TraceResult | TraceError] = []
    for item, request in zip(answer["batch"], requests, strict=True):
        try:
            results.append(_finish(item, request, timeout_s, python))
        except TraceTimeout:
            raise
        except TraceError as exc:
            results.append(exc)
    return results


def _request(
    recipe_file: str | os.PathLike[str],
    *,
    micro_batch_sizes: tuple[int, ...] | list[int] = DEFAULT_SIZES,
    precision: str = "fp32",
    optimizer: str | None = None,
    activation_checkpointing: bool | str = False,  # True: full; "selective"
    grad_accum_steps: int = 1,
    device: str = "cuda",
    max_grad_norm: float | None = 1.0,
    lr: float = 3e-4,
    weight_decay: float = 0.0,
    seed: int = 0,
    verify_sizes: tuple[int, ...] | list[int] = (),
    data_dependent: str = "auto",
    real_run_limit_bytes: int | None = None,
    foreach: bool | None = None,
    scale_depth: bool = True,
    strategy: dict[str, Any] | None = None,
    count_flops: bool = False,
    gpu_generation: str | None = None,
) -> dict[str, Any]:
    """Validate the arguments (here, not in the child: a usage error costs no process)."""
    sizes = tuple(sorted({int(b) for b in micro_batch_sizes}))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"micro_batch_sizes must be positive integers, got {micro_batch_sizes}")
    if grad_accum_steps < 1:
        raise ValueError(f"grad_accum_steps must be >= 1, got {grad_accum_steps}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if precision not in ("fp32", "bf16_mixed", "bf16"):
        raise ValueError(f"precision must be fp32, bf16_mixed or bf16, got {precision!r}")
    if optimizer not in (None, "adamw", "sgd", "adafactor", "adam8bit"):
        raise ValueError(f"optimizer must be adamw, sgd, adafactor, adam8bit or None, "
                         f"got {optimizer!r}")
    if data_dependent not in ("auto", "real", "bound"):
        raise ValueError(f"data_dependent must be auto, real or bound, got {data_dependent!r}")
    request: dict[str, Any] = {
        "recipe_file": str(Path(recipe_file).resolve()),
        "micro_batch_sizes": list(sizes),
        "verify_sizes": [int(b) for b in verify_sizes],
        "precision": precision,
        "optimizer": optimizer,
        "activation_checkpointing": checkpointing_key(activation_checkpointing),
        "grad_accum_steps": int(grad_accum_steps),
        "device": device,
        "max_grad_norm": max_grad_norm,
        "lr": lr,
        "weight_decay": weight_decay,
        "seed": seed,
        "data_dependent": data_dependent,
        "foreach": foreach,
        "scale_depth": bool(scale_depth),
        "count_flops": bool(count_flops),
    }
    if real_run_limit_bytes is not None:
        request["real_run_limit_bytes"] = int(real_run_limit_bytes)
    if gpu_generation is not None:
        request["gpu_generation"] = str(gpu_generation)
    if strategy is not None:
        request["strategy"] = _strategy(strategy)
        if strategies.get(request["strategy"]["name"]).rank_trace == "whole":
            # Traced whole: DDP's gradient buckets are cut by size, not by block, so a DDP
            # rank's peak is not linear in the depth (2 and 4 blocks extrapolated to 8: +15%).
            # A sharded rank is linear from three blocks up and is scaled from 4 and 6
            # (``_blocks.SHARDED_DEPTHS``; docs/benchmarks.md, "depth scaling under a
            # strategy")
            request["scale_depth"] = False
    return request


def _strategy(strategy: dict[str, Any]) -> dict[str, Any]:
    """A distributed strategy to trace (the script's ``wrap_model`` applies it), checked
    here."""
    names = strategies.rank_traceable()
    unknown = set(strategy) - {"name", "world_size", "replicas", "reshard_after_forward"}
    if unknown:
        raise ValueError(f"unknown strategy keys: {', '.join(sorted(unknown))}")
    name, world = strategy.get("name"), strategy.get("world_size")
    if name not in names:
        raise ValueError(f"strategy name must be one of {', '.join(names)}, got {name!r}")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"strategy world_size must be a positive integer, got {world!r}")
    replicas = strategy.get("replicas", 1)
    if strategies.get(name).shards != "node" and replicas != 1:
        raise ValueError(f"replicas is for hybrid_shard only, got {replicas!r} for {name}")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1 or (
        world % replicas
    ):
        raise ValueError(f"replicas ({replicas!r}) must be a positive divisor of world_size "
                         f"({world})")
    return {"name": name, "world_size": world, "replicas": replicas,
            "reshard_after_forward": bool(strategy.get("reshard_after_forward", True))}



@dataclass(frozen=True)
class Measurement:
    """A real CPU step's peak, from the CPU allocator's own events (see ``measure_recipe``)."""

    micro_batch: int
    peak_allocated: int
    running_sum_peak: int
    events: int
    wall_s: float
    threads: int


def measure_recipe(
    recipe_file: str | os.PathLike[str],
    *,
    micro_batch: int,
    precision: str = "fp32",
    optimizer: str | None = None,
    activation_checkpointing: bool | str = False,  # True: full; "selective"
    grad_accum_steps: int = 1,
    max_grad_norm: float | None = 1.0,
    seed: int = 0,
    foreach: bool | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    python: str | None = None,
) -> Measurement:
    """Run two real optimizer steps of the recipe on the CPU and return their peak.

    This is the ground truth the traced estimate is checked against on a machine without a GPU:
    ``torch.profiler``'s memory events are the CPU allocator's own record of every allocation
    and free, with its running total of live bytes. It uses real memory; keep models small.
    """
    request = {
        "action": "measure",
        "recipe_file": str(Path(recipe_file).resolve()),
        "micro_batch": int(micro_batch),
        "precision": precision,
        "optimizer": optimizer,
        "activation_checkpointing": checkpointing_key(activation_checkpointing),
        "grad_accum_steps": int(grad_accum_steps),
        "max_grad_norm": max_grad_norm,
        "seed": seed,
        "foreach": foreach,
    }
    answer = run_child(request, timeout_s, python or sys.executable)
    if not answer.get("ok"):
        error = answer.get("error") or {}
        raise TraceError(error.get("message", "the measurement failed"), file=error.get("file"),
                         line=error.get("line"), kind=error.get("kind", "user_code"))
    return Measurement(
        micro_batch=int(micro_batch), peak_allocated=int(answer["peak_allocated"]),
        running_sum_peak=int(answer["running_sum_peak"]), events=int(answer["events"]),
        wall_s=float(answer["wall_s"]), threads=int(answer["threads"]),
    )
