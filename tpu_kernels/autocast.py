"""``torch.autocast("tpu")``: mixed precision with CUDA's op lists, bfloat16 by default.

Autocast is a dispatch key (AutocastPrivateUse1 for this device) that torch leaves to the
backend. Every op falls through it, except those in CUDA's lists (``autocast_mode.cpp``):
matmul-like ops run in the autocast dtype, numerically sensitive ones (reductions, norms,
losses, exp/log) in float32, and a few take the widest floating input type. A kernel
casts the op's floating tensors and calls the op again below the autocast key, so the
casts are ordinary tpu ops (recorded by autograd, traced by torch.compile).
"""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._pytree import tree_map

# torch's CUDA lists, by op packet (every overload that takes tensors).
LOWER_PRECISION = (
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
    "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
    "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
    "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
    "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
    "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    # float32 unless the caller names an output dtype (CUDA's fp32_set_opt_dtype)
    "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm",
    "sum", "cross_entropy_loss", "norm",
)
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
           "index_put", "tensordot", "scatter_add")

# refused under autocast, as on CUDA (its kernel takes probabilities that a lower-precision
# sigmoid before it may round to exactly 0 or 1)
BANNED = {"binary_cross_entropy": (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")}

_KEY = "AutocastPrivateUse1"
_LIB = torch.library.Library("aten", "IMPL")
_FALLTHROUGH = torch.library.Library("_", "IMPL")
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _is_floating(a: Any) -> bool:
    """CUDA's ``is_eligible``: a floating tpu tensor, not float64."""
    return (isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float64
            and a.device.type == "tpu")


def _cast_to(dtype: torch.dtype):
    return lambda a: a.to(dtype) if _is_floating(a) and a.dtype != dtype else a


def _widest(args: tuple, kwargs: dict) -> torch.dtype:
    found = [a.dtype for a in torch.utils._pytree.tree_leaves((args, kwargs)) if _is_floating(a)]
    return functools.reduce(torch.promote_types, found) if found else torch.float32


def _kernel(op, policy: str, *args, **kwargs):
    if policy == "lower":
        cast = _cast_to(torch.get_autocast_dtype("tpu"))
    elif policy == "float32":
        cast = _cast_to(torch.float32)
    else:
        cast = _cast_to(_widest(args, kwargs))
    args, kwargs = tree_map(cast, args), tree_map(cast, kwargs)
    with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
        return op(*args, **kwargs)


def _register(names: tuple[str, ...], policy: str) -> None:
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            schema = op._schema
            if "out" in overload or schema.is_mutable or not any(
                    "Tensor" in str(a.type) for a in schema.arguments):
                continue
            qual = name if overload == "default" else f"{name}.{overload}"
            if policy == "float32" and any(a.name == "dtype" for a in schema.arguments):
                _LIB.impl(qual, functools.partial(_kernel_opt_dtype, op), _KEY)
            else:
                _LIB.impl(qual, functools.partial(_kernel, op, policy), _KEY)


def _kernel_opt_dtype(op, *args, **kwargs):
    """float32 unless the call names its output dtype (``sum(x, dtype=torch.float16)``)."""
    if kwargs.get("dtype") is not None:
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return _kernel(op, "float32", *args, **kwargs)


def _banned(message: str, *args: Any, **kwargs: Any) -> None:
    raise RuntimeError(message)


@functools.cache   # once per process
def install() -> None:
    """Every op falls through the tpu autocast key except the listed ones; bfloat16 is the
    default autocast dtype (TPUs compute in bfloat16, not float16)."""
    _FALLTHROUGH.fallback(torch.library.fallthrough_kernel, _KEY)
    _register(LOWER_PRECISION, "lower")
    _register(FLOAT32, "float32")
    _register(PROMOTE, "promote")
    for name, message in BANNED.items():
        _LIB.impl(name, functools.partial(_banned, message), _KEY)
    torch.set_autocast_dtype("tpu", torch.bfloat16)
