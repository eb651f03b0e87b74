"""The FlexAttention kernels compile for real TPUs (libtpu compile-only topologies, Mosaic
included) at seq 8192: forward and backward, through the binding, so the score_mod and
mask_mod traced from torch run inside the kernel bodies as they would on a chip.

CI compiles one variant per chip; ``--thorough`` every variant on every chip.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
import torch
from torch.nn.attention.flex_attention import _create_empty_block_mask, create_block_mask

from tpu_kernels import aot
from tpu_kernels.registry.xla.flex_attention import spec_of
from tpu_kernels.registry.bindings import flex_attention as binding
from tpu_kernels.registry.dtypes import to_jax_dtype

pytestmark = pytest.mark.skipif(aot.unavailable_reason() is not None, reason=str(aot.unavailable_reason()))

B, H, HKV, S, D = 1, 8, 2, 8192, 128
CHIPS = ("v5e", "v6e", "v7x")
_DOC = (torch.arange(S) >= S // 3).long() + (torch.arange(S) >= 2 * S // 3).long()
_SLOPES = torch.exp2(-torch.arange(1, H + 1) * 8.0 / H)

VARIANTS = {   # name -> (score_mod, mask_mod, score bufs, mask bufs)
    "causal_softcap": (lambda s, b, h, q, kv: 30 * torch.tanh(s / 30),
                       lambda b, h, q, kv: q >= kv, (), ()),
    "sliding_alibi": (lambda s, b, h, q, kv, sl: s + sl[h] * (kv - q),
                      lambda b, h, q, kv: (q >= kv) & (q - kv < 1024), (_SLOPES,), ()),
    "document_scale": (lambda s, b, h, q, kv, w: s * w[h],
                       lambda b, h, q, kv, d: (d[q] == d[kv]) & (q >= kv), (_SLOPES,), (_DOC,)),
    "no_mask_softcap": (lambda s, b, h, q, kv: 30 * torch.tanh(s / 30), None, (), ()),
    "random_bias": (lambda s, b, h, q, kv, bias: s + bias[h, q, kv],     # a learned [H, S, S] bias
                    lambda b, h, q, kv: ((q // 128) * 7 + (kv // 128) * 3) % 5 < 2,
                    (torch.empty(H, S, S, device="meta"),), ()),
}
CI = {("v5e", "causal_softcap"), ("v6e", "sliding_alibi"), ("v7x", "document_scale")}


@functools.lru_cache(maxsize=None)
def _block_mask(name: str):
    _, mask, _, mbufs = VARIANTS[name]
    if mask is None:            # what flex_attention uses without a block_mask: one block
        return _create_empty_block_mask(torch.empty(1, device="meta"), None)
    return create_block_mask(lambda b, h, q, kv: mask(b, h, q, kv, *mbufs), None, None, S, S,
                             device="cpu")


def _cases():
    return [pytest.param(chip, name, id=f"{chip}-{name}",
                         marks=[] if (chip, name) in CI else [pytest.mark.thorough])
            for chip in CHIPS for name in VARIANTS]


@pytest.mark.parametrize("chip,name", _cases())
def test_compiles_forward_and_backward_at_8192(chip, name):
    sharding = aot.topology.sharding(chip)
    score, mask, sbufs, mbufs = VARIANTS[name]
    bm = _block_mask(name)
    q = torch.empty(B, H, S, D, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(B, HKV, S, D, dtype=torch.bfloat16, device="meta")
    spec = spec_of(q, kv, kv, score, bm.as_tuple()[:-1] + (mask or bm.mask_mod,), D ** -0.5,
                   sbufs, mbufs, tuple(b.is_floating_point() for b in sbufs))
    assert binding.supports_backward(spec) is None

    def sds(t, shape=None, dtype=None):
        return jax.ShapeDtypeStruct(tuple(shape or t.shape), dtype or to_jax_dtype(t.dtype),
                                    sharding=sharding)
    tables = tuple(None if t is None else sds(t) for t in (
        bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices))
    qs, kvs, lse = sds(q), sds(kv), sds(None, (B, H, S), jnp.float32)
    sb, mb = tuple(sds(t) for t in sbufs), tuple(sds(t) for t in mbufs)

    def forward(q, k, v, tables, sb, mb):
        return binding.pallas_forward(spec, q, k, v, tables, sb, mb)

    def backward(q, k, v, out, lse, dout, tables, sb, mb):
        return binding.pallas_backward(spec, q, k, v, out, lse, dout, None, tables, sb, mb)
    for fn, args in ((forward, (qs, kvs, kvs, tables, sb, mb)),
                     (backward, (qs, kvs, kvs, qs, lse, qs, tables, sb, mb))):
        # kernels size their tiles for the chip and lower to Mosaic (compile_for, inside)
        compiled = aot.compile_lowered(lambda: jax.jit(fn).lower(*args), chip).executable
        assert "tpu_custom_call" in compiled.as_text()              # Mosaic, not interpret
        assert compiled.cost_analysis()["flops"] > 2 * B * H * S * S * D   # the kernels' estimates
