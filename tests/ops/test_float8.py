"""float8 tensors on tpu against CPU torch: moves, casts (torch's saturating cast to
float8_e4m3fn) and ``torch._scaled_mm``, the float8 matmul of FP8 training and checkpoints."""
from __future__ import annotations

import pytest
import torch

import tpu_kernels  # noqa: F401

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
# overflow, infinities, the largest finite values and their neighbours, subnormals, signed zero
EDGES = torch.tensor([1e5, -1e5, float("inf"), -float("inf"), 1000.0, 464.0, 449.0, 448.0, 240.0, 250.0,
                      57344.0, 61440.0, 1e-10, 2.0 ** -9, 2.0 ** -10, -0.0, 0.3, -1.7])


def _same_values(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.device.type == "cpu"
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", FLOAT8 + [torch.float8_e8m0fnu])
def test_float8_tensors_move_bit_exact(dtype):
    x = torch.tensor([0.5, 1.0, 2.0, 96.0, 0.125]).to(dtype)
    back = x.to("tpu").cpu()
    assert back.dtype == dtype and torch.equal(back.view(torch.uint8), x.view(torch.uint8))


@pytest.mark.parametrize("dtype", FLOAT8)
@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.float64])
def test_casts_to_float8_round_as_torch(dtype, source):
    """float8_e4m3fn saturates at +-448 (infinity too) in torch; XLA's cast gave NaN."""
    x = EDGES.to(source)
    _same_values(x.to("tpu").to(dtype).cpu(), x.to(dtype))


@pytest.mark.parametrize("dtype", FLOAT8)
def test_casts_from_float8_and_copies(dtype):
    x = EDGES[-6:].to(dtype)
    for target in (torch.float32, torch.bfloat16, torch.float16):
        _same_values(x.to("tpu").to(target).cpu(), x.to(target))
    dst = torch.empty(6, dtype=dtype, device="tpu")
    dst.copy_(EDGES[:6].to("tpu"))            # copy_ casts as .to() does
    _same_values(dst.cpu(), EDGES[:6].to(dtype))


_GEN = torch.Generator().manual_seed(0)   # the rowwise scales: the same in every test order
SCALED_MM = {
    "tensorwise bf16": dict(scale_a=torch.tensor(0.5), scale_b=torch.tensor(2.0), out_dtype=torch.bfloat16),
    "tensorwise f32": dict(scale_a=torch.tensor(0.5), scale_b=torch.tensor(2.0), out_dtype=torch.float32),
    "rowwise": dict(scale_a=torch.rand(16, 1, generator=_GEN) + 0.5, scale_b=torch.rand(1, 32, generator=_GEN) + 0.5,
                    out_dtype=torch.bfloat16),
    "bias": dict(scale_a=torch.tensor(0.5), scale_b=torch.tensor(2.0), bias=torch.randn(32).bfloat16(),
                 out_dtype=torch.bfloat16),
    "float8 result": dict(scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0), scale_result=torch.tensor(4.0),
                          out_dtype=torch.float8_e4m3fn),
}


@pytest.mark.parametrize("case", SCALED_MM)
def test_scaled_mm_matches_cpu(case):
    torch.manual_seed(0)
    a = torch.randn(16, 48).to(torch.float8_e4m3fn)
    b = torch.randn(32, 48).to(torch.float8_e4m3fn).t()          # column-major, as torch requires
    kw = SCALED_MM[case]
    want = torch._scaled_mm(a, b, **kw)
    got = torch._scaled_mm(a.to("tpu"), b.to("tpu"),
                           **{k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
    assert got.dtype == want.dtype and got.shape == want.shape
    # powers-of-two scales are exact; rowwise ones round each f32 product, and XLA sums the
    # 48 products in another order than torch's CPU kernel: the f32 result can differ in its
    # last bits and round to the neighbouring bf16 (seen: 1 of 512 elements, 1 ulp)
    rtol = 2 ** -7 if case == "rowwise" else 0
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=rtol, atol=0)
