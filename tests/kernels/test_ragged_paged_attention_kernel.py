"""Pallas ragged paged attention: interpret-mode parity with the jnp reference (decode,
chunked prefill, GQA, f32/bf16, dead sequences, padding rows), TPU interpret mode with
NaN-filled VMEM and bounds checks, the op through the registry, block choice and cost,
and the real XLA:TPU + Mosaic compile for v5e, v6e and v7x at serving sizes."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels import registry
from tpu_kernels.pallas import ragged_paged_attention as rpa
from tpu_kernels.pallas import tpu_info
from tpu_kernels.pallas.reference import ragged_paged_attention as ref
from tpu_kernels.testing import check_parity

TOL = {jnp.float32: dict(atol=2e-5, rtol=2e-5), jnp.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _case(q_lens, kv_lens, *, hq=4, hkv=2, d=128, ps=8, dtype=jnp.float32, max_seqs=None,
          extra_rows=0, int64=False, seed=0):
    """Operands for sequences with these new-token and context lengths; pages scattered
    over a cache with spare pages; dead sequence slots past len(q_lens) hold garbage."""
    rng = np.random.default_rng(seed)
    s = max_seqs or len(q_lens)
    p = max(-(-k // ps) for k in kv_lens)
    need = [-(-k // ps) for k in kv_lens]
    n = sum(need) + 3
    perm = rng.permutation(n)
    table = rng.integers(0, n, (s, p)).astype(np.int32)     # unused entries: any page
    c = 0
    for i, k in enumerate(need):
        table[i, :k] = perm[c:c + k]
        c += k
    t = sum(q_lens)
    cu = np.full(s + 1, -7, np.int32)                         # garbage past num_seqs
    cu[:len(q_lens) + 1] = np.concatenate([[0], np.cumsum(q_lens)])
    kl = rng.integers(0, 50, s).astype(np.int32)
    kl[:len(kv_lens)] = kv_lens
    idt = np.int64 if int64 else np.int32

    def rand(shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype)
    return (rand((t + extra_rows, hq, d)), rand((n, hkv, ps, d)), rand((n, hkv, ps, d)),
            jnp.asarray(kl.astype(idt)), jnp.asarray(table.astype(idt)),
            jnp.asarray(cu.astype(idt)), jnp.asarray([len(q_lens)], idt))


def _check(args, dtype=jnp.float32, **kw):
    out = rpa.ragged_paged_attention(*args, **kw)
    want = ref.ragged_paged_attention(*args)
    assert out.shape == want.shape and out.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32),
                               **TOL[dtype])
    return out


def test_decode_and_chunked_prefill_gqa_f32():
    # q blocks of 4 tokens straddle sequences; kv blocks of 2 pages end mid-page; a
    # sequence with no new tokens, two dead slots and 3 padding rows give zeros
    q_lens, kv_lens = [1, 5, 1, 20, 0, 3], [33, 5, 64, 40, 7, 100]
    args = _case(q_lens, kv_lens, max_seqs=8, extra_rows=3, int64=True)
    out = _check(args, blocks=rpa.Blocks(4, 2))
    assert not np.asarray(out[sum(q_lens):]).any()


def test_bf16_three_query_heads_per_kv_head_default_blocks():
    args = _case([1, 1, 17, 1], [16, 40, 17, 1], hq=6, hkv=2, ps=16, dtype=jnp.bfloat16)
    _check(args, jnp.bfloat16)


def test_tpu_interpret_mode_nan_vmem_and_bounds_under_jit():
    # Uninitialised VMEM is NaN and out-of-bounds reads raise: pages never fetched (past
    # a context's end) must not leak into the result, metadata reads stay in range.
    args = _case([2, 1], [21, 9], hq=2, hkv=1, max_seqs=3)
    params = pltpu.InterpretParams(uninitialized_memory="nan", out_of_bounds_reads="raise")
    out = jax.jit(lambda *a: rpa.ragged_paged_attention(*a, blocks=rpa.Blocks(4, 2),
                                                        interpret=params))(*args)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref.ragged_paged_attention(*args)),
                               **TOL[jnp.float32])


def test_op_through_the_registry_matches_the_torch_reference():
    args = [torch.from_numpy(np.asarray(a)) for a in _case([1, 6, 1], [9, 30, 17], ps=8)]
    impls = {i.kind for i in registry.impls("tpu_kernels::ragged_paged_attention")}
    assert impls == {"pallas", "xla"}
    assert check_parity("tpu_kernels::ragged_paged_attention", tuple(args),
                        atol=2e-5, rtol=2e-5) == 2     # both impls ran and matched


def test_supports_reasons():
    ok = ((8, 4, 128), "float32", (10, 2, 8, 128), "float32", (10, 2, 8, 128), "float32",
          (3,), (3, 5), (4,))
    assert rpa.supports(*ok) is None
    assert "head_dim" in rpa.supports((8, 4, 64), "float32", (10, 2, 8, 64), "float32",
                                      (10, 2, 8, 64), "float32", (3,), (3, 5), (4,))
    assert "page_size" in rpa.supports((8, 4, 128), "bfloat16", (10, 2, 8, 128), "bfloat16",
                                       (10, 2, 8, 128), "bfloat16", (3,), (3, 5), (4,))
    assert "multiple of kv heads" in rpa.supports((8, 3, 128), *ok[1:])
    assert "int8" in rpa.supports((8, 4, 128), "int8", *ok[2:])
    assert "kv_lens" in rpa.supports(*ok[:6], (3,), (3, 5), (3,))
    with pytest.raises(ValueError, match="head_dim 64"):
        rpa.ragged_paged_attention(*_case([1], [5], d=64))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("hkv,rep", [(8, 1), (8, 3), (8, 4), (4, 7), (1, 8), (16, 4)])
def test_blocks_fill_tiles_and_fit_vmem(dtype, hkv, rep):
    sub = tpu_info.sublane(dtype)
    for t, s, ps, p, d in [(256, 256, 16, 512, 128), (1272, 256, 128, 64, 128),
                           (4096, 16, 64, 128, 256), (5, 2, 16, 4, 128)]:
        b = rpa.choose_blocks(t, s, hkv, rep, ps, p, d, dtype)
        assert (b.q_tokens * rep) % sub == 0 and 1 <= b.pages <= min(p, rpa.MAX_PAGES_PER_BLOCK)
        for gen in tpu_info.CHECKED_GENERATIONS:
            assert rpa.vmem_bytes(b, hkv, rep, ps, d, dtype) <= tpu_info.vmem_budget(
                tpu_info.CHIPS[gen])
    decode = rpa.choose_blocks(256, 256, hkv, rep, 16, 512, 128, dtype)
    assert decode.q_tokens == sub // math.gcd(rep, sub)    # decode: the fewest tokens


def test_cost_counts_fetched_pages_and_computed_rows():
    blocks = rpa.Blocks(q_tokens=2, pages=4)                # kv blocks of 64 tokens, ps 16
    c = rpa.cost([1, 1], [100, 20], 8, 2, 128, "bfloat16", blocks, 16)
    rows = 2 * 4                                            # both sequences in one q block
    # seq 0: 7 pages, 2 kv blocks; seq 1: 2 pages, 1 kv block; per kv head, K and V
    assert c["bytes"] == 2 * 2 * (7 + 2) * 16 * 128 * 2 + 2 * 2 * 8 * 128 * 2
    assert c["flops"] == 2 * (2 + 1) * 4 * rows * 64 * 128


# -- real TPU compile (libtpu compile-only topologies) -------------------------------------
# One serving-sized workload per chip in CI (page sizes 16, 64 and 128, bf16 and f32, 256
# sequences, contexts up to 8192); every workload on every chip in the thorough run.
CHIPS = tpu_info.CHECKED_GENERATIONS          # v5e, v6e, v7x
CI_COMPILES = list(zip(CHIPS, ["decode_ctx8192_ps16_bf16", "mixed_prefill_ps128_f32",
                               "decode_mixed_ps64_bf16"]))


def _compile(chip, workload):
    pytest.importorskip("libtpu", reason="libtpu provides the compile-only TPU topologies")
    from tpu_kernels.bench import paged_attention as bench
    with jax.enable_x64(True):                  # as the runtime runs: the kernel is 32-bit
        row = bench.compile_kernel(chip, bench.WORKLOADS[workload])
    vmem = row["vmem_bytes"]
    assert vmem is not None and 0 < vmem <= tpu_info.CHIPS[chip].scoped_vmem_bytes, row
    assert row["xla_flops"] > 0 and row["xla_seconds"] > 0, row   # the pl.CostEstimate
    assert row["hbm_temp_bytes"] < 2 ** 20, row  # the paged cache is read in place, not copied
    return row


@pytest.mark.parametrize("chip,workload", CI_COMPILES)
def test_compiles_for_tpu(chip, workload):
    _compile(chip, workload)


@pytest.mark.thorough
@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("workload", ["decode_ctx8192_ps16_bf16", "decode_mixed_ps64_bf16",
                                      "mixed_prefill_ps128_f32", "decode_ctx4096_ps32_f32_gqa7"])
def test_compiles_for_tpu_every_workload(chip, workload):
    _compile(chip, workload)


@pytest.mark.thorough
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_random_batches(dtype, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    q_lens = [int(x) for x in rng.integers(0, 12, n)]
    kv_lens = [q + int(x) for q, x in zip(q_lens, rng.integers(1, 90, n))]
    _check(_case(q_lens, kv_lens, ps=16, dtype=dtype, seed=seed, max_seqs=n + 1), dtype,
           blocks=rpa.Blocks(int(rng.choice([8, 16])), int(rng.integers(1, 4))))
