"""Torch's checks on the values of number arguments, made on every call.

The dispatcher keys its caches by a number argument's type, not its value (a new
learning rate or dropout rate must not retrace), so torch's meta function, which holds
some of these checks, runs only on a signature's first call; torch's CPU kernels hold
the others. Each rule names the overloads, the arguments it reads (with their schema
defaults), when the values are bad and torch's message; a rule marked ``"tensors"`` also
reads tensor arguments (their dtypes: ``int_tensors ** -1``). ``checker(op)`` gives the
dispatcher one function per op (None for the many ops without a rule).

    {"ops": ("aten::huber_loss",), "args": ("delta",),
     "bad": lambda delta: delta <= 0, "message": "..."}
"""
from __future__ import annotations

from typing import Any, Callable

from torch._ops import OpOverload


def _num(v: float) -> str:
    """A number as torch's C++ messages print one (``-1``, ``0.5``, ``1e-05``)."""
    return f"{v:g}"


RULES: list[dict[str, Any]] = [
    {"ops": ("aten::smooth_l1_loss", "aten::smooth_l1_loss_backward"), "args": ("beta",),
     "bad": lambda beta: beta < 0,
     "message": lambda beta: "smooth_l1_loss does not support negative values for beta."},
    {"ops": ("aten::huber_loss", "aten::huber_loss_backward"), "args": ("delta",),
     "bad": lambda delta: delta <= 0,
     "message": lambda delta: "huber_loss does not support non-positive values for delta."},
    {"ops": ("aten::celu", "aten::celu_"), "args": ("alpha",),
     "bad": lambda alpha: alpha == 0,
     "message": lambda alpha: "ZeroDivisionError: alpha cannot be 0 for CELU"},
    {"ops": ("aten::bernoulli.p", "aten::bernoulli_.float"), "args": ("p",),
     "bad": lambda p: not 0 <= p <= 1,
     "message": lambda p: f"bernoulli_ expects p to be in [0, 1], but got p={_num(p)}"},
    {"ops": ("aten::uniform", "aten::uniform_"), "args": ("from", "to"),
     "bad": lambda lo, hi: lo > hi,
     "message": lambda lo, hi: f"uniform_ expects to return a [from, to) range, but found from={_num(lo)} > to={_num(hi)}"},
    {"ops": ("aten::random.from", "aten::random_.from"), "args": ("from", "to"),
     "bad": lambda lo, hi: hi is not None and lo >= hi,
     "message": lambda lo, hi: f"random_ expects 'from' to be less than 'to', but got from={lo} >= to={hi}"},
    {"ops": ("aten::normal.float_float", "aten::normal.Tensor_float", "aten::normal_",
             "aten::normal_functional"), "args": ("std",),
     "bad": lambda std: std < 0,
     "message": lambda std: f"normal expects std >= 0.0, but found std {_num(std)}"},
    {"ops": ("aten::geometric", "aten::geometric_"), "args": ("p",),
     "bad": lambda p: not 0 < p < 1,
     "message": lambda p: f"geometric_ expects p to be in (0, 1), but got p={_num(p)}"},
    {"ops": ("aten::log_normal", "aten::log_normal_"), "args": ("std",),
     "bad": lambda std: std <= 0,
     "message": lambda std: f"log_normal_ expects std > 0.0, but found std={_num(std)}"},
    {"ops": ("aten::renorm", "aten::renorm_"), "args": ("maxnorm",),
     "bad": lambda maxnorm: maxnorm < 0,
     "message": lambda maxnorm: f"renorm: expected maxnorm to be >= 0 but got {_num(maxnorm)}"},
    {"ops": ("aten::histc",), "args": ("min", "max"),
     "bad": lambda lo, hi: lo > hi,
     "message": lambda lo, hi: "torch.histc: max must be larger than min"},
    # rules that also read tensors (``"tensors": True``): their dtypes, never their values
    {"ops": ("aten::_foreach_pow.Scalar", "aten::_foreach_pow_.Scalar", "aten::_foreach_pow.ScalarList",
             "aten::_foreach_pow_.ScalarList"), "args": ("self", "exponent"), "tensors": True,
     "bad": lambda xs, e: _int_to_negative_int(xs, e),
     "message": lambda xs, e: "Integers to negative integer powers are not allowed."},
]


def _int_to_negative_int(xs: list, exponent: Any) -> bool:
    """Some integer tensor of ``xs`` raised to a negative Python int (its own, for a list)."""
    es = exponent if isinstance(exponent, (list, tuple)) else [exponent] * len(xs)
    return any(type(e) is int and e < 0 and not (x.is_floating_point() or x.is_complex())
               for x, e in zip(xs, es))


def _names(op: OpOverload) -> set[str]:
    """The names a rule may use for ``op``: ``aten::name`` and ``aten::name.overload``."""
    base = f"aten::{op._schema.name.split('::')[-1]}"
    return {base, f"{base}.{op._overloadname}"} if op._overloadname != "default" else {base}


def _reader(op: OpOverload, name: str) -> Callable[[tuple, dict], Any]:
    """``(args, kwargs) -> value`` of argument ``name`` of ``op`` (its default if absent)."""
    for i, a in enumerate(op._schema.arguments):
        if a.name == name:
            default = a.default_value if a.has_default_value() else None
            kw_only = a.kwarg_only

            def read(args: tuple, kwargs: dict, i=i) -> Any:
                if not kw_only and i < len(args):
                    return args[i]
                return kwargs.get(name, default)
            return read
    raise KeyError(f"{op} has no argument {name!r}")


def checker(op: OpOverload) -> Callable[[tuple, dict], None] | None:
    """The function that raises torch's error for ``op``'s bad argument values, or None."""
    names = _names(op)
    rules = [r for r in RULES if names & set(r["ops"])]
    if not rules:
        return None
    bound = [(r, [_reader(op, a) for a in r["args"]]) for r in rules]

    def check(args: tuple, kwargs: dict) -> None:
        for rule, readers in bound:
            values = [read(args, kwargs) for read in readers]
            # a tensor or symbolic value is not a number to check (unless the rule reads tensors)
            numbers = rule.get("tensors") or all(isinstance(v, (int, float)) or v is None for v in values)
            if numbers and rule["bad"](*values):
                raise RuntimeError(rule["message"](*values))
    return check
