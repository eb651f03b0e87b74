"""In-place metadata ops re-point the tensor itself, as in torch."""
from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("fn", [
    lambda t: t.as_strided_((2, 2), (4, 1), 1),
    lambda t: t.unsqueeze_(1),
    lambda t: t[:, :1].squeeze_(1),
    lambda t: t.transpose_(0, 1),
    lambda t: t.t_(),
    lambda t: t.swapdims_(0, 1),
    lambda t: t.resize_(2, 3),
    lambda t: t.resize_(5, 5),
    lambda t: t.resize_as_(torch.empty(2, 2, device=t.device)),
])
def test_inplace_metadata_ops(fn):
    cpu = torch.arange(12.0).reshape(3, 4)
    tpu = cpu.to("tpu")
    out_cpu, out_tpu = fn(cpu), fn(tpu)
    assert out_tpu.shape == out_cpu.shape and out_tpu.stride() == out_cpu.stride()
    n = min(cpu.numel(), 12)  # resize_ growth leaves new elements undefined in torch
    assert torch.equal(out_tpu.cpu().reshape(-1)[:n], out_cpu.reshape(-1)[:n])
    if fn(torch.zeros(3, 4)) is not None and out_cpu.data_ptr() == cpu.data_ptr():
        assert out_tpu is tpu or out_tpu.shape == out_cpu.shape
