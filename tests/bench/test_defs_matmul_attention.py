"""Benchmark definitions for matmul, grouped matmul and flash attention: FLOP and byte
formulas against hand counts, and the quick cases' args accepted by the torch op."""
import pytest
import torch

from tpu_kernels.bench.defs import flash_attention as fa_def
from tpu_kernels.bench.defs import grouped_matmul as gmm_def
from tpu_kernels.bench.defs import matmul as mm_def
from tpu_kernels.bench.spec import case


def _bench(module, name):
    return next(b for b in module.BENCHMARKS if b.name == name)


def test_mm_counts():
    b, c = _bench(mm_def, "mm"), case(m=2, k=3, n=4)
    assert b.flops(c) == 2 * 2 * 3 * 4 == 48
    assert b.bytes(c) == 4 * (2 * 3 + 3 * 4 + 2 * 4) == 104
    assert b.bytes(case(m=2, k=3, n=4, dtype=torch.bfloat16)) == 52


def test_bmm_and_addmm_counts():
    c = case(b=5, m=2, k=3, n=4)
    assert _bench(mm_def, "bmm").flops(c) == 5 * 48
    assert _bench(mm_def, "bmm").bytes(c) == 5 * 104
    c = case(m=2, k=3, n=4)
    assert _bench(mm_def, "addmm").flops(c) == 48 + 8            # + bias adds
    assert _bench(mm_def, "addmm").bytes(c) == 104 + 4 * 4        # + bias vector


def test_ragged_dot_counts_and_group_sizes():
    b = _bench(gmm_def, "ragged_dot")
    c = case(m=10, k=3, n=4, g=2)
    assert b.flops(c) == 2 * 10 * 3 * 4
    assert b.bytes(c) == 4 * (10 * 3 + 2 * 3 * 4 + 10 * 4) + 4 * 2
    for cs in b.cases:
        sizes = gmm_def.group_sizes(cs)
        assert sizes.dtype == torch.int32 and int(sizes.sum()) == cs["m"] and (sizes >= 0).all()


def test_attention_counts():
    b = _bench(fa_def, "flash_attention")
    c = case(b=2, hq=4, hkv=2, sq=8, skv=16, d=32, causal=0, mask=0)
    assert b.flops(c) == 2 * 2 * (2 * 4 * 8 * 16 * 32)          # q k^T and p v, 2 flops/MAC
    c_causal = case(b=2, hq=4, hkv=2, sq=8, skv=16, d=32, causal=1, mask=0)
    assert b.flops(c_causal) == b.flops(c) / 2
    q_out = 2 * (2 * 4 * 8 * 32)
    kv = 2 * (2 * 2 * 16 * 32)
    assert b.bytes(c) == 4 * (q_out + kv) + 4 * (2 * 4 * 8)      # + f32 logsumexp
    c_mask = case(b=2, hq=4, hkv=2, sq=8, skv=16, d=32, causal=0, mask=1,
                  dtype=torch.bfloat16)
    assert b.bytes(c_mask) == 2 * (q_out + kv) + 4 * (2 * 4 * 8) + 2 * (2 * 8 * 16)


@pytest.mark.parametrize("module", [mm_def, fa_def])
def test_quick_cases_run_on_torch_cpu(module):
    for b in module.BENCHMARKS:
        quick = [c for c in b.cases if c.quick]
        assert 1 <= len(quick) <= 2, b.name
        for c in quick:
            args, kwargs = b.make_args(c)
            out = b.overload()(*args, **kwargs)
            assert b.flops(c) > 0 and b.bytes(c) > 0
            assert (out[0] if isinstance(out, tuple) else out).dtype == c.dtype


def test_ragged_dot_args_shapes():
    b = _bench(gmm_def, "ragged_dot")
    c = next(c for c in b.cases if c.quick)
    (lhs, rhs, sizes), kwargs = b.make_args(c)
    assert lhs.shape == (c["m"], c["k"]) and rhs.shape == (c["g"], c["k"], c["n"])
    assert sizes.shape == (c["g"],) and kwargs == {}
