"""Every Pallas and Helion kernel at production shapes, forward and backward, as programs
to compile: Llama-3-8B-like (hidden 4096, FFN 14336, vocab 128256, sequence 4096-8192,
head_dim 128 and 64, GQA 32/8), MoE layers of 8 and 64 experts, and a serving decode step
(256 sequences of context 8192 in pages of 16), in bf16.

A case is a JAX function and the abstract arguments to compile it with; differentiable
kernels are compiled as ``value_and_grad`` of a scalar loss, so one program holds the
forward and the backward kernels.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from tpu_kernels.pallas import cross_entropy as ce
from tpu_kernels.pallas import embedding as emb
from tpu_kernels.pallas import flash_attention as fa
from tpu_kernels.pallas import fused_adam
from tpu_kernels.pallas import grouped_matmul as gm
from tpu_kernels.pallas import linear_cross_entropy as lce
from tpu_kernels.pallas import matmul as mm
from tpu_kernels.pallas import ragged_paged_attention as rpa
from tpu_kernels.helion_kernels import cumsum, glu, layer_norm, rms_norm, rope, softmax
from tpu_kernels.helion_kernels import topk, var_mean

S = jax.ShapeDtypeStruct
BF16, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
TOKENS, HIDDEN, FFN, VOCAB = 8192, 4096, 14336, 128256


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    kind: str                          # "pallas" | "helion"
    fn: Callable[..., Any]
    specs: tuple[jax.ShapeDtypeStruct, ...]
    thorough: bool = False             # only in `make test-thorough` / full reports


def _grad(f: Callable[..., Any], argnums: tuple[int, ...]) -> Callable[..., Any]:
    """value_and_grad of the f32 sum of ``f``'s floating outputs w.r.t. ``argnums``."""
    def loss(*args):
        leaves = [x for x in jax.tree.leaves(f(*args)) if jnp.issubdtype(x.dtype, jnp.floating)]
        return sum(jnp.sum(x.astype(jnp.float32)) for x in leaves)
    return jax.value_and_grad(loss, argnums=argnums)


def _pallas() -> list[Case]:

    def attn(sq, d, hq=32, hkv=8):
        return (S((1, hq, sq, d), BF16), S((1, hkv, sq, d), BF16), S((1, hkv, sq, d), BF16))

    def adamw(*ts):
        p, g, m, v = (list(ts[i::4]) for i in range(4))
        return fused_adam.fused_adamw(p, g, m, v, None, [5.0] * len(p), lr=1e-3, beta1=0.9,
                                      beta2=0.95, weight_decay=0.1, eps=1e-8)

    def paged_decode(seqs=256, context=8192, page=16):     # inference only: no backward
        pages = context // page
        kv = S((seqs * pages, 8, page, 128), BF16)
        return (S((seqs, 32, 128), BF16), kv, kv, S((seqs,), I32), S((seqs, pages), I32),
                S((seqs + 1,), I32), S((1,), I32))

    adam_shapes = [(HIDDEN, FFN), (HIDDEN,), (1000, 3)]
    causal = lambda q, k, v: fa.flash_attention(q, k, v, causal=True)  # noqa: E731
    return [
        Case("matmul", "pallas", _grad(mm.matmul, (0, 1)),
             (S((TOKENS, HIDDEN), BF16), S((HIDDEN, FFN), BF16))),
        Case("addmm", "pallas",
             _grad(lambda a, b, c: mm.matmul(a, b, c, beta=0.5, alpha=2.0), (0, 1, 2)),
             (S((TOKENS, HIDDEN), BF16), S((HIDDEN, HIDDEN), BF16), S((HIDDEN,), BF16))),
        Case("bmm", "pallas", _grad(mm.bmm, (0, 1)),
             (S((32, 4096, 128), BF16), S((32, 128, 4096), BF16))),
        Case("matmul_f32", "pallas", _grad(mm.matmul, (0, 1)),
             (S((4096, HIDDEN), F32), S((HIDDEN, HIDDEN), F32)), thorough=True),
        Case("flash_attention_d128", "pallas", _grad(causal, (0, 1, 2)), attn(8192, 128)),
        Case("flash_attention_d64", "pallas", _grad(causal, (0, 1, 2)), attn(4096, 64)),
        Case("flash_attention_mask", "pallas",
             _grad(lambda q, k, v, m: fa.flash_attention(q, k, v, m), (0, 1, 2)),
             attn(4096, 128) + (S((1, 1, 4096, 4096), jnp.bool_),), thorough=True),
        Case("cross_entropy", "pallas", _grad(ce.cross_entropy, (0,)),
             (S((TOKENS, VOCAB), BF16), S((TOKENS,), I32))),
        Case("linear_cross_entropy", "pallas", _grad(lce.linear_cross_entropy, (0, 1)),
             (S((4096, HIDDEN), BF16), S((VOCAB, HIDDEN), BF16), S((4096,), I32))),
        Case("embedding", "pallas", _grad(emb.embedding, (0,)),
             (S((VOCAB, HIDDEN), BF16), S((TOKENS,), I32))),
        Case("fused_adamw", "pallas", adamw, tuple(S(s, F32) for s in adam_shapes for _ in range(4))),
        Case("ragged_dot_8_experts", "pallas", _grad(gm.ragged_dot, (0, 1)),
             (S((2 * TOKENS, HIDDEN), BF16), S((8, HIDDEN, FFN), BF16), S((8,), I32))),
        Case("ragged_dot_64_experts", "pallas", _grad(gm.ragged_dot, (0, 1)),
             (S((8 * TOKENS, 2048), BF16), S((64, 2048, 768), BF16), S((64,), I32))),
        Case("ragged_paged_attention", "pallas", rpa.ragged_paged_attention, paged_decode()),
    ]


def _helion() -> list[Case]:

    rows = S((TOKENS, HIDDEN), BF16)
    vec = S((HIDDEN,), BF16)
    ffn = (S((TOKENS, FFN), BF16), S((TOKENS, FFN), BF16))

    def rope_case(seq, d):
        return (S((1, 32, seq, d), BF16), S((seq, d), F32), S((seq, d), F32))

    return [
        Case("rms_norm", "helion", _grad(lambda x, w: rms_norm.rms_norm(x, w, 1e-6), (0, 1)),
             (rows, vec)),
        Case("layer_norm", "helion",
             _grad(lambda x, w, b: layer_norm.layer_norm(x, w, b, 1e-5), (0, 1, 2)),
             (rows, vec, vec)),
        Case("softmax", "helion", _grad(lambda x: softmax.softmax(x) * x, (0,)),
             (S((TOKENS, 8192), BF16),)),
        Case("log_softmax_vocab", "helion", _grad(lambda x: softmax.log_softmax(x) * x, (0,)),
             (S((TOKENS, VOCAB), BF16),)),
        Case("swiglu", "helion", _grad(glu.swiglu, (0, 1)), ffn),
        Case("geglu_tanh", "helion", _grad(lambda a, b: glu.geglu(a, b, "tanh"), (0, 1)), ffn),
        Case("geglu", "helion", _grad(glu.geglu, (0, 1)), ffn, thorough=True),
        Case("glu", "helion", _grad(glu.glu, (0,)), (S((TOKENS, 2 * FFN), BF16),)),
        Case("rope_d128", "helion", _grad(rope.rope, (0,)), rope_case(8192, 128)),
        Case("rope_d64", "helion", _grad(rope.rope, (0,)), rope_case(4096, 64)),
        Case("var_mean", "helion", var_mean.var_mean, (rows,)),
        Case("cumsum", "helion", cumsum.cumsum, (S((TOKENS, HIDDEN), F32),)),
        Case("topk_router", "helion", lambda x: topk.topk(x, 8), (S((TOKENS, 64), F32),)),
    ]


def cases(thorough: bool = False) -> list[Case]:
    """Every kernel case (the CI set, or with ``thorough`` the longer list too)."""
    return [c for c in _pallas() + _helion() if thorough or not c.thorough]


def case(name: str) -> Case:
    for c in cases(thorough=True):
        if c.name == name:
            return c
    raise KeyError(f"no kernel case {name!r}")
