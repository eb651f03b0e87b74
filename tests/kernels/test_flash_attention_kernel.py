"""Pallas flash attention: interpret-mode parity (forward + dq/dk/dv) with the jnp
reference, TPU lowering of forward and backward, and the VMEM estimate per generation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels.pallas import flash_attention as fa
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
