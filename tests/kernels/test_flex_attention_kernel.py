"""Pallas FlexAttention: block tables (tiles vs the mask's blocks), interpret-mode parity of
forward and backward with the dense reference through the JAX API, and the limits."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from tpu_kernels.pallas import flex_attention as fk
from tpu_kernels.pallas import flex_blocks as fb
from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.reference import flex_attention as ref


def _lists(bm):
    return [jnp.asarray(t.numpy()) for t in (bm.kv_num_blocks, bm.kv_indices,
                                             bm.full_kv_num_blocks, bm.full_kv_indices)]


@pytest.mark.parametrize("block,seq,unit,target,want", [
    (128, 8192, 128, 512, 128),     # TPU-sized blocks: tiles = blocks, tables exact
    (64, 8192, 128, 512, 128),      # two 64-blocks per lane-aligned tile
    (96, 8192, 128, 512, 384),      # lcm(96, 128)
    (1 << 30, 8192, 128, 512, 512), # no block mask: one huge block, any tile divides it
    (1 << 30, 100, 16, 256, 64),    # ... shrunk toward a short sequence
    (256, 64, 16, 512, 64),         # a block larger than the sequence
])
def test_tile_size(block, seq, unit, target, want):
    assert fb.tile_size(block, seq, unit, target) == want


@pytest.mark.parametrize("block,tile", [((128, 128), (128, 128)), ((64, 64), (128, 128)),
                                        ((128, 128), (64, 128)), ((64, 128), (256, 256))])
def test_tile_state_matches_the_dense_mask(block, tile):
    """Non-empty / full per tile equals any / all of the dense mask under the tile where
    tiles merge the mask's blocks; a tile that splits a block inherits the block's state
    (non-empty may then cover nothing: mask_mod decides there). The kv tail is never full."""
    sq, skv = 300, 280
    doc = torch.tensor([0] * 90 + [1] * 130 + [2] * 80)

    def mask(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv - 40)
    bm = create_block_mask(mask, 1, 1, sq, skv, device="cpu", BLOCK_SIZE=block)
    tl = fb.Tiling(tile[0], tile[1], -(-sq // tile[0]), -(-skv // tile[1]), 1, 1)
    state = fb.block_state(*_lists(bm), -(-skv // block[1]))
    nonempty, full = fb.tile_state(state, block, tl, skv, mask_is_true=False)
    dense = np.zeros((tl.nq * tl.bq, tl.nk * tl.bk), bool)
    qi, ki = np.arange(sq)[:, None], np.arange(skv)[None, :]
    dense[:sq, :skv] = ((doc.numpy()[qi] == doc.numpy()[ki]) & (qi >= ki - 40))
    tiles = dense.reshape(tl.nq, tl.bq, tl.nk, tl.bk)
    inside = np.zeros_like(dense)
    inside[:sq, :skv] = True
    want_full = (tiles | ~inside.reshape(tiles.shape)).all((1, 3)) & tiles.any((1, 3))
    want_full[:, -1] = False        # skv % bk: the tail tile masks its bounds
    ne, fu = np.asarray(nonempty[0, 0]), np.asarray(full[0, 0])
    if tile[0] % block[0] == 0 and tile[1] % block[1] == 0:
        np.testing.assert_array_equal(ne, tiles.any((1, 3)))
        np.testing.assert_array_equal(fu, want_full)
    else:
        assert (ne >= tiles.any((1, 3))).all() and (fu <= want_full).all()
        assert ne.sum() < ne.size        # still skips


def test_tables_list_non_empty_tiles_in_order():
    nonempty = jnp.array([[[[1, 0, 1], [0, 0, 0]]]], bool)
    full = jnp.array([[[[0, 0, 1], [0, 0, 0]]]], bool)
    t = fb.tables(nonempty, full)
    np.testing.assert_array_equal(t.row_count, [2, 0])
    np.testing.assert_array_equal(t.row_entry[:2], [0, 2 * 2 + 1])
    np.testing.assert_array_equal(t.col_count, [1, 0, 1])
    np.testing.assert_array_equal(np.asarray(t.col_entry)[[0, 4]], [0, 1])


@pytest.mark.parametrize("name,mask,fraction", [
    ("causal", lambda b, h, q, kv: q >= kv, 2080 / 4096),
    ("sliding 1024", lambda b, h, q, kv: (q >= kv) & (q - kv < 1024), 540 / 4096),
])
def test_fetched_tiles_at_8192(name, mask, fraction):
    """Work the tables skip at seq 8192 (128 blocks): causal fetches 51%, a 1024 window 13%."""
    bm = create_block_mask(mask, None, None, 8192, 8192, device="cpu")
    tl = fk.plan(8192, 8192, 128, 128, jnp.bfloat16, bm.BLOCK_SIZE, (1, 1), chip=tpu_info.CHIPS["v6e"])
    state = fb.block_state(*_lists(bm), 64)
    nonempty, _ = fb.tile_state(state, bm.BLOCK_SIZE, tl, 8192, False)
    fetched, dense = fb.fetched(nonempty)
    assert (tl.bq, tl.bk, dense) == (128, 128, 4096)
    assert fetched / dense == pytest.approx(fraction)


def _rand(key, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32).astype(dtype)


@pytest.mark.thorough   # ~25 s of interpret mode; CI runs the same reads via tests/ops
def test_gqa_odd_lengths_with_captured_reads_and_their_gradients():
    """The JAX API (custom_vjp): 4 q heads over 2 kv heads, sq 90 / skv 200 (tiles pad), a
    document mask read by q and kv, a per-head scale (gradient summed per row) and a bias
    read per (h, q, kv) (gradient per tile), against the dense reference's vjp."""
    b, hq, hkv, sq, skv, d = 1, 4, 2, 90, 200, 64
    q, k, v, g = (_rand(i, s) for i, s in enumerate([(b, hq, sq, d), (b, hkv, skv, d),
                                                      (b, hkv, skv, d), (b, hq, sq, d)]))
    doc = (jnp.arange(skv) >= 70).astype(jnp.int32) + (jnp.arange(skv) >= 150)
    scale_h = 1.0 + 0.1 * jnp.arange(hq, dtype=jnp.float32)
    bias = 0.3 * _rand(9, (hq, sq, skv))

    def score(s, b_, h, qi, ki, w, bias_):
        return s * w + bias_

    def mask(b_, h, qi, ki, dq_, dk_):
        return (dq_ == dk_) & (qi + 40 >= ki)
    mods = fk.Mods(score=score, mask=mask,
                   score_reads=(fk.Read(False, True, False, False), fk.Read(False, True, True, True)),
                   mask_reads=(fk.Read(False, False, True, False), fk.Read(False, False, False, True)),
                   grads=(True, True))
    mreads = (doc[:sq].reshape(1, 1, sq, 1), doc.reshape(1, 1, 1, skv))
    keep = (doc[:sq, None] == doc[None, :]) & (jnp.arange(sq)[:, None] + 40 >= jnp.arange(skv))
    state = jnp.where(keep.reshape(1, 1, 1, sq, 1, skv).any((3, 5)), fb.PARTIAL, fb.EMPTY)
    tl = fb.Tiling(32, 128, 3, 2, 1, 1)
    nonempty, full = fb.tile_state(state.reshape(1, 1, 1, 1), (1 << 30, 1 << 30), tl, skv, False)
    tables = fb.tables(nonempty, full)

    def kernel(q, k, v, w, bias_):
        return fk.flex_attention(q, k, v, tables, mods, (w.reshape(1, hq, 1, 1), bias_[None]),
                                 mreads, tiling=tl, interpret=True)

    def dense(q, k, v, w, bias_):
        return ref.attention(q, k, v, score_mod=lambda s, b_, h, qi, ki: s * w[h] + bias_[h, qi, ki],
                             mask_mod=lambda b_, h, qi, ki: (doc[qi] == doc[ki]) & (qi + 40 >= ki))[0]
    args = (q, k, v, scale_h, bias)
    out, vjp = jax.vjp(kernel, *args)
    want, vjp_ref = jax.vjp(dense, *args)
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=2e-5)
    for name, a, e in zip(("dq", "dk", "dv", "dscale", "dbias"), vjp(g), vjp_ref(g)):
        np.testing.assert_allclose(a, e, atol=2e-4, rtol=2e-4, err_msg=name)


def test_supports_says_why():
    tl = fb.Tiling(128, 128, 64, 64, 1, 1)
    shape = (2, 8, 8192, 128)
    assert fk.supports(shape, (2, 2, 8192, 128), (2, 2, 8192, 128), jnp.bfloat16, tl) is None
    assert "float16" in fk.supports(shape, shape, shape, jnp.float16, tl)
    assert "batch" in fk.supports(shape, (1, 8, 8192, 128), (1, 8, 8192, 128), jnp.float32, tl)
    per_head = fb.Tiling(128, 128, 64, 64, 2, 8)      # a block mask per (batch, head)
    assert "SMEM" in fk.supports(shape, shape, shape, jnp.float32, per_head)
    kv_only = fk.Mods(score=lambda s, *a: s, score_reads=(fk.Read(False, False, False, True),),
                      grads=(True,))
    assert "kv_idx but not q_idx" in fk.mods_reason(kv_only)
