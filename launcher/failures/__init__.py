"""Reading training logs: what failed, why, and the next plan change.

``launch explain LOG`` and the supervisor's live watch both end here. The public API::

    from launcher.failures import Diagnosis, LogWatcher, explain_file, explain_lines

    diagnosis = explain_file("job.log")          # or "-" for standard input
    diagnosis.failure    # "gpu_oom" | "host_oom" | "other" | "none"
    diagnosis.cause      # "activations" | "model_states" | "fragmentation" | "other_process"
                         # | "shared_memory" | "unknown" | None (failure is other/none)
    diagnosis.to_dict()  # the ``launch explain --json`` object of the design brief

    watcher = LogWatcher(platform="vertex")      # the supervisor: lines as they arrive
    for line in stream:
        if (first := watcher.feed(line)) is not None:
            stop_the_job()                       # the first out-of-memory line: stop at once
    final = watcher.result()                     # root cause of all that was fed

**Failure.** Any allocator's out-of-memory message is a memory failure: PyTorch's CUDA/HIP/XPU/MPS
messages of every era (with or without figures), the CPU allocator's, cuBLAS/cuDNN allocation
failures, NCCL's CUDA OOM, XLA's RESOURCE_EXHAUSTED, TensorFlow's OOM. Host memory: the kernel's
OOM killer, Kubernetes' OOMKilled, Vertex's "ran out-of-memory", SageMaker's OutOfMemoryError,
DataLoader workers killed, /dev/shm exhausted, Python's MemoryError. A bare SIGKILL / exit 137 /
-9, and the shell's "Killed" (in the languages of glibc's and bash's catalogs too), is host
memory for certain on a managed platform (Vertex, SageMaker, AI Platform), where nothing but the
kernel's OOM killer sends it unannounced, and *probable* host memory elsewhere: the note says so
and the advice names what would confirm it (dmesg, the container's OOMKilled status, the node's
memory graph). oneDNN's "could not create a primitive" is host memory under a memory cap
(``capped=True``) or with memory pressure in the log, probable host memory otherwise. Not memory:
NCCL timeouts (and the "more than 1EB" request that follows one), illegal memory accesses,
device-side asserts, cuDNN/CUDA errors, a full disk, preemption. No failure at all is ``none``.

**Root cause.** The launcher's own ``{"launch": "oom", ...}`` line settles failure and phase;
otherwise the first out-of-memory message in the log wins over everything after it (other ranks'
NCCL errors, SIGTERMs, ChildFailedError); among other failures, a specific error beats an
exception, which beats a distributed cascade, which beats a process exit.

**Cause**, for a GPU out-of-memory error, in this order (figures are measurements, so they go
first; the phase says what was being allocated):

1. ``other_process``: memory outside this process's allocator is large: the 2.1+ message's
   "Process N has X memory in use" adds up to a tenth of the GPU (and at least 1 GiB), or capacity
   minus reserved minus free exceeds both 2 GiB and a quarter of the GPU (more than a CUDA context,
   cuBLAS workspaces and NCCL buffers take). No plan change helps; free the GPU.
2. ``fragmentation``: the allocator holds the bytes but not in one block: reserved minus allocated
   is at least the request, or the driver reports at least twice the request (and 256 MiB more)
   free. ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` lets segments grow instead of
   splitting, so the same plan can run.
3. ``model_states``: it failed in the optimizer step (``exp_avg``, ``optimizer.step``), while
   building or wrapping the model (``__init__`` of a model, ``torch.empty`` for a Parameter, DDP or
   FSDP construction, ``model.to(device)``), or saving a checkpoint: memory that does not depend on
   the micro-batch. Shard (FSDP / hybrid sharding); a smaller batch cannot help.
4. ``activations``: it failed in forward, backward, evaluation or moving a batch: memory that grows
   with the micro-batch. Halve it and double gradient accumulation (global batch unchanged), then
   activation checkpointing.
5. ``unknown``: the log gives neither telling figures nor a phase; the advice is the activations
   one, which is the usual cause and the cheapest try.

Host memory is ``shared_memory`` when /dev/shm ran out (bus error in a DataLoader worker, "unable to
write to file </torch_...>", No space left on /dev/shm), else ``unknown`` (or, for a run on the CPU
that says its phase, activations / model_states as above).

The reasons behind each rule and threshold are in docs/failures.md.
"""

from __future__ import annotations

from launcher.failures._anchors import needles_for
from launcher.failures._diagnosis import Cause, Diagnosis, FailureKind
from launcher.failures._rules import GPU_OOM, HOST_OOM, RULES
from launcher.failures._scan import explain_file, explain_lines, explain_stream
from launcher.failures._sizes import parse_size
from launcher.failures._watch import LogWatcher

__all__ = [
    "GPU_OOM",
    "HOST_OOM",
    "RULES",
    "Cause",
    "Diagnosis",
    "FailureKind",
    "LogWatcher",
    "explain_file",
    "explain_lines",
    "explain_stream",
    "needles_for",
    "parse_size",
]
