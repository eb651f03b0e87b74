"""Property: whatever arguments CPU torch rejects, the tpu device rejects; the rest agree.

Hypothesis draws argument combinations for op families with a CPU reference (many of
them invalid: mismatched shapes, bad dims, wrong dtypes, out-of-range indices). CPU torch
is the oracle: when it raises, the tpu device must raise the same exception class (after
a sync, for device-side checks); when it returns, the tpu device returns the same values.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from tpu_kernels import errors

DTYPES = [torch.float32, torch.int64, torch.bool]
shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
nonempty_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)


def _tensor(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=dtype)
    return torch.randint(-3, 4, shape, generator=g, dtype=dtype)


def _drain():
    try:
        errors.raise_pending()
    except Exception:
        pass


def _cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu(y) for y in x)
    return x


def _two_faults(a: Exception, b: Exception) -> bool:
    """Arguments bad in two ways (say an int tensor and a bad dim for std): torch's meta
    function, which the tpu device runs first, reports the dim; CPU's kernel the dtype."""
    return any(isinstance(e, IndexError) and str(e).startswith("Dimension out of range")
               for e in (a, b)) and all(isinstance(e, (RuntimeError, IndexError)) for e in (a, b))


def _dtype_unsupported(cpu: Exception, tpu: Exception) -> bool:
    """CPU's kernel raises NotImplementedError (a RuntimeError) for a dtype it lacks, where
    torch's meta function (run first on tpu) raises RuntimeError "... not supported"."""
    return isinstance(cpu, NotImplementedError) and "not implemented for" in str(cpu) \
        and type(tpu) is RuntimeError and "not supported" in str(tpu)


def _index_bounds(cpu: Exception, tpu: Exception) -> bool:
    """CPU torch's index kernels disagree among themselves (index_add: IndexError for some
    shapes, RuntimeError for others); an index-bounds error of either class is accepted."""
    words = ("out of range", "out of bounds", "DATA bounds")
    return all(isinstance(e, (IndexError, RuntimeError)) and any(w in str(e) for w in words)
               for e in (cpu, tpu))


def agree(fn, *inputs):
    """Run ``fn`` on CPU tensors and on their tpu copies; CPU's outcome is the oracle."""
    _drain()
    try:
        want, cpu_exc = fn(*inputs), None
    except Exception as exc:  # noqa: BLE001
        want, cpu_exc = None, exc
    try:
        got = _cpu(fn(*[x.to("tpu") if isinstance(x, torch.Tensor) else x for x in inputs]))
        torch.tpu.synchronize()
        tpu_exc = None
    except Exception as exc:  # noqa: BLE001
        got, tpu_exc = None, exc
    finally:
        _drain()
    if cpu_exc is not None:
        assert tpu_exc is not None, f"CPU raised {type(cpu_exc).__name__}({cpu_exc}); tpu returned {got}"
        assert isinstance(tpu_exc, type(cpu_exc)) or _two_faults(cpu_exc, tpu_exc) \
            or _dtype_unsupported(cpu_exc, tpu_exc) or _index_bounds(cpu_exc, tpu_exc), \
            f"CPU raised {type(cpu_exc).__name__}({cpu_exc}); tpu raised {type(tpu_exc).__name__}({tpu_exc})"
        return
    assert tpu_exc is None, f"CPU returned; tpu raised {type(tpu_exc).__name__}: {tpu_exc}"
    if isinstance(want, torch.Tensor):
        want = (want,)
        got = (got,)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        torch.testing.assert_close(g, w, equal_nan=True, rtol=1e-5, atol=1e-5)


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum,
    "div": torch.div, "floor_divide": torch.floor_divide, "remainder": torch.remainder,
    "add_": lambda a, b: a.clone().add_(b), "mul_": lambda a, b: a.clone().mul_(b),
    "eq": torch.eq, "logical_and": torch.logical_and, "where": lambda a, b: torch.where(b > 0, a, b),
}


@given(op=st.sampled_from(sorted(BINARY)), a=shapes, b=shapes,
       da=st.sampled_from(DTYPES), db=st.sampled_from(DTYPES))
def test_binary_broadcasting(op, a, b, da, db):
    agree(BINARY[op], _tensor(a, da), _tensor(b, db, seed=1))


@given(a=st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple),
       b=st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple),
       dtype=st.sampled_from([torch.float32, torch.int64]), mixed=st.booleans(),
       op=st.sampled_from(["matmul", "mm", "bmm", "mv"]))
def test_matmul_shapes(a, b, dtype, mixed, op):
    fn = {"matmul": torch.matmul, "mm": torch.mm, "bmm": torch.bmm, "mv": torch.mv}[op]
    agree(fn, _tensor(a, dtype), _tensor(b, torch.float32 if mixed else dtype, seed=1))


REDUCTIONS = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k), "mean": lambda x, d, k: x.mean(d, keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k), "prod": lambda x, d, k: x.prod(d, keepdim=k),
    "argmax": lambda x, d, k: x.argmax(d, keepdim=k), "std": lambda x, d, k: x.std(d, keepdim=k),
    "logsumexp": lambda x, d, k: x.logsumexp(d, keepdim=k), "softmax": lambda x, d, k: x.softmax(d),
    "cumsum": lambda x, d, k: x.cumsum(d), "max": lambda x, d, k: x.max(d, keepdim=k).values,
}


@given(op=st.sampled_from(sorted(REDUCTIONS)), shape=nonempty_shapes, dim=st.integers(-4, 4),
       keepdim=st.booleans(), dtype=st.sampled_from([torch.float32, torch.int64]))
def test_reductions_with_dims(op, shape, dim, keepdim, dtype):
    agree(lambda x: REDUCTIONS[op](x, dim, keepdim), _tensor(shape, dtype))


@given(shape=st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple),
       target=st.lists(st.integers(-1, 6), min_size=0, max_size=3).map(tuple),
       transpose=st.booleans(), how=st.sampled_from(["view", "reshape", "flatten_unflatten"]))
def test_view_reshape(shape, target, transpose, how):
    def fn(x):
        if transpose and x.dim() >= 2:
            x = x.transpose(0, 1)
        if how == "view":
            return x.view(target) * 1
        if how == "reshape":
            return x.reshape(target) * 1
        return x.flatten().unflatten(0, target) * 1
    agree(fn, _tensor(shape, torch.float32))


@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), dim=st.integers(-3, 3),
       index=st.lists(st.integers(-5, 5), min_size=0, max_size=4),
       op=st.sampled_from(["index_select", "gather", "take", "getitem", "embedding", "index_add"]))
def test_index_ops_random_indices(shape, dim, index, op):
    idx = torch.tensor(index, dtype=torch.int64)

    def fn(x, i):
        if op == "index_select":
            return x.index_select(dim, i)
        if op == "gather":  # an index tensor of x's rank, indices along dim
            return torch.gather(x, dim, i.reshape((-1,) + (1,) * (x.dim() - 1)))
        if op == "take":
            return torch.take(x, i)
        if op == "getitem":
            return x[i]
        if op == "embedding":
            return torch.nn.functional.embedding(i, x.reshape(x.shape[0], -1))
        return x.index_add(dim, i, torch.ones_like(x).narrow(dim % max(x.dim(), 1), 0, 1).expand(
            *[len(index) if d == dim % x.dim() else s for d, s in enumerate(x.shape)]))
    agree(fn, _tensor(shape, torch.float32), idx)


_BAD_NUMBERS = {   # (a valid call, the same call with a value CPU rejects)
    "smooth_l1_beta": (lambda x: F.smooth_l1_loss(x, x.flip(0), beta=1.0), lambda x: F.smooth_l1_loss(x, x.flip(0), beta=-1.0)),
    "huber_delta": (lambda x: F.huber_loss(x, x.flip(0), delta=1.0), lambda x: F.huber_loss(x, x.flip(0), delta=-1.0)),
    "celu_alpha": (lambda x: F.celu(x, 1.0), lambda x: F.celu(x, 0.0)),
    "bernoulli_p": (lambda x: torch.bernoulli(x, p=0.5), lambda x: torch.bernoulli(x, p=1.5)),
    "bernoulli_inplace": (lambda x: x.clone().bernoulli_(0.5), lambda x: x.clone().bernoulli_(-0.5)),
    "uniform_range": (lambda x: x.clone().uniform_(0, 1.0), lambda x: x.clone().uniform_(0, -1.0)),
    "random_range": (lambda x: x.clone().random_(2, 5), lambda x: x.clone().random_(5, 2)),
    "normal_std": (lambda x: torch.normal(0.0, 1.0, (3,), device=x.device), lambda x: torch.normal(0.0, -1.0, (3,), device=x.device)),
    "geometric_p": (lambda x: x.clone().geometric_(0.5), lambda x: x.clone().geometric_(1.5)),
    "log_normal_std": (lambda x: x.clone().log_normal_(0, 1.0), lambda x: x.clone().log_normal_(0, -1.0)),
    "renorm_maxnorm": (lambda x: x.renorm(2, 0, 1.0), lambda x: x.renorm(2, 0, -1.0)),
    "histc_range": (lambda x: torch.histc(x, bins=4, min=1, max=3), lambda x: torch.histc(x, bins=4, min=3, max=1)),
}


@pytest.mark.parametrize("name", list(_BAD_NUMBERS))
def test_number_arguments_are_checked_on_every_call(name):
    """torch rejects these values in its meta function or CPU kernel; the dispatcher's caches
    key numbers by type, so a valid call first made the same call with a bad value run
    (and some were never checked at all). Each raises CPU's error, cold and warm."""
    good, bad = _BAD_NUMBERS[name]
    x = _tensor((4, 5), torch.float32)
    with pytest.raises(RuntimeError) as want:
        bad(x)
    t = x.to("tpu")
    for _ in range(2):      # cold, then after a valid call of the same signature
        with pytest.raises(RuntimeError, match=re.escape(str(want.value))):
            bad(t).cpu()
        good(t).cpu()


@pytest.mark.parametrize("loss", [F.mse_loss, F.smooth_l1_loss, F.huber_loss, F.l1_loss])
def test_mean_loss_of_an_empty_batch_backward(loss):
    """torch's meta function for these backwards divides by numel() (ZeroDivisionError on an
    empty input) where CPU's kernel gives an empty gradient: the gradient was never written
    and the next op raised the deferred error."""
    a, b = torch.randn(0, 5, requires_grad=True), torch.randn(0, 5)
    ta = a.detach().to("tpu").requires_grad_()
    got, want = loss(ta, b.to("tpu")), loss(a, b)
    got.backward()
    want.backward()
    assert got.isnan().item() and want.isnan().item()
    assert ta.grad is not None and ta.grad.shape == a.grad.shape == (0, 5)
    errors.raise_pending()


@pytest.mark.parametrize("exponent", [-1, [-1, 2]], ids=["scalar", "list"])
def test_foreach_pow_of_integers_to_negative_ints_raises(exponent):
    """_foreach_pow's exponent is a leaf of the call: integer tensors to a negative int gave
    zeros, where torch raises (the single-tensor pow raises too: arithmetic.py)."""
    xs = [torch.tensor([2, 3]), torch.tensor([1, 4])]
    with pytest.raises(RuntimeError) as want:
        torch._foreach_pow(xs, exponent)
    ts = [x.to("tpu") for x in xs]
    for f in (torch._foreach_pow, torch._foreach_pow_):
        with pytest.raises(RuntimeError, match=re.escape(str(want.value))):
            f(ts, exponent)
    assert [t.cpu().tolist() for t in torch._foreach_pow(ts, 2)] == [[4, 9], [1, 16]]
    assert [t.cpu().tolist() for t in ts] == [[2, 3], [1, 4]]     # nothing written
