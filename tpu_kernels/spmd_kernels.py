"""Pallas kernels partitioned per shard inside sharded (SPMD) programs.

A Mosaic kernel is an opaque custom call to XLA's SPMD partitioner: left alone, it gets
its operands gathered whole onto every device. Wrapped here with
``jax.experimental.custom_partitioning``, the partitioner asks us how to split it once it
knows the operands' shardings (in an eager op's jitted program, a ``torch.compile`` graph
or a pod step alike), and each device runs the kernel on its own block:

- flash attention (forward and backward): batch and heads stay sharded as ``q`` is
  (``k``/``v`` heads follow: GQA groups never straddle shards when both head counts
  divide); sequence and head_dim are whole per device (the kernel needs every key).
- grouped matmul (``aten._grouped_mm``, 2-D tokens x 3-D experts): experts stay sharded;
  each device multiplies the rows of its own experts (tokens replicated) and the partial
  outputs are summed (one all-reduce of the output, no gather of the expert weights).

Other layouts fall back to replicated operands, as XLA would have done. On one device the
wrapper is inlined (``custom_partitioning`` lowers to the kernel itself).
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from tpu_kernels.registry.kernel_modules import kernel_module

attention = kernel_module("tpu_kernels.pallas.flash_attention")
grouped = kernel_module("tpu_kernels.pallas.grouped_matmul")


def _spec(shape: Any) -> tuple:
    """An operand's partition spec, one entry per dim (None where it is replicated)."""
    s = shape.sharding
    spec = tuple(s.spec) if isinstance(s, NamedSharding) else ()
    return spec + (None,) * (len(shape.shape) - len(spec))


def _size(mesh, axes) -> int:
    if axes is None:
        return 1
    return math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))


def _kept(mesh, axes, *dims: int):
    """``axes`` when they split every one of ``dims`` evenly, else None (replicate)."""
    return axes if axes is not None and all(d % _size(mesh, axes) == 0 for d in dims) else None


def _named(mesh, *spec) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(*spec))


# ---- flash attention: q, o [b, hq, s, d]; k, v [b, hkv, t, d]; lse [b, hq, s] ----------

def _attention_layout(mesh, q, k, mask):
    """(batch axes, head axes) kept from q's sharding, and the mask's sharding."""
    b, hq = q.shape[:2]
    spec = _spec(q)
    batch = _kept(mesh, spec[0], b)
    heads = _kept(mesh, spec[1], hq, k.shape[1])
    if mask is None:
        return batch, heads, None
    if len(mask.shape) != 4:        # broadcast over batch and heads: whole on each device
        return batch, heads, _named(mesh)
    mb, mh = mask.shape[:2]
    return batch, heads, _named(mesh, batch if mb == b else None, heads if mh == hq else None,
                                None, None)


def _attention_rule(*static_mesh_types):
    """Shardy's rule: batch and heads pass through, sequence and head_dim are whole."""
    *_, operands, _results = static_mesh_types
    terms = ["b h s d", "b g t d", "b g t d"]
    if len(operands) == 4:          # the mask: its own factors (it may broadcast)
        terms.append(" ".join(f"m{i}" for i in range(len(operands[3].shape))))
    return (", ".join(terms) + " -> b h s d, b h s",
            dict(need_replication_factors=("s", "d", "t")))  # by first appearance


def _fwd_partition(causal, scale, mesh, arg_shapes, result_shape):
    q, k, _v, mask = arg_shapes
    batch, heads, mask_sharding = _attention_layout(mesh, q, k, mask)
    qs, ls = _named(mesh, batch, heads, None, None), _named(mesh, batch, heads, None)

    def per_shard(q, k, v, mask):
        return attention.flash_attention_fwd(q, k, v, mask, causal=causal, scale=scale)
    return mesh, per_shard, (qs, ls), (qs, qs, qs, mask_sharding)


def _fwd(q, k, v, mask, causal, scale):
    return attention.flash_attention_fwd(q, k, v, mask, causal=causal, scale=scale)


_sharded_fwd = custom_partitioning(_fwd, static_argnums=(4, 5))
_sharded_fwd.def_partition(_fwd_partition, sharding_rule=_attention_rule)


def flash_attention_fwd(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None,
                        *, causal: bool, scale: float | None) -> tuple[jax.Array, jax.Array]:
    """``pallas.flash_attention.flash_attention_fwd``, run per shard of batch and heads."""
    return _sharded_fwd(q, k, v, mask, bool(causal), scale)


def _bwd_rule(*static_mesh_types):
    *_, operands, _results = static_mesh_types
    terms = ["b h s d", "b h s d", "b g t d", "b g t d", "b h s d", "b h s"]
    if len(operands) == 7:
        terms.append(" ".join(f"m{i}" for i in range(len(operands[6].shape))))
    return (", ".join(terms) + " -> b h s d, b g t d, b g t d",
            dict(need_replication_factors=("s", "d", "t")))


def _bwd_partition(causal, scale, mesh, arg_shapes, result_shape):
    _do, q, k, _v, _out, _lse, mask = arg_shapes
    batch, heads, mask_sharding = _attention_layout(mesh, q, k, mask)
    qs, ls = _named(mesh, batch, heads, None, None), _named(mesh, batch, heads, None)

    def per_shard(do, q, k, v, out, lse, mask):
        return attention.flash_attention_bwd(do, q, k, v, out, lse, mask, causal=causal,
                                             scale=scale)
    return mesh, per_shard, (qs, qs, qs), (qs, qs, qs, qs, qs, ls, mask_sharding)


def _bwd(do, q, k, v, out, lse, mask, causal, scale):
    return attention.flash_attention_bwd(do, q, k, v, out, lse, mask, causal=causal,
                                         scale=scale)


_sharded_bwd = custom_partitioning(_bwd, static_argnums=(7, 8))
_sharded_bwd.def_partition(_bwd_partition, sharding_rule=_bwd_rule)


def flash_attention_bwd(do: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array,
                        out: jax.Array, lse: jax.Array, mask: jax.Array | None, *,
                        causal: bool, scale: float | None
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``pallas.flash_attention.flash_attention_bwd``, run per shard of batch and heads."""
    return _sharded_bwd(do, q, k, v, out, lse, mask, bool(causal), scale)


# ---- grouped matmul: lhs [m, k] rows sorted by expert, rhs [e, k, n] -> [m, n] ------------

def _gmm(lhs, rhs, ends, starts):
    return grouped.gmm(lhs, rhs, ends - starts)


def _gmm_partition(mesh, arg_shapes, result_shape):
    lhs, rhs, _ends, _starts = arg_shapes
    experts = _kept(mesh, _spec(rhs)[0], rhs.shape[0])
    whole = _named(mesh)
    if experts is None:
        return mesh, _gmm, whole, (whole, whole, whole, whole)
    by_expert = _named(mesh, experts)

    def per_shard(lhs, rhs, ends, starts):
        # this device's experts own rows [starts[0], ends[-1]): move them to the top, run
        # the kernel on its experts (rows past them give 0), move back, sum the devices'
        first = starts[0]
        out = grouped.gmm(jnp.roll(lhs, -first, axis=0), rhs, ends - starts)
        return jax.lax.psum(jnp.roll(out, first, axis=0), experts)
    return mesh, per_shard, whole, (whole, _named(mesh, experts, None, None), by_expert,
                                    by_expert)


_sharded_gmm = custom_partitioning(_gmm)
_sharded_gmm.def_partition(_gmm_partition, sharding_rule="m k, e k n, e, e -> m n",
                           need_replication_factors=("m", "k", "n"))


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, ends: jax.Array) -> jax.Array:
    """``pallas.grouped_matmul.gmm`` with groups given by their cumulative row ends
    (``aten._grouped_mm``'s ``offs``), run per shard of experts."""
    ends = ends.astype(jnp.int32)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    return _sharded_gmm(lhs, rhs, ends, starts)
