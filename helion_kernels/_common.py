"""Shared plumbing for the Helion kernels: kernel construction, caching, dtype checks and
block-size choice.

Every kernel is a plain Python function written against ``helion.language``. It is
turned into a ``helion.Kernel`` lazily, once per (function, fixed config, interpret
flag), with ``backend="pallas"`` and ``static_shapes=True``; Helion then caches one
compiled ``BoundKernel`` per shape/dtype signature inside that object. Wrappers call
``launch(fn, config, *args)`` which goes through ``Kernel.jax_fn`` and therefore
works on concrete ``jax.Array``s and inside ``jax.jit``.

Where a kernel runs is ``tpu_info.target()``'s decision, as for the Pallas kernels:
interpret mode off TPU, Mosaic on a TPU or inside ``tpu_info.compile_for(chip)`` (what
``tpu_kernels.aot.compile`` uses), which also names the chip to JAX's Pallas lowering.
The interpret flag reaches Helion's launcher as the kernel's ``pallas_interpret``
setting, never through the ``HELION_PALLAS_INTERPRET`` environment variable.

Helion's launcher gives its ``pallas_call`` neither a name nor a cost estimate; ``launch``
traces the Helion call and sets both on it (``cost``: the wrapper's ``pl.CostEstimate``),
so XLA schedules around the kernel and the compiler's reports name it and show its
roofline, as for the hand-written Pallas kernels.
"""
from __future__ import annotations

import functools
import math
import time
from typing import Any, Callable

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
from jax.experimental import pallas as pl

from tpu_kernels.pallas import tpu_info, tuned
from tpu_kernels.pallas.launch import cost  # noqa: F401  (the kernel modules' cost helper)
from tpu_kernels.pallas.tpu_info import round_up


_SUPPORTED = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
# 64-bit inputs are accepted and cast to their 32-bit counterpart by the wrappers.
_DOWNCAST = {
    jnp.dtype(jnp.float64): jnp.dtype(jnp.float32),
}

# (kernel name, config, interpret, signature) -> seconds spent in the first call
# (Helion type propagation + codegen + Pallas trace). Read by tests / reports.
COMPILE_TIMES: dict[tuple, float] = {}


def interpret_mode() -> bool:
    """True when kernels launched now run as ``pallas_call(interpret=True)``."""
    return tpu_info.target().interpret


@functools.lru_cache(maxsize=None)
def _build(fn: Callable, config_items: tuple, interpret: bool, settings: tuple = ()):
    import helion

    cfg = helion.Config(**{k: (list(v) if isinstance(v, tuple) else v) for k, v in config_items})
    return helion.kernel(
        fn,
        backend="pallas",
        pallas_interpret=interpret,
        static_shapes=True,
        config=cfg,
        **dict(settings),
    )


def _forget_vmem_capacity() -> None:
    # Helion's launcher caches the first VMEM capacity it reads (process-wide) and sets it
    # as the kernel's vmem_limit_bytes; a Mosaic launch must read the current target's.
    from helion.runtime.pallas import launcher
    launcher._CACHED_VMEM_LIMIT_BYTES = None


def _freeze(config: dict[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in config.items()))


def _sig(a: Any) -> Any:
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return (tuple(a.shape), str(a.dtype))
    return a


def launch(fn: Callable, config: dict[str, Any], *args: Any, estimate: pl.CostEstimate,
           settings: dict[str, Any] | None = None) -> Any:
    """Run Helion kernel ``fn`` with a fixed ``config`` (and optional extra Helion
    ``settings``) on JAX arrays (or tracers), for ``tpu_info.target()``; ``estimate`` is
    the kernel's ``pl.CostEstimate`` for these arguments."""
    interp = tpu_info.target().interpret
    config = _tuned_config(fn, args) or config
    frozen = _freeze(config)
    kern = _build(fn, frozen, interp, _freeze(settings or {}))
    if not interp:
        _forget_vmem_capacity()
    key = (fn.__name__, frozen, interp, tuple(_sig(a) for a in args))
    t0 = time.perf_counter()
    out = _named_call(kern.jax_fn, args, "helion" + fn.__name__.removesuffix("_kernel"), estimate)
    COMPILE_TIMES.setdefault(key, time.perf_counter() - t0)
    return out


def _tuned_config(fn: Callable, args: tuple) -> dict[str, Any] | None:
    """The kernel's fixed config from its tuned table (``pallas/tuned/helion_<name>.json``,
    e.g. ``helion_rms_fwd.json``) for the target chip and the first array's shape class;
    None: the wrapper's own rule."""
    first = next((a for a in args if hasattr(a, "shape") and hasattr(a, "dtype")), None)
    if first is None:
        return None
    return tuned.helion_config(fn.__name__.strip("_").removesuffix("_kernel"), tpu_info.target().chip,
                               first.dtype, tuple(first.shape))


def _named_call(jax_fn: Callable, args: tuple, name: str, estimate: pl.CostEstimate) -> Any:
    """``jax_fn(*args)`` with ``name`` and ``estimate`` set on the Pallas kernel(s) it makes."""
    arrays = [i for i, a in enumerate(args) if hasattr(a, "shape") and hasattr(a, "dtype")]

    def on_arrays(*xs):
        full = list(args)
        for i, x in zip(arrays, xs):
            full[i] = x
        return jax_fn(*full)

    specs = [jax.ShapeDtypeStruct(args[i].shape, args[i].dtype) for i in arrays]
    closed, shape = jax.make_jaxpr(on_arrays, return_shape=True)(*specs)
    calls = _count_calls(closed.jaxpr)
    share = estimate if calls <= 1 else pl.CostEstimate(
        flops=estimate.flops // calls, transcendentals=estimate.transcendentals // calls,
        bytes_accessed=estimate.bytes_accessed // calls)
    annotated = closed.replace(jaxpr=_annotate(closed.jaxpr, name, share))
    with jax.named_scope(name):     # the compiled program names the kernel after it
        flat = jex_core.jaxpr_as_fun(annotated)(*(args[i] for i in arrays))
    return jax.tree.unflatten(jax.tree.structure(shape), flat)


def _sub_jaxprs(params: dict) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in params.items()
            if isinstance(v, (jex_core.ClosedJaxpr, jex_core.Jaxpr))]


def _is_kernel(eqn: Any) -> bool:
    # pallas_call, or the mpmd_map that pl.kernel (Helion's launcher) makes
    return "cost_estimate" in eqn.params and "name" in eqn.params


def _count_calls(jaxpr: Any) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        if _is_kernel(eqn):
            n += 1
        else:
            n += sum(_count_calls(getattr(v, "jaxpr", v)) for _, v in _sub_jaxprs(eqn.params))
    return n


def _annotate(jaxpr: Any, name: str, estimate: pl.CostEstimate) -> Any:
    eqns = []
    for eqn in jaxpr.eqns:
        if _is_kernel(eqn):
            eqns.append(eqn.replace(params={**eqn.params, "cost_estimate": estimate,
                                            "name": name}))
            continue
        params = dict(eqn.params)
        for k, v in _sub_jaxprs(params):
            params[k] = (v.replace(jaxpr=_annotate(v.jaxpr, name, estimate))
                         if isinstance(v, jex_core.ClosedJaxpr) else _annotate(v, name, estimate))
        eqns.append(eqn.replace(params=params))
    return jaxpr.replace(eqns=eqns)


def nbytes(*arrays: Any) -> int:
    """Bytes of the arrays (or ShapeDtypeStructs): what a streaming kernel moves."""
    return sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in arrays)


# ---------------------------------------------------------------------------- checks

def rows_reason(shape, dims: tuple, max_cols: int | None = None) -> str | None:
    """None when ``dims`` (ints) name only the last dim of a non-empty ``shape`` whose rows
    fit ``max_cols``: the row kernels' common limits."""
    nd = len(shape)
    if nd == 0:
        return "0-d input"
    if len(dims) != 1 or dims[0] not in (-1, nd - 1):
        return f"dim {dims if len(dims) != 1 else dims[0]} is not the last dim"
    if math.prod(shape) == 0:
        return "zero-size input"
    if max_cols is not None and shape[-1] > max_cols:
        return f"row length {shape[-1]} > {max_cols} (row must fit a VMEM block)"
    return None


def norm_reason(x_shape, weight_shape, normalized_ndim: int | None, max_hidden: int) -> str | None:
    """None when a norm over the last ``normalized_ndim`` dims (default: the weight's rank,
    else 1) fits the norm kernels."""
    k = normalized_ndim if normalized_ndim is not None else (len(weight_shape) if weight_shape is not None else 1)
    if len(x_shape) < max(k, 1):
        return f"input rank {len(x_shape)} < normalized rank {k}"
    if weight_shape is not None and tuple(x_shape[len(x_shape) - k:]) != tuple(weight_shape):
        return "weight shape does not match the normalized dims"
    n = math.prod(x_shape[len(x_shape) - k:])
    if n == 0 or math.prod(x_shape) == 0:
        return "zero-size input"
    if n > max_hidden:
        return f"hidden {n} > {max_hidden} (row does not fit a VMEM block)"
    return None


def dtype_reason(*dtypes: Any) -> str | None:
    """None if every dtype is float32/bfloat16 (or float64, downcast by the wrapper)."""
    for d in dtypes:
        try:
            dt = jnp.dtype(d)
        except TypeError:
            return f"unknown dtype {d!r}"
        if dt in _SUPPORTED or dt in _DOWNCAST:
            continue
        if dt == jnp.dtype(jnp.float16):
            return "float16 not supported by Helion's Pallas backend on TPU (use bfloat16)"
        return f"{dt.name} not supported (float32/bfloat16 only)"
    return None


def compute_dtype(x: jax.Array) -> jax.Array:
    """Cast a 64-bit float input to float32; leave float32/bfloat16 alone."""
    dt = jnp.dtype(x.dtype)
    if dt in _DOWNCAST:
        return x.astype(_DOWNCAST[dt])
    return x


def common_dtype(*xs: jax.Array) -> Any:
    dts = {jnp.dtype(compute_dtype(x).dtype) for x in xs}
    return jnp.dtype(jnp.float32) if len(dts) > 1 or jnp.dtype(jnp.float32) in dts else jnp.dtype(jnp.bfloat16)


def pow2_floor(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


def row_block(rows: int, cols: int, budget_elems: int = 128 * 1024, lo: int = 16, hi: int = 256) -> int:
    """Rows per block for a row-wise kernel that holds ``cols`` full columns in VMEM:
    a power of two (multiple of 16 for bf16 sublane packing) with about
    ``budget_elems`` f32 elements per block. Helion clamps it to ``rows`` when the
    array is shorter (a full-dim block is legal on TPU)."""
    padded = -(-max(cols, 1) // 128) * 128
    b = pow2_floor(max(budget_elems // padded, 1))
    return max(lo, min(hi, b))


def col_block(cols: int, hi: int = 2048) -> int:
    """Column tile for loops over long rows: a power of two >= 128."""
    return max(128, min(hi, pow2_floor(cols)))


def next_pow2(n: int) -> int:
    n = max(int(n), 1)
    return 1 << (n - 1).bit_length()


def partial_tiles(rows: int, cols: int, itemsize: int) -> tuple[int, int, int, int]:
    """Tiles for the two-stage column reductions (norm weight/bias grads): each grid step
    reduces one (row_tile, col_tile) block to a partial row, a second pass sums the
    partials. -> (row_tile, col_tile, padded_rows, padded_cols). Blocks of ~2 MiB (bf16)
    keep the per-step cost small and VMEM ~10 MiB whatever the row count; the input is
    zero-padded to whole tiles (zero rows add nothing; aligned shapes need no padding)."""
    bm = min(1024 // max(itemsize, 2), round_up(max(rows, 1), 16))
    cp = round_up(cols, 128)
    bn = next(b for b in (2048, 1024, 512, 256, 128) if cp % b == 0)
    return bm, bn, round_up(rows, bm), cp


def row_groups(x, row_tile: int, rows: int, cols: int):
    """``x`` [r, c] zero-padded to [rows, cols] and viewed as [rows // row_tile, row_tile,
    cols]: a kernel tiling the leading dim by 1 sees one row tile per grid step."""
    return pad2(x, rows, cols).reshape(rows // row_tile, row_tile, cols)


def pad2(x, rows: int, cols: int, value=0):
    if x.shape == (rows, cols):
        return x
    return jnp.pad(x, ((0, rows - x.shape[0]), (0, cols - x.shape[1])), constant_values=value)
