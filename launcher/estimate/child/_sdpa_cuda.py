"""CUDA's attention kernels and dropout, for a GPU estimate traced on a CPU.

``scaled_dot_product_attention`` is one composite op whose C++ body picks a kernel by device
(``aten/src/ATen/native/transformers/attention.cpp``): on a CPU tensor it runs the CPU's choice,
and with dropout that is the math path, which keeps every ``s x s`` score, probability and
dropout mask for the backward pass. On a GPU the same call runs flash attention, the
memory-efficient (CUTLASS) kernel or cuDNN, which keep the output and an fp32 logsumexp per row.
Tracing a GPU step on a CPU-only torch build therefore counted GPT-2 XL's activations at ~730 GB
where a GPU holds ~60 GB. ``at::dropout`` is the same kind of op: on CUDA it runs
``native_dropout`` and keeps a 1-byte bool mask, on a CPU ``input * bernoulli_noise`` and keeps
the noise in the input's dtype (2 or 4 bytes an element).

``install(capability)`` registers, on the ``AutogradCPU`` key (which a directly registered kernel
takes over from the ops' ``CompositeImplicitAutograd`` bodies), kernels that do what the CUDA
build does for fake tensors:

- ``scaled_dot_product_attention``: the backend by PyTorch's own rules for that GPU
  (``select_backend``, a transcription of ``sdp_utils.cpp``'s ``can_use_*`` filters and priority
  order), the same preprocessing as ``attention.cpp`` (boolean masks made additive, flash's head
  dimension padded to a multiple of 8, the efficient kernel's mask expanded and padded to 16
  columns), then the CUDA op itself (``_scaled_dot_product_flash_attention``,
  ``_scaled_dot_product_efficient_attention``, ``_scaled_dot_product_cudnn_attention``, whose
  meta kernels give the real output, logsumexp and RNG-state shapes) inside an autograd function
  that saves exactly what the op's derivative (``derivatives.yaml``) saves, and whose backward
  allocates the kernel's visible workspace (flash: ``softmax_d`` and the fp32 ``dq_accum``; the
  efficient kernel: its fp32 ``delta``) around the backward op. The math fallback is
  ``_scaled_dot_product_attention_math``, as on CUDA.
- ``dropout``: ``native_dropout`` where CUDA's ``is_fused_kernel_acceptable`` holds.

Real (not fake) tensors take the ops' own CPU bodies: the data-dependent rerun on real tensors
measures the CPU it runs on. Only the trace child calls this, when it emulates CUDA on a CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

#: Compute capability of each GPU generation of the catalog (launcher/plan/catalogs/gpus.json).
#: Ampere is the A100's 8.0 (the A10's 8.6 differs only for head dims over 192 in training).
CAPABILITY = {
    "pascal": (6, 0), "volta": (7, 0), "turing": (7, 5), "ampere": (8, 0), "ada": (8, 9),
    "hopper": (9, 0), "blackwell": (10, 0),
}
#: What a GPU estimate assumes when the plan names no generation: an A100/H100-class GPU.
DEFAULT_CAPABILITY = (8, 0)

FLASH, EFFICIENT, CUDNN, MATH = "flash", "efficient", "cudnn", "math"
#: PyTorch's default priority (``at::globalContext().sDPPriorityOrder()``). cuDNN goes first
#: only on sm90/sm10x with a cuDNN newer than 9.15 (``check_prefer_cudnn_attention``), which
#: depends on the wheel's cuDNN; both keep O(s) statistics, so the default order is used.
PRIORITY = (FLASH, EFFICIENT, MATH, CUDNN)

_libraries: list[Any] = []  # kept alive: a Library's registrations end with it
_state: dict[str, Any] = {}


@dataclass(frozen=True)
class SdpParams:
    """What ``sdp::sdp_params`` carries, from tensors or from shapes alone."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    dropout: float
    is_causal: bool
    enable_gqa: bool


def _requires_grad(p: SdpParams) -> bool:
    return torch.is_grad_enabled() and any(
        t.requires_grad for t in (p.query, p.key, p.value))


def _sm_in(cap: tuple[int, int], low: tuple[int, int], high: tuple[int, int]) -> bool:
    return low <= cap <= high


def _dense_heads_ok(p: SdpParams, supports_gqa: bool) -> bool:
    """``check_batch_size_and_num_heads_dense``: same batch; same heads, or GQA when allowed."""
    q, k, v = p.query, p.key, p.value
    if not q.size(0) == k.size(0) == v.size(0):
        return False
    if p.enable_gqa and supports_gqa:
        return k.size(-3) == v.size(-3) and q.size(-3) % k.size(-3) == 0
    return q.size(-3) == k.size(-3) == v.size(-3)


def _common_dense(p: SdpParams, ignore_singleton_dim: bool) -> bool:
    """4-D inputs, nonzero sequence lengths, unit last-dimension strides."""
    q, k, v = p.query, p.key, p.value
    if not q.dim() == k.dim() == v.dim() == 4:
        return False
    if q.size(-2) == 0 or k.size(-2) == 0:
        return False
    unit = q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    if ignore_singleton_dim:
        unit = unit or q.size(-1) == 1
    mask_ok = p.attn_mask is None or p.attn_mask.stride(-1) == 1
    return unit and mask_ok


def can_use_flash(p: SdpParams, cap: tuple[int, int]) -> bool:
    """``can_use_flash_attention`` for a dense input on a CUDA build with flash attention."""
    if not _common_dense(p, ignore_singleton_dim=True) or p.attn_mask is not None:
        return False
    d_q, d_k, d_v = p.query.size(-1), p.key.size(-1), p.value.size(-1)
    if not (d_q == d_k == d_v and d_q <= 256):
        return False
    if not _sm_in(cap, (8, 0), (12, 1)):
        return False
    if _requires_grad(p) and (_sm_in(cap, (8, 6), (8, 9)) or _sm_in(cap, (12, 0), (12, 1))):
        if not (d_q <= 192 or (p.dropout == 0.0 and d_q > 224)):
            return False
    if p.is_causal and p.query.size(-2) != p.key.size(-2):
        return False
    if p.query.dtype not in (torch.float16, torch.bfloat16):
        return False
    return _dense_heads_ok(p, supports_gqa=True)


def _gemm_alignment(dtype: torch.dtype, cap: tuple[int, int]) -> int:
    """``minimum_gemm_alignment``: elements a head dimension must be a multiple of."""
    half = dtype in (torch.float16, torch.bfloat16)
    tensor_cores = cap[0] >= 8 or (cap[0] >= 7 and half)
    alignment = 4 if cap[0] >= 8 else 1
    if tensor_cores:
        alignment = max(alignment, 128 // (16 if half else 32))
    return alignment


def can_use_efficient(p: SdpParams, cap: tuple[int, int]) -> bool:
    """``can_use_mem_efficient_attention`` for a dense input (CUDA, not ROCm)."""
    if not _sm_in(cap, (5, 0), (12, 1)):
        return False
    q, k, v = p.query, p.key, p.value
    if not q.dim() == k.dim() == v.dim() == 4:
        return False
    align = _gemm_alignment(q.dtype, cap)
    if not (q.size(-1) == k.size(-1) and q.size(-1) % align == 0 and q.size(-1) > 0
            and v.size(-1) % align == 0 and v.size(-1) > 0):
        return False
    if cap[0] >= 8 and any(t.storage_offset() % align for t in (q, k, v) if t.numel()):
        return False  # check_data_ptr_alignment_mem_efficient
    if not _common_dense(p, ignore_singleton_dim=False):
        return False
    # GQA: the torch 2.13 header's check takes (supports_gqa, requires_same_num_heads); which
    # value the efficient kernel passes is not in the wheel, so GQA is left to flash or math.
    if not _dense_heads_ok(p, supports_gqa=False):
        return False
    dtypes = ((torch.float16, torch.float32, torch.bfloat16) if cap[0] >= 8
              else (torch.float16, torch.float32))
    return q.dtype in dtypes


def can_use_cudnn(p: SdpParams, cap: tuple[int, int]) -> bool:
    """``can_use_cudnn_attention`` for a dense input, assuming a cuDNN 9.x that supports head
    dimensions up to 256 on sm90/sm10x (128 elsewhere)."""
    if not _common_dense(p, ignore_singleton_dim=True):
        return False
    q, k, v = p.query, p.key, p.value
    if q.dtype not in (torch.float16, torch.bfloat16) or not _sm_in(cap, (8, 0), (12, 1)):
        return False
    if p.dropout * 16.0 != math.floor(p.dropout * 16.0):
        return False
    mask = p.attn_mask
    if mask is not None:
        if mask.requires_grad or mask.dim() not in (2, 4):
            return False
        if mask.size(-2) not in (1, q.size(2)) or mask.size(-1) not in (1, k.size(2)):
            return False
        if mask.dim() == 4 and (mask.size(0) not in (1, q.size(0))
                                or mask.size(1) not in (1, q.size(1))):
            return False
    if not (q.size(0) == k.size(0) == v.size(0)) or q.size(1) % k.size(1):
        return False
    limit = 256 if cap[0] in (9, 10) else 128
    d_qk, d_v = q.size(3), v.size(3)
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8 or k.size(2) == 1:
        return False
    if _requires_grad(p) and limit == 256 and not (
            (d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))):
        return False
    return p.dropout == 0.0 or q.size(2) != 1


def select_backend(p: SdpParams, cap: tuple[int, int] = DEFAULT_CAPABILITY,
                   priority: tuple[str, ...] = PRIORITY) -> str:
    """The backend ``select_sdp_backend`` returns on a GPU of compute capability ``cap``,
    honouring the ``torch.backends.cuda.enable_*_sdp`` switches."""
    backends = torch.backends.cuda
    checks = {
        FLASH: lambda: backends.flash_sdp_enabled() and can_use_flash(p, cap),
        EFFICIENT: lambda: backends.mem_efficient_sdp_enabled() and can_use_efficient(p, cap),
        CUDNN: lambda: backends.cudnn_sdp_enabled() and can_use_cudnn(p, cap),
        MATH: backends.math_sdp_enabled,
    }
    for backend in priority:
        if checks[backend]():
            return backend
    raise RuntimeError("No available kernel for scaled_dot_product_attention on this GPU")


# ----------------------------------------------------------------------------------------------
# The fused kernels: what they keep and allocate.


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class _FusedAttention(torch.autograd.Function):
    """One fused SDPA kernel as its autograd node sees it: the CUDA op's forward, the tensors
    its derivative saves, and its backward with the workspace the kernel allocates."""

    @staticmethod
    def forward(ctx: Any, backend: str, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, bias: torch.Tensor | None, dropout_p: float,
                is_causal: bool, scale: float | None, compute_lse: bool) -> torch.Tensor:
        aten = torch.ops.aten
        if backend == FLASH:
            out, lse, _, _, max_q, max_k, seed, offset, _ = (
                aten._scaled_dot_product_flash_attention(
                    query, key, value, dropout_p, is_causal, False, scale=scale))
            ctx.extra = (max_q, max_k)
        elif backend == EFFICIENT:
            out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
                query, key, value, bias, compute_lse, dropout_p, is_causal, scale=scale)
        else:
            out, lse, _, _, max_q, max_k, seed, offset, _ = (
                aten._scaled_dot_product_cudnn_attention(
                    query, key, value, bias, compute_lse, dropout_p, is_causal, False,
                    scale=scale))
            ctx.extra = (max_q, max_k)
        ctx.backend, ctx.dropout_p, ctx.is_causal, ctx.scale = (
            backend, dropout_p, is_causal, scale)
        ctx.has_bias = bias is not None
        saved = [query, key, value, out, lse, seed, offset]
        if bias is not None:
            saved.append(bias)
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        aten = torch.ops.aten
        query, key, value, out, lse, seed, offset, *rest = ctx.saved_tensors
        bias = rest[0] if rest else None
        b, h, s_q, d = query.shape
        grad_bias = None
        # Both kernels work in [b, s, h, d] and make the transposed grad_out contiguous (a copy
        # unless the caller's layout was [b, s, h, d] already, as transformers' is); flash its
        # output too.
        copies = [grad.transpose(1, 2).contiguous()]
        if ctx.backend == FLASH:
            copies.append(out.transpose(1, 2).contiguous())
            # mha_bwd (flash_api.cpp): softmax_d [b, h, s_q rounded to 128] and the fp32 dq
            # accumulator [b, s_q rounded, h, d rounded to 32 (64 above 128)], alive through
            # the kernel; GQA also expands dk, dv to every query head.
            s_r, d_r = _round_up(s_q, 128), _round_up(d, 32 if d <= 128 else 64)
            # (new_empty: fake like the inputs, whatever mode is active)
            workspace = [query.new_empty((b, h, s_r), dtype=torch.float32),
                         query.new_empty((b, s_r, h, d_r), dtype=torch.float32)]
            if key.size(1) != h:
                workspace += [key.new_empty((b, key.size(2), h, d)) for _ in range(2)]
            max_q, max_k = ctx.extra
            grad_q, grad_k, grad_v = aten._scaled_dot_product_flash_attention_backward(
                grad, query, key, value, out, lse, None, None, max_q, max_k, ctx.dropout_p,
                ctx.is_causal, seed, offset, scale=ctx.scale)
        elif ctx.backend == EFFICIENT:
            # _efficient_attention_backward: delta [b, h, s_q] fp32 for the kernel's rows.
            workspace = [query.new_empty((b, h, s_q), dtype=torch.float32)]
            mask = [*ctx.needs_input_grad[1:4], bool(ctx.needs_input_grad[4])]
            grad_q, grad_k, grad_v, grad_bias = (
                aten._scaled_dot_product_efficient_attention_backward(
                    grad, query, key, value, bias, out, lse, seed, offset, ctx.dropout_p,
                    mask, ctx.is_causal, scale=ctx.scale))
            if not ctx.needs_input_grad[4]:
                grad_bias = None
        else:
            workspace, copies = [], []
            max_q, max_k = ctx.extra
            grad_q, grad_k, grad_v = aten._scaled_dot_product_cudnn_attention_backward(
                grad, query, key, value, out, lse, seed, offset, bias, None, None, max_q,
                max_k, ctx.dropout_p, ctx.is_causal, scale=ctx.scale)
        del workspace, copies
        return None, grad_q, grad_k, grad_v, grad_bias, None, None, None, None


def _convert_boolean_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``convert_boolean_attn_mask``: a bool mask becomes an additive one of the query's dtype
    (a new tensor of the mask's shape)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask.logical_not(), -math.inf)


def _preprocess_mask(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor
                     ) -> torch.Tensor:
    """``preprocess_mask`` (the efficient kernel): expanded to 4-D, padded to a multiple of 16
    columns when it is not one, else made contiguous when its strides are not aligned."""
    mask = mask.expand(query.size(0), query.size(1), query.size(2), key.size(2))
    columns = mask.size(-1)
    if columns % 16:
        padded = torch.nn.functional.pad(mask, (0, 16 - columns % 16))
        return padded[..., :columns]
    if any(mask.stride(i) % 16 for i in range(3)):
        return mask.contiguous()
    return mask


def _is_fake(*tensors: Any) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return any(isinstance(t, torch.Tensor) and is_fake(t) for t in tensors)


def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
          attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
          is_causal: bool = False, *, scale: float | None = None,
          enable_gqa: bool = False) -> torch.Tensor:
    """``scaled_dot_product_attention`` as ``attention.cpp`` runs it on the emulated GPU."""
    args = (query, key, value, attn_mask, dropout_p, is_causal)
    if not _is_fake(query, key, value):
        return torch.ops.aten.scaled_dot_product_attention.default.decompose(
            *args, scale=scale, enable_gqa=enable_gqa)
    params = SdpParams(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    backend = select_backend(params, _state.get("capability", DEFAULT_CAPABILITY))
    counts = _state.setdefault("chosen", {})
    counts[backend] = counts.get(backend, 0) + 1
    if backend == MATH:
        mask = _convert_boolean_mask(attn_mask, query.dtype)
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, mask, dropout_p, is_causal, None, scale=scale,
            enable_gqa=enable_gqa)[0]
    compute_lse = _requires_grad(params)
    if backend == FLASH:
        head = query.size(-1)
        if scale is None:
            scale = 1.0 / math.sqrt(head)  # of the unpadded head dimension
        if head % 8:
            pad = (0, 8 - head % 8)
            query, key, value = (torch.nn.functional.pad(t, pad) for t in (query, key, value))
        out = _FusedAttention.apply(FLASH, query, key, value, None, dropout_p, is_causal,
                                    scale, compute_lse)
        return out[..., :head] if head % 8 else out
    if backend == CUDNN:
        # convert_boolean_attn_mask_cudnn keeps a bool mask as is for cuDNN
        mask = attn_mask
    else:
        mask = _convert_boolean_mask(attn_mask, query.dtype)
        if mask is not None:
            mask = _preprocess_mask(mask, query, key)
    return _FusedAttention.apply(backend, query, key, value, mask, dropout_p, is_causal, scale,
                                 compute_lse)


def _dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    """``at::dropout``: CUDA takes ``native_dropout`` (a bool mask kept for backward) when
    ``is_fused_kernel_acceptable``; anything else runs the composite body, as it would there."""
    if _is_fake(input) and train and 0.0 < p < 1.0 and input.numel() > 0:
        return torch.ops.aten.native_dropout(input, p, train)[0]
    return torch.ops.aten.dropout.default.decompose(input, p, train)


def install(capability: tuple[int, int] | None = None) -> tuple[int, int]:
    """Make ``scaled_dot_product_attention`` and ``dropout`` on fake CPU tensors behave as on a
    GPU of this compute capability (None: ``DEFAULT_CAPABILITY``); return the capability."""
    _state["capability"] = capability or DEFAULT_CAPABILITY
    if not _libraries:
        library = torch.library.Library("aten", "IMPL")
        library.impl("scaled_dot_product_attention", _sdpa, "AutogradCPU")
        library.impl("dropout", _dropout, "AutogradCPU")
        _libraries.append(library)
    return _state["capability"]


def capability_of(generation: str | None) -> tuple[int, int]:
    """The compute capability of a catalog GPU generation (the default when unknown)."""
    return CAPABILITY.get((generation or "").lower(), DEFAULT_CAPABILITY)


def chosen() -> dict[str, int]:
    """How often each backend was chosen since the last call (for the tests)."""
    return _state.pop("chosen", {})
