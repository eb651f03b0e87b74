"""Pallas flash attention: interpret-mode parity (forward + dq/dk/dv) with the jnp
reference and with CPU torch SDPA (head_dim 64 unpadded, causal block skipping, segment
ids, sliding window, ragged lengths), the block tables and block choice, TPU lowering of
forward and backward, and the VMEM estimate per generation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels.pallas import flash_attention as fa
from tpu_kernels.pallas import flash_blocks as fb
from tpu_kernels.pallas import tpu_info, tuned
from helpers import tpu_compile
from tpu_kernels.pallas.reference import flash_attention as ref
from tpu_kernels.testing import tol



def _rand(key, shape, dtype):
    # bf16 cases: round first so kernel and reference see identical inputs.
    return jax.random.normal(jax.random.key(key), shape, jnp.float32).astype(dtype)


def _qkvg(b, hq, hkv, sq, skv, d, dtype):
    return (_rand(0, (b, hq, sq, d), dtype), _rand(1, (b, hkv, skv, d), dtype),
            _rand(2, (b, hkv, skv, d), dtype), _rand(3, (b, hq, sq, d), dtype))


def _check_fwd_bwd(shape, dtype, mask=None, causal=False, block=None, scale=None):
    q, k, v, g = _qkvg(*shape, dtype)
    out_k, vjp_k = jax.vjp(lambda q, k, v: fa.flash_attention(
        q, k, v, mask, causal=causal, scale=scale, block=block), q, k, v)
    out_r, vjp_r = jax.vjp(lambda q, k, v: ref.attention(
        q, k, v, mask, causal=causal, scale=scale), q, k, v)
    for name, x, y in zip(("out", "dq", "dk", "dv"), (out_k, *vjp_k(g)), (out_r, *vjp_r(g))):
        assert x.shape == y.shape and x.dtype == y.dtype, name
        np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                                   err_msg=name, **tol(dtype, kernel=True))


@pytest.mark.parametrize("causal", [False, True])
def test_odd_lengths_pad_and_mask_tail(causal):
    _check_fwd_bwd((1, 2, 1, 33, 77, 64), jnp.float32, causal=causal)


def test_causal_more_queries_than_keys_top_left():
    # torch is_causal: tril(ones(sq, skv)), top-left aligned; head_dim 96 padded to 128.
    _check_fwd_bwd((1, 2, 1, 77, 33, 96), jnp.float32, causal=True, scale=0.3)


def test_gqa_causal_multi_block():
    # 4 q heads over 2 kv heads, 2 x 3 blocks: block skipping and the dkv group walk.
    _check_fwd_bwd((1, 4, 2, 200, 300, 64), jnp.float32, causal=True, block=(128, 128))


def test_bool_mask_with_fully_masked_row():
    # Per-head mask, broadcast over batch, with GQA (2 q heads share 1 kv head).
    keep = jax.random.bernoulli(jax.random.key(5), 0.7, (1, 2, 33, 77))
    keep = keep.at[0, 1, 3, :].set(False)          # that row's output and grads are 0
    _check_fwd_bwd((2, 2, 1, 33, 77, 64), jnp.float32, mask=keep)


def test_additive_mask_broadcast_2d_with_neg_inf():
    keep = jax.random.bernoulli(jax.random.key(6), 0.7, (33, 77))
    add = jnp.where(keep, _rand(7, (33, 77), jnp.float32), -jnp.inf)
    _check_fwd_bwd((1, 2, 2, 33, 77, 80), jnp.float32, mask=add, causal=True)


@pytest.mark.parametrize("d,causal", [(128, True), (64, False)])
def test_bf16(d, causal):
    _check_fwd_bwd((1, 2, 1, 40, 130, d), jnp.bfloat16, causal=causal)


def test_fwd_returns_logsumexp():
    q, k, v, _ = _qkvg(1, 2, 1, 33, 77, 64, jnp.float32)
    out, lse = fa.flash_attention_fwd(q, k, v, causal=True)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, jnp.repeat(k, 2, 1),
                   precision=jax.lax.Precision.HIGHEST) / 8.0
    s = jnp.where(jnp.tril(jnp.ones((33, 77), bool)), s, -jnp.inf)
    np.testing.assert_allclose(lse, jax.nn.logsumexp(s, axis=-1), **tol(jnp.float32, kernel=True))
    np.testing.assert_allclose(out, ref.attention(q, k, v, causal=True), **tol(jnp.float32, kernel=True))


def _check_vs_torch(shape, q_ids=None, kv_ids=None, causal=False, window=None, block=None):
    """Kernel forward and q/k/v gradients against CPU torch SDPA in f32 with the same
    structure as an explicit bool mask (rows with no kept key: torch gives NaN, the
    kernel 0; the cases here keep every row non-empty)."""
    import torch
    import torch.nn.functional as F
    b, hq, hkv, sq, skv, d = shape
    q, k, v, g = _qkvg(*shape, jnp.float32)
    keep = np.ones((b, 1, sq, skv), bool)
    if causal:
        keep &= np.tril(np.ones((sq, skv), bool))
    if window is not None:
        keep &= ~np.tril(np.ones((sq, skv), bool), -window)
    if q_ids is not None:
        keep &= np.asarray(q_ids)[:, None, :, None] == np.asarray(kv_ids)[:, None, None, :]
    out, vjp = jax.vjp(lambda q, k, v: fa.flash_attention(
        q, k, v, causal=causal, window=window, block=block, q_segment_ids=q_ids,
        kv_segment_ids=kv_ids), q, k, v)
    tq, tk, tv = (torch.tensor(np.asarray(x), requires_grad=True) for x in (q, k, v))
    ref = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(keep),
                                         enable_gqa=hq != hkv)
    ref.backward(torch.tensor(np.asarray(g)))
    for name, x, y in zip(("out", "dq", "dk", "dv"), (out, *vjp(g)),
                          (ref, tq.grad, tk.grad, tv.grad)):
        np.testing.assert_allclose(np.asarray(x), y.detach().numpy(), err_msg=name,
                                   **tol(jnp.float32, kernel=True))


def test_head_dim_64_unpadded_and_causal_skipping_vs_torch():
    # 3 x 3 blocks of 128 over 300 (ragged): causal skips the 3 blocks above the diagonal
    _check_vs_torch((1, 2, 1, 300, 300, 64), causal=True, block=(128, 128))


def test_segment_ids_packed_ragged_vs_torch():
    # two batches of packed sequences; segments cross block boundaries, the kv tail is
    # padding, and (batch 1) whole blocks pair segments that never meet: they are skipped
    ids0 = np.repeat([0, 1, 2], [100, 150, 50])
    ids1 = np.repeat([5, 6], [140, 160])
    ids = jnp.asarray(np.stack([ids0, ids1]), jnp.int32)
    _check_vs_torch((2, 1, 1, 300, 300, 64), ids, ids, causal=True, block=(128, 128))


def test_sliding_window_vs_torch():
    _check_vs_torch((1, 2, 1, 300, 300, 64), causal=True, window=100, block=(128, 128))


def test_block_tables_skip_structurally_masked_blocks():
    lay = fb.Layout(sq=300, skv=300, bq=128, bk=128)
    t = fb.tables(lay, causal=True, window=None)
    assert (t.row_lo.tolist(), t.row_hi.tolist()) == ([0, 0, 0], [0, 1, 2])
    assert (t.col_lo.tolist(), t.col_hi.tolist()) == ([0, 1, 2], [2, 2, 2])
    assert t.fraction == 6 / 9 and not t.batched
    t = fb.tables(lay, causal=True, window=100)        # rows 128..255 reach back to col 29
    assert (t.row_lo.tolist(), t.row_hi.tolist()) == ([0, 0, 1], [0, 1, 2])
    ids = jnp.asarray(np.repeat([[0, 1]], [128, 172], axis=1).reshape(1, 300), jnp.int32)
    t = fb.tables(lay, causal=False, window=None, q_ids=ids, kv_ids=ids)
    assert t.batched and (t.row_lo.tolist(), t.row_hi.tolist()) == ([0, 1, 1], [0, 2, 2])
    # a q block whose ids no kv block holds: empty range (hi = lo - 1)
    t = fb.tables(lay, False, None, jnp.zeros((1, 300), jnp.int32), jnp.ones((1, 300), jnp.int32))
    assert t.row_hi.tolist() == [-1, -1, -1]


def _kernel_eqns(jaxpr):
    for e in jaxpr.eqns:
        if "cost_estimate" in e.params:
            yield e
            continue
        for p in e.params.values():
            sub = getattr(p, "jaxpr", p)
            if hasattr(sub, "eqns"):
                yield from _kernel_eqns(sub)


def test_head_dim_is_not_padded():
    # blocks span the full head dim: the kernels read q, k, v at d = 64, and the cost
    # estimate counts half the flops of d = 128
    def kernel_eqns(d):
        spec = jax.ShapeDtypeStruct((1, 2, 256, d), jnp.float32)
        jaxpr = jax.make_jaxpr(lambda q: fa.flash_attention(q, q, q, block=(128, 128)))(spec)
        return list(_kernel_eqns(jaxpr.jaxpr))
    (e64,), (e128,) = kernel_eqns(64), kernel_eqns(128)
    assert [v.aval.shape[-1] for v in e64.invars[2:]] == [64, 64, 64]
    assert e64.params["cost_estimate"].flops * 2 == e128.params["cost_estimate"].flops


@pytest.mark.parametrize("gen", tpu_info.CHECKED_GENERATIONS)
@pytest.mark.parametrize("n,padded", [(520, 640), (2048, 2048), (1100, 1152), (77, 128)])
def test_sequence_blocks_pad_little(gen, n, padded):
    # seq 520 pads to 640 (the old fixed 512-blocks padded it to 1024), and the choice
    # models no slower than the old table's (bq, bk) = (256|512, 512)
    chip = tpu_info.CHIPS[gen]
    for causal in (False, True):
        blocks = fb.choose_blocks(n, n, 64, jnp.bfloat16, chip, causal=causal)
        assert [tpu_info.round_up(n, b) for b in blocks] == [padded, padded]
        old = tuple(min(b, tpu_info.round_up(n, 128)) for b in ((256 if chip.mxu == 128 else 512), 512))
        model = functools.partial(fb.modelled_seconds, sq=n, skv=n, head_dim=64,
                                  dtype=jnp.bfloat16, chip=chip, causal=causal)
        assert model(blocks) <= model(old)


def test_supports_reasons():
    q, kv = (1, 4, 16, 64), (1, 2, 32, 64)
    assert fa.supports(q, "float32", kv, "float32", kv, "float32") is None
    assert fa.supports(q, jnp.bfloat16, kv, jnp.bfloat16, kv, jnp.bfloat16, (16, 32), bool,
                       causal=True) is None
    assert "dropout" in fa.supports(q, "float32", kv, "float32", kv, "float32", dropout_p=0.1)
    assert "float16" in fa.supports(q, "float16", kv, "float16", kv, "float16")
    assert "int64" in fa.supports(q, "int64", kv, "int64", kv, "int64")
    assert "multiple" in fa.supports((1, 3, 16, 64), "float32", kv, "float32", kv, "float32")
    assert "broadcastable" in fa.supports(q, "float32", kv, "float32", kv, "float32",
                                          (16, 31), bool)
    assert "value head_dim" in fa.supports(q, "float32", kv, "float32", (1, 2, 32, 32),
                                           "float32")
    assert "head_dim" in fa.supports((1, 2, 8, 1024), "float32", (1, 2, 8, 1024), "float32",
                                     (1, 2, 8, 1024), "float32")
    assert "segment ids" in fa.supports(q, "float32", kv, "float32", kv, "float32",
                                        segment_ids_shapes=((1, 16), (1, 31)))
    assert "window" in fa.supports(q, "float32", kv, "float32", kv, "float32", window=8)
    with pytest.raises(ValueError, match="both"):
        fa.flash_attention(jnp.ones(q), jnp.ones(kv), jnp.ones(kv),
                           q_segment_ids=jnp.zeros((1, 16), jnp.int32))
    with pytest.raises(ValueError, match="dropout"):
        fa.flash_attention(jnp.ones(q), jnp.ones(kv), jnp.ones(kv), dropout_p=0.5)


@pytest.mark.parametrize("dtype,shape,causal,mask", [
    (jnp.float32, (1, 8, 2, 512, 1024, 128), True, None),     # GQA, multi-block, causal
    (jnp.float32, (2, 2, 2, 200, 300, 96), False, "bool"),    # padded d and seqs, bool mask
    (jnp.bfloat16, (2, 2, 2, 200, 300, 96), False, "bool"),
    (jnp.bfloat16, (1, 2, 1, 256, 256, 256), True, "float"),  # large head dim, additive mask
])
def test_compiles_for_tpu(dtype, shape, causal, mask):
    b, hq, hkv, sq, skv, d = shape
    S = jax.ShapeDtypeStruct
    args = (S((b, hq, sq, d), dtype), S((b, hkv, skv, d), dtype), S((b, hkv, skv, d), dtype))
    if mask == "bool":
        args += (S((b, 1, sq, skv), jnp.bool_),)
    elif mask == "float":
        args += (S((sq, skv), dtype),)
    loss = lambda *a: fa.flash_attention(*a, causal=causal).astype(jnp.float32).sum()  # noqa: E731
    tpu_compile(jax.value_and_grad(loss, argnums=(0, 1, 2)), *args, kernels=3)


@pytest.mark.parametrize("chip", tpu_info.CHECKED_GENERATIONS)
def test_packed_sequences_compile_for_tpu(chip):
    # b1 h8 s2048 d64, GQA 8/2, causal + segment ids: forward and backward compile for each
    # chip with the chosen blocks, and the VMEM Mosaic allocates fits the chip
    S = jax.ShapeDtypeStruct
    q, kv, ids = (S((1, 8, 2048, 64), jnp.bfloat16), S((1, 2, 2048, 64), jnp.bfloat16),
                  S((1, 2048), jnp.int32))

    def loss(q, k, v, ids):
        out = fa.flash_attention(q, k, v, causal=True, q_segment_ids=ids, kv_segment_ids=ids)
        return out.astype(jnp.float32).sum()
    summary = tpu_compile(jax.value_and_grad(loss, argnums=(0, 1, 2)), q, kv, kv, ids,
                          chip=chip, kernels=3)
    row = tpu_info.CHIPS[chip]
    assert all(k.vmem_bytes <= row.vmem_bytes * 3 // 4 for k in summary.kernels), summary.format()


@pytest.mark.parametrize("gen", tpu_info.CHECKED_GENERATIONS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_blocks_fit_vmem(gen, dtype):
    chip = tpu_info.CHIPS[gen]
    for sq, skv in [(128, 128), (2048, 2048), (8192, 8192), (1, 4096), (77, 33)]:
        for d in (64, 96, 128, 192, 256):
            for msz in (0, 1, 4):
                bq, bk = fa.choose_blocks(sq, skv, d, dtype, chip, mask_itemsize=msz)
                assert bq % 128 == 0 and bk % 128 == 0
                hit = None if msz else tuned.lookup_blocks("flash_attention", chip, dtype, sq=sq, skv=skv, d=d)
                assert fa.vmem_bytes((bq, bk), d, dtype, msz) <= tuned.vmem_budget(chip, hit)   # tuned: compiled


@pytest.mark.thorough
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_sweep(dtype, d, causal):
    _check_fwd_bwd((2, 4, 1, 300, 260, d), dtype, causal=causal, block=(128, 128))


def test_custom_op_with_segment_ids_runs_the_kernel_both_ways():
    # tpu_kernels::flash_attention is how torch code passes segment ids (SDPA cannot):
    # forward and backward on tpu run the Pallas kernels and match the CPU reference
    import torch

    from tpu_kernels import dispatch, registry
    torch.manual_seed(0)
    q = torch.randn(2, 2, 40, 64, requires_grad=True)
    k, v = (torch.randn(2, 1, 40, 64, requires_grad=True) for _ in range(2))
    ids = torch.tensor([[0] * 15 + [1] * 25, [3] * 40])
    op = torch.ops.tpu_kernels.flash_attention
    ref = op(q, k, v, ids, ids, True)
    ref.backward(torch.ones_like(ref))
    tq, tk, tv = (x.detach().to("tpu").requires_grad_() for x in (q, k, v))
    names = ("tpu_kernels.flash_attention.default", "tpu_kernels.flash_attention_backward.default")
    before = [dispatch.op_counts().get((n, "pallas"), 0) for n in names]
    with registry.interpret():
        out = op(tq, tk, tv, ids.to("tpu"), ids.to("tpu"), True)
        out.backward(torch.ones_like(out))
    assert [dispatch.op_counts().get((n, "pallas"), 0) for n in names] == [b + 1 for b in before]
    for x, y in ((out, ref), (tq.grad, q.grad), (tk.grad, k.grad), (tv.grad, v.grad)):
        torch.testing.assert_close(x.cpu(), y, **tol(torch.float32, kernel=True))
