"""Every Pallas and Helion kernel, forward and backward, compiled by the real XLA:TPU and
Mosaic compiler (libtpu's compile-only topologies, no TPU needed) for v5e, v6e and v7x at
production shapes (``tpu_kernels.aot.cases``), under the runtime's configuration
(``jax_enable_x64`` on). Each Mosaic kernel must declare its cost estimate, and the VMEM
the compiler allocated for it must fit the chip.

CI cost: one compile per (kernel, chip), 2-15 s each; libtpu loads once per process. CI
compiles for v5e (the 128-wide MXU) and v7x (the smallest VMEM per core: the tightest fit);
v6e, whose compiles take longest, is marked ``thorough``.
"""
from __future__ import annotations

import jax
import pytest

jax.config.update("jax_enable_x64", True)

from tpu_kernels import aot  # noqa: E402
from tpu_kernels.aot import cases  # noqa: E402
from tpu_kernels.pallas import tpu_info  # noqa: E402

pytestmark = pytest.mark.skipif(aot.unavailable_reason() is not None,
                                reason=str(aot.unavailable_reason()))

CASES = [pytest.param(c, id=c.name, marks=[pytest.mark.thorough] if c.thorough else [])
         for c in cases.cases(thorough=True)]


CI_CHIPS = ("v5e", "v7x")
CHIPS = [pytest.param(c, marks=[] if c in CI_CHIPS else [pytest.mark.thorough])
         for c in tpu_info.CHECKED_GENERATIONS]


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("case", CASES)
def test_compiles_at_production_shapes(case, chip):
    result = aot.check(case.name, case.fn, case.specs, chip)
    assert result.ok, f"{case.name} does not compile for {chip}: {result.reason}"
    row = tpu_info.chip(chip)
    for k in result.summary.kernels:
        assert k.flops is not None and k.bytes_accessed, f"{k.name}: no pl.CostEstimate"
        assert k.vmem_bytes is not None, f"{k.name}: the compiler reported no VMEM figure"
        # kernels may raise their scoped limit up to 3/4 of VMEM (the rest is XLA's)
        assert k.vmem_bytes <= row.vmem_bytes * 3 // 4, (k.name, chip, k.vmem_bytes)


def test_every_kernel_module_has_a_case():
    """A new kernel module gets a production-shape case (tpu_kernels/aot/cases.py)."""
    import pkgutil

    import tpu_kernels.helion_kernels as helion_pkg
    import tpu_kernels.pallas as pallas_pkg
    names = " ".join(c.name for c in cases.cases(thorough=True))
    modules = [m.name for pkg in (pallas_pkg, helion_pkg) for m in pkgutil.iter_modules(pkg.__path__)
               if not m.name.startswith("_") and m.name not in
               ("tpu_info", "launch", "reference", "flex_blocks", "flash_blocks", "flash_kernels",
                                            "tuned")]
    aliases = {"grouped_matmul": "ragged_dot", "fused_adam": "fused_adamw", "glu": "swiglu"}
    # compiled by their own test: the score/mask mods are traced from torch functions
    elsewhere = {"flex_attention": "tests/kernels/test_flex_attention_compile.py"}
    missing = [m for m in modules if aliases.get(m, m) not in names and m not in elsewhere]
    assert not missing, f"kernel modules without a compile case: {missing}"
