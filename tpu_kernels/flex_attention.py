"""``torch.nn.attention.flex_attention`` on tpu tensors.

FlexAttention reaches a device as two higher-order ops (HOPs), ``flex_attention`` and
``flex_attention_backward``, whose arguments include the score_mod and mask_mod
callables. HOPs reach a tensor subclass through ``py_impl(<subclass>)``; ``install``
registers the tpu tensor's impls:

- inside torch.compile's tracing (traced tpu tensors) the HOP runs on the shadows, so
  Dynamo/AOTAutograd record it with its score/mask graphs;
- on real tpu tensors (eager, or a compiled graph's nodes inside its jax.jit) the call
  becomes a ``FlexSpec`` and runs the impl ``registry.route`` picks for it, as for any op:
  the Pallas kernel (``registry/bindings/flex_attention.py``) where its ``supports``
  accepts the spec, else the dense XLA impl, each as one jitted program per spec.

Three adjustments to torch's Python code, each for tpu tensors only: the public
function's device check lets "tpu" through; in eager autograd the forward saves what the
backward HOP needs directly instead of torch's per-call joint-graph trace (which makes
real tensors for its example gradient and then mixes them with fake ones); and the
torch.compile that eager flex_attention runs its HOP through keeps static shapes (with
automatic dynamic shapes, Dynamo fails on views of tpu tensors while building guards:
"compound symbols should be cached before", "sources must not be empty for symbol").
"""
from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
import threading
from typing import Any

import jax
import torch
import torch.nn.attention.flex_attention as flex_api
from torch._C import DispatchKey
from torch._higher_order_ops.flex_attention import _permute_strides
from torch.utils._pytree import tree_map

from tpu_kernels import errors
from tpu_kernels.registry import route
from tpu_kernels.registry.core import Impl
from tpu_kernels.registry.xla.flex_attention import FLEX_BWD_HOP, FLEX_HOP, FlexSpec, spec_of
from tpu_kernels import tensor as tensor_mod
from tpu_kernels.dispatch.results import wrap_result
from tpu_kernels.storage import to_jax
from tpu_kernels.tensor import TpuTensor, wrap
from tpu_kernels.tensor_values import value
log = logging.getLogger(__name__)
_LN2 = math.log(2.0)
# (HOP name, impl kind) -> calls; the latest skipped impls with their reasons
RUNS: collections.Counter = collections.Counter()
LAST_SKIPPED: dict[str, list[tuple[str, str]]] = {}


def choose(hop: Any, spec: FlexSpec) -> Impl:
    """The impl the route picks for ``spec`` (the Pallas kernel where it accepts the call,
    else the dense XLA impl); its skipped impls and reasons go to ``LAST_SKIPPED``."""
    r = route(hop, (spec,), {})
    if r.impl is None:
        raise NotImplementedError(f"flex_attention on tpu, query {spec.q_shape} {spec.dtype}: {r.error()}")
    skipped = [(f"{i.kind}:{i.name}", reason) for i, reason in r.skipped]
    LAST_SKIPPED[hop.name()] = skipped
    if skipped:
        log.debug("%s runs %s: %s", hop.name(), r.impl.name, skipped)
    return r.impl


def _tables(block_mask) -> tuple:
    return tuple(None if t is None else value(t) for t in block_mask[2:6])


def _arrays(ts) -> tuple:
    """Captured tensors as arrays; numbers are in the spec (baked into the mods): None."""
    return tuple(value(t) if isinstance(t, TpuTensor) else
                 to_jax(t) if isinstance(t, torch.Tensor) else None for t in ts)


def _stat_unit(kernel_options) -> float:
    """The HOPs' log-sum-exp and max are in log2 units (natural with BACKEND="FLASH")."""
    return 1.0 if (kernel_options or {}).get("BACKEND") == "FLASH" else _LN2


@functools.lru_cache(maxsize=512)
def _program(impl: Impl, spec: FlexSpec, forward: bool, unit: float):
    def run(*args):
        if forward:
            out, lse, mx = impl.fn(spec, *args)
            return out, lse / unit, mx / unit
        q, k, v, out, lse, dout, dlse, *rest = args
        return impl.fn(spec, q, k, v, out, lse * unit, dout,
                       None if dlse is None else dlse / unit, *rest)
    return jax.jit(run)


# -- the HOP impls on tpu tensors --------------------------------------------------------------
def _on_shadows(hop, args: tuple) -> Any:
    """While torch.compile traces: run ``hop`` on the shadows; wrap its tpu results."""
    def unwrap(a):
        return a._tpu_shadow if isinstance(a, TpuTensor) else a

    def rewrap(o):
        if isinstance(o, torch.Tensor) and not isinstance(o, TpuTensor) and o.device.type == "tpu":
            return TpuTensor._traced(o)
        return o
    return tree_map(rewrap, hop(*tree_map(unwrap, args)))


def _is_traced(args: tuple) -> bool:
    return tensor_mod._is_traced(args, {})


def forward(q, k, v, score_mod, block_mask, scale, kernel_options, score_bufs=(), mask_bufs=()):
    """``flex_attention`` HOP on tpu tensors -> (out, lse / ln 2, max score / ln 2)."""
    args = (q, k, v, score_mod, block_mask, scale, kernel_options, score_bufs, mask_bufs)
    if _is_traced(args):
        return _on_shadows(FLEX_HOP, args)
    spec = spec_of(q, k, v, score_mod, block_mask, scale, score_bufs, mask_bufs, ())
    impl = choose(FLEX_HOP, spec)
    RUNS[("flex_attention", impl.kind)] += 1
    out, lse, mx = _program(impl, spec, True, _stat_unit(kernel_options))(
        value(q), value(k), value(v), _tables(block_mask), _arrays(score_bufs), _arrays(mask_bufs))
    meta = _permute_strides(torch.empty(out.shape, dtype=q.dtype, device="meta"), q.stride())
    return wrap_result(out, meta), wrap(lse), wrap(mx)


def backward(q, k, v, out, lse, grad_out, grad_lse, fw_graph, joint_graph, block_mask, scale,
             kernel_options, score_bufs=(), mask_bufs=()):
    """``flex_attention_backward`` HOP on tpu tensors -> (dq, dk, dv, captured grads)."""
    args = (q, k, v, out, lse, grad_out, grad_lse, fw_graph, joint_graph, block_mask, scale,
            kernel_options, score_bufs, mask_bufs)
    if _is_traced(args):
        return _on_shadows(FLEX_BWD_HOP, args)
    try:
        return _backward(*args)
    except Exception as exc:
        if not errors.in_backward():
            raise
        # an exception escaping into the autograd engine aborts the process
        errors.defer(exc, "flex_attention_backward")
        return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v),
                tuple(torch.zeros_like(b) if isinstance(b, torch.Tensor) else None
                      for b in score_bufs))


def _backward(q, k, v, out, lse, grad_out, grad_lse, fw_graph, joint_graph, block_mask, scale,
              kernel_options, score_bufs, mask_bufs):
    qa = value(q)
    in_graph = isinstance(qa, jax.core.Tracer)     # a compiled graph wants every float grad
    grads = tuple(isinstance(b, torch.Tensor) and b.is_floating_point()
                  and (in_graph or b.requires_grad) for b in score_bufs)
    spec = spec_of(q, k, v, fw_graph, block_mask, scale, score_bufs, mask_bufs, grads)
    impl = choose(FLEX_BWD_HOP, spec)
    RUNS[("flex_attention_backward", impl.kind)] += 1
    dq, dk, dv, dbufs = _program(impl, spec, False, _stat_unit(kernel_options))(
        qa, value(k), value(v), value(out), value(lse),
        None if grad_out is None else value(grad_out),
        None if grad_lse is None else value(grad_lse), _tables(block_mask),
        _arrays(score_bufs), _arrays(mask_bufs))
    wrapped = []
    for b, g in zip(score_bufs, dbufs):
        if g is not None:
            wrapped.append(wrap(g, b.dtype))
        else:   # compiled graphs expect a tensor per captured tensor
            wrapped.append(torch.zeros_like(b) if in_graph and isinstance(b, torch.Tensor) else None)
    return (wrap_result(dq, _like(q)), wrap_result(dk, _like(k)), wrap_result(dv, _like(v)),
            tuple(wrapped))


def _like(t: torch.Tensor) -> torch.Tensor:
    return _permute_strides(torch.empty(t.shape, dtype=t.dtype, device="meta"), t.stride())


# -- eager autograd for tpu tensors --------------------------------------------------------------
class _FlexFunction(torch.autograd.Function):
    """Eager flex_attention on tpu tensors: forward and backward HOPs, nothing traced."""

    @staticmethod
    def forward(ctx, q, k, v, score_mod, block_mask, scale, kernel_options, mask_bufs, *score_bufs):
        ctx.set_materialize_grads(False)
        with torch._C._AutoDispatchBelowAutograd():
            out, lse, mx = FLEX_HOP(q, k, v, score_mod, block_mask, scale, kernel_options,
                                    score_bufs, mask_bufs)
        ctx.mark_non_differentiable(mx)
        tensors = [b for b in score_bufs if isinstance(b, torch.Tensor)]
        ctx.save_for_backward(q, k, v, out, lse, *tensors)
        ctx.rest = (score_mod, block_mask, scale, kernel_options, mask_bufs,
                    [None if isinstance(b, torch.Tensor) else b for b in score_bufs])
        return out, lse, mx

    @staticmethod
    def backward(ctx, grad_out, grad_lse, grad_max):
        q, k, v, out, lse, *tensors = ctx.saved_tensors
        score_mod, block_mask, scale, kernel_options, mask_bufs, numbers = ctx.rest
        it = iter(tensors)
        score_bufs = tuple(next(it) if n is None else n for n in numbers)
        dq, dk, dv, dbufs = FLEX_BWD_HOP(q, k, v, out, lse, grad_out, grad_lse, score_mod, None,
                                         block_mask, scale, kernel_options, score_bufs,
                                         mask_bufs)
        return (dq, dk, dv, None, None, None, None, None, *dbufs)


def _autograd_impl(torch_impl):
    def impl(q, k, v, score_mod, block_mask, scale, kernel_options, score_bufs=(), mask_bufs=()):
        args = (q, k, v, score_mod, block_mask, scale, kernel_options, score_bufs, mask_bufs)
        if not isinstance(q, TpuTensor) or _is_traced(args):
            return torch_impl(*args)
        return _FlexFunction.apply(q, k, v, score_mod, block_mask, scale, kernel_options,
                                   mask_bufs, *score_bufs)
    impl.torch_impl = torch_impl
    return impl


class _Call(threading.local):
    on_tpu = False     # the flex_attention call being set up has tpu inputs


_CALL = _Call()


def _validate_device(torch_check):
    def check(query, key, value):
        on_tpu = query.device.type == "tpu"
        if not torch.compiler.is_compiling():    # Dynamo inlines this check: no state there
            _CALL.on_tpu = on_tpu
        if not on_tpu:
            torch_check(query, key, value)
    check.torch_check = torch_check
    return check


def _compilation_env(torch_env):
    """Eager flex_attention runs its HOP through torch.compile; for tpu inputs keep that
    compile's shapes static (a recompile per shape, a few ms): Dynamo's dynamic shapes on
    views of tpu tensors fail while building guards (see the module docstring)."""
    @contextlib.contextmanager
    def env():
        with torch_env() as backend:
            if not _CALL.on_tpu:
                yield backend
                return
            with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
                yield backend
    env.torch_env = torch_env
    return env


def _pass_through(hop, mode, *args):
    return hop(*args)


def pass_through_under(mode: type) -> None:
    """Run the flex HOPs as they are under ``mode``. AOTAutograd runs a compiled graph's
    first call under a mode that answers NotImplemented for tensor subclasses, which a HOP
    returns as its result; the compile backend (which loads AOTAutograd) names that mode."""
    for hop in (FLEX_HOP, FLEX_BWD_HOP):
        hop.py_impl(mode)(functools.partial(_pass_through, hop))


_installed = False


def install() -> None:
    """Idempotent: make flex_attention run on tpu tensors."""
    global _installed
    if _installed:
        return
    _installed = True
    FLEX_HOP.py_impl(TpuTensor)(forward)
    FLEX_BWD_HOP.py_impl(TpuTensor)(backward)
    kernels = FLEX_HOP.py_kernels
    kernels[DispatchKey.Autograd] = _autograd_impl(kernels[DispatchKey.Autograd])
    FLEX_HOP._dispatch_cache.clear()
    flex_api._validate_device = _validate_device(flex_api._validate_device)
    flex_api.setup_compilation_env = _compilation_env(flex_api.setup_compilation_env)


install()
