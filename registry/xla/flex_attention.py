"""FlexAttention's XLA fallback: dense attention with the same score_mod and mask_mod.

The flex_attention higher-order ops take callables, so their impls see a static spec
instead of the call's arguments: each impl is an ``Impl`` of the registry whose ``op`` is
the HOP, called as ``fn(spec, *arrays)`` with a hashable ``FlexSpec`` (shapes, mods,
block-mask geometry, built by ``spec_of``) and checked with ``supports(spec)``; the route
picks one as for any op (``registry.which(torch.ops.higher_order.flex_attention, spec)``).
This module holds the spec and the dense impls, which close the impl list (the Pallas
kernel, ``registry/bindings/flex_attention.py``, comes first). The math follows torch's CPU path (``pallas/reference/flex_attention.py``):
every entry's mask_mod decides (the block tables are only a hint), the backward is the
vjp of the dense forward, including the captured tensors' gradients.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import torch
from torch._higher_order_ops.flex_attention import flex_attention as FLEX_HOP
from torch._higher_order_ops.flex_attention import flex_attention_backward as FLEX_BWD_HOP

from tpu_kernels.pallas.reference import flex_attention as dense
from tpu_kernels.registry.core import DEFAULT_PRIORITY, REGISTRY, Impl
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.registry.xla import flex_mods
from tpu_kernels.registry.xla.flex_mods import Mod

Buffers = tuple    # per captured value: (shape, torch dtype) for a tensor, else the number


@dataclasses.dataclass(frozen=True)
class FlexSpec:
    """The static facts of one flex_attention call (hashable: it keys compiled programs)."""
    q_shape: tuple[int, ...]
    k_shape: tuple[int, ...]
    v_shape: tuple[int, ...]
    dtype: str
    scale: float
    score: Mod | None                 # None: identity
    mask: Mod | None                  # None: keep all (no block mask or torch's noop_mask)
    mask_block: tuple[int, int]       # the BlockMask's (Q_BLOCK_SIZE, KV_BLOCK_SIZE)
    mask_dims: tuple[int, int]        # its batch and head extents (1: shared)
    has_full: bool                    # it lists full blocks separately
    score_bufs: Buffers = ()
    mask_bufs: Buffers = ()
    score_grads: tuple[bool, ...] = ()   # which score_mod captured tensors need gradients

    @property
    def n_kv_blocks(self) -> int:
        return max(1, -(-self.k_shape[2] // self.mask_block[1]))


def _buffers(bufs) -> tuple:
    """Captured values: (shape, dtype) per tensor, numbers as themselves."""
    return tuple((tuple(b.shape), b.dtype) if isinstance(b, torch.Tensor) else b for b in bufs)


def spec_of(q, k, v, score_mod, block_mask, scale, score_bufs, mask_bufs,
            grads: tuple[bool, ...]) -> FlexSpec:
    """The static description of a flex_attention call (its mods traced once per function):
    the HOP's query, key, value, score_mod, block_mask tuple, scale and captured values,
    as tensors of any device (meta included), and which score captures want gradients."""
    sb, mb = _buffers(score_bufs), _buffers(mask_bufs)
    score = flex_mods.lower(score_mod, "score", sb)
    mask = flex_mods.lower(block_mask[-1], "mask", mb)
    kv_num = block_mask[2]
    dtypes = {q.dtype, k.dtype, v.dtype}
    return FlexSpec(
        tuple(q.shape), tuple(k.shape), tuple(v.shape),
        str(to_jax_dtype(q.dtype)) if len(dtypes) == 1 else "mixed", float(scale),
        None if score.is_identity else score, None if mask.is_true else mask,
        (int(block_mask[14]), int(block_mask[15])), tuple(kv_num.shape[:2]),
        block_mask[4] is not None, sb, mb, grads)


def _score_fn(spec: FlexSpec):
    return None if spec.score is None else spec.score.dense


def _mask_fn(spec: FlexSpec):
    return None if spec.mask is None else spec.mask.dense


def forward(spec: FlexSpec, q, k, v, tables, score_bufs, mask_bufs):
    """(out, natural logsumexp, max score) of the dense math."""
    del tables     # torch's CPU path decides every entry with mask_mod
    return dense.attention(q, k, v, score_mod=_score_fn(spec), mask_mod=_mask_fn(spec),
                           score_args=score_bufs, mask_args=mask_bufs, scale=spec.scale)


def backward(spec: FlexSpec, q, k, v, out, lse, dout, dlse, tables, score_bufs, mask_bufs):
    """(dq, dk, dv, captured-tensor grads: None where not wanted) as the dense vjp."""
    del out, lse   # recomputed
    want = [n for n, g in enumerate(spec.score_grads) if g]

    def f(q, k, v, *grad_bufs):
        bufs = list(score_bufs)
        for n, b in zip(want, grad_bufs):
            bufs[n] = b
        o, l, _ = forward(spec, q, k, v, tables, tuple(bufs), mask_bufs)
        return o, l

    (o, l), vjp = jax.vjp(f, q, k, v, *[score_bufs[n] for n in want])
    dout = jnp.zeros_like(o) if dout is None else dout.astype(o.dtype)
    dlse = jnp.zeros_like(l) if dlse is None else dlse.astype(l.dtype)
    dq, dk, dv, *dbufs = vjp((dout, dlse))
    grads: list[Any] = [None] * len(score_bufs)
    for n, g in zip(want, dbufs):
        grads[n] = g
    return dq, dk, dv, tuple(grads)


XLA_FORWARD = REGISTRY.add(Impl(FLEX_HOP, forward, "xla", "flex_attention_dense",
                                priority=DEFAULT_PRIORITY["xla"]))
XLA_BACKWARD = REGISTRY.add(Impl(FLEX_BWD_HOP, backward, "xla", "flex_attention_dense_backward",
                                 priority=DEFAULT_PRIORITY["xla"]))
