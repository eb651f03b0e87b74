"""Fused scaled-dot-product attention ops and their backward ops.

``F.scaled_dot_product_attention`` on a tpu tensor takes torch's math path (the fused
kernel choice is a C++ stub that a Python backend cannot register), so these ops arrive
from graphs recorded elsewhere: ``_scaled_dot_product_flash_attention_for_cpu`` (what the
CPU records), the CUDA flash / memory-efficient / cuDNN variants and the overrideable
PrivateUse1 one. All share one pure-JAX core: scores in float32 for half types, causal
masks aligned top-left (as torch), boolean masks keep ``True``, additive masks add, fewer
kv heads than query heads are shared by consecutive query heads (GQA). Dropout is not
supported (``dropout_p`` must be 0: fused ops carry their RNG state in CUDA's form).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from tpu_kernels.registry.context import out_dtype, out_shape
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import float_compute, matmul_precision


def _einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.einsum(spec, a, b, precision=matmul_precision())


def _no_dropout(op_name: str):
    """A ``supports`` predicate refusing ``dropout_p > 0`` (wherever the call passes it)."""
    pos = [a.name for a in getattr(torch.ops.aten, op_name).default._schema.arguments].index("dropout_p")

    def supports(*args, **kwargs) -> bool | str:
        p = args[pos] if pos < len(args) else kwargs.get("dropout_p", 0.0)
        return p == 0 or "dropout_p > 0 is not supported by the fused attention lowerings"
    return supports


def _fused(op_name: str):
    """Register a lowering of ``aten::op_name`` for dropout-free calls."""
    return xla(f"aten::{op_name}", supports=_no_dropout(op_name), static=("dropout_p",))


def _group(k: jax.Array, heads: int) -> jax.Array:
    """Repeat kv heads so query head h reads kv head h // (heads // kv_heads)."""
    kv = k.shape[-3]
    return k if kv == heads else jnp.repeat(k, heads // kv, axis=-3)


def _ungroup(dk: jax.Array, kv_heads: int) -> jax.Array:
    """Sum the gradients of the query heads that shared a kv head."""
    heads = dk.shape[-3]
    if heads == kv_heads:
        return dk
    return dk.reshape(*dk.shape[:-3], kv_heads, heads // kv_heads, *dk.shape[-2:]).sum(-3)


def _scale(q: jax.Array, scale) -> float | jax.Array:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _scores(q, k, mask, is_causal, scale, ct):
    """Scaled, masked q k^T in the compute dtype ``ct``: (..., L, S)."""
    s = _einsum("...le,...se->...ls", q.astype(ct), _group(k, q.shape[-3]).astype(ct))
    s = s * jnp.asarray(_scale(q, scale), ct)
    if is_causal:
        L, S = s.shape[-2:]
        s = jnp.where(jnp.tril(jnp.ones((L, S), bool)), s, -jnp.inf)
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf) if mask.dtype == jnp.bool_ else s + mask.astype(ct)
    return s


def _forward(q, k, v, mask, is_causal, scale):
    """Attention output (..., L, Ev) in the compute dtype and logsumexp (..., L) in f32.

    A fully masked row gives zeros and logsumexp 0, like torch's CPU flash kernel.
    """
    ct = float_compute(q.dtype)
    s = _scores(q, k, mask, is_causal, scale, ct)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - m)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    denom = jnp.where(denom == 0, 1.0, denom)
    out = _einsum("...ls,...sd->...ld", e / denom, _group(v, q.shape[-3]).astype(ct))
    lse = (m + jnp.log(denom))[..., 0]
    return out, lse.astype(jnp.float32)


def _backward(grad_out, q, k, v, out, lse, mask, is_causal, scale):
    """Gradients of q, k, v (k and v summed over shared heads) and of the scores."""
    ct = float_compute(q.dtype)
    heads = q.shape[-3]
    s = _scores(q, k, mask, is_causal, scale, ct)
    p = jnp.exp(s - lse[..., None].astype(ct))
    g = grad_out.astype(ct)
    vg = _group(v, heads).astype(ct)
    dv = _einsum("...ls,...ld->...sd", p, g)
    dp = _einsum("...ld,...sd->...ls", g, vg)
    delta = jnp.sum(g * out.astype(ct), axis=-1, keepdims=True)
    ds = p * (dp - delta)
    sc = jnp.asarray(_scale(q, scale), ct)
    dq = _einsum("...ls,...se->...le", ds, _group(k, heads).astype(ct)) * sc
    dk = _einsum("...ls,...le->...se", ds, q.astype(ct)) * sc
    return dq, _ungroup(dk, k.shape[-3]), _ungroup(dv, v.shape[-3]), ds


def _extras(start: int, n: int) -> list:
    """Placeholder outputs ``start..start+n-1`` (RNG state, sequence offsets): zeros or None."""
    outs = []
    for i in range(start, start + n):
        try:
            outs.append(jnp.zeros(out_shape(i), out_dtype(i)))
        except RuntimeError:  # not a tensor (None or an int)
            outs.append(None)
    return outs


def _fit(lse: jax.Array, i: int = 1) -> jax.Array:
    """logsumexp padded or cut to the shape torch declares for output ``i``."""
    n = out_shape(i)[-1]
    if n <= lse.shape[-1]:
        return lse[..., :n]
    return jnp.pad(lse, [(0, 0)] * (lse.ndim - 1) + [(0, n - lse.shape[-1])], constant_values=jnp.inf)


def _bias_grad(ds: jax.Array, bias) -> jax.Array | None:
    """The scores' gradient summed down to the shape torch gives the bias's gradient."""
    if bias is None:
        return None
    shape = out_shape(3)
    lead = ds.ndim - len(shape)
    ds = ds.sum(tuple(range(lead))) if lead else ds
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and ds.shape[i] != 1)
    return ds.sum(axes, keepdims=True) if axes else ds


# -- the CPU-recorded op ----------------------------------------------------------------------------
def _one_head_size(query, key, value) -> None:
    """torch's CPU flash kernel's check (its meta function does not make it): a value head
    size that differs (multi-head latent attention) takes the overrideable fused op."""
    if not query.shape[-1] == key.shape[-1] == value.shape[-1]:
        raise RuntimeError("scaled_dot_product_attention_flash_attention: Q/K/V should have the same head size")


@_fused("_scaled_dot_product_flash_attention_for_cpu")
def sdpa_flash_for_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    _one_head_size(query, key, value)
    return _forward(query, key, value, attn_mask, is_causal, scale)


@_fused("_scaled_dot_product_flash_attention_for_cpu_backward")
def sdpa_flash_for_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                                *, attn_mask=None, scale=None):
    _one_head_size(query, key, value)
    return _backward(grad_out, query, key, value, out, logsumexp, attn_mask, is_causal, scale)[:3]


# -- CUDA and PrivateUse1 variants (graphs recorded on other devices) ------------------------------------
@_fused("_scaled_dot_product_flash_attention")
def sdpa_flash(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    out, lse = _forward(query, key, value, None, is_causal, scale)
    L, S = query.shape[-2], key.shape[-2]
    return [out, lse, None, None, L, S, *_extras(6, 3)]


@_fused("_scaled_dot_product_flash_attention_backward")
def sdpa_flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                        dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    return _backward(grad_out, query, key, value, out, logsumexp, None, is_causal, scale)[:3]


@_fused("_scaled_dot_product_efficient_attention")
def sdpa_efficient(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                   *, scale=None):
    out, lse = _forward(query, key, value, attn_bias, is_causal, scale)
    return [out, _fit(lse), *_extras(2, 2)]


@_fused("_scaled_dot_product_efficient_attention_backward")
def sdpa_efficient_backward(grad_out_, query, key, value, attn_bias, out, logsumexp, philox_seed,
                            philox_offset, dropout_p, grad_input_mask, is_causal=False, *, scale=None):
    lse = logsumexp[..., : query.shape[-2]]
    dq, dk, dv, ds = _backward(grad_out_, query, key, value, out, lse, attn_bias, is_causal, scale)
    db = _bias_grad(ds, attn_bias) if grad_input_mask[3] else None
    return dq, dk, dv, db


@_fused("_scaled_dot_product_fused_attention_overrideable")
def sdpa_overrideable(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                      return_debug_mask=False, *, scale=None):
    out, lse = _forward(query, key, value, attn_bias, is_causal, scale)
    L, S = query.shape[-2], key.shape[-2]
    return [out, lse, None, None, L, S, *_extras(6, 3)]


@_fused("_scaled_dot_product_fused_attention_overrideable_backward")
def sdpa_overrideable_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp,
                               cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                               philox_offset, *, scale=None):
    dq, dk, dv, ds = _backward(grad_out, query, key, value, out, logsumexp, attn_bias, is_causal, scale)
    if attn_bias is None:
        return dq, dk, dv, None
    # torch's meta function declares the bias gradient whenever there is a bias
    db = _bias_grad(ds, attn_bias) if grad_input_mask[3] else jnp.zeros(out_shape(3), out_dtype(3))
    return dq, dk, dv, db
