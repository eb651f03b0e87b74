"""The op table: ATen (or custom) op overload -> ordered implementations.

An ``Impl`` is a pure function (jax arrays and Python values in, jax arrays out) plus
a ``supports`` predicate that may refuse arguments with a reason. ``resolve`` walks an
op's impls in priority order and returns the first that is enabled and accepts the
arguments; the XLA lowering closes every list, so a refusal is never an error.

Impls of kind ``runtime`` are different: the tpu runtime's own handlers, called as
``fn(op, args, kwargs)`` on tpu tensors. A handler takes every call of its op (the route
asks for it before anything else, see ``route.py``); a *rule* is a handler for a whole
class of ops (every view op), since those cannot be listed one by one.

Higher-order ops (``torch.ops.higher_order.flex_attention``) have impls here too, keyed
by the op: their ``fn`` and ``supports`` take the op's static spec (a ``FlexSpec``) where
an ATen op's take its arguments. No rule applies to them and the cost model does not
weigh them (it prices ATen arguments).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from typing import Any, Callable, Iterator

from tpu_kernels.pallas.tpu_info import target
from tpu_kernels.registry.costs import decide as costs
from tpu_kernels.registry.kinds import DEFAULT_PRIORITY, KERNEL_KINDS, SWITCHABLE_KINDS
from tpu_kernels.registry.opnames import is_hop


@dataclasses.dataclass(eq=False)
class Impl:
    """One implementation of one op."""
    op: Any                      # torch._ops.OpOverload, or a HigherOrderOperator
    fn: Callable[..., Any]
    kind: str
    name: str
    supports: Callable[..., Any] | None = None
    priority: int = 0
    # Scalar-typed schema args whose value must be known at trace time (they shape the
    # result, e.g. arange's bounds); other Scalars are traced so new values never retrace.
    static: tuple[str, ...] = ()
    # The result's shape depends on values (nonzero, unique): run eagerly, not under jit.
    data_dependent: bool = False
    # Draws random numbers: the dispatcher provides a PRNG key through the context.
    random: bool = False

    def check(self, *args: Any, **kwargs: Any) -> str | None:
        """None when this impl accepts the arguments, else the reason it refuses."""
        if self.supports is None:
            return None
        try:
            verdict = self.supports(*args, **kwargs)
        except Exception as exc:  # a predicate that cannot judge refuses
            return f"supports() raised {type(exc).__name__}: {exc}"
        if verdict is True or verdict is None:
            return None
        if verdict is False:
            return "supports() returned False"
        return str(verdict)

    def __repr__(self) -> str:
        return f"<Impl {self.kind}:{self.name} for {self.op}>"


@dataclasses.dataclass(frozen=True)
class Rule:
    """A runtime handler for every op ``applies`` accepts (views: ``op.is_view``)."""
    name: str
    applies: Callable[[Any], bool]
    fn: Callable[..., Any]

    def impl_for(self, op: Any) -> Impl:
        return Impl(op, self.fn, "runtime", self.name, priority=DEFAULT_PRIORITY["runtime"])


def _kinds_from_env() -> frozenset[str]:
    disabled = frozenset(k.strip() for k in os.environ.get("TPU_KERNELS_DISABLE", "").split(",") if k.strip())
    only = os.environ.get("TPU_KERNELS_ONLY", "").strip()
    if only:
        disabled = frozenset(k for k in SWITCHABLE_KINDS if k not in only.split(","))
    return disabled


class _Enablement:
    """Process-wide switches (the autograd engine runs backward ops on its own thread)."""

    def __init__(self) -> None:
        self.disabled: frozenset[str] = _kinds_from_env()
        self.forced: dict[Any, Impl] = {}
        # Pallas and Helion kernels run off TPU (in interpret mode) only when asked.
        self.interpret = os.environ.get("TPU_KERNELS_INTERPRET", "") not in ("", "0")
        # On a TPU (or compiling for one) a kernel runs only where the cost model expects
        # it to beat the XLA lowering (``costs``); TPU_KERNELS_COST_MODEL=0 turns that off.
        self.costed = os.environ.get("TPU_KERNELS_COST_MODEL", "1") not in ("", "0")


class Registry:
    """The table of impls, and the questions the rest of the system asks of it."""

    def __init__(self) -> None:
        self._table: dict[Any, list[Impl]] = {}
        self._rules: list[Rule] = []
        self._lock = threading.RLock()
        self._state = _Enablement()
        self.epoch = 0  # bumped on every change; part of every dispatch cache key
        self._version = 0  # bumped when impls or rules are added or removed

    # -- building the table -------------------------------------------------
    def add(self, impl: Impl) -> Impl:
        with self._lock:
            impls = self._table.setdefault(impl.op, [])
            impls.append(impl)
            impls.sort(key=lambda i: -i.priority)
            self.epoch += 1
            self._version += 1
        return impl

    def remove(self, impl: Impl) -> None:
        with self._lock:
            impls = self._table.get(impl.op, [])
            if impl in impls:
                impls.remove(impl)
            self.epoch += 1
            self._version += 1

    def add_rule(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
            self.epoch += 1
            self._version += 1
        return rule

    # -- questions -----------------------------------------------------------
    def impls(self, op: Any) -> list[Impl]:
        """Every impl of ``op`` (its rules' handlers included), highest priority first."""
        own = self._table.get(op, ())
        ruled = [r.impl_for(op) for r in self._rules_for(op)]
        if not ruled:
            return list(own)
        return sorted([*own, *ruled], key=lambda i: -i.priority)

    def runtime_handler(self, op: Any) -> Impl | None:
        """The runtime's handler of ``op`` (it takes every call), or None."""
        for impl in self._table.get(op, ()):
            if impl.kind == "runtime":
                return impl
        rules = self._rules_for(op)
        return rules[0].impl_for(op) if rules else None

    def _rules_for(self, op: Any) -> list[Rule]:
        return [] if is_hop(op) else [r for r in self._rules if r.applies(op)]

    def ops(self) -> list[Any]:
        """Op overloads with impls in the table (ops reached only by a rule are not listed;
        higher-order ops: ``higher_order_ops``)."""
        return [op for op, impls in self._table.items() if impls and not is_hop(op)]

    def higher_order_ops(self) -> list[Any]:
        """Higher-order ops with impls in the table (``flex_attention`` and its backward)."""
        return [op for op, impls in self._table.items() if impls and is_hop(op)]

    def has(self, op: Any) -> bool:
        return bool(self._table.get(op))

    def switches(self) -> tuple:
        """The table's version and the switches in force (disabled kinds, interpret mode,
        forced impls): what resolution depends on. Unlike ``epoch``, leaving a setting and
        entering it again gives the same value, so compiled graphs key their programs by it."""
        st = self._state
        return (self._version, st.disabled, st.interpret,
                tuple((str(op), id(impl)) for op, impl in st.forced.items()))

    def disabled(self, kind: str) -> bool:
        return kind in self._state.disabled

    def enabled(self, impl: Impl) -> str | None:
        """None when ``impl``'s kind may run now, else why not."""
        st = self._state
        if impl.kind in st.disabled:
            return f"kind {impl.kind!r} disabled"
        if impl.kind in KERNEL_KINDS and not st.interpret and target().interpret:
            # off TPU, and not compiling for a chip (tpu_info.compile_for)
            return "no TPU: kernels run off TPU only in interpret mode (TPU_KERNELS_INTERPRET=1)"
        return None

    def resolve(self, op: Any, args: tuple, kwargs: dict) -> tuple[Impl | None, list[tuple[Impl, str]]]:
        """The registered impl that runs for these arguments, and each skipped impl with
        its reason (runtime handlers are the route's business, not listed here).

        ``args``/``kwargs`` are what ``supports`` predicates see: tensors with real
        shapes and dtypes (meta tensors on the dispatch path).
        """
        skipped: list[tuple[Impl, str]] = []
        forced = self._state.forced.get(op)
        if forced is not None and forced.kind != "runtime":
            reason = forced.check(*args, **kwargs)   # forced where it applies: a call it
            if reason is None:                       # refuses resolves as usual
                return forced, []
            skipped.append((forced, f"forced, but refuses: {reason}"))
        for impl in self._table.get(op, ()):
            if impl.kind == "runtime":
                continue
            reason = self.enabled(impl) or impl.check(*args, **kwargs)
            if reason is None:
                loser = self._cost_loser(op, impl, args, kwargs)
                if loser is None:
                    return impl, skipped
                reason = loser[1]
                if loser[0] is not impl:          # the kernel won: XLA is the one skipped
                    return impl, [*skipped, loser]
            skipped.append((impl, reason))
        return None, skipped

    def _cost_loser(self, op: Any, impl: Impl, args: tuple, kwargs: dict) -> tuple[Impl, str] | None:
        """On a TPU (or compiling for one), a kernel impl against the op's XLA lowering:
        the loser with the cost model's figures, or None when nothing was compared."""
        if impl.kind not in KERNEL_KINDS or not self._state.costed or is_hop(op):
            return None
        where = target()
        if where.interpret:
            return None                           # off TPU: kernels run only as asked
        xla = next((i for i in self._table.get(op, ()) if i.kind == "xla"), None)
        if xla is None or "xla" in self._state.disabled:
            return None
        decision = costs.decide(op, impl, xla, args, kwargs, where.chip.name)
        if decision is None:
            return None
        return (xla if decision.kernel_wins else impl), decision.reason()

    # -- forcing kinds and impls (tests, benchmarks, A/B) ---------------------
    @contextlib.contextmanager
    def disable(self, *kinds: str) -> Iterator[None]:
        """Within the block, impls of ``kinds`` never run (``disable("pallas", "helion")``)."""
        _check_kinds(kinds)
        st, old = self._state, self._state.disabled
        st.disabled = old | frozenset(kinds)
        self.epoch += 1
        try:
            yield
        finally:
            st.disabled = old
            self.epoch += 1

    @contextlib.contextmanager
    def only(self, *kinds: str) -> Iterator[None]:
        """Within the block, only impls of ``kinds`` run (``only("xla")``); the runtime's
        own handlers always do."""
        _check_kinds(kinds)
        with self.disable(*(k for k in SWITCHABLE_KINDS if k not in kinds)):
            yield

    @contextlib.contextmanager
    def force(self, impl: Impl, interpret: bool = True) -> Iterator[None]:
        """Within the block, ``impl`` runs for its op wherever its ``supports`` accepts the
        arguments (other calls of the op, e.g. from its backward, resolve as usual)."""
        st = self._state
        old, old_interp = st.forced.get(impl.op), st.interpret
        st.forced[impl.op] = impl
        st.interpret = st.interpret or interpret
        self.epoch += 1
        try:
            yield
        finally:
            if old is None:
                st.forced.pop(impl.op, None)
            else:
                st.forced[impl.op] = old
            st.interpret = old_interp
            self.epoch += 1

    @contextlib.contextmanager
    def cost_model(self, on: bool = True) -> Iterator[None]:
        """Within the block, kernels on a TPU are (``on``) or are not weighed against XLA."""
        st, old = self._state, self._state.costed
        st.costed = on
        self.epoch += 1
        try:
            yield
        finally:
            st.costed = old
            self.epoch += 1

    @contextlib.contextmanager
    def interpret(self, on: bool = True) -> Iterator[None]:
        """Let Pallas/Helion kernels run off TPU, in interpret mode (slow; for tests)."""
        st, old = self._state, self._state.interpret
        st.interpret = on
        self.epoch += 1
        try:
            yield
        finally:
            st.interpret = old
            self.epoch += 1


def _check_kinds(kinds: tuple[str, ...]) -> None:
    bad = [k for k in kinds if k not in SWITCHABLE_KINDS]
    if bad:
        raise ValueError(f"unknown impl kind(s) {bad}; kinds that can be switched: {list(SWITCHABLE_KINDS)}")


REGISTRY = Registry()
