"""What a lowering may ask about the call it is lowering, while it is being traced.

Torch's meta functions are the source of truth for result dtypes and shapes; the
dispatcher publishes them here so lowerings follow torch's promotion rules without
re-deriving them, and random ops get their PRNG key the same way.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import torch

from tpu_kernels.registry.dtypes import to_jax_dtype


@dataclasses.dataclass(frozen=True)
class OutMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclasses.dataclass
class Call:
    outs: tuple[OutMeta | None, ...]
    key: Any = None  # a jax PRNG key for random ops
    # (violated: jax bool scalar, exception class, message) raised after the op runs
    checks: list = dataclasses.field(default_factory=list)


_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("tpu_kernels_call", default=None)


# torch's float32 matmul precision as JAX's default for every dot a lowering makes without
# naming one (``a @ b`` in a lowering, jnp.linalg's own dots): unset, JAX's default on a TPU
# is one bfloat16 pass, where torch computes float32 ("highest", torch's default)
_DEFAULT_PRECISION = {"highest": "highest", "high": "high", "medium": "bfloat16"}


@contextlib.contextmanager
def lowering(call: Call) -> Iterator[None]:
    """The context of one op's lowering: its ``Call`` and torch's matmul precision."""
    token = _CALL.set(call)
    try:
        with jax.default_matmul_precision(_DEFAULT_PRECISION[torch.get_float32_matmul_precision()]):
            yield
    finally:
        _CALL.reset(token)


def _call() -> Call:
    call = _CALL.get()
    if call is None:
        raise RuntimeError("no op is being lowered: out_dtype()/rng_key() are only valid inside a lowering")
    return call


def out_meta(i: int = 0) -> OutMeta:
    meta = _call().outs[i]
    if meta is None:
        raise RuntimeError(f"output {i} has no tensor metadata")
    return meta


def out_dtype(i: int = 0) -> jnp.dtype:
    """The jax dtype torch gives output ``i`` of the op being lowered."""
    return to_jax_dtype(out_meta(i).dtype)


def out_shape(i: int = 0) -> tuple[int, ...]:
    return out_meta(i).shape


def rng_key() -> jax.Array:
    """A fresh PRNG key for the random op being lowered."""
    key = _call().key
    if key is None:
        raise RuntimeError("rng_key() called by an impl not registered with random=True")
    return key


def check(ok: jax.Array, message: str, exc: type = IndexError) -> None:
    """Raise ``exc(message)`` if ``ok`` is not all true, without a host sync per op.

    The condition is computed with the op's result; the dispatcher raises it at the next
    synchronisation (``.item()``, ``.cpu()``, printing, ``torch.tpu.synchronize()``), or at
    once with ``TPU_KERNELS_SYNC_CHECKS=1``. XLA would otherwise clamp or drop the bad
    values silently. Outside a lowering (e.g. a kernel called from JAX) it does nothing, and
    so it does with ``index_checks(False)`` / ``TPU_KERNELS_INDEX_CHECKS=0`` (the
    dispatcher keys its cache on that switch, so toggling it retraces).
    """
    call = _CALL.get()
    if call is not None and INDEX_CHECKS.on:
        call.checks.append((jnp.logical_not(jnp.all(ok)), exc, message))


class Switch:
    """A process-wide on/off flag. ``switch.set(v)`` sets it at once and returns a context
    manager that restores the old value on exit: a plain call, or a ``with`` block."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def set(self, on: bool) -> "_Restore":
        restore = _Restore(self, self.on)
        self.on = bool(on)
        return restore

    def __bool__(self) -> bool:
        return self.on


class _Restore:
    def __init__(self, switch: Switch, old: bool) -> None:
        self._switch, self._old = switch, old

    def __enter__(self) -> "_Restore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._switch.on = self._old


# TPU_KERNELS_INDEX_CHECKS=0: lowerings compute no check flags at all (XLA then clamps or
# drops bad indices silently). Read when an op is traced; part of the dispatch cache key.
INDEX_CHECKS = Switch(os.environ.get("TPU_KERNELS_INDEX_CHECKS", "1") not in ("", "0"))


def index_checks(on: bool = True) -> _Restore:
    """Compute device-side checks (index ranges, integer division by zero, probabilities)
    or not (``TPU_KERNELS_INDEX_CHECKS``); toggling retraces ops, it never reuses stale code.
    A plain call switches for good; a ``with`` block for the block."""
    return INDEX_CHECKS.set(on)
