"""In-place metadata ops re-point the tensor itself, as in torch; views stored as linked copies
(complex <-> real) write through both ways."""
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


def test_complex_real_views_write_through_both_ways():
    """view_as_real / view_as_complex / .real / .imag are copies in storages of their own
    (the item size differs), linked to their base's view: writes through either side show
    in the other, as torch's aliasing (they were silently lost before)."""
    def run(dev):
        out = []
        z = torch.tensor([1 + 2j, 3 + 4j], device=dev)
        z.real.zero_()
        z.imag.fill_(5)
        z.real[1] = 7
        out.append(z.clone())
        r = torch.view_as_real(z)
        z.mul_(2)                       # the earlier real view follows
        out.append(r.clone())
        r[0, 1] = -1.0                  # and writes back
        out.append(z.clone())
        x = torch.arange(4.0, device=dev)
        torch.view_as_complex(x.view(2, 2)).mul_(1j)
        out.append(x.clone())
        big = torch.zeros(3, 2, dtype=torch.complex64, device=dev)
        big[1:].real.add_(3)            # a view of a view, offset into the storage
        out.append(big.clone())
        return out
    for got, want in zip(run("tpu"), run("cpu")):
        assert torch.equal(got.cpu(), want), (got, want)
