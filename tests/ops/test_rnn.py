"""Parity of the fused RNN cell lowerings (registry/xla/rnn.py) with CPU torch.

CPU torch has no kernel for ``_thnn_fused_lstm_cell``/``_thnn_fused_gru_cell`` (CUDA and
PrivateUse1 only), so the reference is the same user call on CPU, which runs the cell as
plain ATen ops (or oneDNN for ``nn.LSTM``); backward is checked through autograd.
"""
from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import check

aten = torch.ops.aten


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _rand(*shape, dtype=torch.float32, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).requires_grad_(grad)


def _lstm_args(bias: bool, dtype=torch.float32):
    x, h, c = _rand(3, 5, seed=0, dtype=dtype), _rand(3, 4, seed=1, dtype=dtype), _rand(3, 4, seed=2, dtype=dtype)
    w_ih, w_hh = _rand(16, 5, seed=3, dtype=dtype), _rand(16, 4, seed=4, dtype=dtype)
    b = (_rand(16, seed=5, dtype=dtype), _rand(16, seed=6, dtype=dtype)) if bias else (None, None)
    return (x, h, c, w_ih, w_hh) + b


def _gru_args(bias: bool, dtype=torch.float32):
    x, h = _rand(3, 5, seed=0, dtype=dtype), _rand(3, 4, seed=1, dtype=dtype)
    w_ih, w_hh = _rand(12, 5, seed=3, dtype=dtype), _rand(12, 4, seed=4, dtype=dtype)
    b = (_rand(12, seed=5, dtype=dtype), _rand(12, seed=6, dtype=dtype)) if bias else (None, None)
    return (x, h, w_ih, w_hh) + b


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("outputs", ["both", "hy", "cy"])   # "hy"/"cy": the other grad is None
def test_lstm_cell(bias, outputs):
    def cell(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
        hy, cy = torch.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)
        return {"both": (hy, cy), "hy": (hy,), "cy": (cy,)}[outputs]
    args = [a for a in _lstm_args(bias) if a is not None]
    mode = _Ops()
    with mode:
        check(cell, *args, grad=True)
    assert mode.seen["aten._thnn_fused_lstm_cell.default"] == 1
    assert mode.seen["aten._thnn_fused_lstm_cell_backward_impl.default"] == 1


@pytest.mark.parametrize("bias", [True, False])
def test_gru_cell(bias):
    def cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
        return torch.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)
    args = [a for a in _gru_args(bias) if a is not None]
    mode = _Ops()
    with mode:
        check(cell, *args, grad=True)
    assert mode.seen["aten._thnn_fused_gru_cell.default"] == 1
    assert mode.seen["aten._thnn_fused_gru_cell_backward.default"] == 1


def test_cells_bfloat16():
    # bfloat16: torch on CPU rounds after every op, the lowering computes in float32 and
    # rounds once, so the two differ by a few bf16 ulps (the bf16 row of the table)
    check(lambda *a: torch.lstm_cell(a[0], (a[1], a[2]), *a[3:]),
          *[a.detach() for a in _lstm_args(True, torch.bfloat16)], atol=2e-2, rtol=2e-2)
    check(lambda *a: torch.gru_cell(*a), *[a.detach() for a in _gru_args(True, torch.bfloat16)],
          atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("cls,kw", [(torch.nn.LSTM, dict(num_layers=2, bidirectional=True)),
                                    (torch.nn.LSTM, dict(proj_size=3)),
                                    (torch.nn.GRU, dict(num_layers=2, bidirectional=True, bias=False))])
def test_rnn_modules(cls, kw):
    torch.manual_seed(0)
    cpu = cls(5, 4, batch_first=True, **kw)
    tpu = copy.deepcopy(cpu).to("tpu")
    x = _rand(2, 6, 5, seed=7)
    out, _ = cpu(x)
    tout, _ = tpu(x.detach().to("tpu").requires_grad_())
    torch.testing.assert_close(tout.cpu(), out, atol=1e-5, rtol=1.3e-6)
    out.pow(2).sum().backward()
    tout.pow(2).sum().backward()
    for (name, p), q in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1.3e-6, msg=lambda m: f"{name}: {m}")


def test_direct_backward_ops_shapes():
    ws = torch.rand(3, 16).to("tpu")
    cx, cy = torch.randn(3, 4).to("tpu"), torch.randn(3, 4).to("tpu")
    gg, gcx, gb = aten._thnn_fused_lstm_cell_backward_impl(None, cy, cx, cy, ws, True)
    assert gg.shape == (3, 16) and gcx.shape == (3, 4) and gb.shape == (16,)
    gi, gh, ghx, gbi, gbh = aten._thnn_fused_gru_cell_backward(cx, torch.rand(3, 20).to("tpu"), False)
    assert gi.shape == gh.shape == (3, 12) and ghx.shape == (3, 4) and gbi is None and gbh is None


def test_packed_sequences():
    """``pack_padded_sequence`` (its ``lengths`` a CPU tensor by contract, as on CUDA) runs
    torch's CompositeExplicitAutograd kernel on tpu tensors; an LSTM over the packed batch
    and its gradients match CPU, and tpu ``lengths`` get torch's own error."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.manual_seed(0)
    cpu = torch.nn.LSTM(4, 6, batch_first=True)
    tpu = copy.deepcopy(cpu).to("tpu")
    lengths = torch.tensor([5, 3, 2])
    x = _rand(3, 5, 4, seed=3)
    xt = x.detach().to("tpu").requires_grad_()
    want, want_len = pad_packed_sequence(cpu(pack_padded_sequence(x, lengths, batch_first=True))[0], batch_first=True)
    got, got_len = pad_packed_sequence(tpu(pack_padded_sequence(xt, lengths, batch_first=True))[0], batch_first=True)
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1.3e-6)
    assert got_len.tolist() == want_len.tolist()
    want.pow(2).sum().backward()
    got.pow(2).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad, atol=1e-5, rtol=1.3e-6)
    with pytest.raises(RuntimeError, match="'lengths' argument should be a 1D CPU int64 tensor"):
        pack_padded_sequence(xt, lengths.to("tpu"), batch_first=True)
