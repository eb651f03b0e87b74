"""``out=`` overloads on tpu tensors (``tpu_kernels/runtime_ops/out_variants.py``) against
the same calls on CPU: values, dtypes and shapes of the results and of ``out``, the result
being ``out`` itself, resizing (and torch's warning), dtype checks, factories."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from tpu_kernels.registry import route, tpu_kernel, unregister
from tpu_kernels.runtime_ops.out_variants import OUT_RULE, functional_of

aten = torch.ops.aten


def _like(shape, dtype=torch.float32):
    return lambda dev: torch.empty(shape, dtype=dtype, device=dev)


L = torch.long
# name -> (call(x, y, xi, out), the out it is given: a function of the device)
CASES = {
    "div": (lambda x, y, xi, o: torch.div(x, y, out=o), _like((4, 3))),
    "add_alpha": (lambda x, y, xi, o: torch.add(x, y, alpha=2, out=o), _like((4, 3))),
    "div_floor": (lambda x, y, xi, o: torch.div(x, y, rounding_mode="floor", out=o), _like((4, 3))),
    "exp": (lambda x, y, xi, o: torch.exp(x, out=o), _like((4, 3))),
    "pow": (lambda x, y, xi, o: torch.pow(y, x, out=o), _like((4, 3))),
    "where": (lambda x, y, xi, o: torch.where(x > 0, x, y, out=o), _like((4, 3))),
    "atan2": (lambda x, y, xi, o: torch.atan2(x, y, out=o), _like((4, 3))),
    "mul_bucket_view": (lambda x, y, xi, o: torch.mul(x[:2], 0.5, out=o[1:3]), lambda d: torch.zeros(5, 3, device=d)),   # DDP's reducer
    "int_into_float": (lambda x, y, xi, o: torch.add(xi, xi, out=o), _like((4, 3))),
    "sum_int_into_float": (lambda x, y, xi, o: torch.sum(xi, 1, out=o), _like((4,))),   # computed as float
    "mean_keepdim": (lambda x, y, xi, o: torch.mean(x, 1, keepdim=True, out=o), _like((4, 1))),
    "cumsum": (lambda x, y, xi, o: torch.cumsum(x, 1, out=o), _like((4, 3))),
    "non_contiguous_out": (lambda x, y, xi, o: torch.mul(x, y, out=o.t()), _like((3, 4))),
    "out_is_an_input": (lambda x, y, xi, o: torch.add(o, y, out=o), lambda d: torch.ones(4, 3, device=d)),
    "cat": (lambda x, y, xi, o: torch.cat([x, y], out=o), _like((8, 3))),
    "mm": (lambda x, y, xi, o: torch.mm(x, y.t(), out=o), _like((4, 4))),
    "normalize": (lambda x, y, xi, o: F.normalize(x, dim=0, out=o), _like((4, 3))),   # spectral_norm's
    "index_select": (lambda x, y, xi, o: torch.index_select(x, 0, torch.tensor([2, 0], device=x.device), out=o),
                     _like((2, 3))),
    "resized_from_empty": (lambda x, y, xi, o: torch.mul(x, y, out=o), _like((0,))),
    "resized_with_warning": (lambda x, y, xi, o: torch.add(x, y, out=o), _like((2, 2))),
    "max_dim_two_outs": (lambda x, y, xi, o: torch.max(x, 1, out=(o, torch.empty(0, dtype=L, device=x.device))),
                         _like((4,))),
    "sort_two_outs": (lambda x, y, xi, o: torch.sort(x, 1, out=(o, torch.empty(4, 3, dtype=L, device=x.device))),
                      _like((4, 3))),
    "split_copy_into_a_list": (  # FSDP2's all-gather
        lambda x, y, xi, o: torch.split_with_sizes_copy(x, [1, 3], out=[o[:1], o[1:]]), _like((4, 3))),
    "zeros_factory": (lambda x, y, xi, o: torch.zeros(4, 3, out=o), _like((4, 3))),
    "full_factory": (lambda x, y, xi, o: torch.full((2, 2), 2.5, out=o), _like((0,))),
    "arange_factory": (lambda x, y, xi, o: torch.arange(0, 6, out=o), _like((6,), L)),
}


def _flat(r):
    return list(r) if isinstance(r, (tuple, list)) else [r]


def _run(call, make_out, device):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 3, generator=g), torch.rand(4, 3, generator=g) + 0.5
    xi = torch.randint(-5, 5, (4, 3), generator=g)
    out = make_out(device)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = call(x.to(device), y.to(device), xi.to(device), out)
    resized = [w for w in seen if "was resized" in str(w.message)]
    return out, result, len(resized)


@pytest.mark.parametrize("name", list(CASES))
def test_out_matches_cpu(name):
    call, make_out = CASES[name]
    out_c, res_c, warn_c = _run(call, make_out, "cpu")
    out_t, res_t, warn_t = _run(call, make_out, "tpu")
    assert warn_t == warn_c
    assert (res_t is None) == (res_c is None)   # a list out's overload returns nothing
    for got, want in zip(_flat(res_t), _flat(res_c)) if res_c is not None else ():
        assert got.device.type == "tpu"
        assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride())
        torch.testing.assert_close(got.cpu(), want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out_t.cpu(), out_c, atol=1e-6, rtol=1e-6)
    assert res_c is None or _flat(res_t)[0] is out_t or name.endswith("bucket_view") or name == "non_contiguous_out"


def test_result_that_cannot_cast_into_out_is_refused():
    x = torch.randn(2, 2, device="tpu")
    with pytest.raises(RuntimeError, match="^result type Float can't be cast to the desired output type Long$"):
        torch.add(x, x, out=torch.empty(2, 2, dtype=torch.long, device="tpu"))


@pytest.mark.parametrize("call", [
    lambda x, f: x.__iadd__(1.5),                  # int tensor += float
    lambda x, f: x.mul_(2.5),
    lambda x, f: f.add_(torch.ones(3, dtype=torch.complex64, device=f.device)),
    lambda x, f: torch.exp(f, out=torch.empty(3, dtype=torch.long, device=f.device)),
])
def test_in_place_result_that_cannot_cast_has_torchs_message(call):
    """The message names torch's dtypes ('Float', 'Long'), as CPU torch's does."""
    def run(device):
        x, f = torch.arange(3, device=device), torch.ones(3, device=device)
        with pytest.raises(RuntimeError) as info:
            call(x, f)
        return str(info.value)
    assert run("tpu") == run("cpu")


def test_the_rule_and_what_it_leaves_alone():
    assert functional_of(aten.div.out) is aten.div.Tensor
    assert functional_of(aten.sum.IntList_out) is aten.sum.dim_IntList
    assert functional_of(aten.zeros.out) is aten.zeros.default        # but the tensor options
    assert functional_of(aten.max.dim_max) is aten.max.dim
    assert functional_of(aten.add_.Tensor) is None                     # in place, not out=
    r = route(aten.div.out)
    assert (r.kind, r.impl.name) == ("runtime", OUT_RULE)
    # an out overload with an impl of its own keeps it
    fn = tpu_kernel("aten::exp.out")(lambda x, *, out: x * 0 + 7.0)
    try:
        assert route(aten.exp.out).impl in fn.tpu_impls
        o = torch.empty(3, device="tpu")
        torch.exp(torch.zeros(3, device="tpu"), out=o)
        assert o.cpu().tolist() == [7.0, 7.0, 7.0]
    finally:
        unregister(fn)
    assert route(aten.exp.out).impl.name == OUT_RULE


def test_a_complex_input_into_a_real_out():
    """``linalg.vector_norm(complex, out=real)``: out's dtype is not passed on as the
    functional op's ``dtype`` (which must be complex for a complex input)."""
    z = torch.randn(4, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    want, got = torch.empty(3), torch.empty(3, device="tpu")
    torch.linalg.vector_norm(z, dim=0, out=want)
    torch.linalg.vector_norm(z.to("tpu"), dim=0, out=got)
    torch.testing.assert_close(got.cpu(), want)
