"""Bad inputs fail on tpu the way they fail on CPU torch, and never silently.

Each case is a function of a device. Where CPU torch raises, the tpu device raises the
same exception class (immediately for torch's own argument checks; at the next sync for
device-side checks such as out-of-range indices); where CPU torch returns, the tpu device
returns the same values.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tpu_kernels import dispatch, errors

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _no_leftover_errors():
    _drain()
    yield
    _drain()


def _drain():
    try:
        errors.raise_pending()
    except Exception:
        pass


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def randn(d, *shape, seed=0, **kw):
    return torch.randn(*shape, generator=_gen(seed), **kw).to(d)


def ints(d, *values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype).to(d)


def _materialise(out):
    """Copy results to the CPU: the sync where deferred device errors surface."""
    if isinstance(out, torch.Tensor):
        return out.detach().cpu()
    if isinstance(out, (list, tuple)):
        return type(out)(_materialise(x) for x in out)
    return out


def outcome(fn, device):
    try:
        out = _materialise(fn(device))
        if device == "tpu":
            torch.tpu.synchronize()
        return "ok", out
    except Exception as exc:  # noqa: BLE001 - the class is what is compared
        return "raise", exc


def assert_like_cpu(fn):
    kind, cpu = outcome(fn, "cpu")
    tkind, tpu = outcome(fn, "tpu")
    if kind == "raise":
        assert tkind == "raise", f"CPU raised {type(cpu).__name__}: {cpu}; tpu returned {tpu}"
        assert isinstance(tpu, type(cpu)), \
            f"CPU raised {type(cpu).__name__}({cpu}); tpu raised {type(tpu).__name__}({tpu})"
        assert str(tpu), "the tpu error says nothing"
        return cpu, tpu
    assert tkind == "ok", f"CPU returned {cpu}; tpu raised {type(tpu).__name__}: {tpu}"
    _assert_equal(tpu, cpu)
    return cpu, tpu


def _assert_equal(a, b):
    if isinstance(b, torch.Tensor):
        torch.testing.assert_close(a, b, equal_nan=True)
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_equal(x, y)
    else:
        assert a == b


def _inplace_leaf(d):
    x = randn(d, 3).requires_grad_()
    x.add_(1)


def _backward_twice(d):
    x = randn(d, 3).requires_grad_()
    y = (x.exp() * 2).sum()
    y.backward()
    y.backward()


def _backward_twice_retained(d):  # returns: grads accumulate
    x = randn(d, 3).requires_grad_()
    y = (x.exp() * 2).sum()
    y.backward(retain_graph=True)
    y.backward()
    return x.grad


def _zero_row(d):
    return torch.multinomial(torch.tensor([[1.0, 2.0], [0.0, 0.0]]).to(d), 1)


# (name, fn(device), a word the tpu message must contain or None)
CASES = [
    # shapes and broadcasting
    ("broadcast add", lambda d: randn(d, 2, 3) + randn(d, 4, 3), "4"),
    ("broadcast inplace", lambda d: randn(d, 2, 3).add_(randn(d, 4, 2, 3)), "shape"),
    ("broadcast ok", lambda d: randn(d, 2, 1) * randn(d, 1, 3), None),
    ("cat sizes", lambda d: torch.cat([randn(d, 2, 3), randn(d, 2, 4)]), "Sizes"),
    ("stack sizes", lambda d: torch.stack([randn(d, 2, 3), randn(d, 3, 3)]), "stack"),
    ("where broadcast", lambda d: torch.where(randn(d, 3) > 0, randn(d, 4), randn(d, 3)), None),
    ("expand", lambda d: randn(d, 2, 3).expand(4, 3), "expand"),
    # matmul and conv
    ("mm", lambda d: randn(d, 2, 3) @ randn(d, 4, 3), "2"),
    ("bmm batch", lambda d: torch.bmm(randn(d, 2, 3, 4), randn(d, 3, 4, 5)), None),
    ("matmul 1-d", lambda d: randn(d, 3) @ randn(d, 4), None),
    ("linear", lambda d: F.linear(randn(d, 5, 3), randn(d, 4, 7)), None),
    ("conv channels", lambda d: F.conv2d(randn(d, 1, 3, 8, 8), randn(d, 4, 2, 3, 3)), "channel"),
    ("conv kernel too big", lambda d: F.conv2d(randn(d, 1, 3, 2, 2), randn(d, 4, 3, 3, 3)), None),
    ("conv rank", lambda d: F.conv2d(randn(d, 8), randn(d, 4, 3, 3, 3)), None),
    ("conv ok", lambda d: F.conv2d(randn(d, 1, 3, 5, 5), randn(d, 2, 3, 3, 3, seed=1)), None),
    # dims
    ("sum dim", lambda d: randn(d, 2, 3).sum(5), "range"),
    ("transpose dim", lambda d: randn(d, 2, 3).transpose(0, 2), "range"),
    ("softmax dim", lambda d: randn(d, 2, 3).softmax(-3), "range"),
    ("cat dim", lambda d: torch.cat([randn(d, 2), randn(d, 2)], dim=2), None),
    ("sum dim negative ok", lambda d: randn(d, 2, 3).sum(-1), None),
    # view and reshape
    ("view stride", lambda d: randn(d, 4, 6).t().view(24), "view"),
    ("view numel", lambda d: randn(d, 4, 6).view(5, 5), "invalid"),
    ("view two -1", lambda d: randn(d, 4, 6).view(-1, -1), None),
    ("reshape numel", lambda d: randn(d, 4, 6).reshape(5, 5), "24"),
    ("reshape -1 indivisible", lambda d: randn(d, 4, 6).reshape(-1, 5), None),
    ("reshape after t ok", lambda d: randn(d, 4, 6).t().reshape(24), None),
    # dtype rules
    ("mean of ints", lambda d: torch.arange(5).to(d).mean(), "dtype"),
    ("bool subtraction", lambda d: torch.ones(3, dtype=torch.bool).to(d) - torch.ones(3, dtype=torch.bool).to(d),
     "bool"),
    ("bool neg", lambda d: -torch.ones(3, dtype=torch.bool).to(d), None),
    ("index_put_ dtype", lambda d: torch.zeros(5).to(d).index_put_((ints(d, 1),), torch.ones(1, dtype=torch.float64).to(d)),
     "dtype"),
    ("index_put dtype accumulate", lambda d: torch.index_put(torch.zeros(5).to(d), (ints(d, 1),),
                                                             ints(d, 3), True), "dtype"),
    ("int inplace float", lambda d: torch.ones(3, dtype=torch.int64).to(d).add_(randn(d, 3)), None),
    ("float matmul int", lambda d: randn(d, 2, 2) @ torch.ones(2, 2, dtype=torch.int64).to(d), None),
    # negative sizes
    ("empty negative", lambda d: torch.empty(-1, device=d), "negative"),
    ("zeros negative", lambda d: torch.zeros(2, -3, device=d), "negative"),
    ("randn negative", lambda d: torch.randn(-2, device=d), None),
    ("new_full negative", lambda d: randn(d, 2).new_full((-1,), 0.0), None),
    ("arange step 0", lambda d: torch.arange(0, 5, 0, device=d), None),
    # integer division by zero (device-side check); float division returns inf/nan
    ("int floor_divide 0", lambda d: ints(d, 1, 2) // ints(d, 0, 1), "ZeroDivisionError"),
    ("int div trunc 0", lambda d: torch.div(ints(d, 1, 2), ints(d, 1, 0), rounding_mode="trunc"), "ZeroDivisionError"),
    ("int remainder 0", lambda d: ints(d, 1, 2) % ints(d, 0, 1), "ZeroDivisionError"),
    ("int fmod 0", lambda d: torch.fmod(ints(d, 5, 2), ints(d, 3, 0)), "ZeroDivisionError"),
    ("int32 remainder scalar 0", lambda d: ints(d, 1, 2, dtype=torch.int32) % 0, "ZeroDivisionError"),
    ("float divide 0", lambda d: torch.tensor([1.0, 0.0, -1.0]).to(d) / torch.zeros(3).to(d), None),
    ("int true divide 0", lambda d: ints(d, 1, 0) / ints(d, 0, 0), None),
    # topk / kthvalue
    ("topk k too large", lambda d: randn(d, 5).topk(6), "k"),
    ("topk dim", lambda d: randn(d, 5).topk(2, dim=1), None),
    ("kthvalue k too large", lambda d: randn(d, 5).kthvalue(6), None),
    ("topk ok", lambda d: randn(d, 5).topk(5).values, None),
    # multinomial
    ("multinomial negative", lambda d: torch.multinomial(torch.tensor([0.5, -0.1]).to(d), 1), "multinomial"),
    ("multinomial inf", lambda d: torch.multinomial(torch.tensor([float("inf"), 1.0]).to(d), 1), "multinomial"),
    ("multinomial nan", lambda d: torch.multinomial(torch.tensor([float("nan"), 1.0]).to(d), 1), "multinomial"),
    ("multinomial zero row", _zero_row, "sum of probabilities"),
    ("multinomial too many", lambda d: torch.multinomial(torch.tensor([1.0, 1.0]).to(d), 3), "replacement"),
    ("multinomial 0 samples", lambda d: torch.multinomial(torch.tensor([1.0, 1.0]).to(d), 0), "n_sample"),
    ("multinomial 3-d", lambda d: torch.multinomial(torch.ones(2, 2, 2).to(d), 1), None),
    ("multinomial ints", lambda d: torch.multinomial(torch.ones(2, dtype=torch.int64).to(d), 1), "floating"),
    ("multinomial one-hot ok", lambda d: torch.multinomial(torch.tensor([[0.0, 1.0], [1.0, 0.0]]).to(d), 3, True), None),
    # autograd
    ("in-place on leaf", _inplace_leaf, "leaf"),
    ("backward twice", _backward_twice, "second time"),
    ("backward twice retained ok", _backward_twice_retained, None),
    ("backward non-scalar", lambda d: randn(d, 3).requires_grad_().exp().backward(), "scalar"),
    ("grad of no-grad", lambda d: randn(d, 3).sum().backward(), "grad"),
]


@pytest.mark.parametrize("name,fn,word", CASES, ids=[c[0] for c in CASES])
def test_bad_input_like_cpu(name, fn, word):
    cpu, tpu = assert_like_cpu(fn)
    if isinstance(cpu, Exception):   # torch's own words, as CPU (and CUDA) say them
        assert _first_line(cpu) in str(tpu), f"tpu says {str(tpu)!r}, CPU says {str(cpu)!r}"
    if word is not None:
        assert isinstance(tpu, Exception)
        assert word in str(tpu), f"tpu message {str(tpu)!r} does not mention {word!r}"


def _first_line(exc: Exception) -> str:
    return next((ln for ln in str(exc).splitlines() if ln.strip()), "")


# -- out-of-range indices: device-side checks ---------------------------------------------
def _x(d):
    return randn(d, 4, 3)


def _nll(d, reduction="mean"):
    return F.nll_loss(randn(d, 2, 3).log_softmax(-1), ints(d, 1, 3), reduction=reduction)


# (name, fn(device) -> result, the op name the deferred error must mention)
OOB = [
    ("gather", lambda d: torch.gather(_x(d), 0, ints(d, 0, 4).view(2, 1)), "gather"),
    ("gather negative", lambda d: torch.gather(_x(d), 1, ints(d, -1, 0).view(2, 1)), "gather"),
    ("scatter", lambda d: _x(d).scatter(0, ints(d, 5).view(1, 1), 1.0), "scatter"),
    ("scatter src", lambda d: _x(d).scatter(1, ints(d, 3).view(1, 1), randn(d, 1, 1)), "scatter"),
    ("scatter_add", lambda d: _x(d).scatter_add(0, ints(d, 4).view(1, 1), randn(d, 1, 1)), "scatter_add"),
    ("scatter_reduce", lambda d: _x(d).scatter_reduce(0, ints(d, 9).view(1, 1), randn(d, 1, 1), "amax"),
     "scatter_reduce"),
    ("index_select", lambda d: _x(d).index_select(0, ints(d, 1, 4)), "index_select"),
    ("index_select negative", lambda d: _x(d).index_select(0, ints(d, -1)), "index_select"),
    ("index_add", lambda d: _x(d).index_add(0, ints(d, 7), randn(d, 1, 3)), "index_add"),
    ("index_add negative", lambda d: _x(d).index_add(1, ints(d, -1), randn(d, 4, 1)), "index_add"),
    ("index_copy negative", lambda d: _x(d).index_copy(0, ints(d, -1), randn(d, 1, 3)), "index_copy"),
    ("index_fill negative", lambda d: _x(d).index_fill(1, ints(d, -4), 2.0), "index_fill"),
    ("index_copy", lambda d: _x(d).index_copy(0, ints(d, 4), randn(d, 1, 3)), "index_copy"),
    ("index_fill", lambda d: _x(d).index_fill(1, ints(d, 3), 2.0), "index_fill"),
    ("index_reduce", lambda d: _x(d).index_reduce(0, ints(d, 6), randn(d, 1, 3), "prod"), "index_reduce"),
    ("advanced index", lambda d: _x(d)[ints(d, 0, 4)], "index"),
    ("advanced index negative", lambda d: _x(d)[ints(d, -5)], "index"),
    ("advanced index 2 dims", lambda d: _x(d)[ints(d, 0), ints(d, 3)], "index"),
    ("index_put_", lambda d: _x(d).index_put_((ints(d, 4),), randn(d, 3)), "index_put"),
    ("setitem", lambda d: _setitem(d), "index_put"),
    ("index_put accumulate", lambda d: torch.index_put(_x(d), (ints(d, 9),), randn(d, 3), True), "index_put"),
    ("take", lambda d: torch.take(_x(d), ints(d, 12)), "take"),
    ("take negative", lambda d: torch.take(_x(d), ints(d, -13)), "take"),
    ("put_", lambda d: _x(d).put_(ints(d, 12), randn(d, 1)), "put"),
    ("embedding", lambda d: F.embedding(ints(d, 0, 7), randn(d, 4, 2)), "embedding"),
    ("embedding negative", lambda d: F.embedding(ints(d, -1), randn(d, 4, 2)), "embedding"),
    ("nll_loss", lambda d: _nll(d), "nll_loss"),
    ("nll_loss sum", lambda d: _nll(d, "sum"), "nll_loss"),
    ("nll_loss none", lambda d: _nll(d, "none"), "nll_loss"),
    ("cross_entropy", lambda d: F.cross_entropy(randn(d, 2, 3), ints(d, 0, -2)), "cross_entropy|nll_loss"),
    ("cross_entropy 2d", lambda d: F.cross_entropy(randn(d, 2, 3, 4), torch.full((2, 4), 3).to(d)),
     "cross_entropy|nll_loss"),
    ("cross_entropy smoothing", lambda d: F.cross_entropy(randn(d, 2, 3), ints(d, 0, 3), label_smoothing=0.1),
     "cross_entropy|nll_loss"),
    # values CPU's kernels refuse (a probability above 1, a class past the last): XLA computed on
    ("binary_cross_entropy", lambda d: F.binary_cross_entropy(torch.tensor([1.5, 0.2]).to(d),
                                                             torch.tensor([1.0, 0.0]).to(d)), "between 0 and 1"),
    ("multi_margin_loss", lambda d: F.multi_margin_loss(randn(d, 2, 5), ints(d, 9, 1)), "target out of range"),
]


def _setitem(d):
    x = _x(d)
    x[ints(d, 1, 4)] = 0.5
    return x


@pytest.mark.parametrize("name,fn,opname", OOB, ids=[c[0] for c in OOB])
def test_out_of_range_deferred_to_next_sync(name, fn, opname):
    kind, cpu = outcome(fn, "cpu")
    assert kind == "raise", "the case must be bad on CPU"
    out = fn("tpu")                      # no host sync: the op returns
    with pytest.raises(type(cpu), match=opname):
        _materialise(out)               # ... and the error surfaces at the next sync
    assert not errors.pending()
    assert (randn("tpu", 2) * 0 + 1).cpu().tolist() == [1.0, 1.0]   # later ops work


@pytest.mark.parametrize("name,fn,opname", OOB, ids=[c[0] for c in OOB])
def test_out_of_range_sync_checks(name, fn, opname):
    _, cpu = outcome(fn, "cpu")
    with errors.set_sync_checks(True):
        with pytest.raises(type(cpu), match=opname):
            fn("tpu")                    # raised by the op itself
    assert not errors.SYNC_CHECKS


@pytest.mark.parametrize("sync", ["item", "print", "synchronize", "cpu", "tolist"])
def test_deferred_error_surfaces_at_every_sync(sync, capsys):
    x = _x("tpu")
    y = x.index_select(0, ints("tpu", 4))
    z = x.sum()
    with pytest.raises(IndexError, match="index_select"):
        if sync == "item":
            z.item()
        elif sync == "print":
            print(y)
        elif sync == "synchronize":
            torch.tpu.synchronize()
        elif sync == "tolist":
            z.tolist()
        else:
            z.cpu()     # another op's result: the error is the device's, not the tensor's
    assert z.item() == pytest.approx(float(_x("cpu").sum()), rel=1e-6)


def test_in_range_edges_return_like_cpu():
    for fn in [lambda d: torch.gather(_x(d), 0, ints(d, 3, 0).view(2, 1)),
               lambda d: _x(d)[ints(d, -4, 3)],
               lambda d: torch.take(_x(d), ints(d, -12, 11)),
               lambda d: F.embedding(ints(d, 0, 3), randn(d, 4, 2)),
               lambda d: F.cross_entropy(randn(d, 2, 3), ints(d, 2, -100)),   # ignore_index
               lambda d: _x(d).index_add(0, ints(d, 3, 3), randn(d, 2, 3)),
               lambda d: _x(d).index_fill(1, ints(d, -3, 2), 2.0),
               lambda d: randn(d, 2, 3).softmax(-2),
               lambda d: torch.mm(ints(d, 1, 2).view(1, 2), ints(d, 3, 4).view(2, 1))]:
        assert_like_cpu(fn)


def test_many_unread_flags_read_together_name_the_failing_op():
    # past MAX_WATCHED unread flags the oldest are read in stacks (errors._read_all); the
    # one bad op among hundreds of good ones of two flag shapes is still the one named
    w, x, i3, i1, i7 = randn("tpu", 4, 2), _x("tpu"), ints("tpu", 3), ints("tpu", 1), ints("tpu", 7)
    good = [lambda: F.embedding(i3, w), lambda: x.index_select(0, i1)]
    with pytest.raises(IndexError, match="index_select"):   # raised by the op after the read
        for k in range(errors.MAX_WATCHED + 40):
            good[k % 2]()
            if k == 70:
                x.index_select(0, i7)      # out of range
        torch.tpu.synchronize()
    assert not errors.pending()
    assert k > 70


def test_read_all_keeps_order_and_values():
    import jax.numpy as jnp
    import numpy as np
    flags = [jnp.array([k % 7 == 0, k % 3 == 0]) for k in range(75)] + [jnp.array([True])] * 3
    flags.insert(5, np.array([True, False, True]))    # not a jax array: read as it is
    values = errors._read_all(flags)
    assert [v.tolist() for v in values] == [np.asarray(f).tolist() for f in flags]


def test_switches_sync_checks_at_runtime():
    assert not errors.SYNC_CHECKS
    errors.set_sync_checks(True)
    try:
        with pytest.raises(IndexError, match="embedding"):
            F.embedding(ints("tpu", 9), randn("tpu", 4, 2))
    finally:
        errors.set_sync_checks(False)
    out = F.embedding(ints("tpu", 9), randn("tpu", 4, 2))   # deferred again
    with pytest.raises(IndexError, match="embedding"):
        out.cpu()


def test_index_checks_off_retraces_and_skips_the_check():
    w = randn("tpu", 4, 2)
    bad = ints("tpu", 9)
    with errors.index_checks(False):
        assert not errors.INDEX_CHECKS
        out = F.embedding(bad, w).cpu()     # XLA clamps: no error, by request
        assert out.shape == (1, 2)
    assert errors.INDEX_CHECKS
    with pytest.raises(IndexError, match="embedding"):
        F.embedding(bad, w).cpu()           # checks back on: the entry traced with them


def test_deferred_error_during_backward_names_the_op():
    w = randn("tpu", 4, 2).requires_grad_()
    loss = F.embedding(ints("tpu", 1, 5), w).sum()
    loss.backward()         # no sync: backward runs (the bad row's gradient is dropped)
    with pytest.raises(IndexError, match="embedding"):
        w.grad.cpu()        # the first sync names the forward op that failed
    assert (w * 1).cpu().shape == (4, 2)


# -- memory ----------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda: torch.empty(2 ** 42, device="tpu"),
    lambda: torch.zeros(2 ** 21, 2 ** 21, device="tpu"),
    lambda: torch.ones(2 ** 21, device="tpu").expand(2 ** 21, 2 ** 21) + 1,
    lambda: torch.ones(2 ** 21, device="tpu").expand(2 ** 21, 2 ** 21).contiguous(),
], ids=["empty", "zeros", "add expanded", "contiguous"])
def test_huge_allocation_is_a_clear_oom(make):
    with pytest.raises(torch.OutOfMemoryError, match=r"aten\.\w+.*GiB") as info:
        make()
    assert isinstance(info.value, RuntimeError)     # what CUDA users catch
    assert "16384.00 GiB" in str(info.value)
    x = torch.ones(1000, device="tpu")              # the process survives, later ops work
    assert (x * 2).sum().item() == 2000.0


def test_oom_guard_ignores_small_results():
    n0 = dispatch.cache_info()["ops"].misses
    assert torch.zeros(3, 5, device="tpu").sum().item() == 0.0
    assert dispatch.cache_info()["ops"].misses >= n0
