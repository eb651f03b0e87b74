"""Dispatch: every ATen op on tpu tensors, from ``__torch_dispatch__`` to a jitted call.

    run(op, args, kwargs)      # the entry (installed as the tpu tensor's dispatch hook)
    run_call(op, args, kwargs) # the route after runtime handlers (handlers hand calls on here)
    route(op, margs, mkwargs)  # where an op goes (registry.route: one decision for everyone)

Modules, in import order: ``plan`` (per-op schema analysis, the shared types),
``signature`` (a call as cache key + leaves), ``meta`` (torch's meta results),
``graph_trace`` (what a compiled graph's trace changes), ``cache`` (the executable cache
and counters), ``lowering`` (the jitted function of one signature), ``results``
(wrapping), ``memory`` (the out-of-memory guard), ``fallback`` (decompositions, the CPU
fallback, worker-thread errors), ``views``, ``build`` (a new signature), ``run`` (the hot
path), ``factories`` (the PrivateUse1 entry of ops with no tensor input). Importing the
package installs the dispatch hook in the tensor layer, the view handler in the
registry, and the factories' PrivateUse1 kernels.
"""
from __future__ import annotations

from tpu_kernels import memory as device_memory
from tpu_kernels import tensor as _tensor
from tpu_kernels.dispatch.cache import TRACES, cache_info, clear_cache, op_counts
from tpu_kernels.dispatch.factories import install_factories
from tpu_kernels.dispatch.fallback import defer_error
from tpu_kernels.dispatch.meta import meta_args
from tpu_kernels.dispatch.run import guarded_run, run, run_call
from tpu_kernels.dispatch.views import run_view
from tpu_kernels.registry import register_runtime, register_runtime_rule, route
from tpu_kernels.registry.route import VIEW_RULE, composite_implicit

# the old name of register_runtime (handlers registered with it are runtime impls now)
register_special = register_runtime

register_runtime_rule(VIEW_RULE, lambda op: op.is_view and not composite_implicit(op), run_view)
_tensor.install_dispatch(run, guarded_run, defer_error)
install_factories()
device_memory.on_empty_cache(clear_cache)   # torch.tpu.empty_cache() drops cached executables

__all__ = ["run", "run_call", "route", "op_counts", "cache_info", "clear_cache", "TRACES", "meta_args",
           "register_runtime", "register_special"]
