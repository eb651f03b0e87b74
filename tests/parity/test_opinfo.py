"""PyTorch's OpInfo database as a second source of samples: tpu against CPU.

One test case per (OpInfo, dtype) for float32 and bfloat16 (where the OpInfo supports
the dtype on CPU). Each sample runs ``opinfo.op`` on CPU under a dispatch mode that
records the ATen overloads it calls; a sample none of whose overloads is registered is
skipped (the OpInfo does not map to the registry). Mapped samples run on tpu (default
impl resolution) and are compared with ``tpu_kernels.testing.assert_same``.

Time budget: CI runs a fixed quarter of the float32 cases (every listed known failure among
them: ``known.in_ci_sample``), the first 2 samples of each; the other float32 cases and the
bfloat16 ones (first sample) are marked ``thorough`` (bfloat16's rounding and promotion are
checked per op by test_parity.py's strategies in CI); the ``thorough`` profile (``make
test-thorough``) runs every sample of every case.
TPU_KERNELS_OPINFO_SAMPLES=N overrides (0 = all). Known failures: known_failures.tsv
(source ``opinfo``).

Samples are drawn with torch's global generator (OpInfo's ``make_tensor``) and some
sample functions use Python's ``random``: both are seeded from the case's key before its
samples are drawn, so a case sees the same samples alone, in any order, in any xdist
worker (unseeded, the samples depended on which tests ran before in the worker, and
pytest-randomly reseeds ``random`` from the run's seed: the known-failures list could not
be exact).
"""
from __future__ import annotations

import itertools
import os
import random
import zlib

import pytest
import torch
from torch.utils._pytree import tree_map

import families as F
import known
import strategies as S
from tpu_kernels.registry import REGISTRY
from tpu_kernels.testing import assert_same_or_as_accurate, in_float64
from known import classify
from helpers import RecordOps

try:
    from torch.testing._internal.common_methods_invocations import op_db
except Exception as exc:  # expecttest missing
    op_db = []
    _IMPORT_ERROR = exc

DTYPES = (torch.float32, torch.bfloat16)
# Random or uninitialised results: compared on shape and dtype only.
META_ONLY = ("rand", "bernoulli", "multinomial", "normal", "uniform", "cauchy", "exponential", "geometric",
             "log_normal", "dropout", "empty", "randint", "randn", "randperm")


# Samples that draw random numbers from the device's generator (tpu's stream is not CPU's),
# of OpInfos whose other samples are deterministic: compared on shape and dtype only, as
# META_ONLY ops are, and counted (the record's "random"); the rest in full. Why each:
def _dropout_on(args: tuple, kwargs: dict) -> bool:     # training mode, dropout_p > 0
    p = kwargs.get("dropout_p", args[10] if len(args) > 10 else 0.0)
    return bool(kwargs.get("training", True)) and p > 0


RANDOM_SAMPLES = {
    "nn.functional.multi_head_attention_forward": _dropout_on,
    "nn.functional.rrelu": lambda args, kwargs: bool(kwargs.get("training", False)),   # random slopes
    # the pooling regions are drawn unless the call gives them
    "nn.functional.fractional_max_pool2d": lambda args, kwargs: "_random_samples" not in kwargs,
    "nn.functional.fractional_max_pool3d": lambda args, kwargs: "_random_samples" not in kwargs,
    # a random projection (torch.randn on the input's device) picks the subspace
    "pca_lowrank": lambda args, kwargs: True,
    "svd_lowrank": lambda args, kwargs: True,
}


def _shape_only(opinfo, args: tuple, kwargs: dict) -> bool:
    """Whether this sample's values are random (compared on shape and dtype only)."""
    if any(m in opinfo.name for m in META_ONLY):
        return True
    random_when = RANDOM_SAMPLES.get(opinfo.name)
    return random_when is not None and random_when(args, kwargs)


def _name(o) -> str:
    return o.name + (f".{o.variant_test_name}" if o.variant_test_name else "")


def _cases():
    out = []
    for o in op_db:
        try:
            supported = o.supported_dtypes("cpu")
        except Exception:
            continue
        for dt in DTYPES:
            if dt in supported:
                key = f"{_name(o)}|{str(dt).replace('torch.', '')}"
                in_ci = dt == torch.float32 and known.in_ci_sample("opinfo", key)
                out.append(pytest.param(o, dt, id=key, marks=[] if in_ci else [pytest.mark.thorough]))
    return out


CASES = _cases()


def n_samples(dtype) -> int | None:
    env = os.environ.get("TPU_KERNELS_OPINFO_SAMPLES")
    if env is not None:
        return int(env) or None
    if S.thorough():
        return None
    return 2 if dtype == torch.float32 else 1


def _to_tpu(x):
    def conv(t):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.layout == torch.strided:
            return t.detach().to("tpu")
        return t
    return tree_map(conv, x)


def _clone(x):
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, x)


def seed_samples(key: str) -> None:
    """Seed every generator OpInfo sample functions draw from with the case's key."""
    seed = zlib.crc32(key.encode())
    torch.manual_seed(seed)
    random.seed(seed)


@pytest.mark.skipif(not op_db, reason="torch's OpInfo database needs expecttest")
@pytest.mark.parametrize("opinfo,dtype", CASES)
def test_opinfo(opinfo, dtype, record_property):
    dname = str(dtype).replace("torch.", "")
    key = f"{_name(opinfo)}|{dname}"
    listed = known.KNOWN.get(("opinfo", key))
    record = {"record": "opinfo", "key": key, "date": known.now()[:10], "samples": 0, "passed": 0}
    overloads: set = set()
    failure = None
    limit = n_samples(dtype)
    seed_samples(key)
    try:
        samples = opinfo.sample_inputs("cpu", dtype, requires_grad=False)
        samples = list(itertools.islice(samples, limit * 4 if limit else None))
    except Exception:
        samples = []
    run = 0
    for sample in samples:
        if limit and run >= limit:
            break
        args = (sample.input,) + tuple(sample.args)
        kwargs = dict(sample.kwargs)
        cpu_args, cpu_kwargs = _clone(args), _clone(kwargs)
        rec = RecordOps()
        try:
            with rec:
                expected = opinfo.op(*cpu_args, **cpu_kwargs)
        except Exception:
            continue              # CPU torch rejects the sample
        called = {op for op in rec.ops if REGISTRY.has(op)}
        if not called:
            continue              # maps to no registered overload
        overloads |= {str(op) for op in called}
        run += 1
        record["samples"] += 1
        try:
            targs, tkwargs = _to_tpu(_clone(args)), _to_tpu(_clone(kwargs))
            actual = opinfo.op(*targs, **tkwargs)
            if _shape_only(opinfo, args, kwargs):
                record["random"] = record.get("random", 0) + 1
                assert S.meta_summary(actual) == S.meta_summary(expected), f"shape/dtype {S.meta_summary(actual)} != {S.meta_summary(expected)}"
            else:
                assert_same_or_as_accurate(expected, actual,
                                           lambda: opinfo.op(*in_float64(_clone(args)), **in_float64(_clone(kwargs))),
                                           f"OpInfo {key}: sample {sample}")
            record["passed"] += 1
        except Exception as exc:   # noqa: BLE001 - any tpu failure is a parity failure
            if failure is None:
                failure = exc
            if listed is not None:
                break             # known: fail fast
    record["overloads"] = sorted(overloads)
    record["tiers"] = {o: F.targets().get(o) for o in overloads}
    if not record["samples"]:
        record.update(status="skip", reason="no sample maps to a registered overload")
        record_property("tpu_kernels_parity", record)
        if listed is not None:
            pytest.fail(f"{key} is listed in known_failures.tsv but no sample runs now: delete its line")
        pytest.skip(record["reason"])
    if failure is not None:
        reason = classify(failure)
        if listed is not None:
            record.update(status="known_failure", reason=listed)
            record_property("tpu_kernels_parity", record)
            pytest.xfail(f"known failure: {listed}")
        record.update(status="fail", reason=reason)
        record_property("tpu_kernels_parity", record)
        raise AssertionError(f"OpInfo {key}: {reason}\n(not in tests/parity/known_failures.tsv)") from failure
    record.update(status="pass")
    record_property("tpu_kernels_parity", record)
    if listed is not None:
        pytest.fail(f"{key} is listed in known_failures.tsv ({listed!r}) but passes now: delete its line")
