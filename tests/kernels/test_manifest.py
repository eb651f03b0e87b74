"""The kernel manifest (registry/manifest.py) is complete and true: every Pallas and Helion
kernel module has an entry, every file an entry names exists, every kernel impl in the
registry (higher-order ops' included) belongs to an entry's ops, every entry's ops have a
kernel bound, and every bench definition module is some kernel's."""
from __future__ import annotations

import importlib
import os
import pkgutil

import pytest

from tpu_kernels import helion_kernels, pallas, registry
from tpu_kernels.bench import defs
from tpu_kernels.registry.manifest import KERNELS
from tpu_kernels.registry.opnames import resolve_overload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELPERS = {"tpu_kernels.pallas.tpu_info", "tpu_kernels.pallas.launch", "tpu_kernels.pallas.reference",
           "tpu_kernels.helion_kernels._common", "tpu_kernels.pallas.flex_blocks",
           "tpu_kernels.pallas.flash_blocks", "tpu_kernels.pallas.flash_kernels",
           "tpu_kernels.pallas.tuned"}

def _modules(pkg) -> set[str]:
    return {f"{pkg.__name__}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)}


def test_every_kernel_module_has_an_entry():
    listed = {k.module for k in KERNELS}
    missing = (_modules(pallas) | _modules(helion_kernels)) - listed - HELPERS
    assert not missing, f"kernel modules with no manifest entry: {sorted(missing)}"


@pytest.mark.parametrize("k", KERNELS, ids=lambda k: k.name)
def test_entry_files_exist(k):
    for name in (k.module, k.bindings, k.bench_module) + ((k.reference,) if k.reference else ()):
        importlib.import_module(name)
    assert os.path.exists(os.path.join(ROOT, k.tests)), k.tests
    benches = {b.name for b in getattr(importlib.import_module(k.bench_module), "BENCHMARKS", ())}
    assert set(k.bench) <= benches, f"{k.name}: no KernelBench named {sorted(set(k.bench) - benches)}"
    assert k.examples or k.no_example, f"{k.name}: give examples, or say why none can check it"
    assert set(k.examples) <= set(k.ops)


@pytest.mark.parametrize("k", KERNELS, ids=lambda k: k.name)
def test_entry_ops_have_the_kernel_bound(k):
    for op in k.ops:
        kinds = {i.kind for i in registry.impls(op)}
        assert k.kind in kinds, f"{k.name}: {op} has no {k.kind} impl"


def test_every_kernel_impl_is_in_the_manifest():
    listed = {resolve_overload(op) for k in KERNELS for op in k.ops}
    ops = registry.REGISTRY.ops() + registry.REGISTRY.higher_order_ops()
    bound = {op for op in ops for i in registry.impls(op)
             if i.kind in ("pallas", "helion") and i.fn.__module__.startswith("tpu_kernels.registry.bindings")}
    assert not bound - listed, f"kernel impls missing from the manifest: {sorted(map(str, bound - listed))}"


def test_every_bench_module_is_a_kernels():
    listed = {k.bench_module for k in KERNELS}
    assert _modules(defs) <= listed, sorted(_modules(defs) - listed)
