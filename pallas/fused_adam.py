"""Fused Adam / AdamW over a list of tensors: one read and one write of each state per step.

Per element, in f32 (torch's ``_fused_adam_`` / ``_fused_adamw_`` math; ``step`` is the
already-incremented state step, as torch's optimizer passes it):
    g = grad / grad_scale;  g = -g if maximize
    adamw: p = p (1 - lr wd)          adam: g = g + wd p
    m = m + (1 - b1)(g - m);  v = b2 v + (1 - b2) g^2;  vmax = max(vmax, v) if amsgrad
    p = p - lr / (1 - b1^step) * m / (sqrt(v or vmax) / sqrt(1 - b2^step) + eps)
    everything unchanged when found_inf != 0
Each tensor is viewed as [rows, its last dim] when that dim is a multiple of 128 (a free
view: TPU keeps the tiled HBM layout), else as [rows, 128] lanes (a relayout, padded to a
multiple of 128 elements only when needed); a ragged last row block is masked by Pallas,
and the tensor is walked in (block_rows, width) blocks.
All shared scalars (lr, betas, 1/grad_scale, found_inf) travel in one f32 SMEM vector
(scalar prefetch): a new lr or step reuses the compiled kernel.

Many tensors per call: tensors of at most ``PACK_ROWS`` rows (biases, norm weights: most
of a model's tensors, a sliver of its bytes) are concatenated, per dtype combination, into
one [rows, 128] slab per state and stepped by a single ``pallas_call``; their per-tensor
bias corrections ride along as a per-row [rows, 2] f32 table. Copying a tensor into and
out of the slab costs ~16 passes of its bytes, which stays below the grid step (and the
launch) it saves up to ``PACK_ROWS`` rows; larger tensors keep a call of their own, which
moves each byte once.
"""
from __future__ import annotations

import functools
import itertools
from typing import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.launch import cost, pallas_call
from tpu_kernels.pallas.tpu_info import round_up

_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
LANES = 128
_ROW_BLOCKS = (1024, 512, 256, 128, 64, 32, 16)
# Tensors up to this many 128-lane rows are packed into one call (see the module doc).
PACK_ROWS = 64
# A tensor whose last dim is a multiple of 128 up to this is stepped in its own shape.
MAX_WIDTH = 4096
# Slots of the scalar vector.
_LR, _B1, _B2, _WD, _EPS, _STEP_SIZE, _BC2_SQRT, _INV_SCALE, _SKIP = range(9)


def vmem_bytes(block_rows: int, dtype, amsgrad: bool, width: int = LANES) -> int:
    """Double-buffered blocks (4-5 in, 3-4 out) plus ~6 f32 block temporaries."""
    states = 4 if amsgrad else 3
    io = 2 * (1 + states + states) * tpu_info.block_bytes((block_rows, width), dtype)
    return io + 6 * tpu_info.block_bytes((block_rows, width), jnp.float32)


def block_rows(rows: int, dtype, amsgrad: bool, chip: tpu_info.Chip,
               width: int = LANES) -> int:
    """Largest row block (a sublane multiple) that fits the chip's VMEM budget, capped by
    the tensor's own (rounded-up) row count."""
    cap = round_up(rows, tpu_info.sublane(dtype))
    for br in _ROW_BLOCKS:
        if br <= cap and vmem_bytes(br, dtype, amsgrad, width) <= tpu_info.vmem_budget(chip):
            return br
    return min(cap, _ROW_BLOCKS[-1])


def supports(shapes: Sequence[tuple[int, ...]], dtypes: Sequence, *,
             state_dtypes: Sequence | None = None) -> str | None:
    """None when every (shape, dtype) param (and its states' dtypes) is handled, else why not."""
    if len(shapes) != len(dtypes):
        return "shapes and dtypes differ in length"
    for shape, dt in zip(shapes, dtypes):
        if jnp.dtype(dt) not in _DTYPES:
            return f"param dtype {jnp.dtype(dt)} not in float32/bfloat16"
        numel = 1
        for d in shape:
            numel *= d
        if numel >= 2**31:
            return "a tensor with >= 2**31 elements"
    for dt in state_dtypes or ():
        if jnp.dtype(dt) not in _DTYPES:
            return f"state dtype {jnp.dtype(dt)} not in float32/bfloat16"
    return None


def _kernel(s_ref, *refs, amsgrad: bool, maximize: bool, adamw: bool, per_row: bool):
    f32 = jnp.float32
    if per_row:                 # packed tensors: bias corrections per row, [rows, 2]
        c_ref, refs = refs[0], refs[1:]
        step_size, bc2_sqrt = c_ref[:, 0:1], c_ref[:, 1:2]
    else:
        step_size, bc2_sqrt = s_ref[_STEP_SIZE], s_ref[_BC2_SQRT]
    p_ref, g_ref, m_ref, v_ref, *rest = refs
    vmax_ref, outs = (rest[0], rest[1:]) if amsgrad else (None, rest)
    lr, b1, b2, wd, eps = (s_ref[k] for k in (_LR, _B1, _B2, _WD, _EPS))
    p, m, v = (r[...].astype(f32) for r in (p_ref, m_ref, v_ref))
    g = g_ref[...].astype(f32) * s_ref[_INV_SCALE]
    if maximize:
        g = -g
    if adamw:
        p = p * (1.0 - lr * wd)
    else:
        g = g + wd * p
    m = m + (1.0 - b1) * (g - m)
    v = b2 * v + (1.0 - b2) * g * g
    new = [None, m, v]
    if amsgrad:
        v = jnp.maximum(vmax_ref[...].astype(f32), v)
        new.append(v)
    denom = jnp.sqrt(v) / bc2_sqrt + eps
    new[0] = p - step_size * m / denom
    skip = s_ref[_SKIP] != 0.0          # found_inf: leave every tensor as it was
    olds = (p_ref, m_ref, v_ref) + ((vmax_ref,) if amsgrad else ())
    for out, val, old in zip(outs, new, olds):
        out[...] = jnp.where(skip, old[...], val.astype(out.dtype))


def _view(t: jax.Array) -> jax.Array:
    """``t`` as [rows, width]: its own last dim when that is a multiple of 128 (collapsing
    leading dims keeps TPU's tiled HBM layout: no copy), else ``_lanes``."""
    if t.ndim >= 2 and t.shape[-1] % LANES == 0 and t.shape[-1] <= MAX_WIDTH:
        return t.reshape(-1, t.shape[-1])
    return _lanes(t)


def _lanes(t: jax.Array) -> jax.Array:
    """``t`` as [rows, 128]: a reshape (a relayout on TPU unless the last dim is 128), or a
    pad to a multiple of 128 elements."""
    padded = round_up(t.size, LANES)
    flat = t.reshape(-1)
    return (jnp.pad(flat, (0, padded - t.size)) if padded != t.size else flat).reshape(-1, LANES)


def _unlanes(view: jax.Array, like: jax.Array) -> jax.Array:
    return view.reshape(-1)[:like.size].reshape(like.shape) if view.size != like.size \
        else view.reshape(like.shape)


def _call(scalars, views, coef, *, amsgrad, maximize, adamw, target):
    """One pallas_call over [rows, 128] views (p, g, m, v[, vmax]); ``coef``: the per-row
    bias-correction table of a packed slab, or None. Returns the updated views."""
    rows, width = views[0].shape
    widest = max((t.dtype for t in views), key=lambda d: tpu_info.sublane(d))
    br = block_rows(rows, widest, amsgrad, target.chip, width)
    spec = pl.BlockSpec((br, width), lambda i, s: (i, 0))
    state_ix = [0, 2, 3] + ([4] if amsgrad else [])     # p, m, v (, vmax) are updated
    extra = [] if coef is None else [coef]
    moved = sum(v.nbytes for v in views + extra) + sum(views[k].nbytes for k in state_ix)
    in_specs = [pl.BlockSpec((br, 2), lambda i, s: (i, 0))] * len(extra) + [spec] * len(views)
    return pallas_call(
        functools.partial(_kernel, amsgrad=amsgrad, maximize=maximize, adamw=adamw,
                          per_row=coef is not None),
        target=target,
        name="fused_adamw" if adamw else "fused_adam",
        cost_estimate=cost(20 * rows * width, moved, 2 * rows * width),   # sqrt, divide
        vmem_bytes=vmem_bytes(br, widest, amsgrad, width),
        dimension_semantics=("parallel",),
        out_shape=[jax.ShapeDtypeStruct(views[k].shape, views[k].dtype) for k in state_ix],
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(pl.cdiv(rows, br),),
            in_specs=in_specs, out_specs=[spec] * len(state_ix)),
        input_output_aliases={1 + len(extra) + k: o for o, k in enumerate(state_ix)},
    )(scalars, *extra, *views)


def _step_one(scalars, tensors, **kw):
    """One pallas_call over one parameter and its states; returns the updated states."""
    outs = _call(scalars, [_view(t) for t in tensors], None, **kw)
    return [_unlanes(o, tensors[0]) for o in outs]


def _step_packed(scalars, coefs, group, **kw):
    """One pallas_call over many small tensors: ``group`` is a list of per-tensor lists
    (p, g, m, v[, vmax]), ``coefs`` their (step_size, sqrt(1 - b2^step)) pairs.
    Returns the updated states, per tensor."""
    views = [[_lanes(t) for t in ts] for ts in group]
    sizes = [vs[0].shape[0] for vs in views]
    slabs = [jnp.concatenate([vs[r] for vs in views]) for r in range(len(group[0]))]
    coef = jnp.concatenate([jnp.broadcast_to(c[None, :], (n, 2)) for c, n in zip(coefs, sizes)])
    outs = _call(scalars, slabs, coef, **kw)
    cuts = list(itertools.accumulate(sizes))[:-1]
    per_out = [jnp.split(o, cuts) for o in outs]
    return [[_unlanes(parts[k], group[k][0]) for parts in per_out] for k in range(len(group))]


def _scalars(step, lr, beta1, beta2, weight_decay, eps, grad_scale, found_inf) -> jax.Array:
    f32 = jnp.float32
    step = jnp.asarray(step, f32).reshape(())
    lr, b1, b2 = (jnp.asarray(x, f32).reshape(()) for x in (lr, beta1, beta2))
    inv_scale = 1.0 / jnp.asarray(1.0 if grad_scale is None else grad_scale, f32).reshape(())
    skip = jnp.asarray(0.0 if found_inf is None else found_inf, f32).reshape(())
    return jnp.stack([lr, b1, b2, jnp.asarray(weight_decay, f32), jnp.asarray(eps, f32),
                      lr / (1.0 - b1 ** step), jnp.sqrt(1.0 - b2 ** step), inv_scale, skip])


def fused_adam(params: Sequence[jax.Array], grads: Sequence[jax.Array],
               exp_avgs: Sequence[jax.Array], exp_avg_sqs: Sequence[jax.Array],
               max_exp_avg_sqs: Sequence[jax.Array] | None, state_steps: Sequence,
               *, lr, beta1: float, beta2: float, weight_decay: float, eps: float,
               amsgrad: bool = False, maximize: bool = False, adamw: bool = False,
               grad_scale: jax.Array | None = None, found_inf: jax.Array | None = None,
               interpret: bool | None = None,
               ) -> tuple[list[jax.Array], list[jax.Array], list[jax.Array], list[jax.Array]]:
    """torch's ``_fused_adam_`` (``adamw=True``: ``_fused_adamw_``), functional: returns the
    new (params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs) for the caller to write back.
    ``state_steps`` are the per-tensor steps, already incremented; ``lr`` may be an array.
    ``max_exp_avg_sqs`` is returned unchanged (possibly empty) unless ``amsgrad``."""
    reason = supports([p.shape for p in params], [p.dtype for p in params],
                      state_dtypes=[t.dtype for t in (*exp_avgs, *exp_avg_sqs)])
    if reason:
        raise ValueError(f"fused_adam kernel: {reason}")
    target = tpu_info.target(interpret)
    vmaxes = list(max_exp_avg_sqs or [])
    kw = dict(amsgrad=amsgrad, maximize=maximize, adamw=adamw, target=target)
    shared = _scalars(1.0, lr, beta1, beta2, weight_decay, eps, grad_scale, found_inf)
    tensors = [[p, g, m, v] + ([vmaxes[k]] if amsgrad else [])
               for k, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs))]
    new = [ts[:1] + ts[2:] for ts in tensors]         # what an empty tensor returns
    packs: dict[tuple, list[int]] = {}
    for k, ts in enumerate(tensors):
        rows = -(-ts[0].size // LANES)
        if rows == 0:
            continue
        if rows <= PACK_ROWS:
            packs.setdefault(tuple(t.dtype for t in ts), []).append(k)
            continue
        s = _scalars(state_steps[k], lr, beta1, beta2, weight_decay, eps, grad_scale, found_inf)
        new[k] = _step_one(s, ts, **kw)
    for ks in packs.values():
        coefs = [_scalars(state_steps[k], lr, beta1, beta2, weight_decay, eps, grad_scale,
                          found_inf)[_STEP_SIZE:_BC2_SQRT + 1] for k in ks]
        for k, out in zip(ks, _step_packed(shared, coefs, [tensors[k] for k in ks], **kw)):
            new[k] = out
    new_p, new_m, new_v = ([out[r] for out in new] for r in range(3))
    return new_p, new_m, new_v, ([out[3] for out in new] if amsgrad else vmaxes)


fused_adamw = functools.partial(fused_adam, adamw=True)
fused_adamw.__doc__ = "torch's ``_fused_adamw_`` (decoupled weight decay); see fused_adam."
