"""The answer: what failed, why, and the next plan change in words."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from launcher import remedies
from launcher.failures._sizes import Figures, GiB, MiB
from launcher.units import format_bytes

FailureKind = Literal["gpu_oom", "host_oom", "other", "none"]
Cause = Literal["activations", "model_states", "fragmentation", "other_process", "shared_memory",
                "unknown"]

# Phases, as the launcher's templates name them ("setup", "resume", "data", "forward", "backward",
# "optimizer", "checkpoint", "eval") plus "init" for model construction and "evaluation" for an
# evaluation loop, read off a traceback.
MODEL_STATE_PHASES = frozenset({"optimizer", "init", "setup", "resume", "checkpoint"})
ACTIVATION_PHASES = frozenset(remedies.ACTIVATION_PHASES)  # forward, backward, data, evaluation

# Memory outside this process's allocator that a healthy process explains by itself: the CUDA
# context, cuBLAS/cuDNN workspaces and NCCL buffers take from a few hundred MiB to about 2 GiB.
# Beyond that, and beyond a quarter of the device, something else holds the GPU (case 044: 10.5
# of 23.65 GiB; case 038's 7 GiB of 80 GiB and case 045's 1.55 GiB of 6 GiB stay below).
OUTSIDE_FLOOR = 2 * GiB
OUTSIDE_SHARE = 0.25
# Other processes the 2.1+ message lists by pid: any that hold a tenth of the device count.
OTHER_PROCESS_FLOOR = 1 * GiB
OTHER_PROCESS_SHARE = 0.10
# "Free" above the request by this much, yet the allocation failed: the bytes exist but cannot be
# had as one block (case 032: 2.35 GiB free, 20 MiB refused). Below it, rounding explains the gap
# (case 038: 791.5 MiB free vs a 774 MiB request rounded up to a 2 MiB multiple plus overhead).
FREE_SLACK = 256 * MiB
# The caching allocator always keeps some reserved-but-unallocated slack (block rounding, the
# small-block pool, the tails of split segments): a few percent of what it reserves (case 045:
# 0.31 of 4.42 GiB). Idle reserve is fragmentation worth an allocator setting when it could hold
# the request *and* is a fifth or more of the reserve (case 026: 8.65 of 21.27 GiB; 029: 5.94 of
# 10.46 GiB).
FRAGMENTED_SHARE = 0.2


@dataclass(frozen=True)
class Diagnosis:
    """What a log says failed, and what to change.

    ``failure`` and ``cause`` follow the ``launch explain --json`` contract of the design brief;
    the byte figures are the allocator's own, None where the log does not give them (never an
    estimate); ``line`` is the 1-based line of the root-cause message, ``excerpt`` that message
    cleaned of colour codes and prefixes.
    """

    failure: FailureKind
    cause: Cause | None
    requested_bytes: int | None = None
    capacity_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    free_bytes: int | None = None
    rank: int | None = None
    line: int | None = None
    excerpt: str = ""
    advice: str = ""
    phase: str | None = None
    signature: str = ""
    host: str | None = None
    note: str = ""

    @property
    def is_oom(self) -> bool:
        return self.failure in ("gpu_oom", "host_oom")

    def to_dict(self) -> dict[str, Any]:
        """The ``launch explain --json`` object: the brief's fields, then phase, signature, host
        and note."""
        return asdict(self)

    def summary(self) -> str:
        """One line a person can act on: "gpu_oom (activations) at line 812, rank 3: ..."."""
        if self.failure == "none":
            return f"no failure found{': ' + self.note if self.note else ''}"
        head = self.failure + (f" ({self.cause})" if self.cause else "")
        where = []
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        elif self.host:
            where.append(self.host)
        if self.phase:
            where.append(f"in {self.phase}")
        text = head + (" at " + ", ".join(where) if where else "")
        return f"{text}: {self.advice}" if self.advice else text


def other_process_bytes(fig: Figures) -> int | None:
    """Bytes of this GPU that neither this process's allocator nor its free pool accounts for."""
    if fig.other_processes is not None:
        return fig.other_processes
    if fig.capacity is None or fig.free is None:
        return None
    if fig.this_process is not None:
        return fig.capacity - fig.free - fig.this_process
    if fig.reserved is not None:
        return fig.capacity - fig.free - fig.reserved
    return None


def gpu_cause(fig: Figures, phase: str | None) -> tuple[Cause, str]:
    """The cause of a GPU out-of-memory error and the reason, in words.

    Figures first, because they are measurements: memory held elsewhere (no plan change helps),
    then memory this allocator holds but cannot hand out (an allocator setting helps); then the
    phase, because it says what was being allocated: model states (optimizer step, model
    construction, checkpointing; no micro-batch helps) or activations (forward, backward,
    evaluation; the micro-batch is the lever).
    """
    outside = other_process_bytes(fig)
    if outside is not None and fig.capacity:
        if fig.other_processes is not None:
            significant = outside >= max(OTHER_PROCESS_FLOOR, OTHER_PROCESS_SHARE * fig.capacity)
        else:
            significant = outside >= max(OUTSIDE_FLOOR, OUTSIDE_SHARE * fig.capacity)
        if significant:
            return "other_process", (f"{format_bytes(outside, 2)} of the "
                                     f"{format_bytes(fig.capacity, 2)} GPU is held "
                                     "outside this process's allocator")
    if fig.reserved is not None and fig.allocated is not None and fig.requested is not None:
        cached = fig.reserved - fig.allocated
        if cached >= fig.requested and cached >= FRAGMENTED_SHARE * fig.reserved:
            return "fragmentation", (f"{format_bytes(cached, 2)} is reserved but unallocated, "
                                     f"more than the {format_bytes(fig.requested, 2)} requested")
    if fig.free is not None and fig.requested is not None:
        if fig.free >= 2 * fig.requested and fig.free - fig.requested >= FREE_SLACK:
            return "fragmentation", (f"{format_bytes(fig.free, 2)} was free yet "
                                     f"{format_bytes(fig.requested, 2)} "
                                     "could not be had in one block")
    if phase in MODEL_STATE_PHASES:
        return "model_states", _PHASE_REASON[phase]
    if phase in ACTIVATION_PHASES:
        return "activations", _PHASE_REASON[phase]
    return "unknown", ""


_PHASE_REASON = {
    "optimizer": "it ran out in the optimizer step, whose state does not depend on the batch",
    "init": "it ran out building or wrapping the model, before any batch",
    "setup": "it ran out setting up the model, before any batch",
    "resume": "it ran out loading the checkpoint, before any batch",
    "checkpoint": "it ran out saving a checkpoint",
    "forward": "it ran out in the forward pass, whose activations grow with the micro-batch",
    "backward": "it ran out in the backward pass, whose activations grow with the micro-batch",
    "evaluation": "it ran out in the evaluation loop, at the evaluation batch size",
    "eval": "it ran out in the evaluation loop, at the evaluation batch size",
    "data": "it ran out moving a batch to the device",
}


#: Readings that are host memory only probably: what each rests on (the note) and what would
#: confirm it (said in the advice). ``kill``: a bare SIGKILL (exit 137 / -9, "Signal 9 (SIGKILL)
#: received by PID", the shell's "Killed") off a managed platform: the kernel's OOM killer sends
#: most of them, but not all. ``onednn``: oneDNN's "could not create a primitive" with nothing
#: in the log showing memory pressure and no memory cap known.
PROBABLE_NOTES = {
    "kill": ("probable host OOM, not a certain one: killed by SIGKILL with no memory message in "
             "the log; the kernel's out-of-memory killer sends most such kills, but a user's "
             "kill -9, a scheduler's limit or torchrun's escalation after SIGTERM send them too"),
    "onednn": ("probable host OOM, not a certain one: oneDNN says it could not create a primitive "
               "when its scratchpad cannot be allocated, and also when it has no implementation "
               "for the shapes, dtype or CPU; nothing in the log shows memory pressure and the run "
               "is not known to be under a memory cap"),
}
CONFIRM = {
    "kill": ("confirm with `dmesg | grep -i \"killed process\"` on the node (the kernel's OOM "
             "killer names the process it killed), the container's OOMKilled status (`docker "
             "inspect`, `kubectl describe pod`) or the node's memory graph at that time"),
    "onednn": ("confirm by rerunning with ONEDNN_VERBOSE=all (an out_of_memory status is memory, "
               "unimplemented is not) or by comparing the job's peak memory (`/usr/bin/time -v`, "
               "the node's memory graph) with the machine's RAM or its cap"),
}


def host_cause(signature: str, cause_hint: str | None, phase: str | None,
               device: str | None) -> Cause:
    if cause_hint == "shared_memory":
        return "shared_memory"
    if device == "cpu" and phase in ACTIVATION_PHASES:
        return "activations"
    if device == "cpu" and phase in MODEL_STATE_PHASES:
        return "model_states"
    return "unknown"


_OTHER_ADVICE = {
    "nccl_timeout": "not a memory failure: a collective timed out because a rank stopped or hung; "
                    "find the first rank that failed (its own error comes before the timeouts)",
    "nccl_error": "not a memory failure: the process group broke; look for the first rank's own "
                  "error before these, else check the network (NCCL_DEBUG=INFO)",
    "impossible_allocation_size": "not a memory shortage: the allocator was handed an impossible "
                                  "size after a collective failed; look for the NCCL timeout or "
                                  "error that came first",
    "illegal_memory_access": "not a memory shortage: a kernel read or wrote out of bounds; rerun "
                             "with CUDA_LAUNCH_BLOCKING=1 to find the op (often a bad index)",
    "device_side_assert": "not a memory shortage: an index out of range on the GPU (labels vs "
                          "number of classes, embedding ids vs vocabulary); rerun with "
                          "CUDA_LAUNCH_BLOCKING=1",
    "cuda_error": "not a memory shortage: a CUDA/cuDNN/cuBLAS error; check that the driver, CUDA "
                  "and cuDNN versions match the torch build, and rerun with CUDA_LAUNCH_BLOCKING=1",
    "disk_full": "not a memory failure: the disk is full; write checkpoints to a larger volume or "
                 "a bucket, or keep fewer of them",
    "preemption": "not a memory failure: the machine was preempted; resubmit the same plan, which "
                  "resumes from the last checkpoint",
    "segfault": "not a memory shortage: the process crashed in native code; check library "
                "versions (and /dev/shm if DataLoader workers were involved)",
    "too_many_open_files": "not a memory shortage: the open-file limit; raise `ulimit -n` or use "
                           "torch.multiprocessing.set_sharing_strategy('file_system')",
    "sigterm": "the job was told to stop (SIGTERM): look for the failure that came first, or a "
               "cancellation or preemption",
    "child_failed": "a worker failed: its own error, earlier in the log, is the cause",
    "dataloader_exited": "a DataLoader worker died: look just before for a shared-memory (bus "
                         "error) or host-memory (Killed) message; otherwise set num_workers=0 "
                         "to see the worker's own error",
    "exit_status": "the job exited with an error: see the excerpt",
    "traceback": "the job raised an exception: see the excerpt",
}


_HOST_REMEDY = ("lower DataLoader num_workers, load weights lazily (low_cpu_mem_usage / mmap) and "
                "avoid holding whole datasets in memory, or pick a machine with more RAM")
# oneDNN's scratchpad and buffers are the op's: they grow with the batch it computes.
_ONEDNN_REMEDY = (f"{remedies.SMALLER_MICRO_BATCH.advice} (global batch unchanged), since "
                  "oneDNN's scratchpad and buffers grow with it, or raise the memory cap / pick a "
                  "machine with more RAM")


def advice(failure: str, cause: str | None, phase: str | None, signature: str, reason: str,
           micro_batch_size: int | None = None, probable: str = "") -> str:
    """The next plan change, in words a person can check: the remedies' own advice
    (``launcher/remedies.py``), in their order, where it is a remedy of the plan. ``probable``:
    a host-memory reading that is only probable (a key of :data:`PROBABLE_NOTES`): the advice
    says so and what would confirm it before the remedy."""
    because = f" ({reason})" if reason else ""
    if failure == "none":
        return "nothing to change: the log reports no failure"
    if failure == "other":
        if signature.startswith("exception:"):
            return f"not a memory failure: {signature.split(':', 1)[1]} was raised; see the excerpt"
        return _OTHER_ADVICE.get(signature, "not a memory failure: see the excerpt")
    if failure == "host_oom":
        if cause == "shared_memory":
            return ("shared memory (/dev/shm) ran out, filled by DataLoader workers passing "
                    "batches: give the container more (docker --shm-size, a larger /dev/shm "
                    "volume) or lower num_workers; GPU memory was not the limit")
        if cause == "activations" and phase in remedies.EVALUATION_PHASES:
            return (f"{remedies.EVALUATION_ADVICE}: the CPU ran out of RAM in the evaluation "
                    "loop")
        if cause == "activations":
            return (f"{remedies.SMALLER_MICRO_BATCH.advice} (global batch unchanged): the CPU "
                    "ran out of RAM for this step's activations")
        if cause == "model_states":
            return ("the model states do not fit in host RAM: pick a machine with more memory or "
                    "load weights lazily (low_cpu_mem_usage, meta device, mmap)")
        onednn = signature == "onednn_primitive"
        remedy = _ONEDNN_REMEDY if onednn else _HOST_REMEDY
        where = " in oneDNN" if onednn else ""
        if probable == "kill":
            # No plan change is certain here: the remedies are the host ones, never the
            # micro-batch (a kill leaves no traceback, so no phase says what was allocated).
            return (f"probably host RAM ran out (not GPU memory), though a bare SIGKILL does not "
                    f"say so: {CONFIRM['kill']}. If it did, {remedy}; if none of them shows a "
                    "memory kill, something else stopped the job and the plan need not change")
        if probable == "onednn":
            return (f"probably host RAM ran out{where} (not GPU memory), though the message does "
                    f"not say so: {CONFIRM['onednn']}. If it did, {remedy}; if not, the op is not "
                    "supported for this CPU, shape or dtype (torch.backends.mkldnn.enabled = "
                    "False runs it without oneDNN)")
        return f"host RAM ran out{where} (not GPU memory): {remedy}"
    # gpu_oom
    if cause == "other_process":
        return ("free the GPU and resubmit the same plan: another process holds its memory"
                f"{because}; stop it, or make every rank call torch.cuda.set_device(local_rank) "
                "before its first CUDA call so ranks do not share GPU 0")
    if cause == "fragmentation":
        then = (remedies.EVALUATION_ADVICE if phase in remedies.EVALUATION_PHASES
                else remedies.SMALLER_MICRO_BATCH.advice)
        return f"{remedies.EXPANDABLE_SEGMENTS.advice}{because}; if it fails again, {then}"
    if cause == "model_states":
        return ("shard the model states: weights, gradients and optimizer state do not fit on "
                f"one GPU at any batch size{because}; use FSDP full sharding on one node or "
                "hybrid sharding across nodes (or offload optimizer state to the CPU); a smaller "
                "micro-batch or more gradient accumulation will not help")
    if cause == "activations":
        if phase in remedies.EVALUATION_PHASES:
            return f"{remedies.EVALUATION_ADVICE}{because}; the training plan can stay as it is"
        if micro_batch_size == 1:
            return (f"{remedies.CHECKPOINTING.advice}: the micro-batch is already 1{because}; "
                    f"if that is not enough, {remedies.SHARDING.advice}")
        return (f"{remedies.SMALLER_MICRO_BATCH.advice} (global batch unchanged){because}; if "
                f"the micro-batch is already 1, {remedies.CHECKPOINTING.advice}")
    return (f"{remedies.SMALLER_MICRO_BATCH.advice} (global batch unchanged), the usual fix since "
            "activations grow with it; if micro-batch 1 still fails, the model states do not "
            "fit: shard them with FSDP")
