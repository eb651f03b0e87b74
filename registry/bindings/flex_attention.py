"""The Pallas FlexAttention kernels bound to torch's flex_attention higher-order ops.

``FlexSpec`` (``registry/xla/flex_attention.py``) -> the kernel's tiles, block tables and
per-entry mods: the BlockMask's kv lists become tile tables (``pallas/flex_blocks.py``),
the traced score_mod/mask_mod run inside the kernel body with each captured-tensor read
fetched as a block (arranged here as [Ab, Ah, Aq, Ak] arrays), and the kernel's
gradients of those reads are summed back into the captured tensors' shapes.
``supports`` refuses, with the reason, what the kernel cannot take; the route then picks
the dense XLA impl.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp

from tpu_kernels.registry.kernel_modules import kernel_module
from tpu_kernels.registry.core import DEFAULT_PRIORITY, REGISTRY, Impl
from tpu_kernels.registry.xla.flex_attention import FLEX_BWD_HOP, FLEX_HOP, FlexSpec
from tpu_kernels.registry.xla.flex_mods import SCORE_INDEX, Access, Mod

kernel = kernel_module("tpu_kernels.pallas.flex_attention")
flex_blocks = kernel_module("tpu_kernels.pallas.flex_blocks")

_NAMES = dict(zip(SCORE_INDEX, range(4)))     # b, h, q, kv -> axis of [Ab, Ah, Aq, Ak]


def _read(a: Access) -> kernel.Read:
    return kernel.Read("b" in a.dims, "h" in a.dims, "q" in a.dims, "kv" in a.dims)


@functools.lru_cache(maxsize=256)
def kernel_mods(spec: FlexSpec) -> kernel.Mods:
    """The spec's mods as the kernel's per-entry functions over block reads."""
    score, mask = spec.score, spec.mask
    grads = tuple(bool(spec.score_grads) and spec.score_grads[a.buf]
                  for a in (score.accesses if score else ()))
    return kernel.Mods(
        score=None if score is None else functools.partial(_gathered, score, 5),
        mask=None if mask is None else functools.partial(_gathered, mask, 4),
        score_reads=tuple(_read(a) for a in score.accesses) if score else (),
        mask_reads=tuple(_read(a) for a in mask.accesses) if mask else (),
        grads=grads)


def _gathered(mod: Mod, n_lead: int, *args):
    return mod.gathered(args[:n_lead], args[n_lead:])


def tiling(spec: FlexSpec, chip=None) -> flex_blocks.Tiling:
    q, v = spec.q_shape, spec.v_shape
    return kernel.plan(q[2], spec.k_shape[2], q[3], v[3], jnp.dtype(spec.dtype), spec.mask_block,
                       spec.mask_dims, _n_reads(spec), chip=chip)


def _n_reads(spec: FlexSpec) -> int:
    return sum(len(m.accesses) for m in (spec.score, spec.mask) if m is not None)


def supports(spec: FlexSpec) -> str | None:
    """None when the kernels take this call, else why not."""
    if spec.dtype == "mixed":
        return "query, key and value dtypes differ"
    for kind, mod in (("score_mod", spec.score), ("mask_mod", spec.mask)):
        if mod is not None and mod.refusal:
            return f"{kind}: {mod.refusal}"
    return kernel.supports(spec.q_shape, spec.k_shape, spec.v_shape, jnp.dtype(spec.dtype),
                           tiling(spec), _n_reads(spec))


def supports_backward(spec: FlexSpec) -> str | None:
    return supports(spec) or kernel.mods_reason(kernel_mods(spec))


def block_tables(spec: FlexSpec, tables, tl: flex_blocks.Tiling):
    """BlockMask lists (kv_num, kv_idx, full_num, full_idx) -> the kernel's tile tables."""
    kv_num, kv_idx, full_num, full_idx = tables
    state = flex_blocks.block_state(kv_num, kv_idx, full_num if spec.has_full else None,
                                    full_idx if spec.has_full else None, spec.n_kv_blocks)
    mask_true = spec.mask is None
    nonempty, full = flex_blocks.tile_state(state, spec.mask_block, tl, spec.k_shape[2], mask_true)
    return flex_blocks.tables(nonempty, full)


def _arrange(x, a: Access, spec: FlexSpec):
    """A captured tensor read as ``x[a.dims]`` -> the [Ab, Ah, Aq, Ak] block source."""
    extent = dict(zip(SCORE_INDEX, (spec.q_shape[0], spec.q_shape[1], spec.q_shape[2],
                                    spec.k_shape[2])))
    order = sorted(range(len(a.dims)), key=lambda n: _NAMES[a.dims[n]])
    x = jnp.transpose(x, order) if a.dims else x.reshape(())
    named = [a.dims[n] for n in order]
    for axis, name in enumerate(named):       # only indices below the extent are read
        x = jnp.take(x, jnp.arange(min(extent[name], x.shape[axis])), axis=axis) \
            if x.shape[axis] > extent[name] else x
        if x.shape[axis] < extent[name]:
            pad = [(0, 0)] * x.ndim
            pad[axis] = (0, extent[name] - x.shape[axis])
            x = jnp.pad(x, pad)
    shape = [x.shape[named.index(n)] if n in named else 1 for n in SCORE_INDEX]
    return x.reshape(shape)


def _unarrange(g, a: Access, buf_shape):
    """Gradient of an [Ab, Ah, Aq, Ak] arrangement -> the captured tensor's shape."""
    order = sorted(range(len(a.dims)), key=lambda n: _NAMES[a.dims[n]])
    named = [a.dims[n] for n in order]
    g = g.reshape([g.shape[_NAMES[n]] for n in named])
    for axis, n in enumerate(order):          # back to the tensor's extent
        want = buf_shape[n]
        if g.shape[axis] > want:
            g = jnp.take(g, jnp.arange(want), axis=axis)
        elif g.shape[axis] < want:
            pad = [(0, 0)] * g.ndim
            pad[axis] = (0, want - g.shape[axis])
            g = jnp.pad(g, pad)
    inverse = sorted(range(len(order)), key=lambda n: order[n])
    return jnp.transpose(g, inverse) if a.dims else g.reshape(buf_shape)


def _reads(mod: Mod | None, bufs, spec: FlexSpec):
    return [] if mod is None else [_arrange(bufs[a.buf], a, spec) for a in mod.accesses]


def pallas_forward(spec: FlexSpec, q, k, v, tables, score_bufs, mask_bufs):
    """(out, natural logsumexp, max score) from the block-sparse kernel."""
    tl = tiling(spec)
    return kernel.flex_attention_fwd(
        q, k, v, block_tables(spec, tables, tl), kernel_mods(spec),
        _reads(spec.score, score_bufs, spec), _reads(spec.mask, mask_bufs, spec),
        scale=spec.scale, tiling=tl)


def pallas_backward(spec: FlexSpec, q, k, v, out, lse, dout, dlse, tables, score_bufs, mask_bufs):
    """(dq, dk, dv, captured-tensor grads) from the dq and dk/dv kernels."""
    tl = tiling(spec)
    dout = jnp.zeros(out.shape, q.dtype) if dout is None else dout
    dq, dk, dv, rgrads = kernel.flex_attention_bwd(
        dout, dlse, q, k, v, out, lse, block_tables(spec, tables, tl), kernel_mods(spec),
        _reads(spec.score, score_bufs, spec), _reads(spec.mask, mask_bufs, spec),
        scale=spec.scale, tiling=tl)
    grads = [None] * len(score_bufs)
    for a, g in zip(spec.score.accesses if spec.score else (), rgrads):
        if g is not None:
            shape = score_bufs[a.buf].shape
            g = _unarrange(g, a, shape).astype(score_bufs[a.buf].dtype)
            grads[a.buf] = g if grads[a.buf] is None else grads[a.buf] + g
    return dq, dk, dv, tuple(grads)


PALLAS_FORWARD = REGISTRY.add(Impl(FLEX_HOP, pallas_forward, "pallas", "flex_attention",
                                   supports=supports, priority=DEFAULT_PRIORITY["pallas"]))
PALLAS_BACKWARD = REGISTRY.add(Impl(FLEX_BWD_HOP, pallas_backward, "pallas", "flex_attention_backward",
                                    supports=supports_backward, priority=DEFAULT_PRIORITY["pallas"]))
