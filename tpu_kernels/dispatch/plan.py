"""Per-op schema analysis, computed once per op: what each argument is (a tensor, a
scalar that is traced, a static value), which arguments the op writes, which returns
alias which arguments. The shared types of the dispatch package live here."""
from __future__ import annotations

import dataclasses
from typing import Any

from torch._ops import OpOverload

# schema argument kinds
TENSOR, TENSOR_LIST, SCALAR, SCALAR_LIST, STATIC = "tensor", "tensor_list", "scalar", "scalar_list", "static"
_SCALAR_TYPES = {"number", "Optional[number]", "float", "Optional[float]"}


class _Slot:
    """Marks where a dynamic argument sits in a call's static template."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "<slot>"


SLOT = _Slot()


@dataclasses.dataclass(eq=False)   # hashed by identity: one plan per op, a cheap cache key
class OpPlan:
    op: OpOverload
    pos_kinds: list[str]
    kw_kinds: dict[str, str]
    mutated: list[int]            # schema positions of args written in place
    names: list[str]
    alias_returns: list[int | None]   # for each return: the arg position it aliases
    is_view: bool

    def arg(self, i: int, args: tuple, kwargs: dict) -> Any:
        """Schema argument ``i`` of a call, passed by position or by name."""
        return args[i] if i < len(args) else kwargs.get(self.names[i])


_PLANS: dict[Any, OpPlan] = {}


def op_plan(op: OpOverload) -> OpPlan:
    plan = _PLANS.get(op)
    if plan is None:
        plan = _PLANS[op] = _make_plan(op)
    return plan


def _arg_kind(arg) -> str:
    t = str(arg.type)
    if t in ("Tensor", "Optional[Tensor]"):
        return TENSOR
    if t in ("List[Tensor]", "List[Optional[Tensor]]", "Optional[List[Tensor]]"):
        return TENSOR_LIST
    if t in _SCALAR_TYPES:
        return SCALAR
    if t == "List[number]":  # Scalar[]: optimizers pass new values every step
        return SCALAR_LIST
    return STATIC


def _make_plan(op: OpOverload) -> OpPlan:
    schema = op._schema
    args = schema.arguments
    kinds = [_arg_kind(a) for a in args]
    mutated = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
    alias_returns: list[int | None] = []
    for r in schema.returns:
        hit = None
        if r.alias_info is not None:
            for i, a in enumerate(args):
                if a.alias_info is not None and set(a.alias_info.before_set) & set(r.alias_info.before_set):
                    hit = i
                    break
        alias_returns.append(hit)
    return OpPlan(op, kinds, {a.name: k for a, k in zip(args, kinds)}, mutated,
                  [a.name for a in args], alias_returns, bool(op.is_view))
