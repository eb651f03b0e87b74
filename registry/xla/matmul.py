"""Matmul-family lowerings: mm, bmm, mv, dot, vdot, addmm, baddbmm, addmv, addbmm, addr,
_trilinear, _grouped_mm (and its meta, without the CUDA-only dtype rule), and this
library's N-d ``tpu_kernels::linear`` and its weight gradient.

Matmuls go through ``jax.lax.dot_general``: half types accumulate in float32, integers
in int64 (exact; torch wraps to the result dtype the same way), float32 at the precision
``torch.get_float32_matmul_precision()`` selects (the dispatch cache is keyed on it).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_kernels.registry.context import out_dtype, out_shape
from tpu_kernels.registry.context import out_dtype as _result_dtype   # (``_scaled_mm`` has an argument so named)
from tpu_kernels.registry.custom_ops import library  # noqa: F401  (declares tpu_kernels::linear)
from tpu_kernels.registry.decorator import tpu_kernel, xla
from tpu_kernels.registry.xla._util import cast, float_compute, matmul_precision


def _acc_dtype(dtype):
    """The dtype a matmul accumulates in for operands of ``dtype``."""
    if jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
        return jnp.dtype(jnp.int64)
    return float_compute(dtype)


def _precision(dtype):
    if dtype == jnp.float32 or dtype == jnp.complex64:
        return matmul_precision()
    return jax.lax.Precision.HIGHEST


def _dot(a: jax.Array, b: jax.Array, contract: tuple, batch: tuple = ((), ())) -> jax.Array:
    """dot_general in torch's result dtype, accumulated in ``_acc_dtype`` (result not cast)."""
    dt = jnp.promote_types(a.dtype, b.dtype)
    acc = _acc_dtype(dt)
    if acc == jnp.int64:  # XLA integer dots are exact; int64 keeps products from overflowing
        a, b = a.astype(acc), b.astype(acc)
    else:
        a, b = a.astype(dt), b.astype(dt)
    return jax.lax.dot_general(a, b, (contract, batch), precision=_precision(dt),
                               preferred_element_type=acc)


def _matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b for (..., n, k) x (..., k, m) / (n, k) x (k,) / (k,) x (k,)."""
    if a.ndim == 3:
        return _dot(a, b, ((2,), (1,)), ((0,), (0,)))
    return _dot(a, b, ((a.ndim - 1,), (0,)))


def _scaled_add(self, prod, beta, alpha):
    """beta * self + alpha * prod in the accumulation dtype; beta == 0 ignores self (NaNs too)."""
    dt = out_dtype()
    if dt == jnp.bool_:
        return (jnp.asarray(beta, bool) & (self != 0)) | (jnp.asarray(alpha, bool) & (prod != 0))
    acc = prod.dtype
    p = prod * jnp.asarray(alpha, acc)
    s = self.astype(acc)
    bias = jnp.where(jnp.asarray(beta) == 0, jnp.zeros((), acc), s * jnp.asarray(beta, acc))
    return (bias + p).astype(dt)


def _same_dtype(name: str, *arrays) -> None:
    """torch's matmul kernels (not their meta functions) refuse mixed dtypes; so does this."""
    dtypes = [a.dtype for a in arrays if hasattr(a, "dtype") and a.ndim > 0]
    if len(set(dtypes)) > 1:
        from tpu_kernels.registry.dtypes import to_torch_dtype
        raise RuntimeError(f"{name}: expected all tensors to have the same dtype, but got "
                           + ", ".join(str(to_torch_dtype(d)) for d in dtypes))


@xla("aten::mm.default", "aten::bmm.default", "aten::mv.default", "aten::dot.default")
def mm(self, mat2):
    _same_dtype("mm", self, mat2)
    return _matmul(self, mat2)


@xla("aten::vdot.default")
def vdot(self, other):
    return _dot(jnp.conj(self), other, ((0,), (0,)))


@xla("aten::addmm.default", "aten::baddbmm.default", "aten::addmv.default")
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    _same_dtype("addmm", self, mat1, mat2)
    out = _scaled_add(self, _matmul(mat1, mat2), beta, alpha)
    if out.shape != out_shape():  # addmv with an empty matrix: torch gives beta * self
        out = jnp.broadcast_to(_scaled_add(self, jnp.zeros((), out.dtype), beta, alpha), out_shape())
    return out


@tpu_kernel("tpu_kernels::linear", kind="xla")
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., in] @ weight [out, in].T + bias``, one contraction of x's last dim: its
    leading dims stay (torch's linear flattens them, and on TPU that reshape keeps XLA from
    fusing the matmul with a concatenation or split next to it)."""
    _same_dtype("linear", x, weight, *(() if bias is None else (bias,)))
    out = _dot(x, weight, ((x.ndim - 1,), (1,)))
    return (out if bias is None else out + bias.astype(out.dtype)).astype(x.dtype)


@tpu_kernel("tpu_kernels::linear_weight_grad", kind="xla")
def linear_weight_grad(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``grad [..., out]`` and ``x [..., in]`` contracted over every leading dim: ``[out, in]``."""
    lead = tuple(range(grad.ndim - 1))
    return _dot(grad, x, (lead, lead)).astype(grad.dtype)


@xla("aten::addbmm.default")
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    _same_dtype("addbmm", self, batch1, batch2)
    # contract the batch dim together with k: sum_b batch1[b] @ batch2[b]
    prod = _dot(batch1, batch2, ((0, 2), (0, 1)))
    return _scaled_add(self, prod, beta, alpha)


@xla("aten::addr.default")
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    return _scaled_add(self, _dot(vec1[:, None], vec2[None, :], ((1,), (0,))), beta, alpha)


@xla("aten::_trilinear.default")
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    a = jnp.expand_dims(i1, tuple(expand1)) if expand1 else i1
    b = jnp.expand_dims(i2, tuple(expand2)) if expand2 else i2
    c = jnp.expand_dims(i3, tuple(expand3)) if expand3 else i3
    acc = float_compute(out_dtype())
    prod = a.astype(acc) * b.astype(acc) * c.astype(acc)
    return jnp.sum(prod, axis=tuple(sumdim)) if sumdim else prod


@xla("aten::_scaled_mm.default")
def scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
              use_fast_accum=False):
    """The float8 matmul: (self * scale_a) @ (mat2 * scale_b) + bias, accumulated in float32
    (scales per tensor, per row of ``self``, per column of ``mat2``); a float8 result is
    divided by ``scale_result`` before its (saturating) cast. TPUs before v7x have no float8
    matrix unit: XLA widens the operands."""
    a = self.astype(jnp.float32) * scale_a.astype(jnp.float32)
    b = mat2.astype(jnp.float32) * scale_b.astype(jnp.float32)
    out = jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    if scale_result is not None:
        out = out / scale_result.astype(jnp.float32)
    return cast(out, _result_dtype())


def _group_sizes(offs: jax.Array) -> jax.Array:
    """Group sizes from torch's cumulative group ends."""
    ends = offs.astype(jnp.int32)
    return jnp.diff(ends, prepend=jnp.zeros((1,), jnp.int32))


@xla("aten::_grouped_mm.default")
def grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    """Grouped matmul; rows/cols past the last offset are zero (torch leaves them unset)."""
    acc = _acc_dtype(jnp.promote_types(self.dtype, mat2.dtype))
    prec = _precision(self.dtype)
    if offs is None:           # 3-D x 3-D: a plain batched matmul
        return _matmul(self, mat2)
    sizes = _group_sizes(offs)
    if jax.default_backend() == "cpu" and acc != self.dtype:
        # XLA:CPU's ragged dot has no bf16 x bf16 -> f32 kernel; TPU keeps bf16 operands
        self, mat2 = self.astype(acc), mat2.astype(acc)
    if self.ndim == 2 and mat2.ndim == 3:      # rows of self grouped, one rhs per group
        return jax.lax.ragged_dot(self, mat2, sizes, precision=prec, preferred_element_type=acc)
    if self.ndim == 3 and mat2.ndim == 2:      # columns of mat2 grouped, one lhs per group
        out_t = jax.lax.ragged_dot(jnp.matrix_transpose(mat2), jnp.matrix_transpose(self), sizes, precision=prec,
                                   preferred_element_type=acc)
        return jnp.matrix_transpose(out_t)
    # 2-D x 2-D: the contraction dim is grouped; one output matrix per group
    dn = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((1,), (0,)), ((), ())), lhs_ragged_dimensions=[1],
        rhs_group_dimensions=[])
    return jax.lax.ragged_dot_general(self, mat2, sizes, dn, precision=prec,
                                      preferred_element_type=acc)


def _grouped_mm_meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """torch's meta for _grouped_mm accepts only bfloat16 (a CUDA rule); CPU torch, and so
    the tpu device, run every float dtype. Same output rule, without the dtype rule."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor
    torch._check(mat_a.dtype == mat_b.dtype,
                 lambda: f"_grouped_mm: mat_a {mat_a.dtype} and mat_b {mat_b.dtype} differ")
    torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
                 lambda: f"_grouped_mm: operands must be 2-D or 3-D, got {mat_a.dim()}-D and {mat_b.dim()}-D")
    return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)


_META_OVERRIDES = torch.library.Library("aten", "IMPL")
# also the fake impl FakeTensor runs under torch.compile (it prefers a registered fake impl
# to torch's Python meta, which the Python dispatcher would otherwise pick)
torch.library.register_fake("aten::_grouped_mm", _grouped_mm_meta, lib=_META_OVERRIDES)
