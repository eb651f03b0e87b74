"""The small GPT of ``tpu_kernels.models`` written directly in JAX: the XLA limit that
graph mode is measured against (``bench/graph_modes.py``).

Same math as the torch model (pre-norm blocks, causal softmax attention, exact GELU,
untied LM head, mean next-token cross entropy) and the same AdamW update as
``torch.optim.AdamW`` defaults; parameters are taken from a torch model's state dict.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tpu_kernels.registry.xla._util import matmul_precision


def params_from(model: torch.nn.Module) -> dict[str, jax.Array]:
    """The model's parameters as jax arrays, keyed by their torch names."""
    return {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in model.named_parameters()}


def _linear(p: dict, name: str, x: jax.Array) -> jax.Array:
    y = x @ p[f"{name}.weight"].T
    bias = p.get(f"{name}.bias")
    return y if bias is None else y + bias


def _layer_norm(p: dict, name: str, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p[f"{name}.weight"] + p[f"{name}.bias"]


def _attention(p: dict, name: str, x: jax.Array, heads: int) -> jax.Array:
    b, t, d = x.shape
    q, k, v = jnp.split(_linear(p, f"{name}.qkv", x), 3, axis=-1)
    q, k, v = (z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for z in (q, k, v))
    att = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(d // heads)
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    att = jax.nn.softmax(jnp.where(causal, att, -jnp.inf), axis=-1)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return _linear(p, f"{name}.proj", y)


def forward(p: dict, tokens: jax.Array, *, layers: int, heads: int) -> jax.Array:
    """Logits [b, t, vocab]."""
    t = tokens.shape[1]
    x = p["tok.weight"][tokens] + p["pos.weight"][jnp.arange(t)]
    for i in range(layers):
        blk = f"blocks.{i}"
        x = x + _attention(p, f"{blk}.attn", _layer_norm(p, f"{blk}.ln1", x), heads)
        h = jax.nn.gelu(_linear(p, f"{blk}.mlp.0", _layer_norm(p, f"{blk}.ln2", x)), approximate=False)
        x = x + _linear(p, f"{blk}.mlp.2", h)
    return _linear(p, "fc", _layer_norm(p, "ln_f", x))


def loss(p: dict, tokens: jax.Array, *, layers: int, heads: int) -> jax.Array:
    logits = forward(p, tokens[:, :-1], layers=layers, heads=heads)
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)
    return -picked.mean()


def adamw_step(p: dict, grads: dict, state: dict, *, lr: float = 3e-3, b1: float = 0.9,
               b2: float = 0.999, eps: float = 1e-8, wd: float = 1e-2) -> tuple[dict, dict]:
    """torch.optim.AdamW's update (decoupled weight decay, bias-corrected moments)."""
    step = state["step"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    c1, c2 = 1 - b1 ** step, 1 - b2 ** step

    def update(w, m, v):
        w = w * (1 - lr * wd)
        return w - lr * (m / c1) / (jnp.sqrt(v / c2) + eps)
    return jax.tree.map(update, p, m, v), {"step": step, "m": m, "v": v}


def init_state(p: dict) -> dict[str, Any]:
    # m and v each their own buffers: the train step donates them
    return {"step": jnp.zeros((), jnp.float32), "m": jax.tree.map(jnp.zeros_like, p),
            "v": jax.tree.map(jnp.zeros_like, p)}


def jitted(layers: int, heads: int):
    """(forward, train_step) as jitted functions at torch's current float32 matmul
    precision; train_step(p, state, tokens) -> (loss, p, state)."""
    # the tpu device's matmuls follow torch's setting ("highest", torch's default, is full
    # float32: several bf16 passes on a TPU's MXU), so the reference must too (JAX's own
    # default is one pass); the registry's one table maps it
    precision = matmul_precision().name.lower()

    @jax.jit
    def fwd(p, tokens):
        with jax.default_matmul_precision(precision):
            return forward(p, tokens, layers=layers, heads=heads)

    # parameters and optimizer state donated, as JAX training code does (and as the tpu
    # backend donates what a compiled optimizer step writes)
    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(p, state, tokens):
        with jax.default_matmul_precision(precision):
            value, grads = jax.value_and_grad(loss)(p, tokens, layers=layers, heads=heads)
        p, state = adamw_step(p, grads, state)
        return value, p, state
    return fwd, train_step


def tokens_from(t: torch.Tensor) -> jax.Array:
    return jnp.asarray(np.asarray(t.cpu().numpy(), dtype=np.int32))
