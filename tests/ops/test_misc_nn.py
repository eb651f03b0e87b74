"""Parity of the remaining nn lowerings (registry/xla/misc_nn.py) with CPU torch."""
from __future__ import annotations

import pytest
import torch
from helpers import check

aten = torch.ops.aten
PS = [0.0, 1.0, 2.0, 3.0, 0.5, float("inf")]


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


@pytest.mark.parametrize("p", PS)
def test_cdist_forward_backward(p):
    x1, x2 = _rand(2, 5, 3), _rand(1, 4, 3, seed=1)
    check(lambda a, b: aten._cdist_forward(a, b, p, None), x1, x2)
    x2b = x2.expand(2, 4, 3).contiguous()
    c = aten._cdist_forward(x1, x2b, p, None)
    g = _rand(*c.shape, seed=2)
    check(lambda g, a, b, c: aten._cdist_backward(g, a, b, p, c), g, x1, x2b, c)


def test_cdist_matmul_path_and_grads():
    x1, x2 = _rand(30, 3), _rand(4, 3, seed=1)   # > 25 rows: torch uses the matmul formula
    check(lambda a, b: aten._cdist_forward(a, b, 2.0, None), x1, x2)
    check(lambda a, b: aten._cdist_forward(a, b, 2.0, 2), x1, x2)
    check(lambda a, b: torch.cdist(a, b), x1, x2)
    check(lambda a, b: torch.cdist(a, b, p=1.0), _rand(6, 3).requires_grad_(),
          _rand(5, 4, 3, seed=1).transpose(0, 1).requires_grad_(), grad=True)   # non-contiguous
    check(lambda a, b: torch.cdist(a, b), _rand(2, 6, 3).requires_grad_(),
          _rand(2, 5, 3, seed=1).requires_grad_(), grad=True)


@pytest.mark.parametrize("p", PS)
def test_pdist_forward_backward(p):
    x = _rand(5, 3)
    check(lambda a: aten._pdist_forward(a, p), x)
    d = aten._pdist_forward(x, p)
    g = _rand(*d.shape, seed=2)
    check(lambda g, a, d: aten._pdist_backward(g, a, p, d), g, x, d)


def test_pdist_grad_and_edge_cases():
    check(lambda a: torch.pdist(a), _rand(6, 4).requires_grad_(), grad=True)
    check(lambda a: torch.pdist(a), torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.0, 1.0]], requires_grad=True),
          grad=True)   # a zero distance: torch's gradient is 0 there
    check(lambda a: aten._pdist_forward(a, 2.0), _rand(1, 3))     # no pairs


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce(reduce):
    d = _rand(5, 2)
    lengths = torch.tensor([2, 0, 3])
    check(lambda d, l: aten.segment_reduce(d, reduce, lengths=l), d, lengths)
    check(lambda d, l: aten.segment_reduce(d, reduce, lengths=l, initial=0.5), d, lengths)
    check(lambda d, o: aten.segment_reduce(d, reduce, offsets=o), d, torch.tensor([0, 2, 2, 5]))
    check(lambda d, l: aten.segment_reduce(d, reduce, lengths=l, axis=1), d.t().contiguous(),
          torch.tensor([[1, 1, 3], [0, 5, 0]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int8, torch.int64, torch.bool])
def test_hash_tensor(dtype):
    x = (_rand(3, 4) * 5).to(dtype)
    check(lambda a: aten.hash_tensor(a), x)
    check(lambda a: aten.hash_tensor(a, [1]), x)
    check(lambda a: aten.hash_tensor(a, [0], keepdim=True), x.t())
    check(lambda a: aten.hash_tensor(a, [1]), torch.zeros(0, 2, dtype=dtype))   # zero-size result


@pytest.mark.parametrize("labels, message", [([0, 5, 1], "smaller than num_classes"), ([0, -1, 2], "non-negative")])
def test_one_hot_out_of_range_raises(labels, message):
    """F.one_hot in plain eager (grad mode on) with a class outside [0, num_classes): CPU
    raises, tpu gave a row of zeros (torch's non-CPU decomposition checks nothing); now
    the lowering's device-side check raises CPU's message at the next sync, as in
    inference mode."""
    import torch.nn.functional as F
    with pytest.raises(RuntimeError, match=message):
        F.one_hot(torch.tensor(labels), 3)
    with pytest.raises(RuntimeError, match=message):
        F.one_hot(torch.tensor(labels, device="tpu"), 3).cpu()
    ok = torch.tensor([[0, 2], [1, 0]])
    assert torch.equal(F.one_hot(ok.to("tpu"), 3).cpu(), F.one_hot(ok, 3))
    assert torch.equal(F.one_hot(ok.to("tpu")).cpu(), F.one_hot(ok))      # num_classes=-1
