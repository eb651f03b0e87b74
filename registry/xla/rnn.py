"""Fused RNN cells: what ``nn.LSTM`` / ``nn.GRU`` (and ``LSTMCell`` / ``GRUCell``) reach on tpu.

ATen's ``lstm``/``gru`` are composite: on a non-CPU device each time step is two matmuls
(input and hidden projections) and one fused cell op, ``_thnn_fused_lstm_cell`` or
``_thnn_fused_gru_cell``, whose backward reads the ``workspace`` saved by the forward. The
workspace layout follows ATen's CUDA kernels (aten/src/ATen/native/cuda/RNN.cu):

* LSTM: the activated gates ``[i, f, g, o]`` (input, forget, cell, output), ``[B, 4H]``;
* GRU: ``[r, z, n, hx, hn]`` (reset, update, new gate, previous hidden state, and the
  hidden projection of the new gate with its bias), ``[B, 5H]``.

Half types compute in float32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import float_compute


def _gates(input_gates, hidden_gates, input_bias, hidden_bias, acc):
    ig, hg = input_gates.astype(acc), hidden_gates.astype(acc)
    if input_bias is not None:
        ig = ig + input_bias.astype(acc)
    if hidden_bias is not None:
        hg = hg + hidden_bias.astype(acc)
    return ig, hg


@xla("aten::_thnn_fused_lstm_cell.default")
def thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    acc = float_compute(input_gates.dtype)
    ig, hg = _gates(input_gates, hidden_gates, input_bias, hidden_bias, acc)
    i, f, g, o = jnp.split(ig + hg, 4, axis=1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * cx.astype(acc) + i * g
    hy = o * jnp.tanh(cy)
    dt = input_gates.dtype
    return hy.astype(dt), cy.astype(dt), jnp.concatenate([i, f, g, o], axis=1).astype(dt)


@xla("aten::_thnn_fused_lstm_cell_backward_impl.default", static=("has_bias",))
def thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return None, None, None
    acc = float_compute(workspace.dtype)
    i, f, g, o = jnp.split(workspace.astype(acc), 4, axis=1)
    c, cy = cx.astype(acc), cy.astype(acc)
    ghy = jnp.zeros_like(cy) if grad_hy is None else grad_hy.astype(acc)
    gcy = jnp.zeros_like(cy) if grad_cy is None else grad_cy.astype(acc)
    tanh_cy = jnp.tanh(cy)
    gc = ghy * o * (1 - tanh_cy * tanh_cy) + gcy          # d loss / d cy, both paths
    gi = gc * g * i * (1 - i)
    gf = gc * c * f * (1 - f)
    gg = gc * i * (1 - g * g)
    go = ghy * tanh_cy * o * (1 - o)
    grad_gates = jnp.concatenate([gi, gf, gg, go], axis=1)
    dt = workspace.dtype
    grad_bias = grad_gates.sum(0).astype(dt) if has_bias else None
    return grad_gates.astype(dt), (gc * f).astype(cx.dtype), grad_bias


@xla("aten::_thnn_fused_gru_cell.default")
def thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    acc = float_compute(input_gates.dtype)
    ig, hg = _gates(input_gates, hidden_gates, input_bias, hidden_bias, acc)
    ir, iz, in_ = jnp.split(ig, 3, axis=1)
    hr, hz, hn = jnp.split(hg, 3, axis=1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    h = hx.astype(acc)
    hy = n + z * (h - n)
    dt = input_gates.dtype
    return hy.astype(dt), jnp.concatenate([r, z, n, h, hn], axis=1).astype(dt)


@xla("aten::_thnn_fused_gru_cell_backward.default", static=("has_bias",))
def thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    acc = float_compute(workspace.dtype)
    r, z, n, h, hn = jnp.split(workspace.astype(acc), 5, axis=1)
    gh = grad_hy.astype(acc)
    gn = gh * (1 - z) * (1 - n * n)                       # through tanh
    gz = gh * (h - n) * z * (1 - z)                       # through sigmoid
    gr = gn * hn * r * (1 - r)
    grad_input_gates = jnp.concatenate([gr, gz, gn], axis=1)
    grad_hidden_gates = jnp.concatenate([gr, gz, gn * r], axis=1)
    dt = workspace.dtype
    grad_hx = (gh * z).astype(grad_hy.dtype)
    if has_bias:
        return (grad_input_gates.astype(dt), grad_hidden_gates.astype(dt), grad_hx,
                grad_input_gates.sum(0).astype(dt), grad_hidden_gates.sum(0).astype(dt))
    return grad_input_gates.astype(dt), grad_hidden_gates.astype(dt), grad_hx, None, None
