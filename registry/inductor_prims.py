"""Lowerings of torch's inductor prims: ops that exist once ``torch._inductor`` is loaded.

``prims::fma`` (a * b + c) is defined by ``torch._inductor.inductor_prims``; Dynamo and
inductor's decompositions emit it into compiled graphs (lerp-like optimizer updates).
Importing inductor costs about a second (it loads Dynamo), so this module is not part of
the registry's import: the compile path imports it (``tpu_kernels.compile_backend``, which
torch.compile loads with inductor anyway, and ``tpu_kernels.aot``'s graph capture).
"""
from __future__ import annotations

import torch._inductor.inductor_prims  # noqa: F401  (defines torch.ops.prims.fma)

from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import float_compute


@xla("prims::fma")
def fma(a, b, c):
    """``prims::fma``: a * b + c, computed in float32 or wider."""
    dt = out_dtype()
    cd = float_compute(dt)
    return (a.astype(cd) * b.astype(cd) + c.astype(cd)).astype(dt)
