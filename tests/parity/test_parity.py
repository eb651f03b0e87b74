"""Property-based parity: every impl of every registered op against CPU torch.

One test case per (op overload, impl) in the registry, collected from the registry itself,
each impl forced in turn; an op with no impl but the runtime's handler, and a target op
with no registered impl, is one case labelled by the route it takes (``registry.route``:
a runtime handler, a view, an in-place twin, a decomposition, or the refusal). Each case draws calls from the op's family
strategy (families.py), runs CPU torch (the reference; a call CPU torch rejects is not a
case), runs the same call on tpu with the impl forced, and compares values, shapes and
dtypes (``tpu_kernels.testing.assert_same``: the one tolerance table), mutated arguments,
and for views the aliasing, strides and storage offset. For float cases of tier-1 ops
(every op in the ``thorough`` profile) gradients of a random cotangent are compared too.

CI runs the cases of tier-1 ops and of kernels, and a fixed quarter of the others (every
listed known failure among them); ``--thorough`` runs them all. Examples per case: ``ci``
profile 2 (kernels: Pallas/Helion in interpret mode, XLA lowerings, routes; a tier-1 known
failure 3, the draws it was listed with), no shrinking; ``thorough`` 60 (kernels: 20),
shrinking on.
Override with TPU_KERNELS_PARITY_EXAMPLES. Known failures: known_failures.tsv.
"""
from __future__ import annotations

import contextlib
import os

import pytest
import torch
from hypothesis import Phase, given, reject, settings
from hypothesis.errors import FailedHealthCheck, Unsatisfiable, UnsatisfiedAssumption

import families as F
import known
from known import classify
import strategies as S
from tpu_kernels import registry
from tpu_kernels.dispatch import meta_args
from tpu_kernels.registry import REGISTRY, Route
from tpu_kernels.testing import (assert_as_accurate, assert_same, assert_same_or_as_accurate, in_float64,
                                 reference_of, reproducer)


def label(impl) -> tuple[str, str]:
    """(kind, name) of a case's impl: a registered impl, or the route an op with none takes."""
    if not isinstance(impl, Route):
        return impl.kind, impl.name
    if impl.impl is not None:
        return impl.impl.kind, impl.impl.name
    return ("twin", str(impl.functional)) if impl.kind == "twin" else ("none", impl.kind)


def forced(op, impl) -> bool:
    """Whether the case pins ``impl`` (``registry.force``): a registered impl, not a route."""
    return not isinstance(impl, Route)


def impl_key(op, impl) -> str:
    return f"{op}|{':'.join(label(impl))}"


def _case(op, impl):
    """One case; in CI, every tier-1 op's and every kernel's case, and a fixed quarter of the
    other ops' XLA lowerings and routes (``known.in_ci_sample``), all in ``thorough``."""
    key = impl_key(op, impl)
    sampled = F.tier(op) != 1 and label(impl)[0] not in ("pallas", "helion")
    marks = [pytest.mark.thorough] if sampled and not known.in_ci_sample("parity", key) else []
    return pytest.param(op, impl, id=key, marks=marks)


def _collect():
    cases = []
    routed = []   # ops with no impl to force: the route is the case
    for op in sorted(REGISTRY.ops(), key=str):
        impls = [i for i in REGISTRY.impls(op) if i.kind != "runtime"]
        cases += [_case(op, impl) for impl in impls]
        if not impls:
            routed.append(op)
    routed += [op for op in F.target_overloads() if not REGISTRY.has(op) and F.family(op) is not None]
    for op in sorted(routed, key=str):
        cases.append(_case(op, registry.route(op)))
    return cases


CASES = _collect()


def n_examples(op, impl) -> int:
    env = os.environ.get("TPU_KERNELS_PARITY_EXAMPLES")
    if env:
        return int(env)
    kind = label(impl)[0]
    kernel = kind in ("pallas", "helion")
    if kind == "compile":   # test_compiled.py: a compile per example
        return 10 if S.thorough() else 1
    if S.thorough():
        return 20 if kernel else min(settings().max_examples, THOROUGH_EXAMPLES)
    if kernel:
        return F.KERNEL_EXAMPLES_CI
    if F.tier(op) == 1 and ("parity", impl_key(op, impl)) in known.KNOWN:
        return KNOWN_EXAMPLES   # a listed failure keeps the draws that show it
    return CI_EXAMPLES


CI_EXAMPLES = 2           # per XLA/runtime case (~900 cases must fit CI's 40 minutes)
KNOWN_EXAMPLES = 3        # per tier-1 case listed in known_failures.tsv (listed with 3 draws)
THOROUGH_EXAMPLES = 60    # per case in the thorough profile (kernels: 20)


def grad_wanted(op) -> bool:
    return S.thorough() or F.tier(op) == 1


# -- one call ---------------------------------------------------------------------------------
def _tensor_args(args, kwargs):
    return [t for t in S.flat(list(args) + list(kwargs.values())) if isinstance(t, torch.Tensor)]


def run_case(op, impl, case: S.Case, stats: dict) -> None:
    """One drawn call: CPU torch vs tpu. The op runs with ``impl`` forced, or through
    ``impl.caller(op)`` where the impl says how to call it (the compiled pseudo-impl)."""
    call = impl.caller(op) if hasattr(impl, "caller") else None
    ref = reference_of(op) if str(op).startswith("tpu_kernels.") else op
    cargs, ckw = case.build("cpu")
    try:
        expected = ref(*cargs, **ckw)
    except Exception:
        reject()            # CPU torch does not accept this call: not a case
    def force():
        return registry.force(impl) if call is None and forced(op, impl) else contextlib.nullcontext()
    try:
        _compare(op, impl, ref, case, cargs, ckw, expected, force, stats, call or op)
    except UnsatisfiedAssumption:
        raise
    except Exception as exc:
        a, k = case.build("cpu")
        rep = reproducer(op, a, k, impl if forced(op, impl) and call is None else None)
        dts = ", ".join(sorted(str(d).replace("torch.", "") for d in case.dtypes()))
        raise AssertionError(f"{op} impl {':'.join(label(impl))}: {type(exc).__name__}: {exc}\n"
                             f"dtypes: {dts}\n"
                             f"--- reproducer ---\n{rep}\n------------------") from exc


# Ops whose CPU reference is not refereed by float64 (each with why): a result apart from
# CPU torch's must be within the tolerance of it.
NO_FLOAT64_REFEREE = {
    # torch's CPU flash kernel rounds the probabilities to the input dtype before P @ V:
    # CPU's error is the kernel's own design, and drawn examples fell on both sides of it
    # (the listed case passed in some test orders and failed in others)
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
}


def _exact(op, fn):
    """The float64 referee of ``op`` (``fn``), or None (see NO_FLOAT64_REFEREE)."""
    return None if str(op) in NO_FLOAT64_REFEREE else fn


def _in_float64(ref, case):
    """``ref`` on the case's CPU arguments in float64."""
    args, kwargs = in_float64(case.build("cpu"))
    return ref(*args, **kwargs)


def _compare(op, impl, ref, case, cargs, ckw, expected, force, stats, call):
    targs, tkw = case.build("tpu")
    msg = f"{op} impl {':'.join(label(impl))}"
    if call is op and forced(op, impl):
        margs, mkw = meta_args(targs, tkw)
        if impl.check(*margs, **mkw) is not None:   # the impl does not claim these arguments
            stats["refused"] += 1
            reject()
    try:
        with force():
            actual = call(*targs, **tkw)
    except Exception as exc:
        raise AssertionError(f"tpu raised {type(exc).__name__}: {exc}") from exc
    stats["examples"] += 1
    if case.compare == "meta":
        got, want = S.meta_summary(actual), S.meta_summary(expected)
        assert got == want, f"{msg}\nshape/dtype {got} != {want}"
    else:
        assert_same_or_as_accurate(expected, actual, _exact(op, lambda: _in_float64(ref, case)), msg)
        # mutated arguments (in-place ops; out-of-place ops must not touch their inputs)
        assert_same(_tensor_args(cargs, ckw), _tensor_args(targs, tkw), f"{msg} (arguments after the call)")
    if op.is_view or any(r.alias_info is not None for r in op._schema.returns):
        _check_aliasing(op, cargs, targs, expected, actual, msg)
    if case.grad and grad_wanted(op):
        if _check_grads(op, impl, ref, case, msg, force, call):
            stats["grad_examples"] += 1


def _check_aliasing(op, cargs, targs, expected, actual, msg):
    cin = [a for a in S.flat(list(cargs)) if isinstance(a, torch.Tensor)]
    tin = [a for a in S.flat(list(targs)) if isinstance(a, torch.Tensor)]
    for e, a in zip(S.flat(expected), S.flat(actual)):
        if not isinstance(e, torch.Tensor):
            continue
        e_alias = [i for i, t in enumerate(cin) if e.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                   and e.numel() and t.numel()]
        a_alias = [i for i, t in enumerate(tin) if getattr(a, "_tpu_storage", 0) is getattr(t, "_tpu_storage", 1)
                   and a.numel() and t.numel()]
        assert e_alias == a_alias, f"{msg}\naliasing: output aliases inputs {a_alias} on tpu, {e_alias} on CPU"
        if e_alias and op.is_view and e.numel():
            assert (a.stride(), a.storage_offset()) == (e.stride(), e.storage_offset()), (
                f"{msg}\nview strides/offset {(a.stride(), a.storage_offset())} != {(e.stride(), e.storage_offset())}")


def _with_grad(args, kwargs):
    args, leaves = S.with_grad(args)
    return args, kwargs, leaves


def _check_grads(op, impl, ref, case, msg, force, call) -> bool:
    """Gradients of a random cotangent match CPU's; False when the op is not
    differentiable here (CPU autograd says so)."""
    cargs, ckw, cleaves = _with_grad(*case.build("cpu"))
    if not cleaves or any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
        return False
    try:
        out = ref(*cargs, **ckw)
        outs = [o for o in S.flat(out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if not outs:
            return False
        gen = torch.Generator().manual_seed(1234)
        cots = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype) for o in outs]
        ge = torch.autograd.grad(outs, cleaves, cots, allow_unused=True)
    except Exception:
        return False
    targs, tkw, tleaves = _with_grad(*case.build("tpu"))
    try:
        with force():
            tout = call(*targs, **tkw)
            touts = [o for o in S.flat(tout) if isinstance(o, torch.Tensor) and o.requires_grad]
            ga = torch.autograd.grad(touts, tleaves, [c.to("tpu") for c in cots], allow_unused=True)
    except Exception as exc:
        raise AssertionError(f"{msg}\ngradient on tpu raised {type(exc).__name__}: {exc}") from exc
    ga = [g if g is None or isinstance(g, torch.Tensor) else g for g in ga]
    ge = [g if g is not None else None for g in ge]
    ga = [None if (e is None) else a for e, a in zip(ge, ga)]
    ge = [torch.zeros_like(l) if (e is None and a is not None) else e for e, a, l in zip(ge, ga, cleaves)]
    assert_same_or_as_accurate(list(ge), list(ga), _exact(op, lambda: _exact_grads(ref, case, cots)),
                               f"{msg}\n(gradients of a random cotangent, seed 1234)")
    return True


def _exact_grads(ref, case, cots) -> list:
    """The CPU gradients computed in float64."""
    cargs, ckw, leaves = _with_grad(*in_float64(case.build("cpu")))
    outs = [o for o in S.flat(ref(*cargs, **ckw)) if isinstance(o, torch.Tensor) and o.requires_grad]
    # (a complex cotangent in complex128: ``.double()`` would drop its imaginary part, and
    # autograd rejects the real one, so complex ops went unrefereed)
    wide = [c.to(torch.complex128 if c.is_complex() else torch.float64) for c in cots]
    grads = torch.autograd.grad(outs, leaves, wide, allow_unused=True)
    return [torch.zeros_like(l) if g is None else g for g, l in zip(grads, leaves)]


# -- the test ----------------------------------------------------------------------------------
@pytest.mark.parametrize("op,impl", CASES)
def test_parity(op, impl, record_property):
    check_case(op, impl, record_property)


def check_case(op, impl, record_property) -> None:
    """Run ``n_examples`` drawn calls of ``op`` with ``impl``, record the outcome, and
    apply the known-failures list. (The drawing function's source is part of Hypothesis's
    seed: keep its text as it is, or every drawn example changes.)"""
    key = impl_key(op, impl)
    record = {"record": "impl", "op": str(op), "impl": ":".join(label(impl)), "kind": label(impl)[0],
              "tier": F.tier(op), "registered": REGISTRY.has(op), "family": F.family(op),
              "date": known.now()[:10]}
    strat = F.strategy(op)
    if strat is None:
        record.update(status="untested", reason="no strategy (families.py)")
        record_property("tpu_kernels_parity", record)
        pytest.skip(f"{op}: no strategy")
    listed = known.KNOWN.get(("parity", key))
    stats = {"examples": 0, "grad_examples": 0, "refused": 0}
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if listed is None and os.environ.get("TPU_KERNELS_HYPOTHESIS_PROFILE", "ci") != "ci":
        phases.append(Phase.shrink)        # ci: no shrinking (time); known failures fail fast

    @settings(max_examples=n_examples(op, impl), phases=phases)
    @given(case=strat)
    def check(case):
        try:
            run_case(op, impl, case, stats)
        except S.Unsupported as exc:
            raise AssertionError(f"harness: family {F.family(op)} cannot draw {op}: {exc}") from exc
    check.hypothesis.inner_test._hypothesis_internal_add_digest = key.encode()
    try:
        check()
    except (Unsatisfiable, FailedHealthCheck):
        record.update(status="untested", reason=f"no drawn case ran: the impl refused {stats['refused']}, "
                      "CPU torch or the strategy rejected the rest", **stats)
        record_property("tpu_kernels_parity", record)
        pytest.skip(record["reason"])
    except Exception as exc:
        why = classify(exc)
        if listed is not None:
            record.update(status="known_failure", reason=listed, **stats)
            record_property("tpu_kernels_parity", record)
            pytest.xfail(f"known failure: {listed}")
        record.update(status="fail", reason=why[:300], **stats)
        record_property("tpu_kernels_parity", record)
        raise
    record.update(status="pass", **stats)
    record_property("tpu_kernels_parity", record)
    if listed is not None:
        pytest.fail(f"{key} is listed in known_failures.tsv ({listed!r}) but passes now: delete its line")


# -- coverage of the op table --------------------------------------------------------------------
def untested_ops() -> list:
    return [op for op in sorted(REGISTRY.ops(), key=str) if F.strategy(op) is None]


def test_untested_listing(capsys, record_property):
    """Lists registered ops no strategy covers (they may still have OpInfo samples)."""
    missing = untested_ops()
    with capsys.disabled():
        print(f"\n[parity] {len(REGISTRY.ops())} registered ops, {len(missing)} without a strategy:")
        for op in missing:
            print(f"  untested: {op} (tier {F.tier(op)})")
    recs = []
    for op in missing:
        for impl in REGISTRY.impls(op):
            recs.append({"record": "impl", "op": str(op), "impl": f"{impl.kind}:{impl.name}", "kind": impl.kind,
                         "tier": F.tier(op), "registered": True, "family": None, "status": "untested",
                         "reason": "no strategy (families.py)", "date": known.now()[:10]})
    record_property("tpu_kernels_parity", recs)


def _opinfo_names() -> set:
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except Exception:  # expecttest missing
        return set()
    names = set()
    for o in op_db:
        names.add(o.name.split(".")[-1])
        names.add(getattr(o, "aten_name", None) or o.name)
    return names


def test_tier1_registered_ops_are_tested():
    """A registered tier-1 op needs a strategy or OpInfo samples."""
    missing = [op for op in untested_ops() if F.tier(op) == 1]
    if not missing:
        return
    names = _opinfo_names()
    bare = [op for op in missing if F.packet_name(op) not in names and F.packet_name(op).rstrip("_") not in names]
    assert not bare, f"tier-1 ops registered without a strategy or OpInfo samples: {[str(o) for o in bare]}"


def test_low_precision_results_apart_from_cpu_pass_only_when_no_less_accurate():
    exact = torch.tensor([0.1234567, 1.0, 3.0], dtype=torch.float64)
    cpu = torch.tensor([0.1230, 1.0, 3.0], dtype=torch.float16)     # CPU torch: off in the first
    closer = torch.tensor([0.1235, 1.0, 3.0], dtype=torch.float16)
    worse = torch.tensor([0.1234567, 1.0, 3.01], dtype=torch.float16)
    assert_as_accurate(cpu, closer, exact)
    with pytest.raises(AssertionError, match="further from the float64 result"):
        assert_as_accurate(cpu, worse, exact)
    exact32 = torch.tensor([1.0 + 3e-7], dtype=torch.float64)   # float32: CPU off by 1 ulp, tpu exact-ish
    assert_as_accurate(torch.tensor([1.0], dtype=torch.float32), torch.tensor([1.0 + 2.4e-7]), exact32)
    with pytest.raises(AssertionError, match="apart"):          # integers stay exact
        assert_same_or_as_accurate(torch.tensor([1, 2]), torch.tensor([1, 3]), lambda: None, "apart")
    with pytest.raises(AssertionError, match="no referee"):    # float64 means something else here
        assert_same_or_as_accurate(torch.tensor([1.0]), torch.tensor([1.5]),
                                   lambda: torch.tensor([9.0], dtype=torch.float64), "no referee")
    with pytest.raises(AssertionError, match="expected torch.float32 \\(0,\\)"):  # shapes still count
        assert_same_or_as_accurate(torch.ones(0), torch.ones(3), lambda: torch.ones(0, dtype=torch.float64))
    nan = float("nan")
    with pytest.raises(AssertionError, match="further from the float64 result"):   # NaN lost
        assert_as_accurate(torch.tensor([nan], dtype=torch.float16), torch.tensor([1.0], dtype=torch.float16),
                           torch.tensor([nan], dtype=torch.float64))
