"""What a GPU holds beyond the tensors a trace sees, per GPU, in bytes.

The traced and analytic estimates give what the caching allocator hands out
(``torch.cuda.max_memory_allocated``). A job needs more than that from the device:

* the CUDA context (the driver's and the kernels' code and data), outside PyTorch's allocator;
* the allocator's slack: blocks are rounded (512 B, 2 MiB segments for large ones) and freed
  blocks are cached, so ``max_memory_reserved`` exceeds ``max_memory_allocated``;
* cuBLAS workspaces, and for multi-GPU jobs NCCL's communication buffers.

The constants below are starting points, each with where it comes from; a run's metrics lines
(``peak_allocated_bytes`` and ``peak_reserved_bytes``) calibrate the allocator ratio per GPU type
(see docs/estimator.md). ``launch`` leaves a safety margin on top because a plan that fits
"exactly" does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024**2

#: CUDA context per GPU, by GPU generation, with CUDA's lazy module loading (the default since
#: CUDA 11.7). PyTorch's forums and issues report ~300-500 MiB on Volta/Turing/Ampere and more on
#: Hopper with newer CUDA (the design brief: "hundreds of MiB to over 1 GiB"). Upper ends are used
#: on purpose: an under-estimate is what causes an OOM.
CUDA_CONTEXT_BYTES = {
    "pascal": 400 * MiB, "volta": 450 * MiB, "turing": 450 * MiB, "ampere": 550 * MiB,
    "ada": 550 * MiB, "hopper": 700 * MiB, "blackwell": 900 * MiB,
}
DEFAULT_CUDA_CONTEXT_BYTES = 700 * MiB

#: cuBLAS workspace: PyTorch gives each (handle, stream) a workspace of
#: CUBLAS_WORKSPACE_CONFIG's size, 4 MiB x 8 by default (":4096:8"), from the caching allocator.
CUBLAS_WORKSPACE_BYTES = 32 * MiB

#: NCCL's buffers per GPU for a multi-GPU job: NCCL_BUFFSIZE (4 MiB) per channel and peer
#: connection; with the ring and tree algorithms over 8 GPUs that reaches a few hundred MiB.
NCCL_BYTES = 384 * MiB

#: max_memory_reserved / max_memory_allocated for a steady training step: rounding and cached
#: free blocks. A starting value; calibrated per GPU type from the metrics lines of real runs.
ALLOCATOR_RESERVE_RATIO = 1.08

#: Fraction of the device kept free when deciding "fits".
SAFETY_MARGIN = 0.05


@dataclass(frozen=True)
class GpuOverheads:
    cuda_context: int
    cublas: int
    nccl: int
    reserve_ratio: float

    @property
    def framework(self) -> int:
        """Bytes outside the allocator's peak: the context and NCCL (cuBLAS is inside it)."""
        return self.cuda_context + self.nccl


def gpu_overheads(generation: str | None, world_size: int,
                  reserve_ratio: float | None = None) -> GpuOverheads:
    return GpuOverheads(
        cuda_context=CUDA_CONTEXT_BYTES.get(generation or "", DEFAULT_CUDA_CONTEXT_BYTES),
        cublas=CUBLAS_WORKSPACE_BYTES,
        nccl=NCCL_BYTES if world_size > 1 else 0,
        reserve_ratio=reserve_ratio or ALLOCATOR_RESERVE_RATIO,
    )
