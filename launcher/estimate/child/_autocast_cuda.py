"""CUDA autocast's cast policies, installed for CPU autocast: for a GPU estimate traced on a CPU.

A bf16-autocast step on a GPU keeps different tensors than the same step under CPU autocast,
because the two dispatch keys register different op lists (``aten/src/ATen/autocast_mode.cpp``):
CUDA runs ``layer_norm``, ``group_norm``, ``exp``, ``pow``, ``rsqrt``, ``logsumexp``, the losses...
in fp32 (casting their bf16 inputs up, and autograd keeps the fp32 copies it needs), computes
``softmax``, ``log_softmax``, ``sum``, ``cumsum``, ``prod`` and the norms with an fp32 output
("fp32_set_opt_dtype"), and runs ``addmv``, ``addr``, ``mv``, ``einsum``... in bf16; CPU autocast
has none of these (it has its own, mostly disjoint list). Tracing a GPU step on a CPU-only torch
build (the child's fallback when no GPU is visible) therefore under-counted those fp32 copies.

``install()`` registers, for every op of CUDA's lists that has no ``AutocastCPU`` kernel yet, a
Python kernel on ``AutocastCPU`` that applies CUDA's policy and redispatches below autocast: the
same casts at the same dispatcher level (inside composite ops too, e.g. ``cross_entropy``'s
``log_softmax``), so the autograd graph, and what it saves, is the one CUDA would build. Ops that
only CPU autocast lists are left as they are (``cat``/``stack`` promotion changes no bytes; the
others are pooling, FFT and linear-algebra ops a training step rarely runs in autocast). Only the
trace child calls this, and only when it emulates CUDA on a CPU.

Casts to the autocast dtype go through autocast's weight cache as CUDA's C++ kernels do
(``cached_cast``: an fp32 leaf that requires grad, a parameter, is cast once per autocast region
and the copy reused), so a weight that one of these ops uses several times in a forward (an
``lstm_cell`` over time steps, a tied ``einsum``) is counted once, as on a GPU. A tensor that is
bf16 already is never cast: under FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16)`` the
gathered parameters are bf16, autocast casts and caches nothing, and the trace counts no copy
(checked: docs/estimator.md, "CUDA semantics").

The lists are torch 2.x's ``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
``AT_FORALL_FP32_SET_OPT_DTYPE`` and the ``norm`` overloads of
``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

#: CUDA's lower_precision_fp list (inputs cast to the autocast dtype).
LOWER_PRECISION_FP = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "scaled_dot_product_attention",
)
#: CUDA's fp32 list (floating inputs cast to float32).
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm",
    "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
#: CUDA's fp32_set_opt_dtype list (run with ``dtype=torch.float32`` when the input is floating).
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)
#: fp32_append_dtype: ``norm`` gets a float32 ``dtype`` (it does not promote by itself).
FP32_APPEND_DTYPE = ("norm.Scalar", "norm.ScalarOpt_dim")

_KEY = "AutocastCPU"
_libraries: list[Any] = []  # kept alive: a Library's registrations end with it
#: Autocast's weight cache for these kernels: id -> (weak reference to the fp32 leaf, its cast).
#: Cleared with C++'s cache when the outermost autocast region exits.
_weight_cache: dict[int, tuple[Any, torch.Tensor]] = {}


def _eligible(x: Any) -> bool:
    return (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if _eligible(value):
        if _cacheable(value, dtype):
            hit = _weight_cache.get(id(value))
            if hit is not None and hit[0]() is value:
                return hit[1]
            cast = value.to(dtype)
            _weight_cache[id(value)] = (weakref.ref(value), cast)
            return cast
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _cacheable(value: torch.Tensor, dtype: torch.dtype) -> bool:
    """``cached_cast``'s condition (aten/src/ATen/autocast_mode.h)."""
    return (dtype == torch.get_autocast_dtype("cpu") and value.dtype == torch.float32
            and value.requires_grad and value.is_leaf and not value._is_view()
            and torch.is_autocast_cache_enabled())


def _clear_with(clear: Callable[[], None]) -> Callable[[], None]:
    def clear_autocast_cache() -> None:
        _weight_cache.clear()
        clear()

    return clear_autocast_cache


def _below_autocast() -> Any:
    return torch._C._ExcludeDispatchKeyGuard(
        torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU))


def _kernel(op: Any, policy: str) -> Callable[..., Any]:
    names = [a.name for a in op._schema.arguments]
    dtype_at = names.index("dtype") if "dtype" in names else len(names)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if policy == "lower":
            dtype = torch.get_autocast_dtype("cpu")
            args, kwargs = _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}
        elif policy == "fp32":
            args = _cast(args, torch.float32)
            kwargs = {k: _cast(v, torch.float32) for k, v in kwargs.items()}
        elif _eligible(args[0]):  # set_opt_dtype, append_dtype: an fp32 output, unless asked
            if dtype_at < len(args):
                if args[dtype_at] is None:
                    args = (*args[:dtype_at], torch.float32, *args[dtype_at + 1:])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        with _below_autocast():
            return op(*args, **kwargs)

    return kernel


def _overload(name: str) -> Any | None:
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def install() -> list[str]:
    """Register CUDA's policies on ``AutocastCPU`` where CPU autocast has none; return the ops
    registered (for the trace's notes and the tests)."""
    if _libraries:
        return list(_libraries[0][1])
    library = torch.library.Library("aten", "IMPL")
    done: list[str] = []
    policies = ([(n, "lower") for n in LOWER_PRECISION_FP] + [(n, "fp32") for n in FP32]
                + [(n, "dtype") for n in FP32_SET_OPT_DTYPE + FP32_APPEND_DTYPE])
    for name, policy in policies:
        op = _overload(name)
        if op is None:
            continue
        qualified = f"aten::{name}"
        if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, _KEY):
            continue  # CPU autocast already has a policy for it
        if policy == "dtype" and "dtype" not in {a.name for a in op._schema.arguments}:
            continue
        library.impl(name, _kernel(op, policy), _KEY)
        done.append(name)
    _libraries.append((library, done))
    # torch.autocast.__exit__ calls torch.clear_autocast_cache() when the outermost region ends
    torch.clear_autocast_cache = _clear_with(torch.clear_autocast_cache)
    return done
