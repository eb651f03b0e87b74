"""Parity checking: the same call on CPU torch and on the tpu device, compared.

``check(fn, *cpu_args)`` runs any torch code both ways. ``check_parity(op, ...)`` checks
every tpu impl of an op (each forced in turn) against its CPU reference: the op itself
for ATen ops, the ``reference=`` given to ``@tpu_kernel`` for custom ops. Use it in your
own test suite:

    from tpu_kernels.testing import check_parity
    def test_my_op():
        check_parity("mylib::fused_rms_norm", (torch.randn(4, 64), torch.randn(64), 1e-6))
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

import jax.numpy as jnp
import torch
from torch.utils._pytree import tree_map

from tpu_kernels import registry
from tpu_kernels.registry import resolve_overload
from tpu_kernels.registry.custom_ops import DECLARED
from tpu_kernels.registry.dtypes import to_torch_dtype

@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How far a tpu result may be from the reference, for one dtype: ``atol``/``rtol``
    for a result computed the way torch's CPU kernel computes it (torch.testing's
    defaults, which follow the dtype's precision), ``kernel_atol``/``kernel_rtol`` for a
    kernel that sums in another order (blocked matmuls, online softmax and log-sum-exp,
    tiled reductions: a few more roundings of the dtype's epsilon)."""
    atol: float
    rtol: float
    kernel_atol: float
    kernel_rtol: float

    def __iter__(self):   # ``atol, rtol = TOLERANCES[dtype]``
        return iter((self.atol, self.rtol))


# The one tolerance table, by torch dtype (eps: f32 1.2e-7, bf16 7.8e-3, f16 9.8e-4), used
# by the parity tests, the kernel tests and the bench. Integers and bool compare exactly.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(1e-5, 1.3e-6, 2e-5, 2e-5),
    torch.float64: Tolerance(1e-7, 1e-7, 1e-7, 1e-7),
    torch.bfloat16: Tolerance(1e-5, 1.6e-2, 2e-2, 2e-2),
    torch.float16: Tolerance(1e-5, 1e-3, 2e-3, 2e-3),
    torch.complex64: Tolerance(1e-5, 1.3e-6, 2e-5, 2e-5),
    torch.complex128: Tolerance(1e-7, 1e-7, 1e-7, 1e-7),
}


def tol(dtype: Any, kernel: bool = False) -> dict[str, float]:
    """``assert_close`` tolerances for ``dtype`` (a torch dtype, or a jax/numpy one);
    ``kernel``: for a kernel that reorders its sums."""
    if not isinstance(dtype, torch.dtype):
        dtype = to_torch_dtype(jnp.dtype(dtype))
    t = TOLERANCES.get(dtype)
    if t is None:
        return {"atol": 0.0, "rtol": 0.0}
    return {"atol": t.kernel_atol, "rtol": t.kernel_rtol} if kernel else {"atol": t.atol, "rtol": t.rtol}


def to_tpu(x: Any) -> Any:
    def conv(t):
        if isinstance(t, torch.Tensor):
            out = t.detach().to("tpu")
            return out.requires_grad_(t.requires_grad) if t.is_leaf and t.requires_grad else out
        return t
    return tree_map(conv, x)


def to_cpu(x: Any) -> Any:
    return tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, x)


def assert_same(expected: Any, actual: Any, msg: str = "", **tolerance: float) -> None:
    """Values, shapes and dtypes equal within the dtype's tolerance (or ``tolerance``)."""
    e_leaves = [e for e in _leaves(expected)]
    a_leaves = [a for a in _leaves(actual)]
    assert len(e_leaves) == len(a_leaves), f"{msg}: {len(a_leaves)} outputs, expected {len(e_leaves)}"
    for e, a in zip(e_leaves, a_leaves):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"{msg}: got {type(a)}, expected a tensor"
            a = a.cpu()
            kw = tolerance or tol(e.dtype)
            torch.testing.assert_close(a, e, equal_nan=True, msg=lambda m: f"{msg}\n{m}", **kw)
        else:
            assert a == e or (a != a and e != e), f"{msg}: {a!r} != {e!r}"


ROUNDED = (torch.float16, torch.bfloat16, torch.float32)   # dtypes float64 can referee


def assert_as_accurate(expected: Any, actual: Any, exact: Any, msg: str = "") -> None:
    """For float results that ``assert_same`` finds apart: ``actual`` is, element by
    element, at least as close to ``exact`` (the same computation in float64) as
    ``expected`` (CPU torch) is, within the dtype's tolerance. Two sums in another order
    round differently by more than the tolerance (a convolution's gradient, a batched
    matmul's accumulation); neither is the right one, and the tpu one must not be the
    worse. Other leaves (integers, non-tensors) must be equal as ``assert_same`` says."""
    for e, a, x in zip(_leaves(expected), _leaves(actual), _leaves(exact)):
        if not (isinstance(e, torch.Tensor) and e.dtype in ROUNDED):
            assert_same(e, a, msg)
            continue
        dtype = e.dtype
        assert isinstance(a, torch.Tensor) and (a.shape, a.dtype) == (e.shape, dtype), (
            f"{msg}: got {getattr(a, 'dtype', type(a))} {tuple(getattr(a, 'shape', ()))}, expected "
            f"{dtype} {tuple(e.shape)}")
        atol, rtol = TOLERANCES[dtype]
        a, x, e = a.cpu().double(), x.double(), e.double()
        slack = (e - x).abs() + atol + rtol * x.abs()
        # NaN where float64 has none, or none where it has one, is worse unless CPU torch does the same
        worse = ((a - x).abs() > slack) | ((a.isnan() != x.isnan()) & (a.isnan() != e.isnan()))
        assert not worse.any(), (
            f"{msg}\n{int(worse.sum())} / {worse.numel()} elements are further from the float64 "
            f"result than CPU torch's by more than the {dtype} tolerance (largest tpu error "
            f"{(a - x).abs().max().item():.3g}, CPU's {(e - x).abs().max().item():.3g})")


def assert_same_or_as_accurate(expected: Any, actual: Any, exact: Callable[[], Any] | None,
                               msg: str = "") -> None:
    """``assert_same``; where it fails and every float result is float16, bfloat16 or
    float32, ``assert_as_accurate`` against ``exact()`` (the computation on float64
    inputs), if that runs and gives results of the same shapes (``exact=None``: no referee)."""
    try:
        assert_same(expected, actual, msg)
        return
    except AssertionError as exc:
        apart = exc
    floats = [t for t in _leaves(expected) if isinstance(t, torch.Tensor) and t.dtype.is_floating_point]
    if exact is None or not floats or any(t.dtype not in ROUNDED for t in floats):
        raise apart
    try:
        ref = exact()
    except Exception:   # noqa: BLE001  (the op does not run in float64: no referee)
        raise apart from None
    if [getattr(t, "shape", None) for t in _leaves(ref)] != [getattr(t, "shape", None) for t in _leaves(expected)]:
        raise apart
    if not all(_refereed(e, x) for e, x in zip(_leaves(expected), _leaves(ref))):
        raise apart
    assert_as_accurate(expected, actual, ref, msg)


def _refereed(e: Any, x: Any) -> bool:
    """Whether float64's ``x`` can referee CPU torch's ``e``: the same quantity, CPU off by
    rounding only (within 16 times the dtype's reordered-sum tolerance). An op whose
    meaning changes with the dtype would otherwise make any tpu result pass."""
    if not (isinstance(e, torch.Tensor) and e.dtype in ROUNDED):
        return True
    t = TOLERANCES[e.dtype]
    e, x = e.double(), x.double()
    off = (e - x).abs() > 16 * (t.kernel_atol + t.kernel_rtol * x.abs())
    return not (off & ~(e.isnan() | x.isnan())).any()


def in_float64(x: Any) -> Any:
    """``x`` with every floating tensor (also inside lists and dicts) as float64."""
    return tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.dtype.is_floating_point else t, x)


def _leaves(x: Any) -> list:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _leaves(v)]
    return [x]


def check(fn: Callable[..., Any], *args: Any, grad: bool = False, msg: str = "", **tolerance: float) -> Any:
    """``fn(*args)`` on CPU and on tpu give the same result (and gradients, if ``grad``)."""
    expected = fn(*args)
    targs = to_tpu(args)
    actual = fn(*targs)
    assert_same(expected, actual, msg or getattr(fn, "__name__", "fn"), **tolerance)
    if grad:
        _check_grads(expected, actual, args, targs, msg, **tolerance)
    return actual


def _check_grads(expected, actual, args, targs, msg, **tolerance):
    ins = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    tins = [a for a in targs if isinstance(a, torch.Tensor) and a.requires_grad]
    outs = [e for e in _leaves(expected) if isinstance(e, torch.Tensor) and e.requires_grad]
    touts = [a for a in _leaves(actual) if isinstance(a, torch.Tensor) and a.requires_grad]
    gen = torch.Generator().manual_seed(0)
    cots = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
    ge = torch.autograd.grad(outs, ins, cots, allow_unused=True)
    ga = torch.autograd.grad(touts, tins, [to_tpu(c) for c in cots], allow_unused=True)
    assert_same(list(ge), [g if g is not None else None for g in ga], f"{msg} (grad)", **tolerance)


def _unwrap(op: Any) -> Any:
    """An Impl's op, or ``op`` itself (an OpOverload's ``.op`` is its C++ builtin)."""
    if isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket, str)):
        return op
    return getattr(op, "op", op)


def reference_of(op: Any) -> Callable[..., Any]:
    """The CPU reference of ``op``: a custom op's ``reference=``, else the op itself."""
    overload = resolve_overload(_unwrap(op))
    qual = overload._schema.name
    if qual in DECLARED:
        ref = DECLARED[qual].reference
        if ref is None:
            raise ValueError(f"{qual} has no reference=...; check_parity needs one")
        return ref
    return overload


def check_parity(op: Any, *examples: tuple, strategy: Any = None, max_examples: int = 10,
                 grad: bool = False, **tolerance: float) -> int:
    """Every tpu impl of ``op`` that accepts an example matches the CPU reference.

    ``examples`` are argument tuples of CPU tensors and Python values; ``strategy`` is a
    Hypothesis strategy drawing such tuples. Returns the number of (example, impl) pairs
    checked; raises AssertionError with a reproducer on the first mismatch.
    """
    overload = registry.resolve_overload(_unwrap(op))
    ref = reference_of(op)
    checked = 0

    def one(args: tuple) -> None:
        nonlocal checked
        expected = ref(*args)
        for impl in registry.impls(overload):
            meta = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, args)
            if impl.check(*meta) is not None:
                continue
            with registry.force(impl):
                actual = overload(*to_tpu(args))
            assert_same(expected, actual, f"{overload} impl {impl.kind}:{impl.name}\n"
                        f"reproduce: {reproducer(overload, args)}", **tolerance)
            checked += 1
    for ex in examples:
        one(tuple(ex))
    if strategy is not None:
        from hypothesis import given, settings
        settings(max_examples=max_examples, deadline=None)(given(strategy)(lambda ex: one(tuple(ex))))()
    return checked


def reproducer(op: Any, args: Iterable[Any], kwargs: dict | None = None, impl: Any = None) -> str:
    """A few lines of Python that rebuild ``args`` exactly and compare ``op`` on tpu with CPU.

    Tensors built by ``make_tensor`` (they carry their recipe) are printed as that recipe,
    so the tpu side gets the same strides; other tensors as their exact values (or, when
    large, as a seeded recipe note). ``impl`` (an ``Impl``) is forced on the tpu side.
    """
    kwargs = kwargs or {}
    lines = ["import torch, tpu_kernels",
             "from tpu_kernels import registry",
             "from tpu_kernels.testing import assert_same, make_tensor, to_tpu"]
    counter = [0]

    def name_of(a: Any, device: str) -> str:
        if isinstance(a, torch.Tensor):
            recipe = getattr(a, "_tpu_recipe", None)
            i = counter[0]
            counter[0] += 1
            if recipe is not None:
                lines.append(f"a{i} = make_tensor({_recipe_src(recipe)}, device={device!r})")
            else:
                lines.append(f"a{i} = {_tensor_src(a)}" + (".to('tpu')" if device == "tpu" else ""))
            return f"a{i}"
        if isinstance(a, (list, tuple)):
            inner = ", ".join(name_of(x, device) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
        return _value_src(a)

    opname = f"torch.ops.{op}" if not isinstance(op, str) else op
    cpu_args = [name_of(a, "cpu") for a in args]
    cpu_kw = {k: name_of(v, "cpu") for k, v in kwargs.items()}
    call = ", ".join(cpu_args + [f"{k}={v}" for k, v in cpu_kw.items()])
    lines.append(f"expected = {opname}({call})")
    tpu_args = [name_of(a, "tpu") for a in args]
    tpu_kw = {k: name_of(v, "tpu") for k, v in kwargs.items()}
    call = ", ".join(tpu_args + [f"{k}={v}" for k, v in tpu_kw.items()])
    if impl is not None:
        lines.append(f"impl = [i for i in registry.impls({opname}) if (i.kind, i.name) == "
                     f"({impl.kind!r}, {impl.name!r})][0]")
        lines.append("with registry.force(impl):")
        lines.append(f"    actual = {opname}({call})")
    else:
        lines.append(f"actual = {opname}({call})")
    lines.append("assert_same(expected, actual)")
    return "\n".join(lines)


def _value_src(v: Any) -> str:
    if isinstance(v, float):
        if v != v:
            return "float('nan')"
        if v in (float("inf"), float("-inf")):
            return f"float('{v}')"
    if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return f"torch.{str(v).replace('torch.', '')}" if isinstance(v, torch.dtype) else repr(str(v))
    return repr(v)


def _tensor_src(t: torch.Tensor) -> str:
    t = t.detach().cpu()
    if t.numel() > 512:
        return (f"torch.empty({tuple(t.shape)}, dtype={t.dtype})  # {t.numel()} elements: "
                f"too large to print; rerun the failing Hypothesis example to get them")
    vals = t.to(torch.float64 if t.dtype.is_floating_point else t.dtype).tolist()
    src = repr(vals).replace("nan", "float('nan')").replace("inf", "float('inf')")
    return f"torch.tensor({src}, dtype={t.dtype}).reshape({tuple(t.shape)})"


# -- tensors from recipes ------------------------------------------------------------------
# Special values per dtype (where the op is defined on them): zeros of both signs,
# infinities, nan, large and tiny magnitudes.
def special_values(dtype: torch.dtype) -> list:
    if dtype == torch.bool:
        return [True, False]
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return [0, 1, -1, 7, -8, 100, info.max // 3, -(info.max // 3)] if info.min < 0 else [0, 1, 7, 100, 255]
    fi = torch.finfo(dtype)
    return [0.0, -0.0, float("inf"), float("-inf"), float("nan"), fi.max / 4, -fi.max / 4,
            fi.tiny, -fi.tiny, 1.0, -1.0, 0.5]


def _recipe_src(r: dict) -> str:
    parts = [f"{tuple(r['shape'])!r}", f"torch.{str(r['dtype']).replace('torch.', '')}"]
    for k in ("seed", "values", "layout", "low", "high"):
        if r.get(k) is not None:
            parts.append(f"{k}={r[k]!r}")
    return ", ".join(parts)


def make_tensor(shape: Iterable[int], dtype: torch.dtype, seed: int = 0, values: str = "normal",
                layout: str = "contiguous", low: float | None = None, high: float | None = None,
                device: str = "cpu") -> torch.Tensor:
    """A tensor from a recipe: the same values (seeded CPU generator) on any device.

    ``values``: "normal" (floats randn, ints in [-9, 9], bools random), "special" (normal
    with some elements replaced by ``special_values``), "positive" (in [0.1, 3.1)),
    "unit" (in (-1, 1)), "prob" (in (0.02, 0.98)), "int" (integers in [low, high)),
    "distinct" (each last-dim row a permutation of 0..n-1: no ties), "unique_int" (distinct
    integers in [0, high)), "zeros".
    ``layout``: "contiguous", "transposed" (last two dims swapped from a contiguous base),
    "stepped" (every other element of the last dim), "expanded" (dim 0 broadcast from
    size 1), "offset" (a slice starting at element 1). On ``device`` the same view is
    taken of the moved base, so a tpu tensor has the CPU tensor's strides.
    """
    shape = tuple(int(s) for s in shape)
    gen = torch.Generator().manual_seed(int(seed))
    nd = len(shape)
    if layout == "transposed" and nd >= 2:
        base_shape = shape[:-2] + (shape[-1], shape[-2])
    elif layout == "stepped" and nd >= 1:
        base_shape = shape[:-1] + (2 * shape[-1],)
    elif layout == "expanded" and nd >= 1:
        base_shape = (1,) + shape[1:]
    elif layout == "offset":
        base_shape = (max(1, _numel(shape)) + 1,)
    else:
        layout = "contiguous"
        base_shape = shape
    base = _values(base_shape, dtype, gen, values, low, high)
    if layout == "offset":
        base = base[:_numel(shape) + 1]
    if device != "cpu":
        base = base.to(device)
    if layout == "transposed":
        out = base.transpose(-1, -2)
    elif layout == "stepped":
        out = base[..., ::2]
    elif layout == "expanded":
        out = base.expand(shape)
    elif layout == "offset":
        out = base[1:].view(shape) if _numel(shape) else base[1:1].view(shape)
    else:
        out = base
    if device == "cpu":
        out._tpu_recipe = dict(shape=shape, dtype=dtype, seed=int(seed), values=values,
                               layout=layout, low=low, high=high)
    return out


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _values(shape, dtype, gen, values, low, high) -> torch.Tensor:
    n = _numel(shape)
    if values == "zeros":
        return torch.zeros(shape, dtype=dtype)
    if values == "int" or (values in ("normal", "special") and not dtype.is_floating_point and dtype != torch.bool):
        lo = int(low) if low is not None else -9
        hi = int(high) if high is not None else 10
        if dtype == torch.bool:
            lo, hi = 0, 2
        out = torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64)
        if values == "special" and n:
            out = _sprinkle_special(out, dtype, gen)
        return out.to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if values == "unique_int":  # distinct integers in [0, high): non-colliding indices
        hi = int(high) if high is not None else max(n, 1)
        perm = torch.randperm(max(hi, n), generator=gen)[:n] % max(hi, 1)
        return perm.reshape(shape).to(dtype)
    if values == "distinct":
        last = shape[-1] if shape else 1
        keys = torch.rand(shape if shape else (1,), generator=gen)
        perm = keys.argsort(dim=-1).to(torch.float64)
        out = (perm - last / 2).reshape(shape)
        return out.to(dtype)
    if values == "positive":
        out = torch.rand(shape, generator=gen, dtype=torch.float64) * 3 + 0.1
    elif values == "unit":
        out = torch.rand(shape, generator=gen, dtype=torch.float64) * 1.98 - 0.99
    elif values == "prob":
        out = torch.rand(shape, generator=gen, dtype=torch.float64) * 0.96 + 0.02
    else:
        out = torch.randn(shape, generator=gen, dtype=torch.float64)
        if low is not None or high is not None:
            lo = low if low is not None else -3.0
            hi = high if high is not None else 3.0
            out = torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
    if values == "special" and n:
        out = _sprinkle_special(out, dtype, gen)
    return out.to(dtype)


def _sprinkle_special(out: torch.Tensor, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """About 30% of ``out``'s elements replaced by ``dtype``'s special values (computed
    in ``out``'s wider dtype, cast by the caller)."""
    sv = torch.tensor(special_values(dtype), dtype=out.dtype)
    pick = torch.randint(0, len(sv), out.shape, generator=gen)
    mask = torch.rand(out.shape, generator=gen) < 0.3
    return torch.where(mask, sv[pick], out)
