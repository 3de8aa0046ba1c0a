"""launch_runtime.py: the machinery `launch` runs beside the training script it rendered.

launch_train.py is the script a person reads and keeps: its settings, model, data and loop. What
`launch` needs around that loop lives here, the same file for every strategy: reading plan.json,
joining the process group, the JSON event lines the launcher follows, importing the recipe,
precision and activation checkpointing, checkpoints and resume (a whole model's, or DCP shards'),
where a resumed run's data starts, and the out-of-memory report. launch writes it into the job
folder next to launch_train.py (and next to launch_framework.py, which shares its events and
out-of-memory report); it imports only the standard library and torch, so it runs in any image.

Sections, in the order the training loop first needs them: settings; processes and devices;
reporting; the recipe; model, precision and activation checkpointing; checkpoints; data;
running out of memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import importlib.util
import itertools
import json
import os
import random
import re
import resource
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

# -----------------------------------------------------------------------------------------------
# Settings. Every value the training script uses is data read at run time, never written into
# its code: the plan (plan.json, written by the launcher next to this file, or the file
# LAUNCH_PLAN names) holds the batch sizes, steps, learning rate, precision and checkpoints, and a
# few LAUNCH_* environment variables say where the provider wants things.

#: The job folder: launch writes this file, the script and plan.json into it.
SCRIPT_DIR = Path(__file__).resolve().parent
#: Where the launcher reads the JSON event lines first, when it gives one (the local provider
#: does): a file of their own, so an out-of-memory event never waits behind megabytes of a chatty
#: job's output in the log.
EVENTS_FILE = os.environ.get("LAUNCH_EVENTS_FILE")
#: Where the provider shows a failure's reason, when it has such a file (SageMaker's
#: /opt/ml/output/failure, its job's FailureReason): set by the provider that has one only.
FAILURE_FILE = os.environ.get("LAUNCH_FAILURE_FILE")
#: The keys the training script reads; a plan.json without one of them was not written for it.
TRAINING_KEYS = (
    "recipe_file",
    "micro_batch_size",
    "grad_accum_steps",
    "steps",
    "lr",
    "optimizer",
    "precision",
    "seed",
    "activation_checkpointing",
    "checkpoint_dir",
    "checkpoint_every",
    "keep_checkpoints",
    "log_every",
    "max_grad_norm",
)


def load_plan(keys: tuple[str, ...] = TRAINING_KEYS) -> dict[str, Any]:
    """Read plan.json (or the file named by LAUNCH_PLAN), relative to the job folder."""
    path = Path(os.environ.get("LAUNCH_PLAN") or "plan.json")
    if not path.is_absolute():
        path = SCRIPT_DIR / path
    with open(path, encoding="utf-8") as f:
        plan = json.load(f)
    missing = [key for key in keys if key not in plan]
    if missing:
        raise SystemExit(f"launch: {path} lacks {', '.join(missing)}")
    return plan


def merge_stderr() -> None:
    """One stream, in the order it was written, when the provider asks (LAUNCH_MERGE_STDERR):
    torchrun copies a rank's stdout and stderr through separate readers, so a traceback could
    reach the log ahead of the lines printed just before it."""
    if os.environ.get("LAUNCH_MERGE_STDERR") == "1":
        sys.stdout.reconfigure(line_buffering=True)
        sys.stdout.flush()
        os.dup2(sys.stdout.fileno(), sys.stderr.fileno())


def leave() -> NoReturn:
    """Done, every checkpoint and line written: leave without the interpreter's teardown. Its C++
    static destructors sometimes abort after a CPU (gloo) job has finished ("terminate called
    without an active exception", exit status -6), which would read as a failed job."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

# -----------------------------------------------------------------------------------------------
# Processes and devices. torchrun starts one process per GPU and tells each who it is through
# RANK, LOCAL_RANK and WORLD_SIZE; a plain `python` run sets none of them and is a world of one.


@dataclasses.dataclass(frozen=True)
class Runtime:
    """Who this process is: its rank among all processes, on this node, and its device."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def init_distributed(process_group: bool) -> Runtime:
    """Pick this process's device and, when the strategy needs one, join the process group.

    NCCL is the backend for GPUs; gloo is the one that works on CPUs, which is what makes the same
    script testable on a laptop.
    """
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if process_group:
        backend = "nccl" if device.type == "cuda" else "gloo"
        device_id = device if device.type == "cuda" else None
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, device_id=device_id)
        else:
            # Started without torchrun: a group of one, with an in-process store for rendezvous.
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1, device_id=device_id
            )
    return Runtime(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_gather(value: Any, runtime: Runtime) -> list[Any]:
    """Every rank's ``value``, in rank order (a list of one without a process group)."""
    if not dist.is_initialized():
        return [value]
    values: list[Any] = [None] * runtime.world_size
    dist.all_gather_object(values, value)
    return values


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank, so that all ranks act on one decision."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# -----------------------------------------------------------------------------------------------
# Reporting. Everything the launcher needs to follow the run is one JSON object per line on
# stdout ({"launch": "<event>", ...}), so it can be read from any provider's log stream without
# parsing prose; each line also goes to EVENTS_FILE (see the settings) when the launcher names one.
# Warnings go to stderr as plain text.


def emit(event: str, **fields: Any) -> None:
    """Print one ``{"launch": event, ...}`` line and flush it at once: a job killed a moment later
    must still have told the launcher what happened. One write call for the line and its newline,
    so that lines of ranks sharing one stdout (torchrun's) never interleave mid-line; the same
    line goes to ``EVENTS_FILE`` with one append (O_APPEND: ranks' lines never interleave)."""
    # default=str: a path or a framework's number type is written as its text, never an error.
    line = json.dumps({"launch": event, **fields}, default=str) + "\n"
    sys.stdout.write(line)
    sys.stdout.flush()
    if EVENTS_FILE:
        with contextlib.suppress(OSError):
            fd = os.open(EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)


def warn(message: str) -> None:
    sys.stderr.write(f"launch: warning: {message}\n")
    sys.stderr.flush()


def peak_rss_bytes() -> int | None:
    """The process's peak resident memory: on the CPU this is the memory the plan is about, and on
    a GPU machine it is what a host out-of-memory kill is about."""
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (OSError, ValueError):
        return None
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    return peak if sys.platform == "darwin" else peak * 1024


def memory_stats(device: torch.device) -> dict[str, int | None]:
    """Peak memory so far. On a GPU these are the numbers the launcher's estimate predicts
    (``peak_allocated`` and ``peak_reserved``), so reporting them calibrates the next plan."""
    if device.type == "cuda":
        return {
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
            "rss_bytes": peak_rss_bytes(),
        }
    return {
        "peak_allocated_bytes": None,
        "peak_reserved_bytes": None,
        "rss_bytes": peak_rss_bytes(),
    }


# -----------------------------------------------------------------------------------------------
# The recipe: the user's train.py, which holds the model, the data and the loss.

RECIPE_FUNCTIONS = ("build_model", "example_batch", "training_step")


def load_recipe(recipe_file: str) -> ModuleType:
    """Import the user's recipe from its file path.

    Its directory goes first on sys.path so that the recipe's own sibling imports (``from model
    import GPT``) work as they do when the user runs it by hand. It is imported under its file's
    name, so objects pickled by name (DataLoader workers started with spawn) find it again.
    """
    path = Path(recipe_file)
    if not path.is_absolute():
        path = SCRIPT_DIR / path
    if not path.is_file():
        raise SystemExit(f"launch: recipe {path} does not exist")
    sys.path.insert(0, str(path.parent))
    name = path.stem if path.stem not in sys.modules else "launch_recipe"
    spec = importlib.util.spec_from_file_location(name, path)
    recipe = importlib.util.module_from_spec(spec)
    sys.modules[name] = recipe
    spec.loader.exec_module(recipe)
    missing = [fn for fn in RECIPE_FUNCTIONS if not callable(getattr(recipe, fn, None))]
    if missing:
        raise SystemExit(f"launch: recipe {path} does not define {', '.join(missing)}")
    return recipe


# -----------------------------------------------------------------------------------------------
# Seeds, precision and activation checkpointing: what the script's build_model() and loop ask
# for by the plan's name.


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed that is a pure function of ``parts`` (the plan's seed, a purpose, a rank, an
    index), so any random stream can be recomputed from where it is instead of replayed."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # seeds every GPU as well


def param_dtype(precision: str) -> torch.dtype | None:
    """The dtype weights are stored in: bf16 only for pure bf16. Mixed precision keeps fp32
    weights (and so fp32 gradients and optimizer states) and runs the math in bf16."""
    if precision not in ("fp32", "bf16_mixed", "bf16"):
        raise SystemExit(f"launch: unknown precision {precision!r} (fp32, bf16_mixed, bf16)")
    return torch.bfloat16 if precision == "bf16" else None


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast for bf16_mixed: matmuls run in bf16, reductions and the weights stay fp32.
    bf16 needs no loss scaling (unlike fp16), which is why fp16 is not offered."""
    if precision == "bf16_mixed":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def checkpointing_mode(plan: dict[str, Any]) -> str:
    """none, selective or full. A plan.json written before selective checkpointing existed has
    only ``activation_checkpointing`` (true meant full)."""
    mode = plan.get("checkpointing") or ("full" if plan["activation_checkpointing"] else "none")
    if mode not in ("none", "selective", "full"):
        raise SystemExit(f"launch: unknown checkpointing {mode!r} (none, selective, full)")
    return mode


def _ops(namespace: Any, *names: str) -> frozenset:
    """The ``.default`` overloads of the ops ``names`` this build of PyTorch has (the attention
    kernels differ between versions and devices)."""
    return frozenset(getattr(namespace, n).default for n in names if hasattr(namespace, n))


CheckpointPolicy = torch.utils.checkpoint.CheckpointPolicy
#: Matmuls: selective checkpointing keeps every other one's output (torchtitan's op-level
#: policy). Recomputing a matmul costs as much as computing it; keeping every one would keep
#: nearly all of a block's activations. A linear layer with a bias runs as addmm.
MATMULS = _ops(torch.ops.aten, "mm", "addmm")
#: Kept always: attention (the most expensive op of a block to recompute, and its output is
#: small with fused kernels) and a reduce-scatter's result (recomputing it would communicate
#: again).
ALWAYS_SAVED = _ops(
    torch.ops.aten,
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_fused_attention_overrideable",
) | _ops(torch.ops._c10d_functional, "reduce_scatter_tensor")


def selective_checkpoint_contexts() -> tuple[Any, Any]:
    """The forward and recompute contexts of one checkpointed block call: keep the outputs of
    attention and of every other matmul, recompute the rest (norms, activation functions,
    dropout, casts: cheap element-wise work, most of a block's activation bytes).

    The recompute must make the same choices in the same order as the forward (it takes the
    kept outputs back from the forward's store), so each pass counts its own matmuls, starting
    from zero for every call: a fresh count per call, where torchtitan keeps one per block."""
    matmuls = {False: 0, True: 0}  # forward, recompute

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in MATMULS:
            matmuls[ctx.is_recompute] += 1
            keep = matmuls[ctx.is_recompute] % 2 == 1
        else:
            keep = func in ALWAYS_SAVED
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return torch.utils.checkpoint.create_selective_checkpoint_contexts(policy)


def apply_checkpointing(model: torch.nn.Module, recipe: ModuleType, mode: str = "full") -> None:
    """Recompute each block's activations in the backward pass instead of keeping them.

    Only the modules the recipe names in ``wrap_modules()`` (its transformer blocks, say) are
    wrapped: checkpointing at block boundaries frees most activation memory for about one extra
    forward pass. ``mode`` "selective" keeps the outputs of the expensive ops inside each block
    (``selective_checkpoint_contexts``) and recomputes only the cheap ones: less memory saved,
    a fraction of the extra compute. Non-reentrant checkpointing is the variant PyTorch
    recommends (and the only one that takes a selective policy); it works with autocast, DDP
    and FSDP and with inputs that do not require gradients. A Hugging Face model is checkpointed
    by transformers itself (``gradient_checkpointing_enable``, the same non-reentrant checkpoint
    of each of its layers, with the same policy).
    """
    if not callable(getattr(recipe, "wrap_modules", None)):
        raise SystemExit(
            "launch: the plan turns on activation checkpointing, but the recipe defines no "
            "wrap_modules(); return the block classes to recompute, e.g. `return (Block,)`"
        )
    block_types = tuple(recipe.wrap_modules())
    if not any(isinstance(m, block_types) for m in model.modules()):
        names = ", ".join(t.__name__ for t in block_types)
        raise SystemExit(f"launch: the model has no module of wrap_modules() types ({names})")
    options: dict[str, Any] = {"use_reentrant": False}
    if mode == "selective":
        options["context_fn"] = selective_checkpoint_contexts
    if getattr(model, "supports_gradient_checkpointing", False) and callable(
            getattr(model, "gradient_checkpointing_enable", None)):
        # A Hugging Face model checkpoints its own layers (the same non-reentrant checkpoint):
        # it knows its caches. Wrapped from outside, a layer that updates a KV cache inside its
        # forward (T5's decoder, even with use_cache off) saves different tensors when it is
        # recomputed, and the backward fails with CheckpointError.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
        return
    options.pop("use_reentrant")
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=functools.partial(
            checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **options
        ),
        check_fn=lambda module: isinstance(module, block_types),
    )


def block_types(model: torch.nn.Module, recipe: ModuleType) -> tuple[type, ...]:
    """The classes of the blocks to shard one by one: the recipe's ``wrap_modules()``, or else
    the class that repeats in the model's ModuleLists and Sequentials and holds the most
    parameters per instance (a transformer's layers, not the MLPs inside them)."""
    if callable(getattr(recipe, "wrap_modules", None)):
        return tuple(recipe.wrap_modules())
    count: dict[type, int] = {}
    size: dict[type, int] = {}
    for container in model.modules():
        if isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)):
            for child in container:
                numel = sum(p.numel() for p in child.parameters())
                if numel:
                    count[type(child)] = count.get(type(child), 0) + 1
                    size[type(child)] = numel
    repeated = [t for t, n in count.items() if n > 1]
    if not repeated:
        warn("no wrap_modules() and no repeated blocks: the whole model is one FSDP unit, so "
             "all of its weights are gathered at once")
        return ()
    largest = max(repeated, key=lambda t: size[t])
    warn(f"no wrap_modules(): sharding each of the {count[largest]} {largest.__name__} blocks")
    return (largest,)


# -----------------------------------------------------------------------------------------------
# Checkpoints. A run that starts where checkpoints exist resumes from the newest one that loads:
# this is what lets the launcher stop a job that ran out of memory and resubmit a smaller
# micro-batch without losing the steps done. The strategy says which kind its script writes
# (its CHECKPOINTS): WholeCheckpoints where every rank holds the whole model (single, DDP),
# ShardedCheckpoints where none does (FSDP, hybrid sharding, SMP v2). Both save the same
# resume state beside the weights: the step, the data position and every rank's random state.


def checkpoint_directory(plan: dict[str, Any]) -> Path:
    """LAUNCH_CHECKPOINT_DIR wins over the plan: the provider knows which directory survives the
    job (SageMaker syncs /opt/ml/checkpoints to S3; Vertex mounts buckets under /gcs)."""
    return Path(os.environ.get("LAUNCH_CHECKPOINT_DIR") or plan["checkpoint_dir"])


def rng_state(device: torch.device) -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def restore_rng(saved: dict[str, Any], plan: dict[str, Any], runtime: Runtime) -> None:
    """Continue this rank's random stream from the checkpoint; a different world size cannot be
    continued exactly, so it gets a fresh seed derived from the step instead."""
    states = saved.get("rng") or []
    if saved.get("world_size") == runtime.world_size and len(states) == runtime.world_size:
        set_rng_state(states[runtime.rank], runtime.device)
    else:
        warn("the world size changed since the checkpoint: random state reseeded, not restored")
        seed_all(derive_seed(plan["seed"], "train", runtime.rank, saved["step"]))


def resume_state(step: int, rng_states: list[Any], plan: dict[str, Any], runtime: Runtime,
                 samples_per_rank: int) -> dict[str, Any]:
    """What every checkpoint holds besides the weights, whole or sharded: the step, every rank's
    random state, and the data position (in samples per rank, with the world size and batch
    numbers it was counted under, so a replanned run with another micro-batch resumes at it)."""
    return {
        "step": step,
        "rng": rng_states,
        "world_size": runtime.world_size,
        "micro_batch_size": plan["micro_batch_size"],
        "grad_accum_steps": plan["grad_accum_steps"],
        "data": {"samples_per_rank": samples_per_rank},
    }


def write_atomically(state: dict[str, Any], path: Path) -> None:
    """Write to a temporary file in the same directory, fsync it, then rename it into place.

    The rename is atomic, so a job killed mid-write (an out-of-memory kill, a preempted spot
    machine) leaves the previous checkpoints intact and never a truncated file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable, where the FS allows
        directory_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)


class WholeCheckpoints:
    """Rank 0 writes <dir>/step_00000012.pt after step 12: the model every rank holds whole (its
    replica's state is the model's), the optimizer state, and the resume state.

    ``unwrap``: the script's, from the model it trains to the module whose state is saved (DDP's
    ``.module``); activation-checkpoint wrappers remove their prefix from the keys themselves,
    so a checkpoint loads whether or not the resumed plan recomputes activations.
    """

    FILE = re.compile(r"^step_(\d{8})\.pt$")

    def __init__(self, unwrap: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
        self.unwrap = unwrap

    def list_checkpoints(self, directory: Path) -> list[Path]:
        """Checkpoint files in ``directory``, oldest first."""
        if not directory.is_dir():
            return []
        found = [(self.FILE.match(p.name), p) for p in directory.iterdir()]
        return [p for m, p in sorted((int(m.group(1)), p) for m, p in found if m)]

    def prune(self, directory: Path, keep: int) -> None:
        """Keep the newest ``keep`` checkpoints, and drop temporary files a killed writer left."""
        for path in self.list_checkpoints(directory)[:-keep]:
            path.unlink(missing_ok=True)
        for path in directory.glob(".step_*.tmp"):
            path.unlink(missing_ok=True)

    def save(
        self,
        directory: Path,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        plan: dict[str, Any],
        runtime: Runtime,
        samples_per_rank: int,
    ) -> Path:
        """Save everything a resumed run needs to continue as if never stopped: weights,
        optimizer state, step, data position and every rank's random state (dropout masks
        differ per rank)."""
        rng_states = all_gather(rng_state(runtime.device), runtime)
        path = directory / f"step_{step:08d}.pt"
        if runtime.rank == 0:
            state = {
                **resume_state(step, rng_states, plan, runtime, samples_per_rank),
                "model": self.unwrap(model).state_dict(),
                "optimizer": optimizer.state_dict(),
            }
            write_atomically(state, path)
            self.prune(directory, plan["keep_checkpoints"])
            emit("checkpoint", rank=0, step=step, path=str(path))
        barrier()  # nobody runs ahead (or exits) before the checkpoint is on disk
        return path

    def find(self, directory: Path, runtime: Runtime) -> tuple[Path | None, dict[str, Any] | None]:
        """The newest checkpoint that loads, and its contents.

        Rank 0 chooses and every rank loads the same file: ranks that each picked "the newest"
        could disagree while a checkpoint is being synced. A file that does not load (cut short
        by a copy, corrupted) is skipped with a warning rather than failing the run.
        """
        chosen, state = None, None
        if runtime.rank == 0:
            for path in reversed(self.list_checkpoints(directory)):
                try:
                    state = torch.load(path, map_location="cpu", weights_only=True)
                except Exception as err:
                    if is_out_of_memory(err):
                        raise
                    warn(f"skipping checkpoint {path} that does not load: {first_line(err)}")
                    continue
                if isinstance(state, dict) and {"step", "model", "optimizer"} <= state.keys():
                    chosen = path
                    break
                warn(f"skipping {path}: not a checkpoint written by this script")
            state = state if chosen is not None else None
        chosen = broadcast(chosen)
        if chosen is not None and state is None:
            state = torch.load(chosen, map_location="cpu", weights_only=True)
        return chosen, state

    def load(
        self,
        checkpoint: Path,
        saved: dict[str, Any],
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> None:
        """Put the checkpoint's weights and optimizer state into the freshly built ones."""
        self.unwrap(model).load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])


# -----------------------------------------------------------------------------------------------
# Sharded checkpoints. No rank holds the whole model, so no rank writes it: after step 12 every
# rank writes its own shards into <dir>/step_00000012/ with torch.distributed.checkpoint (DCP),
# then rank 0 writes launch.pt there (the step, the data position, every rank's random state).
# launch.pt is written last, so a step directory without it is one a killed job left half-written
# and is never resumed from; a run that starts where checkpoints exist resumes from the newest
# complete one. DCP records how each tensor was sharded and reads back whichever slices the
# loading ranks need, so a run with another number of processes (or another mesh) resumes from
# the same checkpoint.
#
# A checkpoint is read as untrusted. On a cloud its folder is a bucket prefix (SageMaker syncs
# /opt/ml/checkpoints to S3, Vertex mounts a bucket under /gcs) that every job of the account can
# write, and DCP's own reader unpickles from it without restriction twice over: .metadata with
# pickle.load, and the state's non-tensor values (the optimizer's lr, betas...) with
# torch.load(weights_only=False). A planted pickle would run as this job. So every read goes
# through CheckedReader: .metadata through an unpickler that resolves only the names DCP's
# metadata is made of (metadata_global), every torch.load of the shards with weights_only=True,
# and launch.pt with weights_only=True too. A checkpoint that names anything else is refused with
# one warning and skipped like a corrupt one: the run resumes from an older checkpoint, or starts
# fresh. Skipped, not fatal: nothing of it ran, and failing would let anyone who can write the
# prefix stop every later attempt of the job.
# Why not the alternatives: torch's weights_only unpickler cannot read .metadata (DCP pickles it
# with protocol 4, whose FRAME opcode that unpickler rejects, as of torch 2.13); a manifest of
# SHA-256 sums written beside the checkpoint is rewritten by whoever rewrites the checkpoint, and
# keying it (HMAC) needs a secret this job has and the account's other jobs do not: there is none
# (they share the service account, and a job's environment is readable by whoever can describe
# it). What remains: whoever can write the prefix can still plant a checkpoint that loads, i.e.
# wrong weights or a wrong step, but not code.



class ShardedCheckpoints:
    """Every rank writes its own shards of step 12 into <dir>/step_00000012/ with DCP; rank 0
    then writes launch.pt there (see the comment above). DCP is imported on first use: a script
    that never shards does not pay the import."""

    DIRECTORY = re.compile(r"^step_(\d{8})$")
    COMPLETE = "launch.pt"  # written last: its presence makes a step directory a checkpoint

    def list_checkpoints(self, directory: Path) -> list[Path]:
        """Complete checkpoints (step directories holding launch.pt) in ``directory``, oldest
        first."""
        if not directory.is_dir():
            return []
        found = [(self.DIRECTORY.match(p.name), p) for p in directory.iterdir()]
        complete = [(int(m.group(1)), p) for m, p in found if m and (p / self.COMPLETE).is_file()]
        return [p for _, p in sorted(complete)]

    def prune(self, directory: Path, keep: list[str]) -> None:
        """Delete every step directory but ``keep``: older checkpoints and half-written ones."""
        for path in directory.iterdir():
            if self.DIRECTORY.match(path.name) and path.name not in keep:
                remove_checkpoint(path)

    def save(
        self,
        directory: Path,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        plan: dict[str, Any],
        runtime: Runtime,
        samples_per_rank: int,
    ) -> Path:
        """Save everything a resumed run needs to continue as if never stopped: weights,
        optimizer state, step, data position and every rank's random state (dropout masks differ
        per rank).

        Each node's first process does the directory housekeeping, because on a multi-node job
        each node may write to a disk of its own (SageMaker syncs each node's
        /opt/ml/checkpoints to the same S3 prefix), while on a shared file system they all see
        the same files."""
        from torch.distributed.checkpoint import state_dict_saver

        rng_states = all_gather(rng_state(runtime.device), runtime)
        path = directory / f"step_{step:08d}"
        if runtime.local_rank == 0:
            remove_checkpoint(path)  # a killed attempt's half-written copy of this step
        barrier()
        state_dict_saver.save(sharded_state(model, optimizer), checkpoint_id=path)
        barrier()  # every rank's shards (and DCP's .metadata) are written
        if runtime.rank == 0:
            state = resume_state(step, rng_states, plan, runtime, samples_per_rank)
            write_atomically(state, path / self.COMPLETE)
            emit("checkpoint", rank=0, step=step, path=str(path))
        # Rank 0 decides what is kept (by name), so nodes that never see launch.pt (their own
        # disk) keep the same checkpoints.
        newest = (self.list_checkpoints(directory)[-plan["keep_checkpoints"]:]
                  if runtime.rank == 0 else [])
        keep = broadcast([p.name for p in newest])
        if runtime.local_rank == 0:
            self.prune(directory, keep)
        barrier()  # nobody runs ahead (or exits) before the checkpoint is complete
        return path

    def find(self, directory: Path, runtime: Runtime) -> tuple[Path | None, dict[str, Any] | None]:
        """The newest complete checkpoint whose shards are all there, and its launch.pt.

        Rank 0 chooses and tells the others: ranks that each picked "the newest" could disagree
        while a checkpoint is being synced, and DCP needs every rank to load the same one. A
        checkpoint that does not load is skipped with a warning rather than failing the run."""
        chosen, saved = None, None
        if runtime.rank == 0:
            for path in reversed(self.list_checkpoints(directory)):
                try:
                    state = torch.load(path / self.COMPLETE, map_location="cpu", weights_only=True)
                    missing = missing_shards(path)
                except UntrustedCheckpoint as err:
                    warn(f"refusing checkpoint {path}: {err}; nothing in it was run, and it is "
                         "skipped (its folder is writable by other jobs)")
                    continue
                except Exception as err:
                    if is_out_of_memory(err):
                        raise
                    warn(f"skipping checkpoint {path} that does not load: {first_line(err)}")
                    continue
                if missing:
                    warn(f"skipping checkpoint {path}: missing or cut short: {', '.join(missing)}")
                    continue
                chosen, saved = path, state
                break
        return broadcast((chosen, saved))

    def load(
        self,
        checkpoint: Path,
        saved: dict[str, Any],
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> None:
        """Read this rank's slices of the checkpoint into the model's and optimizer's shards (DCP
        loads in place, into the tensors ``sharded_state`` returns), then hand them back to the
        optimizer, which keys its state by position."""
        from torch.distributed.checkpoint import state_dict_loader
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = sharded_state(model, optimizer)
        state_dict_loader.load(
            state, checkpoint_id=checkpoint, storage_reader=checked_reader(checkpoint)
        )
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )


def sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's shards of the model and optimizer state, keyed by parameter name: the names of
    the plain model (no FSDP or activation checkpointing prefixes), with the optimizer's state
    keyed by them too instead of by position. That is what lets a differently sharded or wrapped
    run load them."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def remove_checkpoint(path: Path) -> None:
    import shutil  # only this function needs it

    # Other nodes may be deleting the same directory on a shared file system: that is fine.
    shutil.rmtree(path, ignore_errors=True)


class UntrustedCheckpoint(Exception):
    """A checkpoint file names something a checkpoint of this script never holds: it was refused
    before anything it names was called."""


def metadata_global(module: str, name: str) -> Any:
    """What the unpickler of DCP's .metadata may resolve ``module.name`` to: DCP's metadata
    dataclasses and enum, its storage record (_StorageInfo), torch.Size, torch's dtypes, layouts
    and memory formats, pathlib's POSIX paths (DCP records the checkpoint_id it was given), and
    two plain containers. Any other name is refused before its module is imported (importing a
    module can run code); those modules are loaded already."""
    import enum  # only this function needs it

    value = None
    if module == "torch":
        value = getattr(torch, name, None)
        kinds = (torch.dtype, torch.layout, torch.memory_format)
        value = value if value is torch.Size or isinstance(value, kinds) else None
    elif (module, name) == ("torch.serialization", "_get_layout"):
        value = torch.serialization._get_layout  # a name -> torch.layout lookup
    elif module == "torch.distributed.checkpoint.metadata":
        value = getattr(sys.modules[module], name, None)
        is_data = isinstance(value, type) and value.__module__ == module and (
            dataclasses.is_dataclass(value) or issubclass(value, enum.Enum))
        value = value if is_data else None
    elif (module, name) == ("torch.distributed.checkpoint.filesystem", "_StorageInfo"):
        value = getattr(sys.modules[module], name)
    elif module in ("pathlib", "pathlib._local") and name in ("PosixPath", "PurePosixPath"):
        import pathlib  # only this function needs it

        value = getattr(pathlib, name)
    elif (module, name) in (("collections", "OrderedDict"), ("builtins", "set"),
                            ("builtins", "frozenset")):
        value = getattr(sys.modules[module], name)
    if value is None:
        raise UntrustedCheckpoint(f"its .metadata names {module}.{name}, which DCP never writes")
    return value


def read_checkpoint_metadata(path: Path) -> Any:
    """DCP's metadata, unpickled with only ``metadata_global``'s names, and every shard file it
    names inside the checkpoint's folder."""
    import pickle  # only this function unpickles a file, and only through this class

    # The modules metadata_global resolves names in, imported (and so run) before anything is
    # unpickled: DCP's own, loaded on first use in this file.
    import torch.distributed.checkpoint.filesystem
    import torch.distributed.checkpoint.metadata  # noqa: F401

    class MetadataUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            return metadata_global(module, name)

    with path.open("rb") as stream:
        metadata = MetadataUnpickler(stream).load()
    if not isinstance(metadata, sys.modules["torch.distributed.checkpoint.metadata"].Metadata):
        raise UntrustedCheckpoint(f"its {path.name} holds a {type(metadata).__name__}")
    for item in (getattr(metadata, "storage_data", None) or {}).values():
        name = getattr(item, "relative_path", None)
        if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
            raise UntrustedCheckpoint(f"its {path.name} names a shard file {name!r}")
    return metadata


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    """Every torch.load in the block loads with weights_only=True, whatever its caller asked:
    DCP's DefaultLoadPlanner.load_bytes asks for weights_only=False."""
    load = torch.load

    def restricted(*args: Any, **kwargs: Any) -> Any:
        return load(*args, **{**kwargs, "weights_only": True})

    torch.load = restricted
    try:
        yield
    finally:
        torch.load = load


def checked_reader(path: Path) -> Any:
    """DCP's file reader for ``path`` with nothing unpickled unrestricted (see the comment
    above)."""
    return _checked_reader_type()(path)


@functools.cache
def _checked_reader_type() -> type:
    """The reader's class, made on first use: its base is DCP's FileSystemReader, whose import
    only a sharded script pays."""
    from torch.distributed.checkpoint import FileSystemReader

    class CheckedReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            rank = kwargs.get("rank")  # DCP's fallback to one rank's own metadata file
            name = ".metadata" if rank is None else f"__{rank}.metadata"
            metadata = read_checkpoint_metadata(Path(self.path) / name)
            if hasattr(metadata, "storage_meta"):  # as FileSystemReader.read_metadata does
                if metadata.storage_meta is None:
                    metadata.storage_meta = sys.modules[
                        "torch.distributed.checkpoint.metadata"].StorageMeta()
                metadata.storage_meta.load_id = getattr(self, "load_id", None)
            return metadata

        def read_data(self, *args: Any, **kwargs: Any) -> Any:
            with weights_only_loads():  # FileSystemReader's read is done when it returns
                return super().read_data(*args, **kwargs)

    return CheckedReader


def missing_shards(path: Path) -> list[str]:
    """The files DCP's metadata names that are absent or shorter than the data it expects in
    them (a copy or an S3 sync cut short). Without this check DCP would find out midway through
    loading, with the model half overwritten."""
    if not (path / ".metadata").is_file():
        return [".metadata"]
    needed: dict[str, int] = {}  # file -> the bytes it must have
    for item in read_checkpoint_metadata(path / ".metadata").storage_data.values():
        end = item.offset + item.length
        needed[item.relative_path] = max(needed.get(item.relative_path, 0), end)
    return [
        name
        for name, size in sorted(needed.items())
        if not (path / name).is_file() or (path / name).stat().st_size < size
    ]


# -----------------------------------------------------------------------------------------------
# Data. A resumed run must see exactly the micro-batches an uninterrupted run would have seen,
# or its losses (and the model it ends with) differ. The default stream is computed from the
# micro-batch's index; a recipe's loader is rebuilt and fast-forwarded.


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Run a block under its own seed and leave the training random state (dropout) untouched,
    so that producing data never shifts the model's random numbers."""
    python_state = random.getstate()
    devices = [device.index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        random.seed(seed)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(python_state)


def synthetic_stream(
    recipe: ModuleType, batch_size: int, seed: int, runtime: Runtime, start: int
) -> Iterator[Any]:
    """Endless ``example_batch`` micro-batches. Micro-batch ``i`` on rank ``r`` is drawn under a
    seed derived from (seed, r, i): reproducible, different on each rank (as a data-parallel
    shard would be), and a resumed run starts at ``start`` without replaying anything."""
    for index in itertools.count(start):
        with seeded(derive_seed(seed, "example_batch", runtime.rank, index), runtime.device):
            batch = recipe.example_batch(batch_size)
        yield batch


def loader_stream(loader: Any, seed: int, runtime: Runtime) -> Iterator[Any]:
    """The recipe's loader, epoch after epoch.

    Each epoch starts under a seed derived from (seed, epoch): a shuffling DataLoader draws its
    order from the global random state when it starts, and that draw must not depend on when a
    resumed run happens to start the epoch. The seed is the same on every rank, so shuffles that
    every rank must agree on (a sharded sampler) do agree.
    """
    for epoch in itertools.count():
        set_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)  # DistributedSampler reshuffles per epoch
        with seeded(derive_seed(seed, "epoch", epoch), runtime.device):
            batches = iter(loader)
            first = next(batches, None)
        if first is None:
            raise SystemExit(
                f"launch: build_dataloader() yielded no batch in epoch {epoch}; return a "
                "re-iterable (a DataLoader, a list) or an endless iterator, not a generator"
            )
        yield from itertools.chain([first], batches)


def move_to_device(batch: Any, device: torch.device, float_dtype: torch.dtype | None) -> Any:
    """Move a batch (a tensor, or dicts, lists and tuples of them, nested) to ``device``.

    Under pure bf16 the weights are bf16, so floating inputs are cast too (integer token ids are
    left alone); otherwise a matmul would mix dtypes and fail.
    """
    if isinstance(batch, torch.Tensor):
        dtype = float_dtype if float_dtype is not None and batch.is_floating_point() else None
        return batch.to(device=device, dtype=dtype, non_blocking=True)
    if isinstance(batch, Mapping):
        return {key: move_to_device(value, device, float_dtype) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(move_to_device(value, device, float_dtype) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(value, device, float_dtype) for value in batch)
    return batch


def micro_batches_to_skip(
    saved: dict[str, Any] | None, plan: dict[str, Any], runtime: Runtime
) -> int:
    """How far into the data stream a resumed run starts.

    The checkpoint counts samples per rank, not micro-batches, because a replanned run may use
    another micro-batch size (the usual fix for running out of memory): 80 samples are 10
    micro-batches of 8 or 20 of 4. It is exact when the world size and micro-batch size divide
    evenly, as they do when the global batch is kept.
    """
    if saved is None:
        return 0
    consumed = saved["data"]["samples_per_rank"] * saved["world_size"]  # samples, all ranks
    per_micro_batch = plan["micro_batch_size"] * runtime.world_size
    if consumed % per_micro_batch:
        warn(
            f"the checkpoint consumed {consumed} samples, not a whole number of micro-batches "
            f"of {per_micro_batch} (all ranks): the data stream resumes near, not at, its position"
        )
    return consumed // per_micro_batch


# -----------------------------------------------------------------------------------------------
# Running out of memory. The launcher's next plan depends on *where* memory ran out (a forward
# pass that grows with the micro-batch, an optimizer step that does not) and by how much, so an
# out-of-memory error is reported as one JSON line with the phase, the step and the allocator's
# numbers, and the process exits with status 1.

OOM_MESSAGES = (
    "out of memory",  # CUDA ("CUDA out of memory"), and the HIP and XPU allocators
    "DefaultCPUAllocator: can't allocate memory",
    "not enough memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
)
SIZE_UNITS = {
    "": 1,
    "B": 1,
    "BYTES": 1,
    "KB": 2**10,
    "KIB": 2**10,
    "MB": 2**20,
    "MIB": 2**20,
    "GB": 2**30,
    "GIB": 2**30,
    "TB": 2**40,
    "TIB": 2**40,
}
REQUESTED = re.compile(r"tried to allocate\s+([0-9.]+)\s*(bytes|[KMGT]i?B|B)?", re.IGNORECASE)
# torch.OutOfMemoryError: 2.4.1 has it (the oldest torch a default image carries); a torch
# older than that may only have the CUDA one.
OUT_OF_MEMORY_ERROR = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


@dataclasses.dataclass
class Progress:
    """Where the training loop is, so that an out-of-memory report can say so."""

    phase: str = "setup"  # setup, resume, data, forward, backward, optimizer, checkpoint
    step: int = 0  # the optimizer step being computed, from 1
    micro_step: int = 0  # the micro-batch within that step, from 1 to grad_accum_steps
    batch_shapes: Any = None  # the micro-batch's tensors' shapes and dtypes (batch_shapes)


def batch_shapes(batch: Any) -> Any:
    """A micro-batch's structure with each tensor's shape and dtype, no values. An out-of-memory
    report carries it: data that grows partway through a run (longer sequences) overflows at
    shapes the plan was not sized on, and the launcher re-traces the step at these."""
    if isinstance(batch, torch.Tensor):
        return {"shape": list(batch.shape), "dtype": str(batch.dtype).removeprefix("torch.")}
    if isinstance(batch, Mapping):
        return {"dict": {str(key): batch_shapes(value) for key, value in batch.items()}}
    if isinstance(batch, (list, tuple)):
        return {"list": [batch_shapes(value) for value in batch]}
    return {"value": batch if isinstance(batch, (bool, int, float, str)) else None}


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:500]


def is_out_of_memory(err: BaseException | None) -> bool:
    """True for torch.OutOfMemoryError, Python's MemoryError and the CPU allocator's RuntimeError,
    also when one of them is the cause of the error actually raised."""
    for _ in range(8):  # follow a few links of __cause__ / __context__, not a cycle
        if err is None:
            return False
        if isinstance(err, (OUT_OF_MEMORY_ERROR, MemoryError)):
            return True
        if isinstance(err, RuntimeError) and any(m in str(err) for m in OOM_MESSAGES):
            return True
        err = err.__cause__ or err.__context__
    return False


def requested_bytes(message: str) -> int | None:
    """The size of the allocation that failed, from "Tried to allocate 2.00 GiB" (CUDA) or "you
    tried to allocate 1073741824 bytes" (CPU)."""
    match = REQUESTED.search(message)
    if match is None:
        return None
    return int(float(match.group(1)) * SIZE_UNITS[(match.group(2) or "").upper()])


def device_memory(device: torch.device) -> dict[str, int | None]:
    """The CUDA allocator's view at the moment of failure. It tells apart memory held by live
    tensors (allocated), by the caching allocator (reserved minus allocated: fragmentation) and by
    other processes or the CUDA context (capacity minus free minus reserved)."""
    names = (
        "allocated_bytes",
        "reserved_bytes",
        "max_allocated_bytes",
        "capacity_bytes",
        "free_bytes",
    )
    stats: dict[str, int | None] = dict.fromkeys(names)
    if device.type != "cuda":
        return stats
    with contextlib.suppress(Exception):  # reporting must not fail because the device did
        stats["allocated_bytes"] = torch.cuda.memory_allocated(device)
        stats["reserved_bytes"] = torch.cuda.memory_reserved(device)
        stats["max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        stats["free_bytes"], stats["capacity_bytes"] = torch.cuda.mem_get_info(device)
    return stats


def report_out_of_memory(
    err: BaseException, progress: Progress, plan: dict[str, Any], runtime: Runtime
) -> NoReturn:
    """Print the ``oom`` line (and write the provider's failure file), then exit with status 1."""
    report = {
        "rank": runtime.rank,
        "phase": progress.phase,
        "step": progress.step,
        "micro_step": progress.micro_step,
        "micro_batch_size": plan["micro_batch_size"],
        "grad_accum_steps": plan["grad_accum_steps"],
        "batch_shapes": progress.batch_shapes,
        "device": runtime.device.type,
        "message": first_line(err),
        "requested_bytes": requested_bytes(str(err)),
        **device_memory(runtime.device),  # read before anything is freed
    }
    # The original error, for a person reading stderr: formatted now (it needs the frames),
    # printed after the ``oom`` line. The launcher stops the job within a fraction of a second
    # of seeing the allocator's message in the traceback; freeing memory below can take longer
    # than that on a loaded machine, and an ``oom`` line not yet printed then is never printed.
    original = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    # Drop the frames (and the tensors they hold) before printing, so the few small allocations
    # printing needs cannot fail in turn. Both calls only release memory.
    err.__traceback__ = None
    gc.collect()
    if runtime.device.type == "cuda":
        torch.cuda.empty_cache()
    emit("oom", **report)
    sys.stderr.write(original)
    write_failure_file({"launch": "oom", **report})
    sys.stderr.flush()
    # os._exit, not sys.exit: the other ranks may be blocked in a collective with this one, and
    # tearing down the process group at interpreter exit could wait for them forever.
    os._exit(1)


def write_failure_file(report: dict[str, Any]) -> None:
    """The report in the provider's failure file (FAILURE_FILE), where it has one: SageMaker
    shows it as the job's FailureReason. "x": the first rank to fail wins."""
    if FAILURE_FILE and Path(FAILURE_FILE).parent.is_dir():
        with contextlib.suppress(OSError), open(FAILURE_FILE, "x") as f:
            f.write(json.dumps(report))
