"""What a GPU holds beyond the tensors a trace sees, per GPU, in bytes.

The traced and analytic estimates give what the caching allocator hands out
(``torch.cuda.max_memory_allocated``). A job needs more than that from the device:

* the CUDA context (the driver's and the kernels' code and data), outside PyTorch's allocator:
  its size depends most on whether CUDA loads every kernel image at start-up (eager, every CUDA
  before 11.7) or each module when first used (lazy loading, CUDA 11.7+; PyTorch turns it on
  itself since 1.13 and CUDA makes it the default on Linux since 12.2), then on the GPU
  generation; ``CUDA_CONTEXT`` is the table, one row per measurement, each with its source;
* the allocator's slack: blocks are rounded (512 B, 2 MiB segments for large ones) and freed
  blocks are cached, so ``max_memory_reserved`` exceeds ``max_memory_allocated``. A traced CUDA
  estimate replays the allocator's rules (``launcher.estimate.allocator``) for its own ratio;
  ``ALLOCATOR_RESERVE_RATIO`` is the fallback where nothing was replayed (analytic plans);
* cuBLAS workspaces, and for multi-GPU jobs NCCL's communication buffers (``nccl_bytes``).

Where no measurement was found the table says so and uses a conservative value: an
under-estimate is what causes an OOM. A run's metrics lines (``peak_allocated_bytes`` and
``peak_reserved_bytes``) calibrate the allocator ratio per GPU type (see docs/estimator.md).
``launch`` leaves a safety margin on top because a plan that fits "exactly" does not fit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MiB = 1024**2
Version = tuple[int, int]

#: CUDA's lazy module loading: first in 11.7 (off by default), PyTorch sets
#: ``CUDA_MODULE_LOADING=LAZY`` when unset since 1.13 (pytorch/pytorch#86509), CUDA's default on
#: Linux since 12.2 (CUDA programming guide, "Lazy Loading", change history).
LAZY_LOADING_SINCE: Version = (11, 7)


@dataclass(frozen=True)
class ContextRow:
    """One measured (or, where none was found, assumed) CUDA context size."""

    lazy: bool  # lazy module loading (CUDA >= 11.7 and CUDA_MODULE_LOADING=LAZY)
    generations: tuple[str, ...]
    bytes: int
    source: str


#: The CUDA context per GPU, by loading mode and GPU generation. Readings are NVML's "used"
#: memory right after the first CUDA tensor, so they include that tensor's allocator segment
#: (2 MiB, 20 MiB for the #86509 tensor); under lazy loading the context then grows by the
#: kernels a training step loads, which no published reading isolates, hence the margins.
CUDA_CONTEXT: tuple[ContextRow, ...] = (
    # -- eager: every kernel image loaded at start-up (CUDA < 11.7, or CUDA_MODULE_LOADING=EAGER)
    ContextRow(False, ("pascal",), 721 * MiB,
               "pytorch/pytorch#55277: GTX 1080, torch 1.8.2+cu101, torch.Tensor(1).cuda(), "
               "nvidia-smi 721 MB"),
    ContextRow(False, ("volta", "turing"), 1343 * MiB,
               "huggingface.co/docs/transformers/model_memory_anatomy: V100-SXM2-16GB, CUDA "
               "11.2, NVML used 1343 MB after torch.ones((1, 1)).to('cuda'); Turing: no reading "
               "found, Volta's (a Titan V under torch 1.3 read 1008 MB, pytorch/pytorch#28394)"),
    ContextRow(False, ("ampere", "ada", "hopper", "blackwell"), 1687 * MiB,
               "pytorch/pytorch#55277: RTX 3090, torch 1.8.2+cu111, nvidia-smi 1687 MB; Ada, "
               "Hopper, Blackwell (CUDA 11.8+ only, so eager only by CUDA_MODULE_LOADING=EAGER): "
               "no reading found, the largest eager one"),
    # -- lazy loading (CUDA >= 11.7 with PyTorch >= 1.13, or CUDA >= 12.2)
    ContextRow(True, ("pascal", "volta", "turing", "ampere", "ada"), 500 * MiB,
               "pytorch/pytorch#86509 (torch 1.13, CUDA 11.7): 287,047,680 bytes used lazy "
               "against 666,632,192 eager, with a 6.4 MB tensor; ptrblck: '~300MB' "
               "(pytorch/pytorch#107667) and 'around 400MB if CUDA >= 11.7' "
               "(pytorch/pytorch#109888). 500 MiB leaves room for the kernels a training "
               "step loads (cuBLAS, cuDNN, fused optimizers), which no reading isolates"),
    ContextRow(True, ("hopper",), 700 * MiB,
               "no published reading found for Hopper (sm_90 kernels are larger, CUDA 12 "
               "libraries ship more of them): assumed, above the older generations'"),
    ContextRow(True, ("blackwell",), 900 * MiB,
               "no published reading found for Blackwell: assumed, above Hopper's"),
)
#: An unknown generation: the largest lazy row (an under-estimate is the costly error).
DEFAULT_CUDA_CONTEXT_BYTES = max(r.bytes for r in CUDA_CONTEXT if r.lazy)


def cuda_context_bytes(generation: str | None, cuda: Version | None = None,
                       lazy: bool | None = None) -> int:
    """The CUDA context for ``generation`` under CUDA ``cuda`` (None: unknown, taken as a CUDA
    with lazy loading, as every default image has) and ``lazy`` (None: lazy exactly when the
    CUDA version has it; False for a job that sets ``CUDA_MODULE_LOADING=EAGER``)."""
    if lazy is None:
        lazy = cuda is None or cuda >= LAZY_LOADING_SINCE
    elif cuda is not None and cuda < LAZY_LOADING_SINCE:
        lazy = False  # older runtimes load eagerly whatever the environment says
    rows = [r for r in CUDA_CONTEXT if r.lazy == lazy]
    for row in rows:
        if generation in row.generations:
            return row.bytes
    return max(r.bytes for r in rows)


#: The lazy-loading context per generation (the view older callers and benchmarks read).
CUDA_CONTEXT_BYTES = {g: cuda_context_bytes(g) for r in CUDA_CONTEXT for g in r.generations}

# Image tags that name their CUDA: pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime, AWS's
# ...-gpu-py311-cu124, Google's pytorch-cu124.2-4.py310.
_CUDA_IN_NAME = re.compile(r"(?:cuda|cu)(\d{2})(\d)\b|cuda(\d+)\.(\d+)")
#: torch 2.0 and later wheels were built with CUDA 11.7 or later (2.0: cu117 and cu118).
_TORCH_WITH_LAZY_CUDA: Version = (2, 0)


def image_cuda(image: str) -> Version | None:
    """The CUDA (major, minor) a training image runs, as far as its name tells: the version it
    names (``cuda12.8``, ``cu124``), else at least 11.7 for an image with torch 2.0 or later
    (``launcher.providers.images.torch_version``: the default images name their torch, not
    their CUDA), else None."""
    match = _CUDA_IN_NAME.search(image.lower())
    if match:
        major, minor = (match.group(1), match.group(2)) if match.group(1) else match.groups()[2:]
        return int(major), int(minor)
    from launcher.providers.images import torch_version

    torch = torch_version(image)
    if torch is not None and torch >= _TORCH_WITH_LAZY_CUDA:
        return LAZY_LOADING_SINCE
    return None


#: cuBLAS workspace: PyTorch gives each (handle, stream) a workspace of
#: CUBLAS_WORKSPACE_CONFIG's size, 4 MiB x 8 by default (":4096:8"), from the caching allocator.
CUBLAS_WORKSPACE_BYTES = 32 * MiB

#: NCCL's buffers per connection (one peer, one direction, one channel), from NCCL's init.cc:
#: the Simple protocol's NCCL_BUFFSIZE (DEFAULT_BUFFSIZE, 4 MiB), LL128's
#: (NCCL_LL128_ELEMS_PER_THREAD 120 x NCCL_LL128_MAX_NTHREADS 640 x NCCL_STEPS 8 x 8 bytes =
#: 4,915,200) and LL's (8 lines x 512 threads x 8 steps x 16 bytes = 524,288): 9.19 MiB.
NCCL_BUFFSIZE = 4 * MiB
NCCL_LL128_BUFFSIZE = 120 * 640 * 8 * 8
NCCL_LL_BUFFSIZE = 8 * 512 * 8 * 16
#: Channels NCCL opens between NVLink-connected GPUs (32 per peer on 8 x H100 in NVIDIA/nccl#1685;
#: MAXCHANNELS is 32 in NCCL 2.x before 2.19), and over PCIe (a few; 4 assumed, no reading).
NCCL_CHANNELS_NVLINK = 32
NCCL_CHANNELS_PCIE = 4
#: A PCIe 5.0 x16 link's bandwidth one way, GB/s: a faster GPU-to-GPU link is NVLink's.
PCIE5_GBYTES_PER_S = 64
#: Receive connections per channel for an all-reduce: the ring's and the tree's (a tree rank
#: receives from its parent and up to two children, but NCCL builds trees over half the
#: channels; 2 per channel is the ring plus one tree connection on average).
NCCL_CONNECTIONS_PER_CHANNEL = 2


def nccl_bytes(world_size: int, nvlink: bool = True, buffsize: int = NCCL_BUFFSIZE) -> int:
    """NCCL's device buffers for one communicator doing all-reduces (and the reduce-scatters and
    all-gathers of sharded strategies), per GPU: channels x connections x the three protocols'
    buffers. 8 x H100 (NVLink): 32 x 2 x 9.19 MiB = 588 MiB, which with a ~0.5 GiB context
    matches the 1.06 GB NVIDIA/nccl#1685 read before its first all-to-all. 0 for one GPU."""
    if world_size <= 1:
        return 0
    channels = NCCL_CHANNELS_NVLINK if nvlink else NCCL_CHANNELS_PCIE
    per_connection = buffsize + NCCL_LL128_BUFFSIZE + NCCL_LL_BUFFSIZE
    return channels * NCCL_CONNECTIONS_PER_CHANNEL * per_connection


#: NCCL's buffers on an NVLink machine (the conservative side when the interconnect is unknown).
NCCL_BYTES = nccl_bytes(8)

#: max_memory_reserved / max_memory_allocated for a steady training step where no trace
#: replayed the caching allocator (analytic or --params plans): rounding and cached free
#: blocks. A starting value; calibrated per GPU type from the metrics lines of real runs.
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
                  reserve_ratio: float | None = None, *, cuda: Version | None = None,
                  lazy: bool | None = None, nvlink: bool = True) -> GpuOverheads:
    """The overheads of one GPU of a ``world_size``-GPU job; ``reserve_ratio`` replaces the
    default allocator ratio (a calibrated or replayed one)."""
    return GpuOverheads(
        cuda_context=cuda_context_bytes(generation, cuda, lazy),
        cublas=CUBLAS_WORKSPACE_BYTES,
        nccl=nccl_bytes(world_size, nvlink),
        reserve_ratio=reserve_ratio or ALLOCATOR_RESERVE_RATIO,
    )
