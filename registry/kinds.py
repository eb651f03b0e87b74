"""The kinds of impl: one list, in the order the coverage report ranks them (best first).

- ``user``: a user's kernel (``@tpu_kernel``)
- ``pallas``, ``helion``: the library's kernels (they run off TPU only in interpret mode)
- ``xla``: the generic XLA lowering that closes every op's list
- ``runtime``: handled by the tpu runtime itself (copies, ``.item()``, views, in-place
  metadata changes, composite calls caught above autograd); never switched off
- ``decomp``: no impl of its own: torch's decomposition into registered ops, or an
  in-place op running its functional twin's impl
- ``cpu``: the CPU fallback (``TPU_KERNELS_CPU_FALLBACK=1``)
"""
from __future__ import annotations

KINDS = ("user", "pallas", "helion", "xla", "runtime", "decomp", "cpu")
KERNEL_KINDS = ("pallas", "helion")
REGISTERED_KINDS = ("user", "pallas", "helion", "xla", "runtime")   # what the table holds
SWITCHABLE_KINDS = ("user", "pallas", "helion", "xla", "decomp")    # disable() / only()
# Higher runs first; user kernels win over built-ins; runtime handlers take every call.
DEFAULT_PRIORITY = {"runtime": 1000, "user": 300, "pallas": 200, "helion": 200, "xla": 100, "decomp": 0}
