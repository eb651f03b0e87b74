"""Rotary position embedding for q/k ``[b, h, s, d]`` with ``cos``/``sin`` ``[s, d]``.

Layouts:
  * half (``interleaved=False``, Llama/HF ``rotate_half``):
        out = x * cos + cat(-x[..., d/2:], x[..., :d/2]) * sin
  * interleaved (pairs ``(x[2i], x[2i+1])``, GPT-J/Meta style):
        out[2i]   = x[2i] * cos[2i]   - x[2i+1] * sin[2i]
        out[2i+1] = x[2i+1] * cos[2i+1] + x[2i] * sin[2i+1]
Both reduce to one Helion kernel on the two halves ``u, v`` of each head vector
(the first/second half, or the even/odd elements, split by XLA in the wrapper):
``out_u = u*A + v*B, out_v = v*C + u*D``. Forward uses ``(A, B, C, D) =
(cos_u, -sin_u, cos_v, sin_v)``; the backward is the transposed rotation
``(cos_u, sin_v, cos_v, -sin_u)``. No lane shuffles happen inside the kernel.

Public (JAX arrays in/out):
    rope(x, cos, sin, interleaved=False) -> out        (custom_vjp; no grads for cos/sin)
    rope_qk(q, k, cos, sin, interleaved=False) -> (q_out, k_out)
    rope_bwd(dy, cos, sin, interleaved=False) -> dx
    supports(x_shape, x_dtype, cos_shape, cos_dtype=None, interleaved=False) -> None | reason
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
import helion.language as hl

from ._common import compute_dtype, cost, dtype_reason, launch, nbytes, next_pow2, pow2_floor
from ._common import round_up

SEQ_TILE = 256


def _rope_kernel(u: torch.Tensor, v: torch.Tensor, ca: torch.Tensor, cb: torch.Tensor,
                 cc: torch.Tensor, cd: torch.Tensor):
    nh, s, hd = u.size()
    ou = torch.empty_like(u)
    ov = torch.empty_like(v)
    for tn, ts in hl.tile([nh, s]):
        uf = u[tn, ts, :].to(torch.float32)
        vf = v[tn, ts, :].to(torch.float32)
        a = ca[ts, :][None, :, :]
        b = cb[ts, :][None, :, :]
        c = cc[ts, :][None, :, :]
        d = cd[ts, :][None, :, :]
        ou[tn, ts, :] = (uf * a + vf * b).to(ou.dtype)
        ov[tn, ts, :] = (vf * c + uf * d).to(ov.dtype)
    return ou, ov


def supports(x_shape, x_dtype, cos_shape, cos_dtype=None, interleaved: bool = False) -> str | None:
    r = dtype_reason(x_dtype, *([cos_dtype] if cos_dtype is not None else []))
    if r:
        return r
    if len(x_shape) != 4:
        return f"expected q/k of rank 4 [b, h, s, d], got rank {len(x_shape)}"
    s, d = x_shape[2], x_shape[3]
    cs = tuple(c for c in cos_shape)
    while len(cs) > 2 and cs[0] == 1:
        cs = cs[1:]
    if cs != (s, d):
        return f"cos/sin shape {tuple(cos_shape)} is not [s, d] = [{s}, {d}]"
    if d % 2:
        return f"head_dim {d} is odd"
    if 0 in x_shape:
        return "zero-size input"
    return None


def _split(x, interleaved):
    if interleaved:
        return x[..., 0::2], x[..., 1::2]
    h = x.shape[-1] // 2
    return x[..., :h], x[..., h:]


def _merge(u, v, interleaved):
    if interleaved:
        return jnp.stack([u, v], axis=-1).reshape(u.shape[:-1] + (2 * u.shape[-1],))
    return jnp.concatenate([u, v], axis=-1)


def _apply(x, cos, sin, interleaved, backward):
    x = compute_dtype(jnp.asarray(x))
    b, h, s, d = x.shape
    cos = jnp.asarray(cos, jnp.float32).reshape(s, d)
    sin = jnp.asarray(sin, jnp.float32).reshape(s, d)
    cu, cv = _split(cos, interleaved)
    su, sv = _split(sin, interleaved)
    coefs = (cu, sv, cv, -su) if backward else (cu, -su, cv, sv)
    u, v = _split(x.reshape(b * h, s, d), interleaved)
    # Sequence tile: the whole sequence when short, else SEQ_TILE rows (padded to whole
    # tiles: Pallas interpret mode cannot run partial tiles of a 2-D tile loop).
    if s <= SEQ_TILE:
        bs, sp = next_pow2(s), s
    else:
        bs, sp = SEQ_TILE, round_up(s, SEQ_TILE)
    if sp != s:
        pad3 = ((0, 0), (0, sp - s), (0, 0))
        u, v = jnp.pad(u, pad3), jnp.pad(v, pad3)
        coefs = tuple(jnp.pad(c, ((0, sp - s), (0, 0))) for c in coefs)
    hd = d // 2
    bn = max(1, min(64, pow2_floor(max(65536 // (min(bs, sp) * max(hd, 128)), 1))))
    ou, ov = launch(_rope_kernel, {"block_sizes": [bn, bs]}, u, v, *coefs,
                    estimate=cost(3 * 2 * u.size, 2 * nbytes(u, v) + nbytes(*coefs)))
    out = _merge(ou[:, :s], ov[:, :s], interleaved)
    return out.reshape(b, h, s, d)


def rope_fwd(x, cos, sin, interleaved: bool = False):
    return _apply(x, cos, sin, interleaved, backward=False)


def rope_bwd(dy, cos, sin, interleaved: bool = False):
    return _apply(dy, cos, sin, interleaved, backward=True)


@jax.custom_vjp
def _rope_half(x, cos, sin):
    return rope_fwd(x, cos, sin, False)


@jax.custom_vjp
def _rope_inter(x, cos, sin):
    return rope_fwd(x, cos, sin, True)


def _mk_vjp(interleaved):
    def f(x, cos, sin):
        return rope_fwd(x, cos, sin, interleaved), (cos, sin)

    def b(res, dy):
        cos, sin = res
        return rope_bwd(dy, cos, sin, interleaved), jnp.zeros_like(cos), jnp.zeros_like(sin)

    return f, b


_rope_half.defvjp(*_mk_vjp(False))
_rope_inter.defvjp(*_mk_vjp(True))


def rope(x, cos, sin, interleaved: bool = False):
    """Apply RoPE to x [b, h, s, d]; differentiable in x (cos/sin get zero cotangents)."""
    x = compute_dtype(jnp.asarray(x))
    cos = compute_dtype(jnp.asarray(cos))
    sin = compute_dtype(jnp.asarray(sin))
    return (_rope_inter if interleaved else _rope_half)(x, cos, sin)


def rope_qk(q, k, cos, sin, interleaved: bool = False):
    return rope(q, cos, sin, interleaved), rope(k, cos, sin, interleaved)
