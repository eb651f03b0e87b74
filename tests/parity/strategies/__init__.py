"""Hypothesis strategies that draw valid calls of ATen ops, by op family.

A strategy draws a ``Case``: the op's positional and keyword arguments, where tensors are
``Spec`` recipes (shape, dtype, seed, value kind, memory layout) that build the same
values on CPU and on tpu (``tpu_kernels.testing.make_tensor``), so a non-contiguous input
is non-contiguous on both devices and a failure prints as a short reproducer.

Families (each a function ``op -> strategy``): ``elementwise`` (schema-driven: every
Tensor argument broadcasts against the first, Scalars are Python numbers, tensor lists
for ``_foreach``), ``reduction`` (schema-driven: dim lists, keepdim, dtype, correction,
p), ``softmax``, ``matmul``, ``norm``, ``conv``/``pool``, ``indexing``, ``shape``,
``creation``, ``random`` (compared on shape and dtype only), ``sorting``, ``loss``,
``linalg`` and ``backward`` (the backward op's arguments captured from CPU autograd of
its forward op's drawn case). Dtypes are drawn from float32, bfloat16, float16, int32,
int64, bool; a case CPU torch rejects is not a case (the test discards it).

Shapes include 0-d, zero-size, size-1, odd (7, 33, 129) and TPU-friendly (8x128) sizes;
the ``ci`` profile caps element counts (``max_numel``) to keep compiles cheap.
"""
from __future__ import annotations

from strategies.base import (ALL, BF16, BOOL, Case, Concrete, F16, F32, FLOATS, I32, I64, INTS, LAYOUTS,
    SIZES, Spec, Unsupported, broadcast_to, dtypes, max_numel, numel, scalar_for, shapes, tensors,
    thorough, valid_dim)
from strategies.elementwise import elementwise, item, kthvalue, reduction, softmax
from strategies.nn import MM_SIZES, conv, matmul, norm, pool
from strategies.indexing import indexing
from strategies.shapes import raise_reject, shape_op
from strategies.creation import FACTORY_KW, creation, random_op, sorting
from strategies.losses import custom, fused_adam, linalg, loss
from strategies.backward import capture_backward, flat, meta_summary, with_grad
from strategies.layers import (attention, distance, fft, glu, grid_sampler, grouped_mm, padding, prelu,
    upsample)

__all__ = ["ALL", "BF16", "BOOL", "Case", "Concrete", "F16", "F32", "FLOATS", "I32", "I64", "INTS",
           "LAYOUTS", "SIZES", "Spec", "Unsupported", "broadcast_to", "dtypes", "max_numel", "numel",
           "scalar_for", "shapes", "tensors", "thorough", "valid_dim", "elementwise", "item", "kthvalue",
           "reduction", "softmax", "MM_SIZES", "conv", "matmul", "norm", "pool", "indexing",
           "raise_reject", "shape_op", "FACTORY_KW", "creation", "random_op", "sorting", "custom",
           "fused_adam", "linalg", "loss", "capture_backward", "flat", "meta_summary", "with_grad",
           "attention", "distance", "fft", "glu", "grid_sampler", "grouped_mm", "padding", "prelu",
           "upsample"]
