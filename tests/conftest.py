"""Test configuration: Hypothesis profiles, the `thorough` marker, JAX on the CPU."""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# tests count traces per signature: the persistent call cache (dispatch/call_cache.py) would
# skip them in every run after the first; tests/test_call_cache.py turns it on
os.environ.setdefault("TPU_KERNELS_CALL_CACHE", "0")
# no JAX persistent cache in the tests (tests of the cache give their processes one): a cold
# run reads back only ~10% of what it writes. (The worker crashes once blamed on it were a
# worker's memory mappings reaching the kernel's limit: see the hook below.)
# TPU_KERNELS_JAX_CACHE=DIR turns it on for a local run.
os.environ.setdefault("TPU_KERNELS_JAX_CACHE", "0")
# XLA:CPU's LLVM optimization at level 1, not 2: the suite's programs are small, so its time
# goes to compiling them, and level 1 makes it ~25% faster (2 files, one run: 0.77x).
# Level 1 keeps what decides float results (XLA's HLO passes, its own vectorized loops,
# LLVM's FMA contraction); level 0 does not contract, and 3 tests saw other roundings.
# Compiles for TPU (libtpu) give the same figures. Subprocesses inherit it; a run that
# sets the level itself keeps its own.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=1").strip()

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.database import DirectoryBasedExampleDatabase  # noqa: E402

# The Hypothesis database lives outside the repo.
_DB = DirectoryBasedExampleDatabase(os.path.expanduser("~/.cache/tpu_kernels/hypothesis"))
settings.register_profile("ci", max_examples=8, derandomize=True, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("dev", max_examples=25, deadline=None, database=_DB,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("thorough", max_examples=300, deadline=None, database=_DB,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.load_profile(os.environ.get("TPU_KERNELS_HYPOTHESIS_PROFILE", "ci"))

import tpu_kernels  # noqa: E402,F401  (sets the tpu device up)
from tpu_kernels import code_memory  # noqa: E402

_RELIEF_EVERY = 16   # tests between two counts of the worker's memory mappings
_ran = [0]


def pytest_addoption(parser):
    parser.addoption("--thorough", action="store_true", default=False,
                     help="also run tests marked `thorough` (big shapes, long sweeps)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--thorough"):
        return
    skip = pytest.mark.skip(reason="thorough sweep: run with `make test-thorough`")
    for item in items:
        if "thorough" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_teardown(item, nextitem):
    # a worker compiles ~30,000 executables, each mapped into it: empty the caches between
    # tests, well before the runtime's own guard (code_memory.HIGH) would inside one (a
    # test that counts traces would then see a retrace)
    _ran[0] += 1
    if _ran[0] % _RELIEF_EVERY == 0:
        code_memory.relieve_if_above(0.25)
