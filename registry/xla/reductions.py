"""Reduction and scan lowerings: sum/mean/prod, min/max/arg*, var/std, norms, all/any,
logsumexp, median/mode/kthvalue, cumulative scans, and whole-tensor comparisons."""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.registry.xla._util import float_compute


# -- helpers ---------------------------------------------------------------------------
def _axes(dim: Any, ndim: int) -> tuple[int, ...]:
    """Reduced axes for an ``int``/``int[]?`` dim argument; None or [] mean all axes.

    A 0-d tensor accepts dim 0/-1 and reduces nothing."""
    if ndim == 0:
        return ()
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(sorted({d % ndim for d in dim}))


def _axis(dim: int, ndim: int) -> int | None:
    """One axis (None for a 0-d tensor, whose only valid dims are 0 and -1)."""
    return None if ndim == 0 else dim % ndim


def _acc(dtype) -> np.dtype:
    """The dtype a reduction accumulates in: float32 for half types, else ``dtype``."""
    return float_compute(dtype)


def _count(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    return int(np.prod([shape[a] for a in axes], dtype=np.int64))


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _keep(x: jax.Array, axes: tuple[int, ...], keepdim: bool) -> jax.Array:
    """Re-insert reduced axes as size 1 (for results computed without keepdims)."""
    return jnp.expand_dims(x, axes) if keepdim and axes else x


# -- sum / mean / prod / nansum -----------------------------------------------------------
def _accumulating(fn: Callable) -> Callable:
    """sum-like reduction: accumulate in float32 for half types (as torch's CPU kernels)."""
    def lower(self, dim=None, keepdim=False, *, dtype=None):
        dt = out_dtype()
        axes = _axes(dim, self.ndim)
        return fn(self.astype(_acc(dt)), axis=axes, keepdims=keepdim).astype(dt)
    return lower


xla("aten::sum.dim_IntList", "aten::sum.default", name="sum")(_accumulating(jnp.sum))
xla("aten::nansum.default", name="nansum")(_accumulating(jnp.nansum))
xla("aten::mean.dim", "aten::mean.default", name="mean")(_accumulating(jnp.mean))
xla("aten::prod.default", name="prod")(_accumulating(jnp.prod))


@xla("aten::prod.dim_int")
def prod_dim(self, dim, keepdim=False, *, dtype=None):
    dt = out_dtype()
    return jnp.prod(self.astype(_acc(dt)), axis=_axes(dim, self.ndim), keepdims=keepdim).astype(dt)


@xla("aten::trace.default")
def trace(self):
    dt = out_dtype()
    return jnp.trace(self.astype(_acc(dt))).astype(dt)


# -- max / min family ----------------------------------------------------------------------
@xla("aten::amax.default", "aten::max.default")
def amax(self, dim=(), keepdim=False):
    return jnp.max(self, axis=_axes(dim, self.ndim), keepdims=keepdim)


@xla("aten::amin.default", "aten::min.default")
def amin(self, dim=(), keepdim=False):
    return jnp.min(self, axis=_axes(dim, self.ndim), keepdims=keepdim)


def _arg_select(arg: Callable) -> Callable:
    """max.dim/min.dim: the values at the first arg index (NaN counts as extreme)."""
    def lower(self, dim, keepdim=False):
        ax = _axis(dim, self.ndim)
        if ax is None:
            return self, jnp.zeros((), jnp.int64)
        idx = arg(self, axis=ax, keepdims=True)
        vals = jnp.take_along_axis(self, idx, axis=ax)
        if not keepdim:
            idx, vals = jnp.squeeze(idx, ax), jnp.squeeze(vals, ax)
        return vals, idx.astype(jnp.int64)
    return lower


xla("aten::max.dim", name="max_dim")(_arg_select(jnp.argmax))
xla("aten::min.dim", name="min_dim")(_arg_select(jnp.argmin))


def _arg(fn: Callable) -> Callable:
    """argmax/argmin: first index of the extreme; dim None means the flattened tensor."""
    def lower(self, dim=None, keepdim=False):
        if dim is None:
            idx = fn(self.reshape(-1))
            return idx.reshape((1,) * self.ndim) if keepdim else idx
        ax = _axis(dim, self.ndim)
        return jnp.zeros((), jnp.int64) if ax is None else fn(self, axis=ax, keepdims=keepdim)
    return lower


xla("aten::argmax.default", name="argmax")(_arg(jnp.argmax))
xla("aten::argmin.default", name="argmin")(_arg(jnp.argmin))


@xla("aten::aminmax.default")
def aminmax(self, *, dim=None, keepdim=False):
    axes = _axes(dim, self.ndim)
    if dim is None and keepdim:   # torch keeps every dim as size 1
        return (jnp.min(self, axis=axes, keepdims=True), jnp.max(self, axis=axes, keepdims=True))
    return jnp.min(self, axis=axes, keepdims=keepdim), jnp.max(self, axis=axes, keepdims=keepdim)


# -- variance and standard deviation --------------------------------------------------------
def _moments(self, dim, correction, keepdim):
    """(var, mean) over ``dim`` with ``correction`` (default 1), computed in float32+."""
    if not jnp.issubdtype(self.dtype, jnp.inexact):  # torch's meta functions let ints through
        raise RuntimeError("std and var only support floating point and complex dtypes")
    x = self.astype(_acc(self.dtype))  # the dispatcher casts var to torch's (real) dtype
    axes = _axes(dim, self.ndim)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    d = x - mean
    sq = (d.real ** 2 + d.imag ** 2) if jnp.iscomplexobj(d) else d * d
    n = _count(self.shape, axes)
    corr = 1 if correction is None else correction
    var = jnp.sum(sq, axis=axes, keepdims=keepdim) / jnp.maximum(n - corr, 0)
    return var, (mean if keepdim else jnp.squeeze(mean, axes))


def _unbiased(unbiased: bool) -> int:
    return 1 if unbiased else 0


@xla("aten::var.correction")
def var(self, dim=None, *, correction=None, keepdim=False):
    return _moments(self, dim, correction, keepdim)[0]


@xla("aten::var.dim")
def var_dim(self, dim, unbiased=True, keepdim=False):
    return _moments(self, dim, _unbiased(unbiased), keepdim)[0]


@xla("aten::var.default")
def var_default(self, unbiased=True):
    return _moments(self, None, _unbiased(unbiased), False)[0]


@xla("aten::std.correction")
def std(self, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_moments(self, dim, correction, keepdim)[0])


@xla("aten::std.dim")
def std_dim(self, dim, unbiased=True, keepdim=False):
    return jnp.sqrt(_moments(self, dim, _unbiased(unbiased), keepdim)[0])


@xla("aten::std.default")
def std_default(self, unbiased=True):
    return jnp.sqrt(_moments(self, None, _unbiased(unbiased), False)[0])


@xla("aten::var_mean.correction")
def var_mean(self, dim=None, *, correction=None, keepdim=False):
    return _moments(self, dim, correction, keepdim)


@xla("aten::std_mean.correction")
def std_mean(self, dim=None, *, correction=None, keepdim=False):
    v, m = _moments(self, dim, correction, keepdim)
    return jnp.sqrt(v), m


# -- logsumexp and norms --------------------------------------------------------------------
@xla("aten::logsumexp.default")
def logsumexp(self, dim, keepdim=False):
    dt = out_dtype()
    x = self.astype(_acc(dt))
    axes = _axes(dim, self.ndim)
    if not axes:
        return x
    m = jnp.max(x, axis=axes, keepdims=True, initial=-jnp.inf)  # empty rows give -inf
    m = jnp.where(jnp.isfinite(m), jax.lax.stop_gradient(m), 0)  # all -inf rows give -inf
    s = jnp.log(jnp.sum(jnp.exp(x - m), axis=axes, keepdims=True)) + m
    return (s if keepdim else jnp.squeeze(s, axes)).astype(dt)


def _vector_norm(x: jax.Array, ord: Any, axes: tuple[int, ...], keepdim: bool) -> jax.Array:
    """The ``ord``-norm of ``x`` (already in its compute dtype) over ``axes``."""
    a = jnp.abs(x)
    if ord == float("inf"):
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


@xla("aten::linalg_vector_norm.default", static=("ord",))
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = self.astype(_acc(self.dtype if dtype is None else to_jax_dtype(dtype)))
    return _vector_norm(x, float(ord), _axes(dim, self.ndim), keepdim)


@xla("aten::norm.ScalarOpt_dim", "aten::norm.Scalar", "aten::norm.ScalarOpt_dtype",
     "aten::norm.ScalarOpt_dim_dtype", static=("p",))
def norm(self, p=2, dim=None, keepdim=False, *, dtype=None):
    x = self.astype(_acc(self.dtype if dtype is None else to_jax_dtype(dtype)))
    return _vector_norm(x, 2.0 if p is None else float(p), _axes(dim, self.ndim), keepdim)


@xla("aten::dist.default", static=("p",))
def dist(self, other, p=2):
    dt = out_dtype()
    d = self.astype(_acc(dt)) - other.astype(_acc(dt))
    return _vector_norm(d, float(p), tuple(range(d.ndim)), False).astype(dt)


@xla("aten::renorm.default", static=("p",))
def renorm(self, p, dim, maxnorm):
    """Rescale each slice along ``dim`` whose p-norm exceeds ``maxnorm`` down to it."""
    dt = out_dtype()
    x = self.astype(_acc(dt))
    ax = _axis(dim, self.ndim)
    others = tuple(a for a in range(self.ndim) if a != ax)
    n = _vector_norm(x, float(p), others, True)
    scale = jnp.where(n > maxnorm, maxnorm / (n + 1e-7), 1.0)  # torch's epsilon
    return (x * scale.astype(x.dtype)).astype(dt)


# -- boolean reductions ---------------------------------------------------------------------
def _logical(fn: Callable) -> Callable:
    def lower(self, dim=None, keepdim=False):
        if isinstance(dim, (list, tuple)) and len(dim) == 0:
            # all.dims/any.dims with dim=[] reduce nothing (unlike sum's [] = all dims)
            return self != 0
        return fn(self != 0, axis=_axes(dim, self.ndim), keepdims=keepdim)
    return lower


xla("aten::all.default", "aten::all.dim", "aten::all.dims", "aten::_is_all_true.default",
    name="all")(_logical(jnp.all))
xla("aten::any.default", "aten::any.dim", "aten::any.dims", "aten::_is_any_true.default",
    name="any")(_logical(jnp.any))


@xla("aten::count_nonzero.default", "aten::count_nonzero.dim_IntList")
def count_nonzero(self, dim=None):
    return jnp.sum(self != 0, axis=_axes(dim, self.ndim), dtype=jnp.int64)


# -- order statistics ---------------------------------------------------------------------------
def _sorted_along(x: jax.Array, ax: int) -> tuple[jax.Array, jax.Array]:
    """Stable ascending sort along ``ax`` with NaN last: (values, int64 indices)."""
    from tpu_kernels.registry.xla.sorting import sort_with_indices
    return sort_with_indices(x, ax, descending=False)


def _pick(vals, idx, pos, ax, keepdim):
    """values/indices at per-slice position ``pos`` (shape of the reduced result, kept)."""
    v = jnp.take_along_axis(vals, pos, axis=ax)
    i = jnp.take_along_axis(idx, pos, axis=ax)
    return (v, i) if keepdim else (jnp.squeeze(v, ax), jnp.squeeze(i, ax))


def _nan_first_index(x, ax):
    """Index of the first NaN along ``ax`` (keepdims), and whether there is one."""
    isn = jnp.isnan(x) if _is_float(x) else jnp.zeros(x.shape, bool)
    return jnp.argmax(isn, axis=ax, keepdims=True), jnp.any(isn, axis=ax, keepdims=True)


def _median_dim(self, dim, keepdim, ignore_nan: bool):
    ax = _axis(dim, self.ndim)
    if ax is None:
        return self, jnp.zeros((), jnp.int64)
    vals, idx = _sorted_along(self, ax)
    n = self.shape[ax]
    if ignore_nan and _is_float(self):
        k = jnp.sum(~jnp.isnan(self), axis=ax, keepdims=True)
        pos = jnp.maximum(k - 1, 0) // 2
    else:
        pos = jnp.full(vals.shape[:ax] + (1,) + vals.shape[ax + 1:], (n - 1) // 2)
        first_nan, has_nan = _nan_first_index(self, ax)
    v, i = _pick(vals, idx, pos, ax, True)
    if not ignore_nan and _is_float(self):  # NaN wins, at the first NaN's index
        v, i = jnp.where(has_nan, jnp.nan, v).astype(v.dtype), jnp.where(has_nan, first_nan, i)
    return (v, i) if keepdim else (jnp.squeeze(v, ax), jnp.squeeze(i, ax))


@xla("aten::median.dim")
def median_dim(self, dim, keepdim=False):
    return _median_dim(self, dim, keepdim, ignore_nan=False)


@xla("aten::nanmedian.dim")
def nanmedian_dim(self, dim, keepdim=False):
    return _median_dim(self, dim, keepdim, ignore_nan=True)


@xla("aten::median.default")
def median(self):
    return _median_dim(self.reshape(-1), 0, False, ignore_nan=False)[0]


@xla("aten::nanmedian.default")
def nanmedian(self):
    return _median_dim(self.reshape(-1), 0, False, ignore_nan=True)[0]


@xla("aten::kthvalue.default")
def kthvalue(self, k, dim=-1, keepdim=False):
    ax = _axis(dim, self.ndim)
    if ax is None:
        return self, jnp.zeros((), jnp.int64)
    vals, idx = _sorted_along(self, ax)
    v = jax.lax.slice_in_dim(vals, k - 1, k, axis=ax)
    i = jax.lax.slice_in_dim(idx, k - 1, k, axis=ax)
    return (v, i) if keepdim else (jnp.squeeze(v, ax), jnp.squeeze(i, ax))


@xla("aten::mode.default")
def mode(self, dim=-1, keepdim=False):
    """Most frequent value (smallest among equally frequent), index of its last occurrence."""
    ax = _axis(dim, self.ndim)
    if ax is None:
        return self, jnp.zeros((), jnp.int64)
    vals, idx = _sorted_along(self, ax)
    vals, idx = jnp.moveaxis(vals, ax, -1), jnp.moveaxis(idx, ax, -1)
    n = vals.shape[-1]
    pos = jnp.arange(n)
    same = vals[..., 1:] == vals[..., :-1]
    if _is_float(vals):
        same = same | (jnp.isnan(vals[..., 1:]) & jnp.isnan(vals[..., :-1]))
    starts = jnp.concatenate([jnp.ones(vals.shape[:-1] + (1,), bool), ~same], axis=-1)
    run_start = jax.lax.cummax(jnp.where(starts, pos, 0), axis=vals.ndim - 1)
    count = pos - run_start + 1
    # the end of the first longest run: count first reaches its max there
    end = jnp.argmax(count, axis=-1, keepdims=True)
    first = jnp.take_along_axis(run_start, end, axis=-1)
    # torch returns the largest original index among the run's elements
    in_run = (pos >= first) & (pos <= end)
    i = jnp.max(jnp.where(in_run, idx, -1), axis=-1, keepdims=True)
    v = jnp.take_along_axis(vals, end, axis=-1)
    v, i = jnp.moveaxis(v, -1, ax), jnp.moveaxis(i, -1, ax)
    return (v, i) if keepdim else (jnp.squeeze(v, ax), jnp.squeeze(i, ax))


# -- scans ------------------------------------------------------------------------------------
def _scan(fn: Callable) -> Callable:
    def lower(self, dim, *, dtype=None):
        dt = out_dtype()
        x = self.astype(_acc(dt))
        ax = _axis(dim, self.ndim)
        return (x if ax is None else fn(x, axis=ax)).astype(dt)
    return lower


xla("aten::cumsum.default", name="cumsum")(_scan(jnp.cumsum))
xla("aten::cumprod.default", name="cumprod")(_scan(jnp.cumprod))


@xla("aten::logcumsumexp.default")
def logcumsumexp(self, dim):
    dt = out_dtype()
    x = self.astype(_acc(dt))
    ax = _axis(dim, self.ndim)
    if ax is None or x.shape[ax] == 0:
        return x.astype(dt)
    return jax.lax.cumlogsumexp(x, axis=ax).astype(dt)


def _cum_extreme(greater: bool) -> Callable:
    """cummax/cummin: running extreme and its index (latest index among ties; NaN sticks)."""
    def combine(a, b):
        (va, ia), (vb, ib) = a, b
        better = vb >= va if greater else vb <= va
        if jnp.issubdtype(va.dtype, jnp.inexact):
            better = jnp.isnan(vb) | (~jnp.isnan(va) & better)
        return jnp.where(better, vb, va), jnp.where(better, ib, ia)

    def lower(self, dim):
        ax = _axis(dim, self.ndim)
        if ax is None:
            return self, jnp.zeros((), jnp.int64)
        if self.shape[ax] == 0:
            return self, jnp.zeros(self.shape, jnp.int64)
        shape = [1] * self.ndim
        shape[ax] = self.shape[ax]
        iota = jnp.broadcast_to(jnp.arange(self.shape[ax], dtype=jnp.int64).reshape(shape), self.shape)
        return jax.lax.associative_scan(combine, (self, iota), axis=ax)
    return lower


xla("aten::cummax.default", name="cummax")(_cum_extreme(True))
xla("aten::cummin.default", name="cummin")(_cum_extreme(False))


# -- whole-tensor comparisons (Python bool results) ----------------------------------------------
@xla("aten::allclose.default", data_dependent=True)
def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return bool(jnp.allclose(self, other, rtol=rtol, atol=atol, equal_nan=equal_nan))


@xla("aten::equal.default", data_dependent=True)
def equal(self, other):
    return self.shape == other.shape and bool(jnp.all(self == other))
