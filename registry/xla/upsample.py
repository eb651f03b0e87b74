"""Resampling by index tables: upsample (nearest, linear family, cubic, antialiased),
grid_sampler 2d/3d, reflection and replication padding, and their backwards.

Upsampling is separable: per spatial dim a static table of source taps (indices, and
weights in torch's opmath precision) is computed in numpy exactly as torch's CPU kernels
do, then applied last dim first (torch's order). Scales are static arguments: they
shape the tables. Every backward is the vjp of its forward (a scatter-add).
"""
from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tpu_kernels.registry.context import out_dtype, out_shape
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import float_compute
from tpu_kernels.registry.xla.norm import output_wanted

_CUBIC_A = -0.75   # torch's bicubic (and grid sampler) coefficient
_AA_CUBIC_A = -0.5  # torch's antialiased bicubic filter


# -- per-dim tap tables ------------------------------------------------------------------------------
def _scale(n_in: int, n_out: int, align_corners: bool, scale, ft) -> np.floating:
    """torch's area_pixel_compute_scale in opmath type ``ft``."""
    if align_corners:
        return ft(n_in - 1) / ft(n_out - 1) if n_out > 1 else ft(0)
    return _scale_value(scale, n_in, n_out, ft)


def _scale_value(scale, n_in: int, n_out: int, ft) -> np.floating:
    """torch's compute_scales_value: 1/scale if a positive scale was given, else in/out."""
    if scale is not None and scale > 0:
        return ft(1.0 / scale)
    return ft(n_in) / ft(n_out)


def _nearest_taps(n_in, n_out, scale, ft, exact: bool, shortcuts: bool):
    """``shortcuts``: exactly twice the size halves the indices, whatever the scale (see
    ``_copies_same_size``)."""
    o = np.arange(n_out)
    if shortcuts and not exact and n_out == 2 * n_in:
        idx = o >> 1
    else:
        s = _scale_value(scale, n_in, n_out, ft)
        src = (o.astype(ft) + ft(0.5)) * s if exact else o.astype(ft) * s
        idx = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    return idx[:, None], None


def _linear_taps(n_in, n_out, align_corners, scale, ft):
    s = _scale(n_in, n_out, align_corners, scale, ft)
    o = np.arange(n_out).astype(ft)
    src = s * o if align_corners else np.maximum(s * (o + ft(0.5)) - ft(0.5), ft(0))
    i0 = np.floor(src).astype(np.int64)
    lam = np.clip(src - i0.astype(ft), ft(0), ft(1)).astype(ft)
    i1 = i0 + (i0 < n_in - 1)
    return np.stack([i0, i1], 1), np.stack([ft(1) - lam, lam], 1)


def _cubic_coeffs(t, a, ft):
    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):   # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    a = ft(a)
    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], 1).astype(ft)


def _cubic_taps(n_in, n_out, align_corners, scale, ft):
    s = _scale(n_in, n_out, align_corners, scale, ft)
    o = np.arange(n_out).astype(ft)
    src = s * o if align_corners else s * (o + ft(0.5)) - ft(0.5)
    i = np.floor(src).astype(np.int64)
    idx = np.clip(i[:, None] + np.arange(-1, 3), 0, n_in - 1)
    return idx, _cubic_coeffs((src - i.astype(ft)).astype(ft), _CUBIC_A, ft)


def _aa_filter(kind: str):
    if kind == "linear":
        return lambda x: np.maximum(1 - np.abs(x), 0)

    def cubic(x):
        x, a = np.abs(x), _AA_CUBIC_A
        return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                        np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0))
    return cubic


def _aa_taps(n_in, n_out, align_corners, scale, ft, kind: str):
    """torch's antialiased taps: the filter widened by the downscale factor, normalised."""
    interp = 2 if kind == "linear" else 4
    s = _scale(n_in, n_out, align_corners, scale, ft)
    support = ft(interp * 0.5) * s if s >= 1 else ft(interp * 0.5)
    k = int(math.ceil(support)) * 2 + 1
    invscale = ft(1) / s if s >= 1 else ft(1)
    center = s * (np.arange(n_out).astype(ft) + ft(0.5))
    xmin = np.maximum((center - support + ft(0.5)).astype(np.int64), 0)
    xsize = np.minimum((center + support + ft(0.5)).astype(np.int64), n_in) - xmin
    j = np.arange(k)
    x = (j[None, :] + xmin[:, None]).astype(ft) - center[:, None] + ft(0.5)
    w = _aa_filter(kind)(x * invscale)
    inside = j[None, :] < xsize[:, None]
    w = np.where(inside, w, 0).astype(ft)
    total = w.sum(1, keepdims=True)
    w = np.where(total != 0, w / np.where(total != 0, total, 1), w).astype(ft)
    # the taps past an output's window (``inside`` False) read a clipped position with weight 0:
    # they are left out of the sum, not added as 0 * x (an inf or nan there made every output
    # that pads onto it nan, where torch's kernel loops over the window only)
    return np.minimum(xmin[:, None] + j[None, :], n_in - 1), w, inside


def _copies_same_size(mode: str, nd: int, backward: bool) -> str | None:
    """Where torch's CPU kernel leaves a dim whose size holds as it is, whatever scale it was
    given: "dim" (each such dim; nearest also halves the indices for exactly twice the
    size), "all" (only when every dim holds) or None (never). Measured per kernel: each
    differs, and so does its backward (5 -> 5 at scale 1.1: the linear kernels copy both
    ways, nearest 1-d/3-d forward reads sources 0, 0, 1, 2, 3 but its backward copies, the
    antialiased ones the other way round)."""
    if mode == "nearest":
        return "dim" if nd == 2 or backward else None
    if mode == "cubic":
        return "all" if backward else None
    if mode.startswith("aa"):
        return None if backward else "dim"
    return "dim" if mode == "linear" else None


def _taps(mode: str, n_in: int, n_out: int, align_corners: bool, scale, ft, shortcuts: bool):
    """(indices, weights, which taps count: None for all) of each output along one dim."""
    if mode in ("nearest", "nearest-exact"):
        return *_nearest_taps(n_in, n_out, scale, ft, mode == "nearest-exact", shortcuts), None
    if mode == "linear":
        return *_linear_taps(n_in, n_out, align_corners, scale, ft), None
    if mode == "cubic":
        return *_cubic_taps(n_in, n_out, align_corners, scale, ft), None
    return _aa_taps(n_in, n_out, align_corners, scale, ft, mode.split("-")[1])


def resample(x: jax.Array, out_sizes, mode: str, align_corners: bool = False, scales=None,
             backward: bool = False) -> jax.Array:
    """Upsample the trailing ``len(out_sizes)`` dims of ``x`` (torch's upsample_* kernels;
    ``backward``: as its backward kernel reads the geometry, whose gradient this is)."""
    nd = len(out_sizes)
    scales = tuple(scales) if scales is not None else (None,) * nd
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    ft = np.dtype(float_compute(x.dtype)).type if floating else np.float32
    y = x if mode.startswith("nearest") else x.astype(float_compute(x.dtype))
    rule = _copies_same_size(mode, nd, backward)
    copies = rule == "dim" or (rule == "all" and tuple(x.shape[-nd:]) == tuple(out_sizes))
    for d in reversed(range(nd)):
        axis = x.ndim - nd + d
        if copies and x.shape[axis] == out_sizes[d]:
            continue
        idx, w, inside = _taps(mode, x.shape[axis], out_sizes[d], align_corners, scales[d], ft, copies)
        g = jnp.take(y, jnp.asarray(idx.reshape(-1)), axis=axis)
        g = g.reshape(y.shape[:axis] + idx.shape + y.shape[axis + 1:])   # (..., out, taps, ...)
        if w is None:
            y = jnp.take(g, 0, axis=axis + 1)
            continue
        trailing = (1,) * (y.ndim - axis - 1)
        w = jnp.asarray(w.reshape(w.shape + trailing))
        for k in range(w.shape[1]):  # accumulate in tap order, as torch's kernels do
            term = jnp.take(g, k, axis=axis + 1) * w[:, k]
            if inside is not None and not inside[:, k].all():
                term = jnp.where(jnp.asarray(inside[:, k].reshape((-1,) + trailing)), term, 0)
            y = term if k == 0 else y + term
    return y


# -- upsample ops ----------------------------------------------------------------------------------------
_MODES = {  # op stem -> (mode, spatial dims)
    "upsample_nearest1d": ("nearest", 1), "upsample_nearest2d": ("nearest", 2),
    "upsample_nearest3d": ("nearest", 3), "_upsample_nearest_exact1d": ("nearest-exact", 1),
    "_upsample_nearest_exact2d": ("nearest-exact", 2), "_upsample_nearest_exact3d": ("nearest-exact", 3),
    "upsample_linear1d": ("linear", 1), "upsample_bilinear2d": ("linear", 2),
    "upsample_trilinear3d": ("linear", 3), "upsample_bicubic2d": ("cubic", 2),
    "_upsample_bilinear2d_aa": ("aa-linear", 2), "_upsample_bicubic2d_aa": ("aa-cubic", 2),
}
_SCALE_NAMES = {1: ("scales",), 2: ("scales_h", "scales_w"), 3: ("scales_d", "scales_h", "scales_w")}


def _bind(op, first: int, rest: tuple, kw: dict) -> dict:
    """The schema arguments after position ``first`` by name."""
    names = [a.name for a in op._schema.arguments][first:]
    return {**dict(zip(names, rest)), **kw}


def _forward(op, mode: str, nd: int):
    def lower(self, output_size, *rest, **kw):
        a = _bind(op, 2, rest, kw)
        scales = tuple(a.get(n) for n in _SCALE_NAMES[nd])
        y = resample(self, out_shape()[-nd:], mode, a.get("align_corners", False), scales)
        return y.astype(out_dtype())
    return lower


def _forward_vec(op, mode: str, nd: int):
    def lower(input, output_size, *rest, **kw):
        a = _bind(op, 2, rest, kw)
        y = resample(input, out_shape()[-nd:], mode, a.get("align_corners", False), a.get("scale_factors"))
        return y.astype(out_dtype())
    return lower


def _backward(op, mode: str, nd: int):
    def lower(grad_output, output_size, input_size, *rest, **kw):
        a = _bind(op, 3, rest, kw)
        scales = tuple(a.get(n) for n in _SCALE_NAMES[nd])
        acc = float_compute(grad_output.dtype)

        def f(x):
            return resample(x, tuple(output_size), mode, a.get("align_corners", False), scales, backward=True)
        _, vjp = jax.vjp(f, jnp.zeros(tuple(input_size), acc))
        return vjp(grad_output.astype(acc))[0].astype(out_dtype())
    return lower


def _register_upsample() -> None:
    aten = torch.ops.aten
    for stem, (mode, nd) in _MODES.items():
        packet = getattr(aten, stem)
        xla(packet.default, name=stem, static=_SCALE_NAMES[nd])(_forward(packet.default, mode, nd))
        xla(packet.vec, name=f"{stem}_vec")(_forward_vec(packet.vec, mode, nd))
        back = getattr(aten, f"{stem}_backward", None)
        if back is not None:
            xla(back.default, name=f"{stem}_backward",
                static=_SCALE_NAMES[nd])(_backward(back.default, mode, nd))


_register_upsample()


# -- grid sampler -------------------------------------------------------------------------------------------
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _reflect(c, twice_low: int, twice_high: int):
    """torch's reflect_coordinates: fold ``c`` into [low, high] by mirroring."""
    if twice_low == twice_high:
        return jnp.zeros_like(c)
    lo, span = twice_low / 2, (twice_high - twice_low) / 2
    c = jnp.abs(c - lo)
    extra = jnp.fmod(c, span)
    flips = jnp.floor(c / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + lo, span - extra + lo)


def _clip_coord(c, size: int):
    """torch's clip_coordinates: ``c`` clamped to [0, size - 1], with a zero gradient on
    the borders themselves (torch counts them out of bounds; ``jnp.clip`` would give half)."""
    return jnp.where(c <= 0, 0.0, jnp.where(c >= size - 1, float(size - 1), c)).astype(c.dtype)


def _pad_coord(c, size: int, padding_mode: int, align_corners: bool):
    """torch's compute_coordinates: apply border / reflection padding to a source coordinate."""
    if padding_mode == _BORDER:
        return _clip_coord(c, size)
    if padding_mode == _REFLECTION:
        c = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
        return _clip_coord(c, size)
    return c


def _grid_taps(c, size: int, interp: int, padding_mode: int, align_corners: bool):
    """Source taps of one dim: list of (integer index, weight) arrays, weight None for nearest."""
    c = ((c + 1) / 2) * (size - 1) if align_corners else ((c + 1) * size - 1) / 2
    if interp == _BICUBIC:  # padding applies to each tap, not to the centre
        i0 = jnp.floor(c)
        coeffs = _cubic_coeffs_jnp(c - i0)
        return [(_pad_coord(i0 - 1 + k, size, padding_mode, align_corners), coeffs[k]) for k in range(4)]
    c = _pad_coord(c, size, padding_mode, align_corners)
    if interp == _NEAREST:
        return [(jnp.round(c), None)]   # round half to even, as nearbyint
    i0 = jnp.floor(c)
    return [(i0, (i0 + 1) - c), (i0 + 1, c - i0)]


def _cubic_coeffs_jnp(t):
    a = _CUBIC_A

    def near(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def grid_sample(input, grid, interp: int, padding_mode: int, align_corners: bool):
    """torch's grid_sampler_{2,3}d: input (N, C, *S), grid (N, *O, nd) with x first."""
    nd = grid.shape[-1]
    acc = float_compute(input.dtype)
    x, grid = input.astype(acc), grid.astype(acc)
    n, c, sizes = x.shape[0], x.shape[1], x.shape[2:]
    planes = x.reshape(n, c, -1)
    # grid[..., 0] indexes the last spatial dim
    taps = [_grid_taps(grid[..., nd - 1 - d], sizes[d], interp, padding_mode, align_corners)
            for d in range(nd)]
    out = 0
    for combo in itertools.product(*taps):
        flat, ok, w = 0, True, None
        for d, (i, wt) in enumerate(combo):
            ok = ok & (i >= 0) & (i <= sizes[d] - 1)
            flat = flat * sizes[d] + jnp.clip(i, 0, sizes[d] - 1).astype(jnp.int64)
            w = wt if w is None else (w if wt is None else w * wt)
        vals = jnp.take_along_axis(planes, flat.reshape(n, 1, -1), axis=2)
        vals = jnp.where(ok.reshape(n, 1, -1), vals, 0)
        if w is not None:
            vals = vals * w.reshape(n, 1, -1)
        out = out + vals
    return out.reshape((n, c) + grid.shape[1:-1])


@xla("aten::grid_sampler_2d", "aten::grid_sampler_3d")
def grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    return grid_sample(input, grid, interpolation_mode, padding_mode, align_corners).astype(out_dtype())


@xla("aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward")
def grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                          output_mask):
    acc = float_compute(input.dtype)

    def f(x, g):
        return grid_sample(x, g, interpolation_mode, padding_mode, align_corners)
    _, vjp = jax.vjp(f, input.astype(acc), grid.astype(acc))
    gi, gg = vjp(grad_output.astype(acc))
    return (gi if output_wanted(0) else None, gg if output_wanted(1) else None)


# -- reflection / replication padding ----------------------------------------------------------------------
def _pad_index(n: int, lo: int, hi: int, mode: str) -> np.ndarray:
    i = np.arange(-lo, n + hi)
    if mode == "reflect":
        return (n - 1) - np.abs((n - 1) - np.abs(i))
    return np.clip(i, 0, n - 1)


def pad_by_index(x: jax.Array, padding, mode: str) -> jax.Array:
    """torch's reflection/replication pad: ``padding`` pairs run from the last dim backwards."""
    for j in range(len(padding) // 2):
        axis = x.ndim - 1 - j
        x = jnp.take(x, jnp.asarray(_pad_index(x.shape[axis], padding[2 * j], padding[2 * j + 1], mode)),
                     axis=axis)
    return x


def _pad_forward(mode: str):
    def lower(self, padding):
        return pad_by_index(self, padding, mode)
    return lower


def _pad_backward(mode: str):
    def lower(grad_output, self, padding):
        acc = float_compute(grad_output.dtype)
        _, vjp = jax.vjp(lambda x: pad_by_index(x, padding, mode), jnp.zeros(self.shape, acc))
        return vjp(grad_output.astype(acc))[0].astype(out_dtype())
    return lower


for _kind, _mode in (("reflection", "reflect"), ("replication", "edge")):
    for _nd in (1, 2, 3):
        xla(f"aten::{_kind}_pad{_nd}d", name=f"{_kind}_pad{_nd}d")(_pad_forward(_mode))
        xla(f"aten::{_kind}_pad{_nd}d_backward", name=f"{_kind}_pad{_nd}d_backward")(_pad_backward(_mode))
