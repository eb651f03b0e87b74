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

Inside ``attention_parallel(mesh, batch, heads)`` flash attention runs instead as a
``shard_map`` with batch over ``batch`` and heads over ``heads``, whatever the operands'
shardings: for programs compiled where ``custom_partitioning`` has no partitioner
(libtpu's compile-only topologies, which ``tpu_kernels.aot.pod``'s step compiles with).
"""
from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Iterator

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from tpu_kernels.registry.kernel_modules import kernel_module

log = logging.getLogger(__name__)
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
    if _ATTENTION_LAYOUTS:
        return _mapped(_fwd_shard, (q, k, v), mask, (3, 3, 3), (3, 2), causal, scale)
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
    if _ATTENTION_LAYOUTS:
        return _mapped(_bwd_shard, (do, q, k, v, out, lse), mask, (3, 3, 3, 3, 3, 2),
                       (3, 3, 3), causal, scale)
    return _sharded_bwd(do, q, k, v, out, lse, mask, bool(causal), scale)


# ---- flash attention with a layout given by the program's author (shard_map) ----------------

_ATTENTION_LAYOUTS: list[tuple] = []


@contextlib.contextmanager
def attention_parallel(mesh: jax.sharding.Mesh, batch: tuple[str, ...],
                       heads: tuple[str, ...]) -> Iterator[None]:
    """Inside, flash attention traced for ``mesh`` runs as a ``shard_map`` (the Pallas
    kernel on each device's block, forward and backward) with the batch over ``batch`` and
    the query and key/value heads over ``heads``; where those do not divide the operands,
    ``attention_refusal`` says why (the op's XLA lowering runs instead)."""
    _ATTENTION_LAYOUTS.append((mesh, tuple(batch), tuple(heads)))
    try:
        yield
    finally:
        _ATTENTION_LAYOUTS.pop()


def attention_refusal(q_shape: tuple, k_shape: tuple, mask_shape: tuple | None) -> str | None:
    """Within ``attention_parallel``: None when its layout splits q [b, hq, s, d],
    k/v [b, hkv, t, d] and the mask evenly (GQA groups whole per device), else why not."""
    if not _ATTENTION_LAYOUTS:
        return None
    mesh, batch, heads = _ATTENTION_LAYOUTS[-1]
    nb, nh = _size(mesh, batch), _size(mesh, heads)
    reason = None
    if q_shape[0] % nb or q_shape[1] % nh or k_shape[1] % nh:
        reason = (f"batch {q_shape[0]} over {batch} ({nb}) or heads q {q_shape[1]} / kv "
                  f"{k_shape[1]} over {heads} ({nh}) do not divide")
    elif mask_shape is not None and len(mask_shape) == 4 and (
            (mask_shape[0] not in (1, q_shape[0]) or mask_shape[1] not in (1, q_shape[1]))):
        reason = f"mask {tuple(mask_shape)} neither broadcasts nor matches q {tuple(q_shape)}"
    if reason:
        log.warning("flash attention per shard refused (%s): XLA's attention runs", reason)
    return reason


def _fwd_shard(q, k, v, mask, causal, scale):
    return attention.flash_attention_fwd(q, k, v, mask, causal=causal, scale=scale)


def _bwd_shard(do, q, k, v, out, lse, mask, causal, scale):
    return attention.flash_attention_bwd(do, q, k, v, out, lse, mask, causal=causal,
                                         scale=scale)


def _mapped(kernel, operands: tuple, mask, in_ranks: tuple, out_ranks: tuple, causal, scale):
    """``kernel(*operands, mask, causal, scale)`` as a shard_map over the active layout:
    dim 0 over its batch axes, dim 1 over its head axes (a mask dim of 1 stays whole)."""
    mesh, batch, heads = _ATTENTION_LAYOUTS[-1]
    b, h = batch or None, heads or None

    def spec(rank):
        return PartitionSpec(b, h, *(None,) * (rank - 2))
    in_specs = [spec(r) for r in in_ranks]
    args = list(operands)
    if mask is not None:
        if mask.ndim == 4:
            in_specs.append(PartitionSpec(b if mask.shape[0] > 1 else None,
                                          h if mask.shape[1] > 1 else None, None, None))
        else:
            in_specs.append(PartitionSpec())
        args.append(mask)

    def per_shard(*xs):
        m = xs[len(operands)] if mask is not None else None
        return kernel(*xs[:len(operands)], m, bool(causal), scale)
    return jax.shard_map(per_shard, mesh=mesh, in_specs=tuple(in_specs),
                         out_specs=tuple(spec(r) for r in out_ranks), check_vma=False)(*args)


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
