"""Parity of the elementwise lowerings (registry/xla/unary.py, arithmetic.py, binary.py, comparison.py,
ternary.py) with CPU torch."""
from __future__ import annotations

import re

import pytest
import torch

from helpers import check, to_tpu

G = torch.Generator()


@pytest.fixture(autouse=True)
def _seed():
    G.manual_seed(0)  # each test sees the same values whatever ran before it


def rand(*shape, dtype=torch.float32, low=-3.0, high=3.0):
    x = torch.rand(*shape, generator=G) * (high - low) + low
    if dtype.is_floating_point:
        return x.to(dtype)
    if dtype == torch.bool:
        return x > 0
    return x.round().to(dtype)


def special(dtype=torch.float32):
    """Values at the edges: zeros of both signs, infinities, nan, halves, big and tiny."""
    return torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, float("inf"), float("-inf"),
                         float("nan"), 1e-30, 1e30, 3.7, -7.2], dtype=dtype)


# -- unary -----------------------------------------------------------------------------------
UNARY_FLOAT = ["exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
               "reciprocal", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
               "asinh", "acosh", "atanh", "sigmoid", "tanh", "erf", "erfc", "erfinv", "sinc",
               "deg2rad", "rad2deg", "angle"]
UNARY_SAME = ["neg", "abs", "sign", "sgn", "ceil", "floor", "trunc", "round", "frac",
              "isnan", "isinf", "isposinf", "isneginf", "isfinite", "signbit", "logical_not"]
# domains where the op is finite, so tolerances compare meaningful values
DOMAIN = {"log": (0.01, 5), "log2": (0.01, 5), "log10": (0.01, 5), "log1p": (-0.9, 5),
          "sqrt": (0.01, 5), "rsqrt": (0.05, 5), "asin": (-0.99, 0.99), "acos": (-0.99, 0.99),
          "atanh": (-0.95, 0.95), "acosh": (1.01, 5), "erfinv": (-0.95, 0.95),
          "tan": (-1.2, 1.2), "reciprocal": (0.2, 4)}


def with_specials(x):
    """``x`` (6x6) with the special values in its first row and a half."""
    x = x.clone()
    sp = special(x.dtype)
    x.view(-1)[: sp.numel()] = sp
    return x


@pytest.mark.parametrize("name", UNARY_FLOAT + UNARY_SAME)
def test_unary_float_inputs(name):
    lo, hi = DOMAIN.get(name, (-3, 3))
    fn = getattr(torch, name)
    x = with_specials(rand(6, 6, low=lo, high=hi))
    check(fn, x)
    check(fn, x.t())  # non-contiguous
    check(fn, rand(6, 6, dtype=torch.bfloat16, low=lo, high=hi))


@pytest.mark.parametrize("name", ["exp", "sqrt", "sin", "sigmoid", "reciprocal", "neg", "abs",
                                  "sign", "ceil", "round", "isnan", "signbit", "logical_not",
                                  "deg2rad", "angle"])
def test_unary_int(name):
    check(getattr(torch, name), rand(4, 5, dtype=torch.int64, low=-9, high=9))


@pytest.mark.parametrize("name", ["angle", "abs", "sgn", "neg", "exp", "sqrt", "log", "reciprocal",
                                  "sigmoid", "isnan", "isfinite"])
def test_unary_complex(name):
    # angle and abs give real results from a complex input: the imaginary part counts
    z = torch.complex(rand(5, 4), rand(5, 4))
    z.view(-1)[:6] = torch.tensor([1 + 1j, -1 + 1j, -1 - 1j, 3j, -2.0 + 0j, 0j])
    check(getattr(torch, name), z)
    check(getattr(torch, name), z.to(torch.complex128))


def test_conj_physical():
    z = torch.complex(rand(3, 4), rand(3, 4))
    check(torch.conj_physical, z)
    check(torch.conj_physical, rand(3, 4))
    check(torch.ops.aten._conj_physical, z)
    check(lambda t: torch.fft.ihfft2(t), rand(3, 4, 6))   # ihfft's last step


def test_logit_half_types():
    # torch's CPU kernel rounds eps, 1 - eps, 1 - x and the quotient to the half type
    for dt in (torch.bfloat16, torch.float16):
        x = rand(200, low=0.0, high=1.0).to(dt)
        for eps in (None, 0.0, 0.05, 1e-6):
            check(lambda t, eps=eps: torch.logit(t, eps), x)


def test_unary_shapes():
    check(torch.exp, torch.tensor(0.5))
    check(torch.neg, torch.empty(0, 3))
    check(torch.bitwise_not, rand(6, dtype=torch.int32, low=-50, high=50))
    check(torch.bitwise_not, rand(6, dtype=torch.bool))
    check(torch.abs, rand(6, dtype=torch.int8, low=-100, high=100))


def test_unary_inplace():
    def f(x):
        y = x.clone()
        y.exp_()
        y.neg_().sqrt_()
        return y
    check(f, rand(3, 4))
    check(lambda x: x.clone().ceil_(), rand(3, 4))


def test_round_decimals():
    x = rand(20, low=-100, high=100)
    for d in (0, 1, 2, -1, -2):
        check(lambda t: torch.round(t, decimals=d), x)
    check(lambda t: torch.round(t, decimals=1), rand(7, dtype=torch.bfloat16))


def test_nan_to_num_logit_frexp():
    check(torch.nan_to_num, special())
    check(lambda x: torch.nan_to_num(x, nan=1.5, posinf=9.0, neginf=-9.0), special())
    check(torch.nan_to_num, special(torch.bfloat16))
    check(torch.nan_to_num, rand(5, dtype=torch.int32))
    check(torch.logit, rand(10, low=0.01, high=0.99))
    check(lambda x: torch.logit(x, eps=0.1), rand(10, low=-0.5, high=1.5))
    check(torch.frexp, special())
    check(torch.frexp, rand(4, 3, dtype=torch.bfloat16, low=-100, high=100))


# -- binary arithmetic ---------------------------------------------------------------------------
ARITH_DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.int32]


@pytest.mark.parametrize("dtype", ARITH_DTYPES)
def test_add_sub_mul(dtype):
    a, b = rand(3, 5, dtype=dtype), rand(5, dtype=dtype)  # broadcasting
    for f in (torch.add, torch.sub, torch.mul):
        check(f, a, b)
        check(f, a.t(), rand(5, 3, dtype=dtype))
        check(lambda x: f(x, 3), a)
    check(lambda x, y: torch.add(x, y, alpha=2), a, b)
    check(lambda x, y: torch.sub(x, y, alpha=3), a, b)
    check(lambda x, y: torch.rsub(x, y, alpha=2), a, b)
    check(lambda x: torch.rsub(x, 5), a)
    check(lambda x: torch.rsub(x, 5, alpha=2), a)


def test_arith_promotion():
    f, i, h = rand(4), rand(4, dtype=torch.int64), rand(4, dtype=torch.bfloat16)
    check(torch.add, i, f)
    check(torch.mul, h, f)
    check(lambda x: x * 2.5, i)                 # int tensor * float scalar -> float
    check(lambda x: x + torch.tensor(2.0), h)   # 0-d tensor does not promote bf16
    check(lambda x: x + torch.tensor(2.0), i)
    check(lambda x, y: x + y, h, torch.tensor(1.5, dtype=torch.float64))
    check(lambda x: x * 0.1, rand(5, dtype=torch.float64))
    check(torch.add, rand(4, dtype=torch.bool), rand(4, dtype=torch.bool))
    check(lambda x: x + 1, torch.empty(0))
    check(torch.mul, torch.tensor(2.0), torch.tensor(3.0))


def test_scalar_args_do_not_retrace():
    from tpu_kernels import dispatch
    x = rand(4).to("tpu")
    dispatch.clear_cache()   # a fresh signature: whatever ran before in this process traced its own
    for s in (1.5, 2.5, 3.5):
        torch.add(x, x, alpha=s).cpu()
        torch.addcdiv(x, x, x, value=s).cpu()
        torch.clamp(x, -s, s).cpu()
    assert dispatch.TRACES[torch.ops.aten.add.Tensor] == 1
    assert dispatch.TRACES[torch.ops.aten.addcdiv.default] == 1
    assert dispatch.TRACES[torch.ops.aten.clamp.default] == 1


def test_python_scalar_operand_does_not_retrace():
    from tpu_kernels import dispatch
    x = rand(4).to("tpu")
    dispatch.clear_cache()   # a fresh signature: whatever ran before in this process traced its own
    for s in (1.5, 2.5, 3.5):
        (x + s).cpu()
    assert dispatch.TRACES[torch.ops.aten.add.Tensor] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_division_family(dtype):
    a = rand(6, 7, dtype=dtype, low=-20, high=20)
    b = rand(6, 7, dtype=dtype, low=-5, high=5)
    b = torch.where(b == 0, torch.ones_like(b), b)
    check(torch.div, a, b)
    check(lambda x, y: torch.div(x, y, rounding_mode="trunc"), a, b)
    check(lambda x, y: torch.div(x, y, rounding_mode="floor"), a, b)
    check(lambda x: torch.div(x, -3, rounding_mode="floor"), a)
    check(lambda x: torch.div(x, 3, rounding_mode="trunc"), a)
    check(torch.floor_divide, a, b)
    check(lambda x: torch.floor_divide(x, -4), a)
    check(torch.remainder, a, b)
    check(lambda x: torch.remainder(x, -3), a)
    check(lambda y: torch.remainder(7, y), b)
    check(torch.fmod, a, b)
    check(lambda x: torch.fmod(x, -3), a)
    check(lambda x: x / 2, a)


def test_division_special_values():
    s = special()
    b = torch.tensor([0.0, 1.0, -2.0, 0.0, -0.0, 3.0, 0.7, -0.7, 2.0, 2.0, 1.0, 5.0, 1e-30, -1.0, 0.0])
    for mode in (None, "trunc", "floor"):
        check(lambda x, y: torch.div(x, y, rounding_mode=mode), s, b)
    check(torch.remainder, s, b)
    check(torch.fmod, s, b)
    check(torch.floor_divide, s, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pow_float(dtype):
    x = rand(5, 6, dtype=dtype)
    for e in (2, 3, 0.5, -0.5, -1, -2, 1.7, 0, 1, 2.0):
        check(lambda t: torch.pow(t, e), x.abs() + 0.1)
        check(lambda t: torch.pow(t, e), x)
    check(torch.pow, x.abs(), rand(5, 6, dtype=dtype))
    check(lambda t: torch.pow(2.0, t), x)
    check(lambda t: torch.pow(2, t), x)
    check(lambda t: t ** 2, special())


def test_pow_int_exact():
    x = rand(5, 6, dtype=torch.int64, low=-9, high=9)
    check(lambda t: t ** 2, x)
    check(lambda t: t ** 3, x)
    check(lambda t: t ** 2.5, x.abs())
    check(torch.pow, x, rand(5, 6, dtype=torch.int64, low=0, high=12))
    check(torch.pow, torch.tensor([3, -3, 7, 2], dtype=torch.int64), torch.tensor([39, 39, 22, 62]))
    check(lambda t: torch.pow(3, t), torch.tensor([0, 1, 5, 20, 39]))
    check(torch.pow, torch.tensor([1, -1, 2, -1]), torch.tensor([-3, -3, -1, -2]))
    check(lambda t: t ** 3, rand(7, dtype=torch.int32, low=-100, high=100))
    check(lambda t: torch.float_power(t, 2), x)


def test_pow_retrace_free():
    from tpu_kernels import dispatch
    x = rand(4).to("tpu")
    dispatch.clear_cache()   # a fresh signature: whatever ran before in this process traced its own
    for e in (2, 3, 4):
        (x ** e).cpu()
    assert dispatch.TRACES[torch.ops.aten.pow.Tensor_Scalar] == 1


NEGATIVE_INT_POWER = "Integers to negative integer powers are not allowed."


def test_pow_int_to_negative_python_int_raises():
    """torch refuses an integer (or bool) tensor to a negative Python int, in place and with
    out= too; tpu returned 0s (1s for |x| == 1)."""
    x = torch.tensor([2, 3]).to("tpu")
    calls = [lambda: x ** -1, lambda: torch.tensor([1, -1]).to("tpu") ** -2, lambda: x.clone().pow_(-1),
             lambda: torch.pow(x, -1, out=torch.empty_like(x)), lambda: torch.tensor([True]).to("tpu") ** -1,
             lambda: torch.tensor([2], dtype=torch.uint8).to("tpu") ** -3]
    for call in calls:
        with pytest.raises(RuntimeError, match=re.escape(NEGATIVE_INT_POWER)):
            call()
    i = torch.tensor([2, 1, -1, -1, 0])
    check(torch.pow, i, torch.tensor([-1, -1, -1, -2, -1]))   # a tensor exponent: values
    check(lambda t: t ** -1.5, i.abs())                        # a float exponent promotes
    check(lambda t: 2 ** t, torch.tensor([-1, 2]))
    check(lambda t: t ** 0, i)
    check(lambda t: t ** 5, i)


BINARY_FLOAT = ["atan2", "hypot", "copysign", "nextafter", "xlogy", "logaddexp", "logaddexp2",
                "maximum", "minimum", "fmax", "fmin", "heaviside"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", BINARY_FLOAT)
def test_binary_float(name, dtype):
    fn = getattr(torch, name)
    a, b = rand(4, 5, dtype=dtype), rand(5, dtype=dtype)
    if name == "xlogy":
        b = b.abs()
    check(fn, a, b)
    check(fn, a.t().contiguous().t(), b)
    sa = special(dtype)
    check(fn, sa, sa.flip(0))


def test_binary_float_scalars_and_ints():
    x = rand(6, low=0.1, high=4)
    check(lambda t: torch.xlogy(t, 2.0), x)
    check(lambda t: torch.xlogy(2.0, t), x)
    check(torch.xlogy, torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.0, float("nan"), 0.0]))
    check(torch.special.xlog1py, x, x)
    check(lambda t: torch.special.xlog1py(t, 2.0), x)
    i = rand(6, dtype=torch.int64)
    check(torch.atan2, i, i.flip(0))
    check(torch.maximum, i, i.flip(0))
    check(torch.minimum, rand(6, dtype=torch.int32), i)
    check(torch.ldexp, x, rand(6, dtype=torch.int64, low=-4, high=4))
    check(torch.ldexp, rand(6, dtype=torch.bfloat16), rand(6, dtype=torch.int32, low=-4, high=4))


def test_integer_binary():
    a = rand(5, 6, dtype=torch.int64, low=-60, high=60)
    b = rand(5, 6, dtype=torch.int64, low=-60, high=60)
    for f in (torch.gcd, torch.lcm, torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor):
        check(f, a, b)
    check(lambda x: x & 6, a)
    check(lambda x: x | 6, rand(4, dtype=torch.int32))
    check(lambda x: x ^ 6, a)
    check(lambda x, y: torch.bitwise_and(x, y), rand(5, dtype=torch.bool), rand(5, dtype=torch.bool))
    check(lambda x, y: x ^ y, rand(5, dtype=torch.bool), rand(5, dtype=torch.bool))
    s = torch.tensor([0, 1, 3, 31, 32, 63, 64, 70, 5], dtype=torch.int64)
    v = torch.tensor([1, -1, 5, -7, 123, 1, -1, 9, -1024], dtype=torch.int64)
    check(torch.bitwise_left_shift, v, s)
    check(torch.bitwise_right_shift, v, s)
    check(lambda x: x << 2, v)
    check(lambda x: x >> 2, v)
    i32, s32 = v.to(torch.int32), s.clamp(max=40).to(torch.int32)
    check(torch.bitwise_left_shift, i32, s32)
    check(torch.bitwise_right_shift, i32, s32)
    u8 = torch.tensor([1, 128, 255, 7], dtype=torch.uint8)
    check(torch.bitwise_right_shift, u8, torch.tensor([1, 3, 8, 9], dtype=torch.uint8))


def raises_as_cpu(fn, *args) -> None:
    """``fn(*args)`` raises on tpu what it raises on CPU: the same type and message."""
    with pytest.raises(Exception) as cpu:
        fn(*args)
    with pytest.raises(cpu.type, match=re.escape(str(cpu.value))) as tpu:
        fn(*to_tpu(args))
    assert type(tpu.value) is cpu.type


BITWISE_CALLS = [
    lambda x: torch.bitwise_and(x, 1), lambda x: torch.bitwise_or(x, x), lambda x: torch.bitwise_xor(1, x),
    lambda x: x & 1, lambda x: x | x, lambda x: 1 ^ x, lambda x: x.clone().bitwise_and_(1),
    lambda x: x.clone().__ior__(1), lambda x: torch.bitwise_xor(x, 1, out=torch.empty_like(x)),
    torch.bitwise_not, lambda x: x.clone().bitwise_not_(), lambda x: torch.bitwise_not(x, out=torch.empty_like(x)),
]


def test_bitwise_on_floats_raises_as_cpu():
    """torch has integer and bool bitwise kernels only: NotImplementedError, where tpu raised
    JAX's TypeError (which ``x & 1`` turned into 'unsupported operand type(s)')."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64):
        for call in BITWISE_CALLS:
            raises_as_cpu(call, torch.tensor([1.5, 2.0], dtype=dtype))
    raises_as_cpu(torch.bitwise_and, torch.tensor([3]), torch.tensor([1.5]))   # promotes to Float
    raises_as_cpu(lambda b: b | 1.0, torch.tensor([True]))


def test_shifts_on_floats_and_bools_raise_as_cpu():
    for dtype in (torch.float32, torch.float16):
        for call in (lambda x: x << 1, lambda x: x >> 1, lambda x: 1 << x, lambda x: torch.bitwise_left_shift(x, 1),
                     lambda x: torch.bitwise_right_shift(x, x)):
            raises_as_cpu(call, torch.tensor([1.5, 2.0], dtype=dtype))
    b = torch.tensor([True, False])
    raises_as_cpu(torch.bitwise_left_shift, b, b)   # no bool shift kernels
    raises_as_cpu(torch.bitwise_right_shift, b, b)


def test_bitwise_error_names_the_tpu_device():
    """Past the size the dispatcher re-runs on CPU for torch's own error, the lowering's error
    stands: torch's wording, the device named as CUDA's names itself ("bitwise_and_cuda")."""
    from tpu_kernels.dispatch.meta import PROBE_LIMIT
    x = torch.zeros(PROBE_LIMIT + 1, device="tpu")
    with pytest.raises(NotImplementedError, match=re.escape('"bitwise_and_tpu" not implemented for \'Float\'')):
        torch.bitwise_and(x, 1)
    with pytest.raises(NotImplementedError, match=re.escape('"bitwise_not_tpu" not implemented for \'Half\'')):
        torch.bitwise_not(x.half())


# -- comparisons, logical, where, clamp --------------------------------------------------------------
@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_compare(op):
    f = getattr(torch, op)
    a = rand(4, 5, dtype=torch.int64)
    check(f, a, rand(5, dtype=torch.int64))
    check(f, a, rand(4, 5))                  # int vs float: compared as float
    check(lambda x: f(x, 0.5), a)            # int vs float scalar
    check(lambda x: f(x, 1), rand(4, 5, dtype=torch.bfloat16))
    check(f, special(), special().flip(0))
    check(lambda x: getattr(x.clone(), op + "_")(0.0), rand(3, 3))


def test_logical():
    a, b = rand(4, 5), rand(4, 5, dtype=torch.int64)
    for f in (torch.logical_and, torch.logical_or, torch.logical_xor):
        check(f, a, b)
        check(f, rand(5, dtype=torch.bool), rand(5, dtype=torch.bool))
    check(lambda x, y: x.clone().logical_and_(y), a, b)
    check(lambda x: x.clone().logical_not_(), b)


def test_where():
    c = rand(4, 5) > 0
    check(torch.where, c, rand(4, 5), rand(5))
    check(torch.where, c, rand(4, 5, dtype=torch.bfloat16), rand(4, 5))
    check(torch.where, c, rand(4, 5, dtype=torch.int64), rand(4, 5))
    check(lambda cc, y: torch.where(cc, 1.5, y), c, rand(4, 5))
    check(lambda cc, x: torch.where(cc, x, 0), c, rand(4, 5, dtype=torch.int32))
    check(lambda cc: torch.where(cc, 1.0, 0.0), c)
    check(torch.where, torch.tensor(True), rand(3), rand(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_clamp(dtype):
    x = rand(5, 6, dtype=dtype, low=-5, high=5)
    check(lambda t: torch.clamp(t, -1, 2), x)
    check(lambda t: torch.clamp(t, min=0), x)
    check(lambda t: torch.clamp(t, max=1), x)
    check(lambda t: torch.clamp(t, 3, 1), x)       # min > max -> max
    check(lambda t: torch.clamp_min(t, 0.5), x)   # float bound on int promotes
    check(lambda t: torch.clamp_max(t, 1), x)
    lo, hi = rand(6, dtype=dtype, low=-3, high=0), rand(5, 1, dtype=dtype, low=0, high=3)
    check(torch.clamp, x, lo, hi)
    check(lambda t, l: torch.clamp(t, min=l), x, lo)
    check(lambda t, h: torch.clamp(t, max=h), x, hi)
    check(torch.clamp_min, x, lo)
    check(torch.clamp_max, x, hi)
    check(lambda t: t.clone().clamp_(-1, 1), x)
    check(lambda t, l: t.clone().clamp_min_(l), x, lo)


def test_clamp_nan():
    check(lambda t: torch.clamp(t, -1, 1), special())


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize("weight", [0.5, "tensor"])
def test_lerp_of_integers_raises_as_cpu(dtype, weight):
    """torch has no integer lerp kernel; tpu returned truncated integers."""
    def run(device):
        x = torch.zeros(3, dtype=dtype, device=device)
        w = torch.ones((), dtype=dtype, device=device) if weight == "tensor" else weight
        with pytest.raises(NotImplementedError) as info:
            x.lerp(torch.ones(3, dtype=dtype, device=device), w)
        with pytest.raises(NotImplementedError):
            x.lerp_(torch.ones(3, dtype=dtype, device=device), w)
        return str(info.value)
    assert run("tpu") == run("cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lerp_addcmul_addcdiv(dtype):
    a, b, c = rand(4, 5, dtype=dtype), rand(4, 5, dtype=dtype), rand(5, dtype=dtype, low=0.5, high=2)
    for w in (0.0, 0.3, 0.5, 0.9, 1.0, 1.5, -0.2):
        check(lambda x, y: torch.lerp(x, y, w), a, b)
    check(torch.lerp, a, b, rand(4, 5, dtype=dtype, low=-0.5, high=1.5))
    check(lambda x, y: x.clone().lerp_(y, 0.1), a, b)
    check(lambda x, y, w: x.clone().lerp_(y, w), a, b, rand(5, dtype=dtype))
    check(torch.addcmul, a, b, c)
    check(lambda x, y, z: torch.addcmul(x, y, z, value=-0.3), a, b, c)
    check(torch.addcdiv, a, b, c)
    check(lambda x, y, z: torch.addcdiv(x, y, z, value=0.7), a, b, c)
    check(lambda x, y, z: x.clone().addcdiv_(y, z, value=-1e-3), a, b, c)
    check(lambda x, y, z: x.clone().addcmul_(y, z, value=2), a, b, c)


def test_addcmul_int():
    a, b, c = (rand(3, 4, dtype=torch.int64) for _ in range(3))
    check(lambda x, y, z: torch.addcmul(x, y, z, value=3), a, b, c)


# -- gradients (tier-1 differentiable ops) ----------------------------------------------------------
def test_grads():
    a = rand(3, 4, low=0.5, high=2).requires_grad_()
    b = rand(3, 4, low=0.5, high=2).requires_grad_()
    check(lambda x, y: (x * y + x / y - y).exp(), a, b, grad=True)
    check(lambda x, y: torch.pow(x, y) + x.sqrt() + x.rsqrt() + x.log() + x.reciprocal(), a, b, grad=True)
    check(lambda x: torch.tanh(x) + torch.sigmoid(x) + x.neg() + x ** 2 + x.abs(), a, grad=True)
    check(lambda x, y: torch.where(x > 1, x, y) + torch.clamp(x, 0.8, 1.5) + torch.maximum(x, y), a, b, grad=True)
    check(lambda x, y: torch.lerp(x, y, 0.3) + torch.addcmul(x, x, y) + torch.addcdiv(x, x, y), a, b, grad=True)
    check(lambda x: torch.sin(x) * torch.cos(x) + torch.erf(x) + torch.expm1(x) + torch.log1p(x), a, grad=True)


def test_inplace_and_out_variants():
    a, b = rand(4, 5, low=-9, high=9), rand(4, 5, low=0.5, high=3)
    check(lambda x, y: x.clone().floor_divide_(y), a, b)
    check(lambda x: x.clone().floor_divide_(2), rand(4, 5, dtype=torch.int64, low=-9, high=9))
    check(lambda x, y: torch.atan2(x, y, out=torch.empty_like(x)), a, b)


def test_in_place_ops_run_the_functional_overload_with_their_argument_types():
    """``x.pow_(2)`` is ``pow.Tensor_Scalar`` in place, not the same-named ``pow.Scalar``
    (a Scalar base): ``square_()`` (Adafactor) failed on tpu, and ``pow_(tensor)``,
    ``floor_divide_(tensor)``, ``float_power_`` and ``ldexp_`` took torch's decompositions."""
    from tpu_kernels.registry.opnames import functional_twin
    aten = torch.ops.aten
    assert functional_twin(aten.pow_.Scalar) is aten.pow.Tensor_Scalar
    assert functional_twin(aten.pow_.Tensor) is aten.pow.Tensor_Tensor
    assert functional_twin(aten.add_.Tensor) is aten.add.Tensor
    g = torch.Generator().manual_seed(0)
    x, e = torch.rand(3, 4, generator=g) + 0.5, torch.rand(3, 4, generator=g) + 0.1
    calls = [lambda x, e: x.pow_(2), lambda x, e: x.pow_(e), lambda x, e: x.square_(),
             lambda x, e: x.floor_divide_(e), lambda x, e: x.double().float_power_(e.double()),
             lambda x, e: x.ldexp_(e.round())]
    for call in calls:
        want = call(x.clone(), e)
        got = call(x.to("tpu"), e.to("tpu"))
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)
