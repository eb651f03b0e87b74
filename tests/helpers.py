"""Test helpers: the library's parity checking (one tolerance table, in tpu_kernels.testing)."""
from tpu_kernels.testing import TOLERANCES, assert_same, check, check_parity, to_cpu, to_tpu, tol  # noqa: F401
