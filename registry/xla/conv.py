"""Convolution lowerings: convolution (1d/2d/3d, transposed, groups), its backward, im2col/col2im."""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import scalar_type_name
from tpu_kernels.registry.xla._util import float_compute, matmul_precision
from tpu_kernels.registry.xla.conv_strided import (conv, unit_stride_conv, unit_stride_conv_transpose,
                                                   unit_stride_on_tpu)


def transposed_weight(w: jax.Array, groups: int) -> jax.Array:
    """(C_in, C_out/g, *k) of a transposed conv -> (C_out, C_in/g, *k) of the equivalent conv, flipped."""
    cin, cout_g, *k = w.shape
    w = w.reshape(groups, cin // groups, cout_g, *k).swapaxes(1, 2)
    w = w.reshape(groups * cout_g, cin // groups, *k)
    return jnp.flip(w, axis=tuple(range(2, w.ndim)))


def conv_nd(x: jax.Array, w: jax.Array, stride: Sequence[int], padding: Sequence[int],
            dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
            groups: int) -> jax.Array:
    """torch's convolution (no bias) on NC* / OI* layouts; half types accumulate in float32."""
    nd = x.ndim - 2
    stride, padding, dilation = _expand(stride, nd), _expand(padding, nd), _expand(dilation, nd)
    acc = float_compute(x.dtype)
    kw = dict(precision=matmul_precision(),
              preferred_element_type=acc if acc != x.dtype else None)
    if not transposed:
        if unit_stride_on_tpu(x.shape, stride, dilation):
            return unit_stride_conv(x, w, stride, padding, groups, **kw)
        return conv(x, w, stride, [(p, p) for p in padding], rhs_dilation=dilation,
                    feature_group_count=groups, **kw)
    output_padding = _expand(output_padding, nd)
    if unit_stride_on_tpu(x.shape, stride, dilation):
        return unit_stride_conv_transpose(x, w, stride, padding, output_padding, groups, **kw)
    k = w.shape[2:]
    # a transposed conv is the input-gradient of a conv: dilate the input by the stride
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op)
            for kk, p, d, op in zip(k, padding, dilation, output_padding)]
    return conv(x, transposed_weight(w, groups), (1,) * nd, pads, lhs_dilation=stride,
                rhs_dilation=dilation, feature_group_count=groups, **kw)


def _expand(v: Sequence[int], nd: int) -> tuple[int, ...]:
    v = tuple(v)
    return v * nd if len(v) == 1 else v


def _bias_shape(nd: int) -> tuple[int, ...]:
    return (1, -1) + (1,) * nd


# the C++ type names CPU's bias check prints ("Input type (float) and bias type (double)")
_CTYPE = {"Float": "float", "Double": "double", "BFloat16": "c10::BFloat16", "Half": "c10::Half"}
_DIM_NAMES = {2: ("height", "width"), 3: ("depth", "height", "width")}


def _check_args(input, weight, bias, stride, dilation, transposed, output_padding) -> None:
    """CPU's convolution checks that torch's meta function skips, with CPU's messages: the
    weight's and bias's dtypes, and a transposed convolution's output_padding."""
    if weight.dtype != input.dtype:
        raise RuntimeError(f"expected scalar type {scalar_type_name(input.dtype)} but found "
                           f"{scalar_type_name(weight.dtype)}")
    # (CPU's transposed convolution takes a float32 input's float64 bias)
    if bias is not None and bias.dtype != input.dtype and not transposed:
        i, b = scalar_type_name(input.dtype), scalar_type_name(bias.dtype)
        raise RuntimeError(f"Input type ({_CTYPE.get(i, i)}) and bias type ({_CTYPE.get(b, b)}) should be the same")
    if not transposed or all(o < max(s, d) for o, s, d in zip(output_padding, stride, dilation)):
        return
    # CPU runs a 1-d convolution as a 2-d one of height 1
    lists = [list(v) if len(v) > 1 else [default] + list(v)
             for v, default in ((output_padding, 0), (stride, 1), (dilation, 1))]
    names = _DIM_NAMES[len(lists[0])]
    parts = [f"{label}_{n}: {v}" for label, vs in zip(("output_padding", "stride", "dilation"), lists)
             for n, v in zip(names, vs)]
    raise RuntimeError("output padding must be smaller than either stride or dilation, but got " + " ".join(parts))


@xla("aten::convolution")
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    _check_args(input, weight, bias, stride, dilation, transposed, output_padding)
    y = conv_nd(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        y = y + bias.astype(y.dtype).reshape(_bias_shape(y.ndim - 2))
    return y.astype(out_dtype())


@xla("aten::convolution_backward")
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    def f(x, w):
        return conv_nd(x, w, stride, padding, dilation, transposed, output_padding, groups)

    y, vjp = jax.vjp(f, input, weight)
    gx, gw = vjp(grad_output.astype(y.dtype))
    gb = None
    if output_mask[2]:
        acc = float_compute(grad_output.dtype)
        gb = grad_output.astype(acc).sum(axis=(0, *range(2, grad_output.ndim)))
    return (gx if output_mask[0] else None, gw if output_mask[1] else None, gb)


# -- im2col / col2im ------------------------------------------------------------------------
def _batched(fn, batched_ndim: int):
    """Run ``fn`` on a batched input, adding/removing torch's optional batch dim."""
    def lower(x):
        batched = x.ndim == batched_ndim
        y = fn(x if batched else x[None])
        return (y if batched else y[0]).astype(out_dtype())
    return lower


def _patches_exact(x, kernel_size, dilation, padding, stride):
    # conv_general_dilated_patches multiplies by one-hot filters; gather instead so values
    # (inf/nan, ints) pass through exactly
    n, c, h, w = x.shape
    kh, kw = kernel_size
    xp = jnp.pad(x, [(0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2])
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    ih = (np.arange(oh) * stride[0])[None, :] + (np.arange(kh) * dilation[0])[:, None]  # (kh, oh)
    iw = (np.arange(ow) * stride[1])[None, :] + (np.arange(kw) * dilation[1])[:, None]  # (kw, ow)
    cols = xp[:, :, ih[:, None, :, None], iw[None, :, None, :]]   # (n, c, kh, kw, oh, ow)
    return cols.reshape(n, c * kh * kw, oh * ow)


@xla("aten::im2col")
def im2col(self, kernel_size, dilation, padding, stride):
    return _batched(lambda x: _patches_exact(x, kernel_size, dilation, padding, stride), 4)(self)


@xla("aten::col2im")
def col2im(self, output_size, kernel_size, dilation, padding, stride):
    def fold(cols):
        n, ck = cols.shape[:2]
        c = ck // (kernel_size[0] * kernel_size[1])
        zeros = jnp.zeros((n, c, *output_size), cols.dtype)
        _, vjp = jax.vjp(lambda x: _patches_exact(x, kernel_size, dilation, padding, stride), zeros)
        return vjp(cols)[0]

    acc = float_compute(self.dtype)
    return _batched(fold, 3)(self.astype(acc))
