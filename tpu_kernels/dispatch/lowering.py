"""The function one call signature runs: the template filled with the call's leaves, the
impl traced under the lowering context (result metadata, PRNG key, check flags), its
results cast to the dtypes torch's meta function says."""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from tpu_kernels import errors, random_state
from tpu_kernels.dispatch.cache import TRACES
from tpu_kernels.dispatch.plan import OpPlan
from tpu_kernels.dispatch.signature import fill_call, view_read
from tpu_kernels.registry import Impl
from tpu_kernels.registry.context import Call, lowering
from tpu_kernels.registry.dtypes import to_jax_dtype


def jit_fn(op, impl: Impl, targs, tkw, func_outs, outs, plan: OpPlan, write_dtypes, reads: tuple = (),
           checks: list | None = None, orders: list | None = None, keep_inputs: bool = False) -> Callable:
    """The jitted function for one call signature: reads the views it takes as their
    storages' arrays (``reads``), fills the template, lowers, casts, and lays out in
    memory order the results ``orders`` names (``results.dense_order``: torch's strides
    are not contiguous, so the result's storage is that transposed array).
    It returns (results, check flags or None); ``.checks`` says what each flag means
    (``checks``: what a persistent cache entry says, until a trace fills it again).
    ``keep_inputs``: inputs the impl does not read stay arguments of the executable, so
    that it runs on their device (``zeros_like(t)`` of a ``t`` on tpu:1; see
    ``dispatch/devices.py``)."""
    n_alias_free = [i for i, a in enumerate(plan.alias_returns) if a is None]
    expect = [m for m in outs] if not plan.mutated else None

    def lowered(*dyn):
        TRACES[op] = TRACES.get(op, 0) + 1
        key = None
        if impl.random:
            *dyn, kd = dyn
            key = random_state.key_from_data(kd)
        if any(reads):
            dyn = view_read(reads, dyn)
        a, kw = fill_call(targs, tkw, dyn)
        call = Call(tuple(func_outs), key)
        with lowering(call):
            result = impl.fn(*a, **kw)
        if plan.mutated:
            result = _cast_mutations(op, impl, result, write_dtypes, n_alias_free, outs)
        else:
            result = _cast_outputs(op, impl, result, expect)
            if orders is not None:
                result = [r if o is None or r is None else jnp.transpose(r, o)
                          for r, o in zip(result, orders)]
        checks[:] = [(exc, msg) for _, exc, msg in call.checks]
        flags = jax.numpy.stack([bad for bad, _, _ in call.checks]) if call.checks else None
        return result, flags

    checks = [] if checks is None else checks   # filled at trace time: what each flag means
    jitted = jax.jit(lowered, keep_unused=keep_inputs)
    jitted.checks = checks
    return jitted


def eager_fn(impl: Impl, targs, tkw, reads: tuple = ()) -> Callable:
    """A data-dependent impl (its result shape needs values) runs unjitted; its device-side
    checks (``context.check``) are watched like a jitted op's flags."""
    def call(*dyn):
        a, kw = fill_call(targs, tkw, view_read(reads, dyn) if any(reads) else dyn)
        ctx = Call(())
        with lowering(ctx):
            result = impl.fn(*a, **kw)
        if ctx.checks:
            errors.watch(jnp.stack([bad for bad, _, _ in ctx.checks]), impl.op,
                         [(exc, msg) for _, exc, msg in ctx.checks])
        return result
    return call


def flatten(x: Any) -> list:
    if isinstance(x, (list, tuple)):
        out = []
        for y in x:
            out.extend(flatten(y))
        return out
    return [x]


def _cast_outputs(op, impl, result, expect):
    flat = flatten(result)
    if len(flat) != len(expect):
        raise RuntimeError(f"{op}: impl {impl.name} ({impl.kind}) returned {len(flat)} outputs, torch expects {len(expect)}")
    out = []
    for r, m in zip(flat, expect):
        if m is None or r is None:
            out.append(r)
            continue
        if tuple(r.shape) != m.shape:
            raise RuntimeError(
                f"{op}: impl {impl.name} ({impl.kind}) returned shape {tuple(r.shape)}, torch's meta "
                f"function says {m.shape}: this is a bug in the impl")
        out.append(r.astype(to_jax_dtype(m.dtype)) if r.dtype != to_jax_dtype(m.dtype) else r)
    return out


def _cast_mutations(op, impl, result, write_dtypes, alias_free, outs):
    """Impls of ops with mutated args return (*alias-free returns, *new values of mutated args)."""
    flat = flatten(result)
    n_ret = len(alias_free)
    rets = _cast_outputs(op, impl, flat[:n_ret], [outs[i] for i in alias_free]) if n_ret else []
    muts = []
    for v, dt in zip(flat[n_ret:], flatten(write_dtypes)):
        muts.append(None if v is None or dt is None else v.astype(to_jax_dtype(dt)))
    return rets + muts
