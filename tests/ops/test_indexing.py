"""Parity tests for the indexing lowerings (registry/xla/gather_scatter.py,
advanced_indexing.py, masks.py, embedding.py)."""
from __future__ import annotations

import copy
import re

import pytest
import torch
from helpers import check, to_cpu, to_tpu

aten = torch.ops.aten
F32, BF16, I64 = torch.float32, torch.bfloat16, torch.int64


def r(*shape, dtype=F32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape) + 7 * len(shape))
    if dtype in (torch.int64, torch.int32):
        return torch.randint(-5, 6, shape, generator=g, dtype=dtype)
    x = torch.randn(shape, generator=g).to(dtype)
    return x.requires_grad_() if grad else x


def idx(high, *shape, seed=0):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed + high))


def perm(n, seed=0):
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


# -- gather / scatter ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, I64])
def test_gather(dtype):
    x = r(4, 5, dtype=dtype)
    check(lambda x, i: torch.gather(x, 1, i), x, idx(5, 4, 3))
    check(lambda x, i: torch.gather(x, 0, i), x, idx(4, 2, 3))   # index smaller in dim 1
    check(lambda x, i: torch.gather(x, -1, i), x.t(), idx(4, 5, 2))
    check(lambda x, i: torch.gather(x, 0, i), r(dtype=dtype), torch.tensor(0))
    check(lambda x, i: torch.gather(x, 1, i), x, idx(5, 4, 0))


def test_gather_grad():
    check(lambda x, i: torch.gather(x, 1, i) * 2, r(3, 4, grad=True), idx(4, 3, 6), grad=True)


@pytest.mark.parametrize("dtype", [F32, BF16, I64])
def test_scatter(dtype):
    x = r(4, 5, dtype=dtype)
    i = torch.stack([perm(5, s)[:3] for s in range(2)])          # unique per row
    check(lambda x, i, s: torch.scatter(x, 1, i, s), x, i, r(2, 4, dtype=dtype))
    check(lambda x, i: torch.scatter(x, 1, i, 3), x, i)
    check(lambda x, i, s: torch.scatter_add(x, 1, i, s), x, idx(5, 3, 6), r(3, 6, dtype=dtype))
    check(lambda x, i, s: torch.scatter(x, 0, i, s, reduce="add"), x, idx(4, 6, 5), r(6, 5, dtype=dtype))
    check(lambda x, i: x.clone().scatter_(0, i, 7), x, idx(4, 1, 5))
    check(lambda x, i, s: x.clone().scatter_add_(0, i, s), x, idx(4, 3, 5), r(3, 5, dtype=dtype))


def test_scatter_multiply_and_grad():
    x = r(4, 5)
    check(lambda x, i, s: torch.scatter(x, 0, i, s, reduce="multiply"), x, idx(4, 6, 5), r(6, 5))
    check(lambda x, i: torch.scatter(x, 1, i, 2.0, reduce="multiply"), x, idx(5, 4, 2))
    check(lambda x, i, s: torch.scatter_add(x, 1, i, s), r(3, 4, grad=True), idx(4, 3, 6),
          r(3, 6, grad=True), grad=True)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    i = idx(4, 6, 5)
    for dtype in (F32, I64):
        x, s = r(4, 5, dtype=dtype), r(6, 5, dtype=dtype, seed=1)
        check(lambda x, i, s: torch.scatter_reduce(x, 0, i, s, reduce, include_self=include_self), x, i, s)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(reduce):
    x, s = r(4, 3), r(4, 6)
    i = idx(3, 6)
    check(lambda x, i, s: x.index_reduce(1, i, s, reduce), x, i, s)
    check(lambda x, i, s: x.index_reduce(1, i, s, reduce, include_self=False), x, i, s)


# -- index_* ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, I64])
def test_index_select(dtype):
    x = r(4, 5, dtype=dtype)
    check(lambda x, i: torch.index_select(x, 0, i), x, idx(4, 7))
    check(lambda x, i: torch.index_select(x, -1, i), x.t(), idx(4, 2))
    check(lambda x, i: torch.index_select(x, 0, i), x, torch.tensor(2))
    check(lambda x, i: torch.index_select(x, 1, i), x, idx(5, 0))
    check(lambda x, i: torch.index_select(x, 0, i), r(dtype=dtype), torch.tensor([0]))


def test_index_select_grad():
    check(lambda x, i: torch.index_select(x, 1, i) * 2, r(3, 4, grad=True), idx(4, 6), grad=True)


@pytest.mark.parametrize("dtype", [F32, I64])
def test_index_add_copy_fill(dtype):
    x = r(5, 3, dtype=dtype)
    check(lambda x, i, s: x.index_add(0, i, s), x, idx(5, 7), r(7, 3, dtype=dtype))
    check(lambda x, i, s: x.index_add(1, i, s, alpha=2), x, idx(3, 4), r(5, 4, dtype=dtype))
    check(lambda x, i, s: x.index_copy(0, i, s), x, perm(5)[:3], r(3, 3, dtype=dtype))
    check(lambda x, i: x.index_fill(1, i, -1), x, idx(3, 2))
    check(lambda x, i, v: x.index_fill(0, i, v), x, idx(5, 2), torch.tensor(4, dtype=dtype))
    check(lambda x, i, s: x.clone().index_add_(0, i, s), x, idx(5, 7), r(7, 3, dtype=dtype))


# -- advanced indexing ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, I64])
def test_index_tensor(dtype):
    x = r(3, 4, 5, dtype=dtype)
    i, j = idx(3, 2, 1), idx(5, 3)
    check(lambda x, i: x[i], x, idx(3, 6))
    check(lambda x, i: x[:, i], x, idx(4, 2, 2))
    check(lambda x, i, j: x[i, :, j], x, i, j)                # non-adjacent: batch dims first
    check(lambda x, i, j: x[:, i, j], x, idx(4, 2, 1), j)     # adjacent: stay in place
    check(lambda x, i: x[..., i], x.transpose(0, 2), idx(3, 4) - 3)  # negative indices
    check(lambda x, i: aten.index(x, [None, i]), x, idx(4, 3))
    check(lambda x, i: aten._unsafe_index(x, [i, None, i]), x, idx(3, 2))
    check(lambda x, i: x[i], x, torch.tensor(1))


def test_index_tensor_mask():
    x = r(3, 4, 5)
    check(lambda x, m: x[m], x, x > 0)
    check(lambda x, m: x[m], x, x[:, :, 0] > 0)
    check(lambda x, m: x[:, m], x, x[0, :, 0] > 0)
    check(lambda x, m: x[m], x, torch.zeros(3, 4, 5, dtype=torch.bool))


def _raises_as_cpu(exc, message, fn, *args):
    """``fn`` raises ``exc(message)`` on CPU, and so it does on tpu (at the call or its sync)."""
    with pytest.raises(exc, match=re.escape(message)):
        fn(*args)
    with pytest.raises(exc, match=re.escape(message)):
        to_cpu(fn(*to_tpu(args)))


def _mask_error(mask, at, shape, dim):
    return (f"The shape of the mask {mask} at index {at} does not match the shape of the indexed "
            f"tensor {shape} at index {dim}")


def _setmask(x, m):
    y = x.clone()
    y[m] = 0
    return y


BAD_MASKS = [   # (index call, mask, torch's error)
    (lambda x, m: x[m], torch.tensor([True, False]), _mask_error([2], 0, [4, 5], 0)),
    (lambda x, m: x[m], torch.ones(6, dtype=torch.bool), _mask_error([6], 0, [4, 5], 0)),
    (lambda x, m: x[m], torch.ones(2, 5, dtype=torch.bool), _mask_error([2, 5], 0, [4, 5], 0)),
    (lambda x, m: x[m], torch.ones(4, 3, dtype=torch.bool), _mask_error([4, 3], 1, [4, 5], 1)),
    (lambda x, m: x[:, m], torch.ones(3, dtype=torch.bool), _mask_error([3], 0, [4, 5], 1)),
    (lambda x, m: x[torch.tensor([0, 1], device=x.device), m], torch.ones(3, dtype=torch.bool),
     _mask_error([3], 0, [4, 5], 1)),
    (lambda x, m: aten.index(x, [None, m]), torch.ones(5, 6, dtype=torch.bool),
     "Dimension out of range (expected to be in range of [-2, 1], but got 2)"),
    (lambda x, m: aten.index(x, [None, None, m]), torch.ones(1, dtype=torch.bool),
     "too many indices for tensor of dimension 2 (got 3)"),
    (_setmask, torch.tensor([True, False]), _mask_error([2], 0, [4, 5], 0)),
    (lambda x, m: torch.index_put(x, (m,), torch.tensor(1.0, device=x.device), accumulate=True),
     torch.ones(3, dtype=torch.bool), _mask_error([3], 0, [4, 5], 0)),
    (lambda x, m: aten.index_put(x, [None, m], torch.tensor(1.0, device=x.device)),
     torch.ones(4, dtype=torch.bool), _mask_error([4], 0, [4, 5], 1)),
    (lambda x, m: aten.index_put_(x.clone(), [m], torch.tensor(1.0, device=x.device)),
     torch.ones(4, 3, dtype=torch.bool), _mask_error([4, 3], 1, [4, 5], 1)),
]


@pytest.mark.parametrize("fn, mask, message", BAD_MASKS)
def test_mask_of_the_wrong_shape_raises_as_cpu(fn, mask, message):
    _raises_as_cpu(IndexError, message, fn, torch.arange(20.0).reshape(4, 5), mask)


def test_mask_of_the_wrong_shape_raises_when_compiled():
    torch._dynamo.reset()
    x, m = torch.arange(20.0, device="tpu").reshape(4, 5), torch.tensor([True, False], device="tpu")
    for fn in (lambda x, m: x[m], _setmask):
        with pytest.raises(IndexError, match=re.escape(_mask_error([2], 0, [4, 5], 0))):
            torch.compile(fn, backend="tpu")(x, m).cpu()
        torch._dynamo.reset()


def test_mask_beside_an_out_of_range_index_raises():
    x, m = to_tpu(torch.arange(20.0).reshape(4, 5)), to_tpu(torch.ones(4, dtype=torch.bool))
    with pytest.raises(IndexError, match="out of bounds for dimension 1 with size 5"):
        x[m, to_tpu(torch.tensor([7]))].cpu()


def test_index_grad():
    check(lambda x, i: x[i] * 2, r(5, 3, grad=True), idx(5, 7), grad=True)
    check(lambda x, i: x[:, i] * 2, r(3, 5, grad=True), idx(5, 2, 2), grad=True)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtype", [F32, I64])
def test_index_put(accumulate, dtype):
    x = r(4, 5, dtype=dtype)
    # without accumulate duplicate indices are undefined in torch: unique indices there
    i = idx(4, 6) if accumulate else perm(4)[:3]
    check(lambda x, i, v: torch.index_put(x, (i,), v, accumulate), x, i, r(len(i), 5, dtype=dtype))
    check(lambda x, i, v: aten.index_put(x, [None, i], v, accumulate), x, perm(5)[:2], r(2, dtype=dtype))
    check(lambda x, i, j, v: torch.index_put(x, (i, j), v, accumulate), x, i, i + 1, r(dtype=dtype))
    check(lambda x, i, v: x.clone().index_put_((i,), v, accumulate), x, i, r(5, dtype=dtype))


def test_index_put_mask():
    x = r(3, 4)
    m = x > 0
    check(lambda x, m: x.masked_fill(m, 0) + 0, x, m)

    def setmask(x, m, v):
        y = x.clone()
        y[m] = v
        return y

    check(setmask, x, m, torch.tensor(2.0))
    check(setmask, x, x[:, 0] > 0, r(4))
    rows = x[:, 0] > 0
    check(setmask, x, rows, r(int(rows.sum()), 4))
    check(setmask, x, m, r(int(m.sum())))
    cols = x[0] > 0
    check(lambda x, m, v: aten.index_put(x, [None, m], v), x, cols, r(3, int(cols.sum())))
    check(lambda x, m, v: aten.index_put(x, [None, m], v), x, cols, r(3, 1))

    def addmask(x, m, v):
        return torch.index_put(x, (m,), v, accumulate=True)

    check(addmask, x, m, r(int(m.sum())))


@pytest.mark.parametrize("n", [2, 5])
def test_mask_assignment_of_another_count_of_values_raises(n):
    """``x[mask] = v`` with v of 2 or 5 elements where the mask selects 3: CPU raises a
    shape mismatch; tpu wrote the wrong elements (the count is on the device: the error
    comes at the next sync)."""
    m = torch.tensor([True, False, True, True, False])
    with pytest.raises(RuntimeError, match="shape mismatch: value tensor of shape"):
        torch.zeros(5)[m] = torch.arange(float(n))
    x = torch.zeros(5, device="tpu")
    x[m.to("tpu")] = torch.arange(float(n), device="tpu")
    with pytest.raises(RuntimeError, match=re.escape(f"shape mismatch: value tensor of shape [{n}]")):
        x.cpu()
    assert torch.ones(1, device="tpu").item() == 1.0   # later ops work


def test_index_put_grad():
    check(lambda x, i, v: torch.index_put(x, (i,), v, True), r(5, 3, grad=True), idx(5, 7),
          r(7, 3, grad=True), grad=True)


def test_unsafe_masked_index():
    x = r(4, 5)
    i = torch.tensor([0, 3, 9, -1])
    m = torch.tensor([True, True, False, True])
    check(lambda x, m, i: aten._unsafe_masked_index(x, m, [i], 2.5), x, m[:, None], i)
    check(lambda x, m, i, v: aten._unsafe_masked_index_put_accumulate(x, m, [i], v),
          x, m[:, None].expand(4, 5), i, r(4, 5))


def test_take_put():
    x = r(3, 4)
    check(lambda x, i: torch.take(x, i), x, idx(12, 2, 3) - 6)
    check(lambda x, i: torch.take(x, i), x.t(), idx(12, 5))
    check(lambda x, i, s: x.put(i, s), x, perm(12)[:5], r(5))
    check(lambda x, i, s: x.put(i, s, accumulate=True), x, idx(12, 2, 4), r(8))


# -- masks ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, I64, torch.bool])
def test_masked_fill(dtype):
    x = r(3, 4, dtype=dtype) if dtype != torch.bool else r(3, 4) > 0
    m = r(3, 4, seed=3) > 0
    check(lambda x, m: x.masked_fill(m, 1), x, m)
    check(lambda x, m: x.masked_fill(m[0], 0), x, m)           # broadcast mask
    check(lambda x, m, v: x.masked_fill(m, v), x, m, torch.tensor(1).to(dtype))
    check(lambda x, m: x.masked_fill(m, 2), x.t(), m.t())
    check(lambda x, m: x.clone().masked_fill_(m, 0), x, m)


def test_masked_fill_grad():
    check(lambda x, m: x.masked_fill(m, -1.0) * 2, r(3, 4, grad=True), r(3, 4, seed=2) > 0, grad=True)


def test_masked_scatter_select():
    x, m = r(3, 4), r(3, 4, seed=5) > 0
    check(lambda x, m, s: x.masked_scatter(m, s), x, m, r(20))
    check(lambda x, m, s: x.masked_scatter(m, s), x, m[0], r(3, 5))
    check(lambda x, m, s: x.masked_scatter(m, s), r(3, 4, grad=True), m, r(13, grad=True), grad=True)
    check(lambda x, m: torch.masked_select(x, m), x, m)
    check(lambda x, m: torch.masked_select(x, m), x, m[1])
    check(lambda g, m: aten.masked_scatter_backward(g, m, [4, 4]), x, m)


def test_masked_scatter_with_too_few_source_elements_raises():
    """CPU refuses a source shorter than the mask's count; tpu filled zeros."""
    msg = "Number of elements of source < number of ones in mask"
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(RuntimeError, match=msg):
        torch.zeros(2, 3).masked_scatter(m, torch.arange(3.0))
    out = torch.zeros(2, 3, device="tpu").masked_scatter(m.to("tpu"), torch.arange(3.0, device="tpu"))
    with pytest.raises(RuntimeError, match=msg):
        out.cpu()


def test_masked_select_bad_mask_raises_as_cpu():
    x = torch.zeros(4, 5)
    _raises_as_cpu(RuntimeError, "The size of tensor a (3) must match the size of tensor b (5) at "
                   "non-singleton dimension 1", torch.masked_select, x, torch.ones(3, dtype=torch.bool))
    _raises_as_cpu(RuntimeError, "The size of tensor a (5) must match the size of tensor b (3) at "
                   "non-singleton dimension 1", torch.masked_select, torch.zeros(3), x > -1)
    _raises_as_cpu(RuntimeError, "masked_select: expected BoolTensor for mask", torch.masked_select,
                   x, torch.ones(5))


@pytest.mark.parametrize("dtype", [F32, I64, torch.bool])
def test_nonzero(dtype):
    x = r(3, 5, dtype=dtype) if dtype != torch.bool else r(3, 5) > 0
    check(lambda x: torch.nonzero(x), x)
    check(lambda x: torch.nonzero(x), x.t())
    check(lambda x: torch.nonzero(x), torch.zeros(0, 3, dtype=dtype))
    check(lambda x: torch.nonzero(x), torch.ones((), dtype=dtype))
    check(lambda x: torch.nonzero_static(x, size=4), x)
    check(lambda x: torch.nonzero_static(x, size=20, fill_value=-7), x)


def test_isin():
    e, t = torch.tensor([[1, 5, 2], [7, 2, 0]]), torch.tensor([2, 7, 9])
    check(lambda e, t: torch.isin(e, t), e, t)
    check(lambda e, t: torch.isin(e, t, invert=True), e, t)
    check(lambda e, t: torch.isin(e, t), e.float(), t)
    check(lambda e: torch.isin(e, 2), e)
    check(lambda t: torch.isin(7, t), t)
    check(lambda e, t: torch.isin(e, t), e, t[:0])
    check(lambda e, t: torch.isin(e, t), torch.tensor([1.0, float("nan")]), torch.tensor([float("nan"), 1.0]))


# -- embeddings --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_embedding(dtype):
    w = r(10, 4, dtype=dtype)
    check(lambda w, i: torch.nn.functional.embedding(i, w), w, idx(10, 3, 5))
    check(lambda w, i: torch.nn.functional.embedding(i, w), w, torch.tensor(3))


@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("freq", [False, True])
def test_embedding_grad(padding_idx, freq):
    w = r(10, 4, grad=True)
    i = torch.tensor([[1, 2, 2, 9], [2, 1, 0, 2]])
    check(lambda w, i: torch.nn.functional.embedding(i, w, padding_idx, scale_grad_by_freq=freq),
          w, i, grad=True)


def test_embedding_dense_backward():
    g, i = r(2, 3, 4), torch.tensor([[1, 2, 2], [0, 1, 5]])
    check(lambda g, i: aten.embedding_dense_backward(g, i, 6, -1, False), g, i)
    check(lambda g, i: aten.embedding_dense_backward(g, i, 6, 1, True), g, i)
    check(lambda g, i: aten.embedding_dense_backward(g, i, 6, 1, True), r(2, 3, 4, dtype=BF16), i)


def test_out_of_range_is_dropped_or_filled():
    """With device-side checks off (errors.index_checks(False)): reads fill 0, writes drop.
    With them on (the default) the next sync raises: tests/test_errors.py."""
    from tpu_kernels import errors
    x = to_tpu(torch.arange(4.0))
    i = to_tpu(torch.tensor([1, 7]))
    with errors.index_checks(False):
        assert torch.index_select(x, 0, i).cpu().tolist() == [1.0, 0.0]
        assert torch.index_put(x, (i,), to_tpu(torch.tensor([9.0, 9.0]))).cpu().tolist() == [0, 9, 2, 3]
    with pytest.raises(IndexError, match="index_select"):
        torch.index_select(x, 0, i).cpu()


def _bag_grads(device, mode, pad=None, freq=False, psw=False, last=False):
    """EmbeddingBag's output and its weight's (and per-sample weights') gradients."""
    torch.manual_seed(0)
    w = r(10, 3).to(device).requires_grad_()
    i = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9], device=device)
    o = torch.tensor([0, 2, 2, 5, 8] if last else [0, 2, 2, 5], device=device)   # bag 1 is empty
    p = r(8, seed=1).to(device).requires_grad_() if psw else None
    out = torch.nn.functional.embedding_bag(i, w, o, mode=mode, padding_idx=pad, scale_grad_by_freq=freq,
                                            per_sample_weights=p, include_last_offset=last)
    out.backward(r(*out.shape, seed=2).to(device))
    return [t.detach().cpu() for t in (out, w.grad) + ((p.grad,) if psw else ())]


@pytest.mark.parametrize("mode, pad, psw, last", [("sum", 4, True, False), ("mean", None, False, True),
                                                  ("max", 4, False, False), ("max", None, False, True)])
def test_embedding_bag_backward(mode, pad, psw, last):
    """nn.EmbeddingBag trains: the weight's gradient (sum, mean, max; padding rows get
    none; an empty bag gives none) and the per-sample weights' match CPU."""
    for got, want in zip(_bag_grads("tpu", mode, pad, psw=psw, last=last), _bag_grads("cpu", mode, pad, psw=psw, last=last)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_backward_scaled_by_frequency(mode):
    """scale_grad_by_freq divides each row's gradient by its index's count, as nn.Embedding's
    (and CUDA's) backward does. CPU's EmbeddingBag kernel on torch 2.13 divides some rows by
    another index's count (pytorch#190063, fixed after 2.13), so the reference is
    nn.Embedding's CPU gradient of the same bags."""
    _, grad = _bag_grads("tpu", mode, pad=4, freq=True)
    w, g = r(10, 3).requires_grad_(), r(4, 3, seed=2)
    i = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    bag = torch.tensor([0, 0, 2, 2, 2, 3, 3, 3])       # offsets [0, 2, 2, 5]
    rows = torch.nn.functional.embedding(i, w, padding_idx=4, scale_grad_by_freq=True)
    seeds = g[bag]
    if mode == "mean":    # each bag's rows other than padding: 2, 0, 1, 3
        seeds = seeds / torch.tensor([2.0, 1.0, 1.0, 3.0])[bag][:, None]
    (rows * seeds).sum().backward()
    torch.testing.assert_close(grad, w.grad)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_embedding_bag(mode):
    w, i = r(10, 3), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    o = torch.tensor([0, 2, 2, 5])
    for pad in (-1, 4):
        check(lambda w, i, o: aten._embedding_bag(w, i, o, False, mode, False, None, False, pad)[0], w, i, o)
        res = aten._embedding_bag(to_tpu(w), to_tpu(i), to_tpu(o), False, mode, False, None, False, pad)
        cpu = aten._embedding_bag(w, i, o, False, mode, False, None, False, pad)
        if mode:  # CPU's sum fast path returns an empty offset2bag; the meta shape has one per index
            assert torch.equal(res[1].cpu(), cpu[1]) and torch.equal(res[2].cpu(), cpu[2])
        if mode == 2:
            assert torch.equal(res[3].cpu(), cpu[3])
    check(lambda w, i, o: torch.nn.functional.embedding_bag(i, w, o, mode=("sum", "mean", "max")[mode],
                                                             include_last_offset=True), w, i, torch.tensor([0, 3, 3, 8]))
    check(lambda w, i, o: aten._embedding_bag_forward_only(w, i, o, False, mode)[0], w, i, o)
    if mode == 0:
        psw = r(8)
        check(lambda w, i, o, p: torch.nn.functional.embedding_bag(i, w, o, per_sample_weights=p, mode="sum"), w, i, o, psw)


@pytest.mark.parametrize("indices,offsets,match", [
    ([1, 2, 4, 5], [1, 2], "offsets\\[0\\] has to be 0"),
    ([1, 2, 4, 5], [0, 5], "offsets\\[-1\\] can not be greater than input's length 4"),
    ([1, 2, 10, 5], [0, 2], "valid range"),
    ([1, -1, 3, 5], [0, 2], "valid range"),
])
def test_embedding_bag_refuses_what_torch_refuses(indices, offsets, match):
    """A bad bag layout raised nothing: XLA read zeros (an index past the table) or
    misplaced bags (offsets not starting at 0, past the input)."""
    w, i, o = r(10, 3), torch.tensor(indices), torch.tensor(offsets)
    with pytest.raises(RuntimeError, match=match.replace("valid range", "")):
        torch.nn.functional.embedding_bag(i, w, o, mode="sum")
    with pytest.raises(RuntimeError, match=match):
        torch.nn.functional.embedding_bag(to_tpu(i), to_tpu(w), to_tpu(o), mode="sum").cpu()
    pad = torch.nn.functional.embedding_bag(to_tpu(torch.tensor([1, 2, 4, 5])), to_tpu(w), to_tpu(torch.tensor([0, 2])),
                                            mode="sum", padding_idx=2)
    assert pad.shape == (2, 3)       # (a padding index is a valid one)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_embedding_max_norm_renorms_the_rows_it_reads(norm_type, compiled):
    """``nn.Embedding(max_norm=...)`` rescales, in place, each row the lookup reads whose
    norm exceeds ``max_norm`` (``aten.embedding_renorm_``); other rows stay; gradients flow."""
    torch.manual_seed(0)
    cpu = torch.nn.Embedding(10, 4, max_norm=1.0, norm_type=norm_type)
    with torch.no_grad():
        cpu.weight.mul_(3)
    tpu = copy.deepcopy(cpu).to("tpu")
    idx = torch.tensor([[1, 2], [2, 7]])
    run = torch.compile(tpu, backend="tpu") if compiled else tpu
    torch._dynamo.reset()
    want, got = cpu(idx), run(idx.to("tpu"))
    want.pow(2).sum().backward()
    got.pow(2).sum().backward()
    for a, b in ((got, want), (tpu.weight, cpu.weight), (tpu.weight.grad, cpu.weight.grad)):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
