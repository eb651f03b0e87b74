"""One route for every op: what runs for an op and its (meta) arguments.

    route(op)                   # what the op's calls can take, before seeing arguments
    route(op, args, kwargs)     # what runs for these arguments, and every impl skipped

In order, the first that applies:

1. ``runtime``: a handler of the tpu runtime (copies, ``.item()``, in-place metadata
   changes...) takes every call of the op; ``view``: the runtime's view handler (every
   op whose schema says it returns a view).
2. ``impl``: the registered impl of the highest priority that is enabled and whose
   ``supports`` accepts the arguments (the skipped ones are kept, with their reasons).
3. ``twin``: an in-place op with no impl of its own runs its functional twin's impl
   (``add_`` runs ``add``'s) and writes the result back.
4. ``decomp``: torch's decomposition (``torch._decomp``, or the op's
   CompositeImplicitAutograd kernel, or an aten op's CompositeExplicitAutograd one:
   torch's kernel for every backend) into ops that have routes of their own.
5. ``cpu``: with ``TPU_KERNELS_CPU_FALLBACK=1``, the op runs on CPU copies.
6. ``refused``: nothing runs; ``Route.error()`` names the op, each skipped impl's
   reason and the remedies.

A higher-order op (``torch.ops.higher_order.flex_attention``) routes the same way, with
its static spec as the one argument its impls' ``supports`` see (a ``FlexSpec``,
``registry/xla/flex_attention.py: spec_of``); it has no runtime handler, twin,
decomposition or CPU fallback, so a call no impl accepts is refused.

The dispatcher, the flex_attention path, ``registry.which``, the coverage report, the
parity tests and the bench all ask this function; nothing else decides where an op goes.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import torch
from torch._decomp import decomposition_table

from tpu_kernels.registry.core import REGISTRY, Impl
from tpu_kernels.registry.opnames import functional_twin, is_hop, op_name

VIEW_RULE = "view"   # the name of the runtime's rule for view ops


@dataclasses.dataclass(frozen=True)
class Route:
    """Where ``op`` goes. ``impl`` is what runs (for ``twin``: the functional op's impl;
    None for ``refused``, and when no arguments were given and the choice depends on them).
    ``candidates`` are the impls in the order they are tried."""
    kind: str                               # runtime | view | impl | twin | decomp | cpu | refused
    op: Any
    impl: Impl | None = None
    skipped: tuple[tuple[Impl, str], ...] = ()
    functional: Any = None                  # twin: the functional op whose impl runs
    candidates: tuple[Impl, ...] = ()

    @property
    def impl_kind(self) -> str:
        """The kind of impl that runs (``decomp`` for a twin, as the coverage report counts it)."""
        if self.kind == "refused":
            return "none"
        if self.kind == "twin":
            return "decomp"
        if self.impl is not None:
            return self.impl.kind
        return self.candidates[0].kind if self.candidates else "none"

    def error(self) -> NotImplementedError:
        """The refusal: names the op, why each impl refused, and what to do."""
        op, name = self.op, op_name(self.op)
        why = "".join(f"\n  {i.kind}:{i.name} refused: {r}" for i, r in self.skipped)
        if is_hop(op):
            head, remedy = name, (f"Register an impl that takes these calls: registry.REGISTRY.add(Impl("
                                  f"torch.ops.{name.replace('::', '.')}, fn, \"user\", name, supports=...)).")
        else:
            head, remedy = str(op), (f"Set TPU_KERNELS_CPU_FALLBACK=1 to run it on the CPU (copying the "
                                     f"tensors), or register an impl with @tpu_kernel(\"{name}\").")
        if "sparse" in name:   # a sparse layout, not a missing kernel: say where it came from
            remedy = (f"The tpu device has no sparse tensors (as XLA: dense arrays only). "
                      f"nn.Embedding(sparse=True) and nn.EmbeddingBag(sparse=True) make sparse "
                      f"gradients: use sparse=False (dense gradients, any optimizer but SparseAdam).\n{remedy}")
        return NotImplementedError(f"{head} has no implementation on the tpu device.{why}\n{remedy}")


def cpu_fallback_enabled() -> bool:
    return os.environ.get("TPU_KERNELS_CPU_FALLBACK", "") not in ("", "0")


def decomposition(op: Any) -> Impl | None:
    """torch's decomposition of ``op`` as a ``decomp`` impl, or None (also None while the
    ``decomp`` kind is disabled, and for a higher-order op)."""
    if REGISTRY.disabled("decomp") or is_hop(op):
        return None
    fn = decomposition_table.get(op)
    if fn is not None:
        return Impl(op, fn, "decomp", "torch._decomp")
    if composite_implicit(op):
        return Impl(op, op.decompose, "decomp", "CompositeImplicitAutograd")
    if (op.namespace == "aten" and _has_kernel(op, "CompositeExplicitAutograd")
            and not _has_kernel(op, "PrivateUse1")):
        # torch's kernel for every backend, written in ATen ops (``_pack_padded_sequence``,
        # ``randn_like(generator=)``): the device's own slot holds it, and its ops dispatch
        # again. aten's only: a custom op's default impl is any Python, often CPU-bound
        return Impl(op, functools.partial(op.redispatch, _DEVICE_KEYS), "decomp", "CompositeExplicitAutograd")
    return None


_DEVICE_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


def composite_implicit(op: Any) -> bool:
    """Whether ``op`` has a CompositeImplicitAutograd kernel: torch decomposes it above the
    tpu tensor's dispatch, except where autograd's keys are off (inference mode), which
    hands it over whole (``aten.to``, ``contiguous``, ``reshape``: they may copy, so they
    are decomposed, not taken as views)."""
    return _has_kernel(op, "CompositeImplicitAutograd")


def _has_kernel(op: Any, key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)
    except RuntimeError:
        return False


CPU_FALLBACK = "cpu_fallback"


def route(op: Any, args: tuple | None = None, kwargs: dict | None = None) -> Route:
    """Where ``op`` goes (see the module docstring). ``args``/``kwargs`` are what
    ``supports`` predicates see (meta tensors on the dispatch path); without them the
    answer is the route before any ``supports`` is asked."""
    return runtime_route(op) or call_route(op, args, kwargs)


def runtime_route(op: Any) -> Route | None:
    """Step 1 of ``route``: the runtime handler that takes every call of ``op``, if any
    (the dispatcher asks this once per op, before it looks at the arguments)."""
    handler = REGISTRY.runtime_handler(op)
    if handler is None:
        return None
    return Route(VIEW_RULE if handler.name == VIEW_RULE else "runtime", op, handler, candidates=(handler,))


def call_route(op: Any, args: tuple | None = None, kwargs: dict | None = None) -> Route:
    """Steps 2-6 of ``route``: what a call takes when no runtime handler takes the op
    (also where a handler hands a call on, e.g. ``copy_`` between two tpu tensors)."""
    if args is None:
        return _static_route(op)
    impl, skipped = REGISTRY.resolve(op, args, kwargs or {})
    if impl is not None:
        return Route("impl", op, impl, tuple(skipped), candidates=_candidates(op))
    twin = _twin(op)
    if twin is not None:
        timpl, _ = REGISTRY.resolve(twin, args, kwargs or {})
        if timpl is not None:
            return Route("twin", op, timpl, tuple(skipped), functional=twin)
    return _last_resort(op, tuple(skipped))


def _twin(op: Any) -> Any:
    """The functional twin of an in-place op overload, or None."""
    return functional_twin(op) if not is_hop(op) and op._schema.is_mutable else None


def _candidates(op: Any) -> tuple[Impl, ...]:
    """The op's registered impls in the order they are tried (enabled or not: which of
    them may run now is the arguments' route's business)."""
    return tuple(i for i in REGISTRY.impls(op) if i.kind != "runtime")


def _static_route(op: Any) -> Route:
    impls = _candidates(op)
    if impls:
        only = impls[0] if impls[0].supports is None else None
        return Route("impl", op, only, candidates=impls)
    twin = _twin(op)
    if twin is not None and _candidates(twin):
        return Route("twin", op, None, functional=twin, candidates=_candidates(twin))
    return _last_resort(op, ())


def _last_resort(op: Any, skipped: tuple) -> Route:
    decomp = decomposition(op)
    if decomp is not None:
        return Route("decomp", op, decomp, skipped, candidates=(decomp,))
    if cpu_fallback_enabled() and not is_hop(op):
        cpu = Impl(op, None, "cpu", CPU_FALLBACK)
        return Route("cpu", op, cpu, skipped, candidates=(cpu,))
    return Route("refused", op, None, skipped)
