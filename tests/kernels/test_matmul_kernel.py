"""Pallas matmul (mm / addmm / bmm): interpret-mode parity with the jnp reference,
TPU lowering, and the VMEM estimate per checked TPU generation."""
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels.pallas import matmul as mm
from tpu_kernels.pallas import tpu_info, tuned
from helpers import tpu_compile
from tpu_kernels.pallas.reference import matmul as ref
from tpu_kernels.testing import tol

DTYPES = [jnp.float32, jnp.bfloat16]


def _rand(key, shape, dtype):
    # bf16 cases: round first so kernel and reference see identical inputs.
    return jax.random.normal(jax.random.key(key), shape, jnp.float32).astype(dtype)


def _close(x, y, dtype):
    np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                               **tol(dtype, kernel=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n,block", [
    (33, 70, 129, None),              # odd: padded on every axis
    (128, 256, 128, None),            # aligned, one block
    (40, 300, 260, (16, 128, 128)),   # multi-step grid (3 x 3 x 3), ragged k masked
    (520, 260, 136, None),            # full-extent blocks on ragged m and k
])
def test_mm_parity(dtype, m, k, n, block):
    a, b = _rand(0, (m, k), dtype), _rand(1, (k, n), dtype)
    out = mm.matmul(a, b, block=block)
    assert out.shape == (m, n) and out.dtype == dtype
    _close(out, ref.matmul(a, b), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias_shape", [(129,), (1, 129), (33, 1), (33, 129), ()])
def test_addmm_bias_broadcast(dtype, bias_shape):
    a, b, c = _rand(0, (33, 70), dtype), _rand(1, (70, 129), dtype), _rand(2, bias_shape, dtype)
    out = mm.matmul(a, b, c, beta=0.5, alpha=2.0)
    _close(out, ref.matmul(a, b, c, beta=0.5, alpha=2.0), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bmm_parity(dtype):
    a, b = _rand(0, (3, 20, 70), dtype), _rand(1, (3, 70, 130), dtype)
    _close(mm.bmm(a, b), ref.matmul(a, b), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_addmm_grad(dtype):
    a, b, c = _rand(0, (33, 70), dtype), _rand(1, (70, 129), dtype), _rand(2, (129,), dtype)
    g = _rand(3, (33, 129), dtype)
    f_k = lambda a, b, c: mm.matmul(a, b, c, alpha=1.5, beta=0.5)
    f_r = lambda a, b, c: ref.matmul(a, b, c, alpha=1.5, beta=0.5)
    out_k, vjp_k = jax.vjp(f_k, a, b, c)
    out_r, vjp_r = jax.vjp(f_r, a, b, c)
    _close(out_k, out_r, dtype)
    for gk, gr in zip(vjp_k(g), vjp_r(g)):
        assert gk.shape == gr.shape and gk.dtype == gr.dtype
        _close(gk, gr, dtype)


def test_bmm_grad():
    a, b = _rand(0, (2, 20, 70), jnp.float32), _rand(1, (2, 70, 130), jnp.float32)
    gk = jax.grad(lambda a, b: (mm.bmm(a, b) ** 2).sum(), argnums=(0, 1))(a, b)
    gr = jax.grad(lambda a, b: (ref.matmul(a, b) ** 2).sum(), argnums=(0, 1))(a, b)
    for x, y in zip(gk, gr):
        _close(x, y, jnp.float32)


@pytest.mark.parametrize("ta,tb", [(False, True), (True, False), (True, True)])
def test_transposed_layouts_forward_and_grad(ta, tb):
    """a read as [k, m] (TN) / b as [n, k] (NT); ragged k masked; grads in the stored layouts."""
    m, k, n, dtype = 40, 300, 136, jnp.float32
    a = _rand(0, (k, m) if ta else (m, k), dtype)
    b = _rand(1, (n, k) if tb else (k, n), dtype)
    g = _rand(2, (m, n), dtype)
    f_k = lambda a, b: mm.matmul(a, b, transpose_a=ta, transpose_b=tb, alpha=0.5,  # noqa: E731
                                 block=(128, 128, 128))
    f_r = lambda a, b: ref.matmul(a.T if ta else a, b.T if tb else b, alpha=0.5)   # noqa: E731
    out_k, vjp_k = jax.vjp(f_k, a, b)
    out_r, vjp_r = jax.vjp(f_r, a, b)
    _close(out_k, out_r, dtype)
    for x, y in zip(vjp_k(g), vjp_r(g)):
        assert x.shape == y.shape
        _close(x, y, dtype)


def test_backward_moves_no_transpose_through_hbm():
    """dA = g B^T and dB = A^T g read b and a where they lie: no transpose, pad or slice
    equation around the kernels (the real compile checks the HLO: test_compiles_for_tpu)."""
    a, b = jax.ShapeDtypeStruct((520, 1100), jnp.bfloat16), jax.ShapeDtypeStruct((1100, 200), jnp.bfloat16)
    grad = jax.grad(lambda a, b: mm.matmul(a, b, interpret=True).astype(jnp.float32).sum(), (0, 1))
    names = {e.primitive.name for e in jax.make_jaxpr(grad)(a, b).jaxpr.eqns}
    assert not names & {"transpose", "pad", "slice"}, names


def test_f32_precision_argument_reaches_the_dot():
    a, b = _rand(0, (16, 128), jnp.float32), _rand(1, (128, 128), jnp.float32)
    for p in (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGH, jax.lax.Precision.DEFAULT):
        # Interpret mode lowers the kernel body to HLO, where the dot's precision shows.
        text = jax.jit(partial(mm.matmul, precision=p, interpret=True)).lower(a, b).as_text()
        assert f"precision = [{p.name}, {p.name}]" in text
        _close(mm.matmul(a, b, precision=p), ref.matmul(a, b), jnp.float32)


def test_supports_reasons():
    assert mm.supports((4, 8), "float32", (8, 16), "float32") is None
    assert mm.supports((2, 4, 8), jnp.bfloat16, (2, 8, 16), jnp.bfloat16) is None
    assert mm.supports((4, 8), "float32", (8, 16), "float32", (16,), "float32") is None
    assert "int64" in mm.supports((4, 8), "int64", (8, 16), "int64")
    assert "float16" in mm.supports((4, 8), jnp.float16, (8, 16), jnp.float16)
    assert "mixed" in mm.supports((4, 8), "float32", (8, 16), "bfloat16")
    assert mm.supports((4, 8), "float32", (9, 16), "float32") == "shape mismatch"
    assert "broadcast" in mm.supports((4, 8), "float32", (8, 16), "float32", (3, 16), "float32")
    assert "2-D" in mm.supports((4, 8), "float32", (2, 8, 16), "float32")
    with pytest.raises(ValueError):
        mm.matmul(jnp.ones((4, 8), jnp.int32), jnp.ones((8, 4), jnp.int32))


@pytest.mark.parametrize("dtype", [jnp.float32])   # bf16: test_real_compile
def test_compiles_for_tpu(dtype):
    S = jax.ShapeDtypeStruct
    a, b = S((300, 700), dtype), S((700, 1000), dtype)     # padded on every axis

    def program(a, b, bias, x, y):
        loss = lambda a, b, c: mm.matmul(a, b, c).astype(jnp.float32).sum()  # noqa: E731
        return mm.bmm(x, y), mm.matmul(a, b, bias[0]), jax.grad(loss, argnums=(0, 1, 2))(a, b, bias)

    tpu_compile(program, a, b, S((300, 1), dtype), S((4, 64, 512), dtype), S((4, 512, 256), dtype),
                kernels=4)   # bmm, matmul, dA, dB (grad of a sum: no forward)


def test_backward_compiles_without_operand_transposes():
    """The real compile of a ragged matmul's backward holds its two kernels and no
    transpose or layout copy of an operand (nor a pad or slice of one)."""
    from tpu_kernels import aot
    if aot.unavailable_reason():
        pytest.skip(aot.unavailable_reason())
    S = jax.ShapeDtypeStruct
    grad = jax.grad(lambda a, b: mm.matmul(a, b).astype(jnp.float32).sum(), (0, 1))
    compiled = aot.compile(grad, S((520, 1100), jnp.bfloat16), S((1100, 640), jnp.bfloat16), chip="v6e")
    assert len(compiled.summary.kernels) == 2
    big = re.compile(r"= bf16\[(?:520,1100|1100,520|1100,640|640,1100)\]\S* (transpose|copy|pad|slice|fusion)\(")
    assert not big.findall(compiled.as_text()), compiled.as_text()


SHAPES = [(1, 4096, 4096), (8, 4096, 14336), (2048, 4096, 4096), (8192, 8192, 8192),
          (4096, 1024, 8192), (33, 129, 70)]


@pytest.mark.parametrize("gen", tpu_info.CHECKED_GENERATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_blocks_fit_vmem(gen, dtype):
    chip = tpu_info.CHIPS[gen]
    for m, n, k in SHAPES:
        bm, bn, bk = blocks = mm.choose_blocks(m, n, k, dtype, chip)
        hit = tuned.lookup_blocks("matmul", chip, dtype, m=m, n=n, k=k)     # tuned: checked by compiling
        assert mm.vmem_bytes(blocks, dtype) <= tuned.vmem_budget(chip, hit), (gen, m, n, k)
        assert bm % tpu_info.sublane(dtype) == 0 or bm == m
        assert (bn % 128 == 0 or bn == n) and (bk % 128 == 0 or bk == k)
        if chip.mxu == 256 and min(m, n, k) >= 1024:   # compute-bound: whole MXU passes
            assert bn % 256 == 0 and bk % 256 == 0


def test_blocks_shrink_to_a_small_budget():
    tiny = tpu_info.Chip("tiny", 2 * tpu_info.MiB, 2 * tpu_info.MiB, 256, 1.0, 1.0, 1)
    blocks = mm.choose_blocks(4096, 4096, 4096, jnp.float32, tiny)
    assert mm.vmem_bytes(blocks, jnp.float32) <= tpu_info.vmem_budget(tiny)
    assert blocks != mm.choose_blocks(4096, 4096, 4096, jnp.float32, tpu_info.CHIPS["v6e"])


@pytest.mark.parametrize("gen", tpu_info.CHECKED_GENERATIONS)
def test_ragged_shapes_get_blocks_that_waste_little(gen):
    """m=520 and k=1100 used to pad to 1024 and 2048 on v6e (~97% and ~86% of a block
    dim); now a full-extent or evenly split block covers them: the grid does at most 10%
    more work than the MXU needs anyway (n and k in whole MXU widths)."""
    chip = tpu_info.CHIPS[gen]
    sub = tpu_info.sublane(jnp.bfloat16)
    for m, n, k in [(520, 4096, 4096), (4096, 4096, 1100), (1100, 1408, 520)]:
        blocks = mm.choose_blocks(m, n, k, jnp.bfloat16, chip)
        padded = [-(-d // b) * b for d, b in zip((m, n, k), blocks)]
        need = [tpu_info.round_up(m, sub), tpu_info.round_up(n, chip.mxu), tpu_info.round_up(k, chip.mxu)]
        for d, p, q in zip((m, n, k), padded, need):
            assert p <= 1.1 * max(q, d), (gen, (m, n, k), blocks)


def test_vmem_estimate_by_hand():
    # 2 x (a + b) bf16 blocks + 2 x bf16 out block + f32 accumulator.
    assert mm.vmem_bytes((512, 1024, 1024), jnp.bfloat16) == \
        2 * (512 * 1024 + 1024 * 1024) * 2 + 2 * 512 * 1024 * 2 + 512 * 1024 * 4


@pytest.mark.thorough
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 129, 257), (300, 513, 200), (512, 1024, 768)])
def test_mm_parity_sweep(dtype, m, k, n):
    a, b = _rand(0, (m, k), dtype), _rand(1, (k, n), dtype)
    _close(mm.matmul(a, b), ref.matmul(a, b), dtype)
