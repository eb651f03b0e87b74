"""The experts of a mixture-of-experts FFN (``tpu_kernels::moe_experts``), expert-parallel
inside sharded (SPMD) programs.

    out[t] = sum_k  weights[t, k] * down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t])),
             e = index[t, k]        (``gate_up [E, 2I, H]`` holds gate then up; ``down [E, H, I]``)

On one device (and wherever the experts are not sharded) every routed copy of a token is
computed, as Hugging Face's ``grouped_mm`` experts do: the copies sorted by expert, one
grouped matmul (``jax.lax.ragged_dot``) per projection (*dropless*).

Sharded, through ``jax.experimental.custom_partitioning`` (the partitioner tells us the
operands' shardings in whatever program the op lands in): when the experts (dim 0) are
split over mesh axes ("ep"), the tokens are split over those axes too (besides their own
data axes), and each device sends each of its tokens' routed copies to the device that
holds the copy's expert, with one ``all_to_all`` over the expert axes, computes its own
experts on what it received (a batched matmul per expert), and sends the results back with
a second ``all_to_all``; the results are weighted and summed per token where the token
lives (GShard's dispatch, Lepikhin et al. 2020). No device ever holds the whole batch.
Inside ``expert_parallel(mesh, tokens, experts)`` the same runs as a ``shard_map`` with
the layout given there instead (libtpu's compile-only client, which the pod step compiles
with, has no partitioner for ``custom_partitioning``).

**Capacity.** The all_to_all buffers have static shapes: each device sends at most
``C = ceil(capacity_factor * tokens_per_device * top_k / experts)`` copies to each expert
(rounded up to a multiple of 8, at most ``tokens_per_device``: an expert gets at most one
copy of a token). Copies are admitted in order of rank (every token's first choice before
any second choice, GShard/Switch's priority), then by token; a copy past its expert's
capacity is **dropped**: it contributes nothing (the token keeps its other experts and the
residual connection), as in GShard and the Switch Transformer. With ``capacity_factor >=
experts / top_k`` nothing can be dropped and the sharded result equals the dropless one;
the default 2.0 is GShard's training value. The padding slots cost compute: the experts
run ``capacity_factor`` times the routed tokens' FLOPs.

The backward recomputes the forward per shard (its two all_to_alls again) and
differentiates it: the dispatch buffers are not kept between forward and backward.
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Iterator

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

DEFAULT_CAPACITY_FACTOR = 2.0
_F32 = jnp.float32


def _cast(x: jax.Array, dtype) -> jax.Array:
    return x if x.dtype == dtype else x.astype(dtype)


def _precision(dtype):
    return jax.lax.Precision.HIGHEST if dtype == _F32 else None


def _glu(h: jax.Array) -> jax.Array:
    """silu(gate) * up of the gate-up projection's output, in f32."""
    gate, up = jnp.split(h, 2, axis=-1)
    return (jax.nn.silu(_cast(gate, _F32)) * _cast(up, _F32)).astype(h.dtype)


def experts_dropless(x: jax.Array, index: jax.Array, weights: jax.Array,
                     gate_up: jax.Array, down: jax.Array) -> jax.Array:
    """Every routed copy computed: copies sorted by expert, grouped matmuls."""
    t, k = index.shape
    dtype = x.dtype
    flat = index.reshape(-1).astype(jnp.int32)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=gate_up.shape[0]).astype(jnp.int32)
    rows = x[order // k]
    prec = _precision(dtype)
    h = jax.lax.ragged_dot(rows, jnp.swapaxes(gate_up, 1, 2), sizes, precision=prec,
                           preferred_element_type=_F32).astype(dtype)
    y = jax.lax.ragged_dot(_glu(h), jnp.swapaxes(down, 1, 2), sizes, precision=prec,
                           preferred_element_type=_F32).astype(dtype)
    copies = jnp.zeros_like(y).at[order].set(y, unique_indices=True)
    return _combine(copies.reshape(t, k, -1), weights, dtype)


def _combine(copies: jax.Array, weights: jax.Array, dtype) -> jax.Array:
    """sum_k weights[t, k] * copies[t, k] in f32."""
    return jnp.einsum("tkh,tk->th", _cast(copies, _F32), _cast(weights, _F32),
                      precision=_precision(_F32)).astype(dtype)


def capacity(tokens: int, top_k: int, experts: int, factor: float) -> int:
    """Copies each device may send to each expert (see the module docstring)."""
    c = math.ceil(factor * tokens * top_k / experts)
    return max(1, min(tokens, -(-c // 8) * 8))


def _slots(index: jax.Array, experts: int, cap: int) -> jax.Array:
    """Each copy's slot in the [experts * cap] send buffer (rank-major order of copies:
    copy r * T + t is token t's rank-r choice), ``experts * cap`` for a dropped copy."""
    flat = index.T.reshape(-1).astype(jnp.int32)
    hit = flat[:, None] == jnp.arange(experts, dtype=jnp.int32)[None, :]
    position = jnp.take_along_axis(jnp.cumsum(hit, axis=0, dtype=jnp.int32),
                                   flat[:, None], axis=1)[:, 0] - 1
    return jnp.where(position < cap, flat * cap + position, experts * cap)


def experts_dispatch(x: jax.Array, index: jax.Array, weights: jax.Array, gate_up: jax.Array,
                     down: jax.Array, *, axes: tuple[str, ...], n: int, cap: int) -> jax.Array:
    """One device's part: its tokens ``x [T, H]``, its experts ``gate_up [E/n, 2I, H]``,
    ``down [E/n, H, I]`` of the n devices over ``axes``; all_to_all there and back."""
    t, k = index.shape
    local, h = gate_up.shape[0], x.shape[1]
    experts, dtype = local * n, x.dtype
    slots = _slots(index, experts, cap)
    tokens = jnp.tile(jnp.arange(t, dtype=jnp.int32), k)
    source = jnp.full((experts * cap,), t, jnp.int32).at[slots].set(tokens, mode="drop")
    padded = jnp.concatenate([x, jnp.zeros((1, h), dtype)])
    send = padded[source].reshape(n, local * cap, h)         # by the device owning the expert
    got = jax.lax.all_to_all(send, axes, 0, 0, tiled=True)   # [n sources, local * cap, h]
    got = got.reshape(n, local, cap, h).transpose(1, 0, 2, 3).reshape(local, n * cap, h)
    prec = _precision(dtype)
    hid = jnp.einsum("ech,eih->eci", got, gate_up, precision=prec,
                     preferred_element_type=_F32).astype(dtype)
    y = jnp.einsum("eci,ehi->ech", _glu(hid), down, precision=prec,
                   preferred_element_type=_F32).astype(dtype)
    y = y.reshape(local, n, cap, h).transpose(1, 0, 2, 3).reshape(n, local * cap, h)
    back = jax.lax.all_to_all(y, axes, 0, 0, tiled=True).reshape(experts * cap, h)
    back = jnp.concatenate([back, jnp.zeros((1, h), dtype)])
    copies = back[slots].reshape(k, t, h).transpose(1, 0, 2)
    return _combine(copies, weights, dtype)


# ---- partitioning -------------------------------------------------------------------------

def _axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _spec_axes(shape, dim: int) -> tuple[str, ...]:
    s = shape.sharding
    spec = tuple(s.spec) if isinstance(s, NamedSharding) else ()
    return _axes(spec[dim]) if dim < len(spec) else ()


def _size(mesh, axes: tuple[str, ...]) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def _named(mesh, *spec) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(*(s if s else None for s in spec)))


def _layout(mesh, x, gate_up) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(token axes, expert axes): experts stay split as given when that divides them,
    and the tokens are then split over those axes too; otherwise experts are whole."""
    tokens, experts = _spec_axes(x, 0), _spec_axes(gate_up, 0)
    if experts and gate_up.shape[0] % _size(mesh, experts) == 0:
        both = tokens + tuple(a for a in experts if a not in tokens)
        if x.shape[0] % _size(mesh, both) == 0:
            return both, experts
    return (tokens if x.shape[0] % _size(mesh, tokens) == 0 else ()), ()


def _local(mesh, tokens, experts, factor, x, index, gate_up):
    """The per-shard forward for this layout."""
    if not experts:
        return experts_dropless
    t = x.shape[0] // _size(mesh, tokens)
    cap = capacity(t, index.shape[1], gate_up.shape[0], factor)
    return functools.partial(experts_dispatch, axes=experts, n=_size(mesh, experts), cap=cap)


def _fwd(x, index, weights, gate_up, down, factor):
    return experts_dropless(x, index, weights, gate_up, down)


def _fwd_partition(factor, mesh, arg_shapes, result_shape):
    x, index, _w, gate_up, _down = arg_shapes
    tokens, experts = _layout(mesh, x, gate_up)
    ts, es = _named(mesh, tokens, None), _named(mesh, experts, None, None)
    return mesh, _local(mesh, tokens, experts, factor, x, index, gate_up), ts, \
        (ts, ts, ts, es, es)


_sharded_fwd = custom_partitioning(_fwd, static_argnums=(5,))
_sharded_fwd.def_partition(_fwd_partition,
                           sharding_rule="t h, t k, t k, e i h, e h j -> t h",
                           need_replication_factors=("h", "k", "i", "j"))


def _grads(forward, g, x, index, weights, gate_up, down):
    _, vjp = jax.vjp(lambda a, w, b, c: forward(a, index, w, b, c), x, weights, gate_up, down)
    return vjp(g)


def _bwd(g, x, index, weights, gate_up, down, factor):
    return _grads(experts_dropless, g, x, index, weights, gate_up, down)


def _backward_local(mesh, tokens, experts, factor, x, index, gate_up, down):
    """The per-shard backward for this layout, and its gradients' shardings."""
    forward = _local(mesh, tokens, experts, factor, x, index, gate_up)
    # the experts' gradients are partial sums over the other token axes: reduce-scattered
    # over them on dim 1 (where FSDP splits the expert weights), else all-reduced
    rest = tuple(a for a in tokens if a not in experts)
    scatter = bool(rest) and all(w.shape[1] % _size(mesh, rest) == 0 for w in (gate_up, down))

    def per_shard(g, x, index, weights, gate_up, down):
        dx, dw, d1, d2 = _grads(forward, g, x, index, weights, gate_up, down)
        if scatter:
            d1, d2 = (jax.lax.psum_scatter(d, rest, scatter_dimension=1, tiled=True)
                      for d in (d1, d2))
        elif rest:
            d1, d2 = jax.lax.psum((d1, d2), rest)
        return dx, dw, d1, d2
    return per_shard, (tokens, experts, rest if scatter else ())


def _bwd_partition(factor, mesh, arg_shapes, result_shape):
    _g, x, index, _w, gate_up, down = arg_shapes
    tokens, experts = _layout(mesh, x, gate_up)
    per_shard, (_, _, split) = _backward_local(mesh, tokens, experts, factor, x, index,
                                               gate_up, down)
    ts, es = _named(mesh, tokens, None), _named(mesh, experts, None, None)
    ds = _named(mesh, experts, split, None)
    return mesh, per_shard, (ts, ts, ds, ds), (ts, ts, ts, ts, es, es)


_sharded_bwd = custom_partitioning(_bwd, static_argnums=(6,))
_sharded_bwd.def_partition(
    _bwd_partition,
    sharding_rule="t h, t h, t k, t k, e i h, e h j -> t h, t k, e i h, e h j",
    need_replication_factors=("h", "k"))


# ---- a layout given by the program's author (shard_map) --------------------------------

_LAYOUTS: list[tuple] = []


@contextlib.contextmanager
def expert_parallel(mesh: jax.sharding.Mesh, tokens: tuple[str, ...],
                    experts: tuple[str, ...]) -> Iterator[None]:
    """Inside, ``moe_experts`` traced for ``mesh`` runs as a ``shard_map`` with the tokens
    over ``tokens`` and the experts over ``experts`` (all_to_all over those), whatever
    the operands' shardings: for programs compiled where ``custom_partitioning`` has no
    partitioner (libtpu's compile-only topologies: "Custom emitter for
    CustomSPMDPartitioning not found"), e.g. ``tpu_kernels.aot.pod``'s step."""
    _LAYOUTS.append((mesh, tuple(tokens), tuple(experts)))
    try:
        yield
    finally:
        _LAYOUTS.pop()


def _given_layout(x, gate_up):
    """(mesh, tokens, experts) of the active ``expert_parallel`` when it splits evenly."""
    if not _LAYOUTS:
        return None
    mesh, tokens, experts = _LAYOUTS[-1]
    if gate_up.shape[0] % _size(mesh, experts) or x.shape[0] % _size(mesh, tokens):
        return None
    return mesh, tokens, experts


def _spec(*axes) -> PartitionSpec:
    return PartitionSpec(*(a if a else None for a in axes))


def moe_experts(x: jax.Array, index: jax.Array, weights: jax.Array, gate_up: jax.Array,
                down: jax.Array, capacity_factor: float = DEFAULT_CAPACITY_FACTOR) -> jax.Array:
    """The experts' output ``[T, H]`` for tokens ``x [T, H]`` routed to ``index [T, K]``
    with ``weights [T, K]``; expert-parallel where ``gate_up``/``down`` are sharded."""
    index, factor = index.astype(jnp.int32), float(capacity_factor)
    given = _given_layout(x, gate_up)
    if given is None:
        return _sharded_fwd(x, index, weights, gate_up, down, factor)
    mesh, tokens, experts = given
    local = _local(mesh, tokens, experts, factor, x, index, gate_up)
    ts, es = _spec(tokens, None), _spec(experts, None, None)
    return jax.shard_map(local, mesh=mesh, in_specs=(ts, ts, ts, es, es), out_specs=ts,
                         check_vma=False)(x, index, weights, gate_up, down)


def moe_experts_backward(g: jax.Array, x: jax.Array, index: jax.Array, weights: jax.Array,
                         gate_up: jax.Array, down: jax.Array,
                         capacity_factor: float = DEFAULT_CAPACITY_FACTOR) -> tuple:
    """Gradients of ``moe_experts`` w.r.t. (x, weights, gate_up, down) for ``g [T, H]``."""
    index, factor = index.astype(jnp.int32), float(capacity_factor)
    given = _given_layout(x, gate_up)
    if given is None:
        return _sharded_bwd(g, x, index, weights, gate_up, down, factor)
    mesh, tokens, experts = given
    per_shard, (_, _, split) = _backward_local(mesh, tokens, experts, factor, x, index,
                                               gate_up, down)
    ts, es, ds = _spec(tokens, None), _spec(experts, None, None), _spec(experts, split, None)
    return jax.shard_map(per_shard, mesh=mesh, in_specs=(ts, ts, ts, ts, es, es),
                         out_specs=(ts, ts, ds, ds), check_vma=False)(
        g, x, index, weights, gate_up, down)
