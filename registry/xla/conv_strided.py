"""Convolutions XLA:TPU computes wrongly, written as ones it computes right: strided 1-d
convolutions, and transposed ones, as stride-1 convolutions (below); a convolution whose
output is longer than its input behind an optimization barrier (``conv``). And
convolutions of stride 4 or more, plain and transposed, on which XLA:TPU's compiler may
abort, in the same stride-1 forms (``aborts_on_tpu``).

Why: XLA:TPU (libtpu 0.0.42, run on a v5e) returns wrong values for programs that chain
strided 1-d convolutions. HuBERT's feature extractor (kernel 8 stride 4, then kernel 4
stride 2, over 400 samples; so WavLM, SEW) came out 0.28 relative off when compiled as one
program, and of 30 random two- and three-layer strided 1-d chains (forward and gradients
in one jitted program, plain JAX) 7 were wrong, 5 of them in the gradients only (~100%);
each convolution alone was right, and so was every chain rewritten as below (30/30). Chains
of transposed 1-d convolutions (vocoders' upsamplers: Encodec, DAC, SpeechT5's HiFi-GAN)
were worse: 16 of 23 wrong, 3 of 23 rewritten (those 3 begin with a stride-1 layer, a
growing one: ``conv``'s barrier mends them; 0 of 14 transposed chains wrong with both). The
same chains written as 2-d convolutions of height 1 were as wrong. Strided 2-d and 3-d
convolutions of stride 2-3 are left to XLA: no wrong result was seen there (random 2-d chains,
ResNet's compiled training step on the chip), and on the chip (v5e) this rewrite was a wash
layer by layer (ResNet's stride-2 layers, forward and both gradients, 0.94-1.04x) but made
ResNet-18's compiled training step 1.13x slower (the reshapes between layers); 1-d ones
take it for correctness. From stride 4 on they take the rewrite (``aborts_on_tpu``), which
the chip ran faster, forward and both gradients, batch 8 at 224x224: ConvNeXt's stem (k4
s4) 0.70x, AlexNet's first (k11 s4) 0.58x, ViT's patch embedding (k16 s16) 2.1 ms against
XLA's 529 ms.

The rewrite: the input, padded, is cut into blocks of ``stride`` along each spatial
dimension and each block's positions become channels, and the kernel is split the same way:

    y[o, j] = sum_{c, t} x[c, j*s + t] w[o, c, t]
            = sum_{c, r, u} xs[c*s + r, j + u] ws[o, c*s + r, u],   t = u*s + r

with ``xs[c*s + r, i] = x[c, i*s + r]`` and ``ws[o, c*s + r, u] = w[o, c, u*s + r]`` (zero
past the kernel's end). Sums and products are those of the strided convolution; taps that
do not exist are exact zeros. A kernel no longer than its stride reads only its own
``k`` phases of each block (no zero taps at all: a 1x1 stride-2 convolution costs what a
1x1 one does). A transposed convolution is the same read backwards: its output position
``m*s + r`` is phase ``r`` of a stride-1 convolution with the kernel's taps ``r, r+s, ...``,
so one stride-1 convolution computes every phase as channels, which are then interleaved.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax


def miscompiled_on_tpu(shape: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> bool:
    """Whether a convolution of an input of ``shape`` (N, C, *spatial) is one XLA:TPU may
    compute wrongly in a larger program (see the module): strided (a transposed one: its
    input dilated), undilated, and 1-d (or written as 2-d/3-d, every other spatial size 1)."""
    return max(stride) > 1 and max(dilation) == 1 and sum(n > 1 for n in shape[2:]) <= 1


def aborts_on_tpu(stride: Sequence[int], dilation: Sequence[int]) -> bool:
    """Whether a convolution is one XLA:TPU's compiler may abort on, as XLA writes it or its
    gradient (a transposed one, or a strided one's input gradient: the input dilated by the
    stride): stride 4 or more, undilated. Why: libtpu 0.0.42's space-to-batch pass fails a
    check and aborts the process (SIGABRT, no Python error) on ``nn.ConvTranspose2d(32, 32,
    5, stride=4)`` over 20x20 and 28x28 inputs at batch 1-2 (2 of 301 transposed 2-d shapes,
    strides 2-5, swept with the compile-only v5e compiler, which aborts alike; found on a
    v5e by ``bench/conv_chains.py --dims 2``), and on the backward of ``nn.Conv2d(32, 32, 5,
    stride=4)`` over 81x81 and 113x113 (the same dilated convolution as its input gradient).
    The stride-1 forms (``unit_stride_conv``, ``unit_stride_conv_transpose``: no dilation
    anywhere) compile for all of them; on the chip the phase form ran stride-4 transposed
    layers at 0.91-1.10x the dilated form's time, and is right."""
    return max(stride) >= 4 and max(dilation) == 1


def unit_stride_on_tpu(shape: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> bool:
    """Whether a convolution (plain or transposed) of an input of ``shape`` is written in its
    stride-1 form: XLA:TPU computes it wrongly, or may abort on it, as XLA writes it."""
    return miscompiled_on_tpu(shape, stride, dilation) or aborts_on_tpu(stride, dilation)


def conv(x: jax.Array, w: jax.Array, stride: Sequence[int], pads: Sequence[tuple[int, int]],
         lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
         **conv_kw: Any) -> jax.Array:
    """``lax.conv_general_dilated`` (NC*/OI* layouts), every lowering's one call of it: a
    convolution whose output is longer than its input along some dimension reads its input
    through an ``optimization_barrier``. Why: XLA:TPU (libtpu 0.0.42, v5e) computes the
    weight gradient of such a convolution wrongly (100-200% off; forward and input gradient
    right) when its input is computed in the same program: of 24 random 2-3 layer stride-1
    1-d chains (tanh between) the 15 with a growing layer after the first were wrong, the 9
    without right; so were a 3x3 padding-2 2-d convolution and a ConvTranspose2d k4 s2 p1 (a
    UNet's or VAE decoder's upsampler) after a 3x3 one. With the barrier, which keeps the
    producer out of the convolution's fusion, all of them were right (7 re-run 1-d chains, the
    first 14 of the sweep, 14 transposed 1-d chains, the 2-d cases). libtpu's estimate of
    its cost: 1.08x for the VAE upsampler's forward and backward. Transposed stride-1
    convolutions and ``unit_stride_conv_transpose``'s phase convolution are growing ones."""
    nd = x.ndim - 2
    lhs_dilation = tuple(lhs_dilation or (1,) * nd)
    rhs_dilation = tuple(rhs_dilation or (1,) * nd)
    if _grows(x.shape[2:], w.shape[2:], stride, pads, lhs_dilation, rhs_dilation):
        x = lax.optimization_barrier(x)
    return lax.conv_general_dilated(x, w, tuple(stride), list(pads), lhs_dilation=lhs_dilation,
                                    rhs_dilation=rhs_dilation, **conv_kw)


def _grows(size, k, stride, pads, lhs_dilation, rhs_dilation) -> bool:
    """Whether a convolution's output is longer than its input along some dimension."""
    out = [((n - 1) * ld + 1 + lo + hi - d * (kk - 1) - 1) // s + 1
           for n, kk, s, (lo, hi), ld, d in zip(size, k, stride, pads, lhs_dilation, rhs_dilation)]
    return any(o > n for o, n in zip(out, size))


def unit_stride_conv(x: jax.Array, w: jax.Array, stride: Sequence[int], padding: Sequence[int],
                     groups: int, **conv_kw: Any) -> jax.Array:
    """``lax.conv_general_dilated(x, w, stride, padding)`` (NC*/OI* layouts, dilation 1,
    ``groups`` feature groups) computed by a stride-1 convolution (see the module)."""
    nd = x.ndim - 2
    k = w.shape[2:]
    x = jnp.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    w, taps = _split_kernel(w, stride)
    out = [(n - kk) // s + 1 for n, kk, s in zip(x.shape[2:], k, stride)]
    blocks = [o + t - 1 for o, t in zip(out, taps)]
    # each dim: exactly blocks*s samples (cut the unread tail, or pad a short one)
    x = x[(slice(None),) * 2 + tuple(slice(0, b * s) for b, s in zip(blocks, stride))]
    x = jnp.pad(x, [(0, 0), (0, 0)] + [(0, b * s - n) for b, s, n in zip(blocks, stride, x.shape[2:])])
    # phases a kernel reads: all s of them, or only its k when it fits in one block
    phases = [s if t > 1 else kk for t, s, kk in zip(taps, stride, k)]
    xs = _to_depth(x, blocks, stride, phases)
    ws = _to_depth(w, taps, stride, phases)
    return conv(xs, ws, (1,) * nd, [(0, 0)] * nd, feature_group_count=groups, **conv_kw)


def unit_stride_conv_transpose(x: jax.Array, w: jax.Array, stride: Sequence[int],
                               padding: Sequence[int], output_padding: Sequence[int],
                               groups: int, **conv_kw: Any) -> jax.Array:
    """torch's transposed convolution (weight (C_in, C_out/groups, *k), dilation 1) without
    an input dilation: output position ``m*s + r`` is phase ``r`` of a stride-1 convolution
    with the kernel's taps ``r, r+s, ...``; the phases are computed as channels and
    interleaved (the inverse of the space-to-depth above)."""
    nd = x.ndim - 2
    cin, cout_g, *k = w.shape
    w, taps = _split_kernel(w, stride)
    phases = math.prod(stride)
    w = _to_depth(w, taps, stride, stride)      # (C_in, C_out/groups * phases, *taps)
    w = w.reshape((groups, cin // groups, cout_g * phases) + tuple(taps)).swapaxes(1, 2)
    w = jnp.flip(w.reshape((groups * cout_g * phases, cin // groups) + tuple(taps)),
                 axis=tuple(range(2, 2 + nd)))
    z = conv(x, w, (1,) * nd, [(t - 1, t - 1) for t in taps], feature_group_count=groups, **conv_kw)
    m = z.shape[2:]
    z = z.reshape((z.shape[0], groups * cout_g) + tuple(stride) + tuple(m))
    z = z.transpose((0, 1) + tuple(i for d in range(nd) for i in (2 + nd + d, 2 + d)))
    y = z.reshape(z.shape[:2] + tuple(a * s for a, s in zip(m, stride)))
    size = [(n - 1) * s - 2 * p + kk + op for n, s, p, kk, op in
            zip(x.shape[2:], stride, padding, k, output_padding)]
    # output_padding may reach past the full result: those positions are zeros
    y = jnp.pad(y, [(0, 0), (0, 0)] + [(0, max(0, p + n - f)) for p, n, f in zip(padding, size, y.shape[2:])])
    return y[(slice(None),) * 2 + tuple(slice(p, p + n) for p, n in zip(padding, size))]


def _split_kernel(w: jax.Array, stride: Sequence[int]) -> tuple[jax.Array, list[int]]:
    """``w`` (A, B, *k) zero-padded to whole blocks of ``stride``, and the blocks per dim."""
    k = w.shape[2:]
    taps = [-(-kk // s) for kk, s in zip(k, stride)]
    return jnp.pad(w, [(0, 0), (0, 0)] + [(0, t * s - kk) for t, s, kk in zip(taps, stride, k)]), taps


def _to_depth(a: jax.Array, blocks: Sequence[int], stride: Sequence[int],
              phases: Sequence[int]) -> jax.Array:
    """(A, B, *blocks*stride) -> (A, B*prod(phases), *blocks): position ``i*s + r`` of a
    spatial dim becomes block ``i`` of channel ``b*s + r`` (phases ``r < phases`` kept)."""
    nd = len(blocks)
    a = a.reshape(a.shape[:2] + tuple(d for b, s in zip(blocks, stride) for d in (b, s)))
    a = a[(slice(None),) * 2 + tuple(i for p in phases for i in (slice(None), slice(0, p)))]
    perm = (0, 1) + tuple(3 + 2 * i for i in range(nd)) + tuple(2 + 2 * i for i in range(nd))
    a = a.transpose(perm)
    return a.reshape((a.shape[0], a.shape[1] * math.prod(phases)) + tuple(blocks))
