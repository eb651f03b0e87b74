"""An impl as a JAX program over abstract arrays: what dispatch would trace for these
(meta) arguments, for the cost model and for compiling an impl ahead of time."""
from __future__ import annotations

from typing import Any, Callable

import jax
import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from tpu_kernels.registry.context import Call, OutMeta, lowering
from tpu_kernels.registry.dtypes import to_jax_dtype


def program(op: Any, impl: Any, args: tuple, kwargs: dict) -> tuple[Callable[..., Any], list]:
    """``impl.fn`` over abstract arrays standing for the tensors in ``args``/``kwargs``,
    inside the lowering context dispatch gives it (torch's meta results), and the
    ``jax.ShapeDtypeStruct``s to call it with."""
    try:
        results = tree_leaves(op(*args, **kwargs))
    except NotImplementedError:     # no meta kernel (in-place optimizer ops): no outputs
        results = []
    outs = tuple(OutMeta(tuple(t.shape), t.dtype) for t in results if isinstance(t, torch.Tensor))
    leaves, spec = tree_flatten((args, kwargs))
    where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    specs = [jax.ShapeDtypeStruct(tuple(leaves[i].shape), to_jax_dtype(leaves[i].dtype))
             for i in where]

    def run(*arrays):
        full = list(leaves)
        for i, a in zip(where, arrays):
            full[i] = a
        a, kw = tree_unflatten(full, spec)
        with lowering(Call(outs)):
            return impl.fn(*a, **kw)
    return run, specs
