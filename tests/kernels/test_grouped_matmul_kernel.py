"""Pallas grouped matmul (gmm / tgmm / ragged_dot): interpret-mode parity with the jnp
reference (forward + both gradients), empty and straddling groups, the work list, TPU
lowering, and the VMEM estimate per generation."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tpu_kernels.pallas import grouped_matmul as gm
from tpu_kernels.pallas import tpu_info
from helpers import tpu_compile
from tpu_kernels.pallas.reference import grouped_matmul as ref
from tpu_kernels.testing import tol

SMALL = (128, 128, 128)     # several row tiles on tiny problems


def _rand(key, shape, dtype):
    # bf16 cases: round first so kernel and reference see identical inputs.
    return jax.random.normal(jax.random.key(key), shape, jnp.float32).astype(dtype)


def _close(x, y, dtype, name=""):
    assert x.shape == y.shape and x.dtype == y.dtype, name
    np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                               err_msg=name, **tol(dtype, kernel=True))


def _check(m, k, n, sizes, dtype=jnp.float32, block=None):
    gs = jnp.array(sizes, jnp.int32)
    lhs, rhs = _rand(0, (m, k), dtype), _rand(1, (len(sizes), k, n), dtype)
    g = _rand(2, (m, n), dtype)
    out_k, vjp_k = jax.vjp(lambda a, b: gm.ragged_dot(a, b, gs, block=block), lhs, rhs)
    out_r, vjp_r = jax.vjp(lambda a, b: ref.ragged_dot(a, b, gs), lhs, rhs)
    for name, x, y in zip(("out", "dlhs", "drhs"), (out_k, *vjp_k(g)), (out_r, *vjp_r(g))):
        _close(x, y, dtype, name)
    return out_k, vjp_k(g)


def test_odd_shape_empty_group_and_rows_past_the_groups():
    out, _ = _check(33, 70, 129, [10, 0, 17, 3])          # 30 of 33 rows grouped
    assert not np.asarray(out[30:]).any()


def test_tiles_straddle_groups_and_empty_groups_get_zero_grad():
    # 3 row tiles of 128; groups cross tile edges; groups 0, 2 and 5 are empty.
    _, (_, drhs) = _check(300, 70, 100, [0, 100, 0, 27, 150, 0], block=SMALL)
    assert not np.asarray(drhs[jnp.array([0, 2, 5])]).any()


def test_group_ending_on_a_tile_edge_then_empty_groups():
    _check(256, 70, 100, [128, 0, 0, 72], block=SMALL)


def test_all_groups_empty():
    out, (dlhs, drhs) = _check(40, 128, 128, [0, 0, 0])
    assert not np.asarray(out).any() and not np.asarray(drhs).any()


def test_bf16():
    _check(64, 128, 256, [30, 0, 34], dtype=jnp.bfloat16)


def test_int64_group_sizes_and_jit():
    lhs, rhs = _rand(0, (40, 128), jnp.float32), _rand(1, (2, 128, 128), jnp.float32)
    gs = np.array([25, 15], np.int64)
    out = jax.jit(gm.ragged_dot)(lhs, rhs, jnp.asarray(gs))
    _close(out, ref.gmm(lhs, rhs, jnp.asarray(gs, jnp.int32)), jnp.float32)


def test_tgmm_and_transposed_gmm_directly():
    gs = jnp.array([5, 0, 30], jnp.int32)
    lhs, grad = _rand(0, (40, 70), jnp.float32), _rand(1, (40, 129), jnp.float32)
    _close(gm.tgmm(lhs, grad, gs), ref.tgmm(lhs, grad, gs), jnp.float32)
    w = _rand(2, (3, 70, 129), jnp.float32)
    _close(gm.gmm(grad, w, gs, transpose_rhs=True),
           ref.gmm(grad, jnp.swapaxes(w, 1, 2), gs), jnp.float32)


def test_group_offset_runs_a_shard_of_the_experts():
    """rhs holds experts [2, 5) of 6 (a sharded MoE layer): rows of other experts give 0
    and their gradient 0; the shard's rhs gradient matches the full layer's rows 2..4."""
    sizes = jnp.array([40, 0, 70, 0, 90, 30], jnp.int32)      # uneven, empty, ragged tail
    m, k, n, lo, hi = 240, 70, 129, 2, 5
    lhs, full = _rand(0, (m, k), jnp.float32), _rand(1, (6, k, n), jnp.float32)
    keep = jnp.zeros((6, 1, 1)).at[lo:hi].set(1.0)
    g = _rand(2, (m, n), jnp.float32)
    out_k, vjp_k = jax.vjp(lambda a, b: gm.ragged_dot(a, b, sizes, group_offset=lo, block=SMALL),
                           lhs, full[lo:hi])
    out_r, vjp_r = jax.vjp(lambda a, b: ref.ragged_dot(a, b * keep, sizes), lhs, full)
    dlhs_k, drhs_k = vjp_k(g)
    dlhs_r, drhs_r = vjp_r(g)
    _close(out_k, out_r, jnp.float32, "out")
    _close(dlhs_k, dlhs_r, jnp.float32, "dlhs")
    _close(drhs_k, drhs_r[lo:hi], jnp.float32, "drhs")
    assert not np.asarray(out_k[:40]).any() and not np.asarray(out_k[200:]).any()


@partial(jax.jit, static_argnums=(1, 2, 3))
def _gmm_work_list(sizes, m, tm, offset):
    starts, ends = gm._local_groups(sizes, offset, 3, m)
    return gm._work_list(starts, ends, -(-m // tm), tm, zero_fill=True, last_kk=5)


@given(st.lists(st.integers(0, 300), min_size=6, max_size=6), st.sampled_from([1, 129, 700]),
       st.sampled_from([128, 256]), st.sampled_from([0, 2, 3]))
def test_work_list_covers_every_row_once_in_tile_order(sizes, m, tm, offset):
    meta, num = _gmm_work_list(jnp.array(sizes), m, tm, offset)
    tile, group, start, end, live, ftile, fgroup, pin = map(np.asarray, meta)
    n, ntiles = int(num), -(-m // tm)
    assert n <= len(tile) and np.all(np.diff(tile[:n]) >= 0)
    covered = np.zeros(ntiles * tm, int)
    for w in range(n):
        rows = np.arange(tile[w] * tm, tile[w] * tm + tm)
        covered[rows] += ((rows >= start[w]) & (rows < end[w])) * live[w]
    ends = np.minimum(np.cumsum(sizes), m)
    lo, hi = (ends[offset - 1] if offset else 0), ends[offset + 2]
    assert np.all(covered[lo:hi] == 1) and not covered[:lo].any() and not covered[hi:].any()
    assert set(tile[:n]) == set(range(ntiles))               # every tile visited (zero fill)
    for w in range(n):                                       # idle items fetch nothing new
        if not live[w] and live[:w].any():
            prev = np.flatnonzero(live[:w])[-1]
            assert (ftile[w], fgroup[w], pin[w]) == (tile[prev], group[prev], 5)


def test_supports_reasons():
    assert gm.supports((8, 16), "float32", (2, 16, 32), "float32", (2,), "int32") is None
    assert gm.supports((8, 16), jnp.bfloat16, (2, 16, 32), jnp.bfloat16, (2,), "int64") is None
    assert "int8" in gm.supports((8, 16), "int8", (2, 16, 32), "int8", (2,))
    assert "mixed" in gm.supports((8, 16), "float32", (2, 16, 32), "bfloat16", (2,))
    assert "integer" in gm.supports((8, 16), "float32", (2, 16, 32), "float32", (2,), "float32")
    assert gm.supports((8, 16), "float32", (3, 16, 32), "float32", (2,)) == "shape mismatch"
    assert gm.supports((8, 16), "float32", (2, 16, 32), "float32", (6,)) is None   # a shard
    assert "expects" in gm.supports((8, 16), "float32", (16, 32), "float32", (2,))
    with pytest.raises(ValueError):
        gm.ragged_dot(jnp.ones((8, 16)), jnp.ones((3, 16, 4)), jnp.ones((2,), jnp.int32))


@pytest.mark.parametrize("dtype,m,k,n,g", [(jnp.bfloat16, 512, 1024, 2048, 8),
                                            (jnp.float32, 300, 70, 129, 4)])
def test_compiles_for_tpu(dtype, m, k, n, g):
    S = jax.ShapeDtypeStruct
    loss = lambda a, b, s: gm.ragged_dot(a, b, s).astype(jnp.float32).sum()  # noqa: E731
    tpu_compile(jax.value_and_grad(loss, argnums=(0, 1)), S((m, k), dtype), S((g, k, n), dtype),
                S((g,), jnp.int32), kernels=3)


@pytest.mark.parametrize("gen", tpu_info.CHECKED_GENERATIONS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_blocks_fit_vmem(gen, dtype):
    chip = tpu_info.CHIPS[gen]
    for m, k, n in [(8192, 4096, 14336), (16384, 7168, 2048), (512, 1024, 2048), (33, 70, 129)]:
        tm, tk, tn = gm.choose_blocks(m, k, n, dtype, chip)
        assert tm % 128 == 0 and (tk % 128 == 0 or tk == k) and (tn % 128 == 0 or tn == n)
        assert gm.vmem_bytes((tm, tk, tn), dtype) <= tpu_info.vmem_budget(chip)


@pytest.mark.thorough
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("sizes", [[1] * 9, [0, 511, 0, 1], [200, 200, 112]])
def test_sweep(dtype, sizes):
    _check(512, 200, 300, sizes, dtype=dtype, block=SMALL)
