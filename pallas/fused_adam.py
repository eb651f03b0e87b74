"""Fused Adam / AdamW over a list of tensors: one read and one write of each state per step.

Per element, in f32 (torch's ``_fused_adam_`` / ``_fused_adamw_`` math; ``step`` is the
already-incremented state step, as torch's optimizer passes it):
    g = grad / grad_scale;  g = -g if maximize
    adamw: p = p (1 - lr wd)          adam: g = g + wd p
    m = m + (1 - b1)(g - m);  v = b2 v + (1 - b2) g^2;  vmax = max(vmax, v) if amsgrad
    p = p - lr / (1 - b1^step) * m / (sqrt(v or vmax) / sqrt(1 - b2^step) + eps)
    everything unchanged when found_inf != 0
Each tensor is viewed as [rows, 128] lanes (padded to a multiple of 128 elements only when
needed; a ragged last row block is masked by Pallas) and walked in (block_rows, 128) blocks.
All scalars (lr, betas, bias corrections, 1/grad_scale, found_inf) travel in one f32 SMEM
vector (scalar prefetch): a new lr or step reuses the compiled kernel.
"""
from __future__ import annotations

import functools
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
# Slots of the scalar vector.
_LR, _B1, _B2, _WD, _EPS, _STEP_SIZE, _BC2_SQRT, _INV_SCALE, _SKIP = range(9)


def vmem_bytes(block_rows: int, dtype, amsgrad: bool) -> int:
    """Double-buffered blocks (4-5 in, 3-4 out) plus ~6 f32 block temporaries."""
    states = 4 if amsgrad else 3
    io = 2 * (1 + states + states) * tpu_info.block_bytes((block_rows, LANES), dtype)
    return io + 6 * tpu_info.block_bytes((block_rows, LANES), jnp.float32)


def block_rows(rows: int, dtype, amsgrad: bool, chip: tpu_info.Chip) -> int:
    """Largest row block (a sublane multiple) that fits the chip's VMEM budget, capped by
    the tensor's own (rounded-up) row count."""
    cap = round_up(rows, tpu_info.sublane(dtype))
    for br in _ROW_BLOCKS:
        if br <= cap and vmem_bytes(br, dtype, amsgrad) <= tpu_info.vmem_budget(chip):
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


def _kernel(s_ref, p_ref, g_ref, m_ref, v_ref, *rest, amsgrad: bool, maximize: bool,
            adamw: bool):
    f32 = jnp.float32
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
    denom = jnp.sqrt(v) / s_ref[_BC2_SQRT] + eps
    new[0] = p - s_ref[_STEP_SIZE] * m / denom
    skip = s_ref[_SKIP] != 0.0          # found_inf: leave every tensor as it was
    olds = (p_ref, m_ref, v_ref) + ((vmax_ref,) if amsgrad else ())
    for out, val, old in zip(outs, new, olds):
        out[...] = jnp.where(skip, old[...], val.astype(out.dtype))


def _step_one(scalars, tensors, *, amsgrad, maximize, adamw, target):
    """One pallas_call over one parameter and its states; returns the updated states."""
    shape, numel = tensors[0].shape, tensors[0].size
    padded = round_up(numel, LANES)
    rows = padded // LANES
    views = [jnp.pad(t.reshape(-1), (0, padded - numel)).reshape(rows, LANES)
             if padded != numel else t.reshape(rows, LANES) for t in tensors]
    widest = max((t.dtype for t in tensors), key=lambda d: tpu_info.sublane(d))
    br = block_rows(rows, widest, amsgrad, target.chip)
    spec = pl.BlockSpec((br, LANES), lambda i, s: (i, 0))
    state_ix = [0, 2, 3] + ([4] if amsgrad else [])     # p, m, v (, vmax) are updated
    moved = sum(v.nbytes for v in views) + sum(views[k].nbytes for k in state_ix)
    outs = pallas_call(
        functools.partial(_kernel, amsgrad=amsgrad, maximize=maximize, adamw=adamw),
        target=target,
        name="fused_adamw" if adamw else "fused_adam",
        cost_estimate=cost(20 * rows * LANES, moved, 2 * rows * LANES),   # sqrt, divide
        vmem_bytes=vmem_bytes(br, widest, amsgrad),
        dimension_semantics=("parallel",),
        out_shape=[jax.ShapeDtypeStruct(views[k].shape, views[k].dtype) for k in state_ix],
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(pl.cdiv(rows, br),),
            in_specs=[spec] * len(views), out_specs=[spec] * len(state_ix)),
        input_output_aliases={1 + k: o for o, k in enumerate(state_ix)},
    )(scalars, *views)
    return [o.reshape(-1)[:numel].reshape(shape) if padded != numel else o.reshape(shape)
            for o in outs]


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
    new_p, new_m, new_v, new_vmax = [], [], [], []
    for k, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        if p.size == 0:
            new_p.append(p), new_m.append(m), new_v.append(v)
            if amsgrad:
                new_vmax.append(vmaxes[k])
            continue
        s = _scalars(state_steps[k], lr, beta1, beta2, weight_decay, eps, grad_scale,
                     found_inf)
        outs = _step_one(s, [p, g, m, v] + ([vmaxes[k]] if amsgrad else []),
                         amsgrad=amsgrad, maximize=maximize, adamw=adamw, target=target)
        new_p.append(outs[0]), new_m.append(outs[1]), new_v.append(outs[2])
        if amsgrad:
            new_vmax.append(outs[3])
    return new_p, new_m, new_v, (new_vmax if amsgrad else vmaxes)


fused_adamw = functools.partial(fused_adam, adamw=True)
fused_adamw.__doc__ = "torch's ``_fused_adamw_`` (decoupled weight decay); see fused_adam."
