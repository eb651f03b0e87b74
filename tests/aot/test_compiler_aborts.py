"""Programs XLA:TPU's compiler aborts on (libtpu 0.0.42: a failed check, SIGABRT, the whole
process gone with no Python error), each compiled for v5e in a fresh process: as XLA writes
it (the abort still there, so the workaround is still needed), and as the registry lowers it
(compiles). ``registry/xla/conv_strided.py``'s ``aborts_on_tpu``."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tpu_kernels import aot

pytestmark = pytest.mark.skipif(aot.unavailable_reason() is not None,
                                reason=str(aot.unavailable_reason()))

# nn.ConvTranspose2d(32, 32, 5, stride=4) on 2x32x20x20 (forward), and nn.Conv2d(32, 32, 5,
# stride=4) on 2x32x81x81 (forward and backward: its input gradient is the former's
# dilated convolution): the registry's lowering, or XLA's form
_PROGRAM = """
import jax, jax.numpy as jnp
from jax import lax
from tpu_kernels import aot
from tpu_kernels.registry.xla.conv import conv_nd, transposed_weight
S = jax.ShapeDtypeStruct
W = S((32, 32, 5, 5), jnp.float32)
def transposed(form):
    if form == "registry":
        return lambda x, w: conv_nd(x, w, (4,), (0,), (1,), True, (0,), 1)
    return lambda x, w: lax.conv_general_dilated(x, transposed_weight(w, 1), (1, 1),
                                                 [(4, 4), (4, 4)], lhs_dilation=(4, 4))
def strided(form):
    conv = ((lambda x, w: conv_nd(x, w, (4,), (0,), (1,), False, (0,), 1)) if form == "registry"
            else (lambda x, w: lax.conv_general_dilated(x, w, (4, 4), [(0, 0), (0, 0)])))
    return jax.grad(lambda x, w: jnp.tanh(conv(x, w)).sum(), argnums=(0, 1))
side = {{"transposed": 20, "strided": 81}}["{case}"]
aot.compile({case}("{form}"), S((2, 32, side, side), jnp.float32), W, chip="v5e")
print("compiled")
"""
CASES = ["transposed", "strided"]


def _compile(case: str, form: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _PROGRAM.format(case=case, form=form)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", CASES)
def test_the_registry_lowering_compiles(case):
    done = _compile(case, "registry")
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("case", CASES)
def test_xla_form_still_aborts(case):
    """When a libtpu release compiles these, ``aborts_on_tpu`` can go (and this test)."""
    done = _compile(case, "xla")
    assert done.returncode != 0 and "space_to_batch_converter" in done.stderr, (
        f"rc {done.returncode}: libtpu compiled XLA's form; aborts_on_tpu may be unneeded")
