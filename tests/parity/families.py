"""Which strategy draws each op's arguments: op overload -> family.

``family(op)`` names the family of an op (an ``OpOverload``) by explicit tables of op
names, then by name patterns; ``strategy(op)`` builds its Hypothesis strategy (or None:
the op is "untested" by the parity harness). Backward ops (``*_backward``,
``*_backward_data``) get their arguments captured from CPU autograd of their forward op,
so they are covered whenever the forward op has a family.

The tables list packet names (``aten.add``); an entry covers every overload the family
can draw (the schema-driven families refuse overloads with arguments they do not know).
"""
from __future__ import annotations

import functools
from typing import Any

import torch

import strategies as S
from tpu_kernels.coverage import load_targets
from tpu_kernels.registry.opnames import base_name, lookup_op, overload_or_none

aten = torch.ops.aten

# -- tables ---------------------------------------------------------------------------------
BITWISE = {"__and__", "__or__", "__xor__", "__lshift__", "__rshift__", "bitwise_and", "bitwise_or",
           "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift", "gcd", "lcm"}
COMPARISON = {"eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite", "isposinf", "isneginf",
              "signbit", "logical_and", "logical_or", "logical_xor", "logical_not", "maximum", "minimum",
              "fmax", "fmin", "where"}
FLOAT_ONLY = {"polar", "complex", "hardshrink", "softshrink", "log_sigmoid_forward", "polygamma", "mvlgamma", "renorm",
              "erfinv", "digamma", "lgamma", "i0", "logit", "nextafter", "frexp", "sinc", "special_xlog1py",
              "xlogy", "ldexp", "heaviside", "float_power", "igamma", "igammac"}
ELEMENTWISE = {
    "abs", "acos", "acosh", "add", "addcdiv", "addcmul", "angle", "asin", "asinh", "atan", "atan2", "atanh",
    "ceil", "clamp", "clamp_max", "clamp_min", "copysign", "cos", "cosh", "deg2rad", "digamma", "div", "erf",
    "erfc", "erfinv", "exp", "exp2", "expm1", "float_power", "floor", "floor_divide", "fmod", "frac", "frexp",
    "heaviside", "hypot", "i0", "ldexp", "lerp", "lgamma", "log", "log10", "log1p", "log2", "logaddexp",
    "logaddexp2", "logit", "mul", "nan_to_num", "neg", "nextafter", "pow", "rad2deg", "reciprocal", "remainder",
    "round", "rsqrt", "rsub", "sgn", "sigmoid", "sign", "sin", "sinc", "sinh", "special_xlog1py", "sqrt", "sub",
    "tan", "tanh", "trunc", "xlogy", "relu", "silu", "gelu", "hardtanh", "hardsigmoid", "hardswish",
    "leaky_relu", "elu", "softplus", "mish", "glu_", "threshold", "relu6", "selu", "celu", "log_sigmoid",
    "square", "positive", "conj_physical", "abs_", "add_", "mul_", "div_", "sub_", "sqrt_", "exp_",
    "lerp_", "addcmul_", "addcdiv_", "clamp_", "clamp_min_", "relu_", "silu_", "hardtanh_", "leaky_relu_",
    "hardswish_", "floor_divide_", "logical_and_", "masked_fill_", "sigmoid_", "tanh_", "neg_", "pow_",
    "hardshrink", "softshrink", "log_sigmoid_forward", "igamma", "igammac", "polygamma", "mvlgamma", "renorm",
    "polar", "complex",
} | BITWISE | COMPARISON
REDUCTION = {"sum", "mean", "prod", "amax", "amin", "aminmax", "argmax", "argmin", "all", "any", "_is_all_true",
             "_is_any_true", "count_nonzero", "cummax", "cummin", "cumprod", "cumsum", "logcumsumexp",
             "logsumexp", "linalg_vector_norm", "max", "min", "median", "nanmedian", "mode", "nansum", "norm",
             "std", "var", "std_mean", "var_mean", "dist", "equal", "allclose", "trace"}
REDUCTION_FLOAT = {"logsumexp", "logcumsumexp", "linalg_vector_norm", "norm", "std", "var", "std_mean",
                   "var_mean", "dist", "mean", "nanmedian", "nansum"}
SOFTMAX = {"_softmax", "_log_softmax", "_safe_softmax"}
MATMUL = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "addr", "mv", "dot", "vdot"}
NORM = {"native_layer_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
        "native_group_norm", "_fused_rms_norm", "_weight_norm_interface", "_batch_norm_with_update",
        "_batch_norm_with_update_functional", "_batch_norm_no_update"}
CONV = {"convolution", "im2col", "col2im"}
POOL = {"_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_avg_pool1d", "adaptive_max_pool2d",
        "adaptive_max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool2d_with_indices",
        "max_pool3d_with_indices", "fractional_max_pool2d", "fractional_max_pool3d"}
INDEXING = {"gather", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_",
            "index_select", "index_add", "index_add_", "index_copy", "index_copy_", "index_fill", "index_fill_",
            "index_reduce", "index_reduce_", "index", "_unsafe_index", "index_put", "index_put_",
            "_unsafe_index_put", "masked_fill", "masked_fill_", "masked_scatter", "masked_scatter_",
            "masked_select", "take", "put", "put_", "embedding", "nonzero", "nonzero_static", "isin"}
SHAPE = {"view", "_unsafe_view", "reshape", "permute", "transpose", "t", "squeeze", "unsqueeze", "expand",
         "select", "select_scatter", "slice", "slice_scatter", "narrow", "split", "split_with_sizes", "chunk",
         "unbind", "cat", "stack", "_chunk_cat", "flip", "roll", "repeat", "constant_pad_nd", "tril", "triu",
         "diagonal", "diag_embed", "diagonal_scatter", "alias", "detach", "clone", "lift_fresh",
         "lift_fresh_copy", "_to_copy", "copy", "copy_", "unfold", "as_strided", "as_strided_scatter",
         "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle", "block_diag", "rot90",
         "repeat_interleave", "movedim", "unsafe_split", "unsafe_split_with_sizes"}
PADDING = {"reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d",
           "replication_pad3d"}
UPSAMPLE = {"upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_linear1d",
            "upsample_bilinear2d", "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_bicubic2d_aa",
            "_upsample_bilinear2d_aa", "_upsample_nearest_exact1d", "_upsample_nearest_exact2d",
            "_upsample_nearest_exact3d"}
ATTENTION = {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_fused_attention_overrideable"}
DISTANCE = {"_cdist_forward", "_pdist_forward", "_euclidean_dist"}
FFT = {"_fft_c2c", "_fft_r2c", "_fft_c2r"}
MISC = {"_local_scalar_dense": "item", "_prelu_kernel": "prelu", "_grouped_mm": "grouped_mm",
        "grid_sampler_2d": "grid_sampler",
        "grid_sampler_3d": "grid_sampler", "glu": "glu"}
CREATION = {"zeros", "ones", "empty", "full", "scalar_tensor", "empty_strided", "empty_permuted", "eye",
            "arange", "linspace", "logspace", "tril_indices", "triu_indices", "zeros_like", "ones_like",
            "empty_like", "full_like", "new_zeros", "new_ones", "new_empty", "new_full", "new_empty_strided",
            "fill", "fill_", "zero_"}
RANDOM = {"bernoulli", "bernoulli_", "cauchy", "cauchy_", "exponential", "exponential_", "geometric",
          "geometric_", "log_normal", "log_normal_", "multinomial", "native_dropout", "normal", "normal_",
          "normal_functional", "rand", "rand_like", "randint", "randint_like", "randn", "randn_like", "random",
          "random_", "randperm", "uniform", "uniform_"}
SORTING = {"sort", "topk", "_unique2", "unique_consecutive", "bincount", "bucketize", "searchsorted", "histc",
           "kthvalue"}
LOSS = {"mse_loss", "huber_loss", "smooth_l1_loss", "soft_margin_loss", "binary_cross_entropy",
        "binary_cross_entropy_with_logits", "nll_loss_forward", "nll_loss2d_forward", "multi_margin_loss",
        "multilabel_margin_loss_forward"}
LINALG = {"linalg_solve_triangular", "triangular_solve", "cholesky", "linalg_cholesky_ex", "linalg_inv_ex",
          "_linalg_det", "linalg_matrix_exp", "_linalg_solve_ex", "linalg_cross"}
CUSTOM = {"cross_entropy", "linear_cross_entropy", "ragged_dot"}
FUSED = {"_fused_adam_", "_fused_adamw_"}

# backward op name -> forward op (overload) whose CPU autograd calls it
BACKWARD_OF = {
    "_softmax_backward_data": "aten._softmax.default",
    "_log_softmax_backward_data": "aten._log_softmax.default",
    "nll_loss_backward": "aten.nll_loss_forward.default",
    "nll_loss2d_backward": "aten.nll_loss2d_forward.default",
    "multilabel_margin_loss_backward": "aten.multilabel_margin_loss_forward.default",
    "embedding_dense_backward": "aten.embedding.default",
    "masked_scatter_backward": "aten.masked_scatter.default",
    "batch_norm_backward": "aten._batch_norm_with_update.default",
    "select_backward": "aten.select.int",
    "slice_backward": "aten.slice.Tensor",
    "unfold_backward": "aten.unfold.default",
    "native_dropout_backward": "aten.native_dropout.default",
    "_fused_rms_norm_backward": "aten._fused_rms_norm.default",
    "cross_entropy_backward": "tpu_kernels.cross_entropy.default",
    "linear_cross_entropy_backward": "tpu_kernels.linear_cross_entropy.default",
    "ragged_dot_backward": "tpu_kernels.ragged_dot.default",
    "_cdist_backward": "aten._cdist_forward.default",
    "_pdist_backward": "aten._pdist_forward.default",
}

# Kernel impls (Pallas/Helion) run in interpret mode off TPU: few, small examples.
KERNEL_EXAMPLES_CI = 2


def packet_name(op) -> str:
    """``aten.add.Tensor`` -> ``add``."""
    return base_name(op)


def family(op) -> str | None:
    name = packet_name(op)
    base = name.rstrip("_") if name.endswith("_") and not name.startswith("_") and name[:-1] in ELEMENTWISE else name
    if name.startswith("_foreach_"):
        return "elementwise"
    if name in BACKWARD_OF or name.endswith("_backward") or name.endswith("_backward_data"):
        return "backward"
    for fam, table in (("reduction", REDUCTION), ("softmax", SOFTMAX), ("matmul", MATMUL), ("norm", NORM),
                       ("conv", CONV), ("pool", POOL), ("indexing", INDEXING), ("creation", CREATION),
                       ("random", RANDOM), ("sorting", SORTING), ("loss", LOSS), ("linalg", LINALG),
                       ("custom", CUSTOM), ("fused_adam", FUSED), ("padding", PADDING),
                       ("upsample", UPSAMPLE), ("attention", ATTENTION), ("distance", DISTANCE), ("fft", FFT)):
        if name in table:
            return fam
    if name in MISC:
        return MISC[name]
    if name.startswith("special_"):
        return "elementwise"
    if name in SHAPE or (name.endswith("_copy") and name[:-5] in SHAPE):
        return "shape"
    if name in ELEMENTWISE or base in ELEMENTWISE:
        return "elementwise"
    return None


def _forward_of(op):
    name = packet_name(op)
    if name in BACKWARD_OF:
        return lookup_op(BACKWARD_OF[name])
    ns = str(op).split(".")[0]
    for suffix in ("_backward_data", "_backward"):
        if name.endswith(suffix):
            fname = name[: -len(suffix)]
            packet = getattr(getattr(torch.ops, ns), fname, None)
            if packet is None:
                return None
            ov = str(op).split(".")[2]
            return getattr(packet, ov, None) or getattr(packet, "default", None)
    return None


@functools.lru_cache(maxsize=None)
def strategy(op) -> Any:
    """The Hypothesis strategy drawing ``Case``s for ``op``, or None (untested)."""
    try:
        return _strategy(op)
    except S.Unsupported:
        return None


def _strategy(op) -> Any:
    fam = family(op)
    name = packet_name(op)
    if fam is None:
        return None
    if fam == "elementwise":
        allowed = S.ALL
        if name.rstrip("_") in BITWISE:
            allowed = S.INTS + (S.BOOL,)
        elif name == "complex":   # float16 parts make complex32 (ComplexHalf): JAX has none
            allowed = (S.F32, S.BF16)
        elif name.rstrip("_") in FLOAT_ONLY or name.startswith("special_"):
            allowed = S.FLOATS
        return S.elementwise(op, allowed)
    if fam == "reduction":
        if name in ("kthvalue",):
            return S.kthvalue(op)
        return S.reduction(op, S.FLOATS if name in REDUCTION_FLOAT else S.ALL)
    if fam == "backward":
        fwd = _forward_of(op)
        if fwd is None:
            return None
        fs = strategy(fwd)
        if fs is None:
            return None
        return S.capture_backward(op, fwd, fs)
    table = {"softmax": S.softmax, "matmul": S.matmul, "norm": S.norm, "conv": S.conv, "pool": S.pool,
             "indexing": S.indexing, "shape": S.shape_op, "creation": S.creation, "random": S.random_op,
             "sorting": S.sorting, "loss": S.loss, "linalg": S.linalg, "custom": S.custom,
             "fused_adam": S.fused_adam, "padding": S.padding, "upsample": S.upsample,
             "attention": S.attention, "distance": S.distance, "fft": S.fft, "prelu": S.prelu,
             "grouped_mm": S.grouped_mm, "grid_sampler": S.grid_sampler, "glu": S.glu, "item": S.item}
    return table[fam](op)


# -- targets ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def targets() -> dict[str, int]:
    """``aten.add.Tensor`` -> tier (1, 2, 3), from the coverage report's target list."""
    return {t["op"]: int(t["tier"]) for t in load_targets()}


def tier(op) -> int | None:
    return targets().get(str(op))


def target_overloads() -> list:
    return [op for op in map(overload_or_none, targets()) if op is not None]
