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

# nn.ConvTranspose2d(32, 32, 5, stride=4) on 2x32x20x20: the registry's lowering, or XLA's
# form (the input dilated by the stride, the kernel flipped)
_PROGRAM = """
import jax, jax.numpy as jnp
from jax import lax
from tpu_kernels import aot
from tpu_kernels.registry.xla.conv import conv_nd, transposed_weight
S = jax.ShapeDtypeStruct
def registry(x, w):
    return conv_nd(x, w, (4,), (0,), (1,), True, (0,), 1)
def xla(x, w):
    return lax.conv_general_dilated(x, transposed_weight(w, 1), (1, 1), [(4, 4), (4, 4)],
                                    lhs_dilation=(4, 4))
aot.compile({form}, S((2, 32, 20, 20), jnp.float32), S((32, 32, 5, 5), jnp.float32), chip="v5e")
print("compiled")
"""


def _compile(form: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _PROGRAM.format(form=form)],
                          capture_output=True, text=True, timeout=300)


def test_the_registry_lowering_compiles():
    done = _compile("registry")
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-2000:]


def test_xla_form_still_aborts():
    """When a libtpu release compiles this, ``aborts_on_tpu`` can go (and this test)."""
    done = _compile("xla")
    assert done.returncode != 0 and "space_to_batch_converter" in done.stderr, (
        f"rc {done.returncode}: libtpu compiled XLA's form; aborts_on_tpu may be unneeded")
