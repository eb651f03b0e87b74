"""Shape lowerings: cat/stack, the ``*_copy`` twins of views, flips and rolls, padding,
triangles, pixel/channel shuffles, and the backward/scatter ops of slicing views."""
from __future__ import annotations


import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpu_kernels.registry.context import out_dtype, out_shape
from tpu_kernels.registry.decorator import xla


def _dim(d: int, ndim: int) -> int:
    return d % max(ndim, 1)


def _at_dim(ndim: int, dim: int, index) -> tuple:
    """An index tuple selecting ``index`` along ``dim`` and everything elsewhere."""
    return (slice(None),) * dim + (index,) + (slice(None),) * (ndim - dim - 1)


def _diag_index(n: int, offset: int) -> tuple[jax.Array, jax.Array]:
    """Row and column indices of the ``offset`` diagonal (length ``n``) of a matrix."""
    i = jnp.arange(n)
    return (i, i + offset) if offset >= 0 else (i - offset, i)


# -- concatenation ---------------------------------------------------------------------
@xla("aten::cat")
def cat(tensors, dim=0):
    dt, shape = out_dtype(), out_shape()
    # torch skips legacy empty 1-d tensors of shape (0,) whatever the other ranks
    parts = [t.astype(dt) for t in tensors if t.shape != (0,)]
    if not parts:
        return jnp.zeros(shape, dt)
    return jnp.concatenate(parts, axis=_dim(dim, len(shape)))


@xla("aten::stack")
def stack(tensors, dim=0):
    dt = out_dtype()
    return jnp.stack([t.astype(dt) for t in tensors], axis=_dim(dim, len(out_shape())))


@xla("aten::_chunk_cat")
def chunk_cat(tensors, dim, num_chunks):
    dim = dim % tensors[0].ndim if dim < 0 else dim
    parts = []
    for t in tensors:
        size = t.shape[dim]
        padded = -(-size // num_chunks) * num_chunks
        if padded != size:
            t = jnp.pad(t, [(0, 0)] * dim + [(0, padded - size)] + [(0, 0)] * (t.ndim - dim - 1))
        parts.append(t.reshape(t.shape[:dim] + (num_chunks, -1)))
    return jnp.concatenate(parts, axis=dim + 1)


@xla("aten::block_diag")
def block_diag(tensors):
    out = jnp.zeros(out_shape(), out_dtype())
    r = c = 0
    for t in tensors:
        t2 = t.reshape(1, -1) if t.ndim < 2 else t
        h, w = t2.shape
        out = out.at[r:r + h, c:c + w].set(t2.astype(out.dtype))
        r, c = r + h, c + w
    return out


# -- copies of views: the view's values, computed ----------------------------------------
@xla("aten::_unsafe_view", "aten::view_copy", "aten::squeeze_copy", "aten::squeeze_copy.dim",
     "aten::squeeze_copy.dims", "aten::unsqueeze_copy")
def reshape_to_out(self, *args, **kwargs):
    return self.reshape(out_shape())


@xla("aten::expand_copy")
def expand_copy(self, size, *, implicit=False):
    return jnp.broadcast_to(self, out_shape())


@xla("aten::permute_copy")
def permute_copy(self, dims):
    return jnp.transpose(self, [_dim(d, self.ndim) for d in dims])


@xla("aten::t_copy")
def t_copy(self):
    return self.T


@xla("aten::transpose_copy.int")
def transpose_copy(self, dim0, dim1):
    return jnp.swapaxes(self, _dim(dim0, self.ndim), _dim(dim1, self.ndim)) if self.ndim else self


@xla("aten::narrow_copy")
def narrow_copy(self, dim, start, length):
    dim = _dim(dim, self.ndim)
    start = start % self.shape[dim] if start < 0 else start
    return lax.slice_in_dim(self, start, start + length, axis=dim)


@xla("aten::split_with_sizes_copy", "aten::unsafe_split_with_sizes")
def split_with_sizes_copy(self, split_sizes, dim=0):
    dim = _dim(dim, self.ndim)
    cuts = [sum(split_sizes[:i + 1]) for i in range(len(split_sizes) - 1)]
    return jnp.split(self, cuts, axis=dim)


@xla("aten::split_copy.Tensor", "aten::unsafe_split.Tensor")
def split_copy(self, split_size, dim=0):
    dim = _dim(dim, self.ndim)
    n = self.shape[dim]
    return jnp.split(self, list(range(split_size, n, split_size)) if split_size else [], axis=dim)


@xla("aten::unbind_copy.int")
def unbind_copy(self, dim=0):
    dim = _dim(dim, self.ndim)
    return [jnp.take(self, i, axis=dim) for i in range(self.shape[dim])]


@xla("aten::select_copy.int")
def select_copy(self, dim, index):
    dim = _dim(dim, self.ndim)
    return lax.index_in_dim(self, index % self.shape[dim], axis=dim, keepdims=False)


@xla("aten::slice_copy.Tensor")
def slice_copy(self, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, self.ndim)
    first, last, step = slice(start, end, step).indices(self.shape[dim])
    return lax.slice_in_dim(self, first, max(first, last), step, axis=dim)


@xla("aten::diagonal_copy")
def diagonal_copy(self, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(self, offset, _dim(dim1, self.ndim), _dim(dim2, self.ndim))


def _unfold_index(length: int, size: int, step: int) -> jax.Array:
    n = (length - size) // step + 1
    return jnp.arange(n)[:, None] * step + jnp.arange(size)[None, :]


@xla("aten::unfold_copy")
def unfold_copy(self, dimension, size, step):
    if self.ndim == 0:
        return self.reshape(out_shape())
    dim = _dim(dimension, self.ndim)
    idx = _unfold_index(self.shape[dim], size, step)
    moved = jnp.moveaxis(self, dim, -1)[..., idx]          # (..., n, size)
    return jnp.moveaxis(moved, -2, dim)


@xla("aten::unfold_backward")
def unfold_backward(grad_in, input_sizes, dim, size, step):
    if len(input_sizes) == 0:
        return grad_in.reshape(())
    dim = _dim(dim, len(input_sizes))
    idx = _unfold_index(input_sizes[dim], size, step).reshape(-1)
    g = jnp.moveaxis(grad_in, dim, -2)                      # (..., n, size)
    g = g.reshape(g.shape[:-2] + (idx.size,))   # not -1: a zero-size window or batch has no size to infer
    zeros = jnp.zeros(tuple(input_sizes), grad_in.dtype)
    out = jnp.moveaxis(zeros, dim, -1).at[..., idx].add(g)
    return jnp.moveaxis(out, -1, dim)


def _strided_index(size, stride, offset: int) -> jax.Array:
    """Flat storage positions of an ``as_strided`` view (``size``/``stride``/``offset``)."""
    idx = jnp.full(tuple(size), offset, jnp.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (jnp.arange(n, dtype=jnp.int64) * s).reshape(shape)
    return idx


@xla("aten::as_strided_copy")
def as_strided_copy(self, size, stride, storage_offset=None):
    # the input is treated as contiguous storage (functional semantics)
    return self.reshape(-1)[_strided_index(size, stride, storage_offset or 0)]


@xla("aten::as_strided_scatter")
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    idx = _strided_index(size, stride, storage_offset or 0)
    flat = self.reshape(-1).at[idx].set(src.astype(self.dtype))
    return flat.reshape(self.shape)


# -- scatters into views and the backwards of views ----------------------------------------
def _slice(size: int, start, end, step: int) -> slice:
    return slice(*slice(start, end, step).indices(size))


@xla("aten::slice_backward")
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    dim = _dim(dim, len(input_sizes))
    zeros = jnp.zeros(tuple(input_sizes), grad_output.dtype)
    return zeros.at[_at_dim(len(input_sizes), dim, _slice(input_sizes[dim], start, end, step))].set(grad_output)


@xla("aten::slice_scatter")
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, self.ndim)
    where = _at_dim(self.ndim, dim, _slice(self.shape[dim], start, end, step))
    return self.at[where].set(src.astype(self.dtype))


@xla("aten::select_backward")
def select_backward(grad_output, input_sizes, dim, index):
    dim = _dim(dim, len(input_sizes))
    zeros = jnp.zeros(tuple(input_sizes), grad_output.dtype)
    return zeros.at[_at_dim(len(input_sizes), dim, index % input_sizes[dim])].set(grad_output)


@xla("aten::select_scatter")
def select_scatter(self, src, dim, index):
    dim = _dim(dim, self.ndim)
    return self.at[_at_dim(self.ndim, dim, index % self.shape[dim])].set(src.astype(self.dtype))


@xla("aten::diagonal_scatter")
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    d1, d2 = _dim(dim1, self.ndim), _dim(dim2, self.ndim)
    moved = jnp.moveaxis(self, (d1, d2), (-2, -1))
    rows, cols = _diag_index(src.shape[-1], offset)
    moved = moved.at[..., rows, cols].set(src.astype(self.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@xla("aten::diag_embed")
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    shape = out_shape()
    d1, d2 = _dim(dim1, len(shape)), _dim(dim2, len(shape))
    m = shape[d1]
    rows, cols = _diag_index(self.shape[-1], offset)
    out = jnp.zeros(self.shape[:-1] + (m, m), self.dtype).at[..., rows, cols].set(self)
    # moveaxis needs its destinations in increasing order to place both right
    src, dst = ((-2, -1), (d1, d2)) if d1 < d2 else ((-1, -2), (d2, d1))
    return jnp.moveaxis(out, src, dst)


# -- rearrangements ------------------------------------------------------------------------
@xla("aten::flip")
def flip(self, dims):
    return jnp.flip(self, tuple(_dim(d, self.ndim) for d in dims)) if dims else self


@xla("aten::roll")
def roll(self, shifts, dims=()):
    if not dims:  # roll the flattened tensor
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return jnp.roll(self, tuple(shifts), tuple(_dim(d, self.ndim) for d in dims))


@xla("aten::rot90")
def rot90(self, k=1, dims=(0, 1)):
    return jnp.rot90(self, k, axes=tuple(_dim(d, self.ndim) for d in dims))


@xla("aten::repeat")
def repeat(self, repeats):
    x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    return jnp.tile(x, tuple(repeats))


@xla("aten::tril")
def tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@xla("aten::triu")
def triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


@xla("aten::constant_pad_nd")
def constant_pad_nd(self, pad, value=0):
    # pad pairs run from the last dim backwards; negative amounts crop (lax.pad does both)
    n = len(pad) // 2
    config = [(0, 0, 0)] * (self.ndim - n)
    config += [(pad[2 * i], pad[2 * i + 1], 0) for i in reversed(range(n))]
    return lax.pad(self, jnp.asarray(value).astype(self.dtype), config)


@xla("aten::channel_shuffle", "aten::native_channel_shuffle")
def channel_shuffle(self, groups):
    n, c = self.shape[:2]
    x = self.reshape((n, groups, c // groups) + self.shape[2:])
    return jnp.swapaxes(x, 1, 2).reshape(self.shape)


@xla("aten::pixel_shuffle")
def pixel_shuffle(self, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = self.shape
    x = self.reshape(tuple(lead) + (c // (r * r), r, r, h, w))
    b = len(lead)
    x = jnp.transpose(x, tuple(range(b)) + (b, b + 3, b + 1, b + 4, b + 2))
    return x.reshape(out_shape())


@xla("aten::pixel_unshuffle")
def pixel_unshuffle(self, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = self.shape
    x = self.reshape(tuple(lead) + (c, h // r, r, w // r, r))
    b = len(lead)
    x = jnp.transpose(x, tuple(range(b)) + (b, b + 2, b + 4, b + 1, b + 3))
    return x.reshape(out_shape())


@xla("aten::repeat_interleave.Tensor", data_dependent=True)
def repeat_interleave(repeats, *, output_size=None):
    """``arange(len(repeats))`` with element i repeated ``repeats[i]`` times (int64)."""
    total = int(jnp.sum(repeats)) if output_size is None else output_size
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=repeats.dtype), repeats,
                      total_repeat_length=total)


# -- complex -------------------------------------------------------------------------------
def _no_complex32(a, b, *_: object) -> str | None:
    if torch.float16 in (a.dtype, b.dtype):
        return ("float16 parts make torch.complex32 (ComplexHalf), which JAX has no dtype for: "
                "pass float32 parts")
    return None


@xla("aten::complex", supports=_no_complex32)
def complex_(real, imag):
    return lax.complex(*jnp.broadcast_arrays(real, imag)).astype(out_dtype())


@xla("aten::polar", supports=_no_complex32)
def polar(abs, angle):
    a, t = jnp.broadcast_arrays(abs, angle)
    return lax.complex(a * jnp.cos(t), a * jnp.sin(t)).astype(out_dtype())
