"""Shared plumbing for the Helion kernels: kernel construction, caching, interpret/TPU
lowering selection, dtype checks and block-size choice.

Every kernel is a plain Python function written against ``helion.language``. It is
turned into a ``helion.Kernel`` lazily, once per (function, fixed config, interpret
flag), with ``backend="pallas"`` and ``static_shapes=True``; Helion then caches one
compiled ``BoundKernel`` per shape/dtype signature inside that object. Wrappers call
``launch(fn, config, *args)`` which goes through ``Kernel.jax_fn`` and therefore
works on concrete ``jax.Array``s and inside ``jax.jit``.

Interpret mode: on (``pallas_call(interpret=True)``) when JAX's default backend is not
a TPU, off on a TPU. Inside ``with tpu_lowering():`` the non-interpret variant is used
even off-TPU, so ``jax.export.export(..., platforms=["tpu"])`` runs the real
Pallas -> Mosaic lowering (the launcher falls back to the ``HELION_PALLAS_INTERPRET``
environment variable when a kernel was compiled without interpret mode, so the context
sets it to ``0`` while it is active).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
import threading
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp

from tpu_kernels.pallas.tpu_info import on_tpu

_SUPPORTED = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
# 64-bit inputs are accepted and cast to their 32-bit counterpart by the wrappers.
_DOWNCAST = {
    jnp.dtype(jnp.float64): jnp.dtype(jnp.float32),
}

_tpu_lowering: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tpu_kernels_helion_tpu_lowering", default=False
)
_env_lock = threading.Lock()

# (kernel name, config, interpret, signature) -> seconds spent in the first call
# (Helion type propagation + codegen + Pallas trace). Read by tests / reports.
COMPILE_TIMES: dict[tuple, float] = {}


def interpret_mode() -> bool:
    """True when kernels run as ``pallas_call(interpret=True)`` (off-TPU, and not
    inside ``tpu_lowering()``)."""
    return not _tpu_lowering.get() and not on_tpu()


@contextlib.contextmanager
def tpu_lowering() -> Iterator[None]:
    """Use the non-interpret (Mosaic) kernel variants while active, e.g. around
    ``jax.export.export(jax.jit(f), platforms=["tpu"])`` on a CPU machine."""
    token = _tpu_lowering.set(True)
    with _env_lock:
        old = os.environ.get("HELION_PALLAS_INTERPRET")
        os.environ["HELION_PALLAS_INTERPRET"] = "0"
    try:
        yield
    finally:
        with _env_lock:
            if old is None:
                os.environ.pop("HELION_PALLAS_INTERPRET", None)
            else:
                os.environ["HELION_PALLAS_INTERPRET"] = old
        _tpu_lowering.reset(token)


def _ensure_env() -> None:
    # Helion's launcher and its device-count helper read HELION_PALLAS_INTERPRET at
    # run time; off TPU the interpret path is the only one that can execute.
    if not on_tpu() and not _tpu_lowering.get():
        os.environ.setdefault("HELION_PALLAS_INTERPRET", "1")


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


def _freeze(config: dict[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in config.items()))


def _sig(a: Any) -> Any:
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return (tuple(a.shape), str(a.dtype))
    return a


def launch(fn: Callable, config: dict[str, Any], *args: Any, settings: dict[str, Any] | None = None) -> Any:
    """Run Helion kernel ``fn`` with a fixed ``config`` (and optional extra Helion
    ``settings``) on JAX arrays (or tracers)."""
    _ensure_env()
    interp = interpret_mode()
    frozen = _freeze(config)
    kern = _build(fn, frozen, interp, _freeze(settings or {}))
    key = (fn.__name__, frozen, interp, tuple(_sig(a) for a in args))
    if key in COMPILE_TIMES:
        return kern.jax_fn(*args)
    t0 = time.perf_counter()
    out = kern.jax_fn(*args)
    COMPILE_TIMES[key] = time.perf_counter() - t0
    return out


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


def round_up(n: int, m: int) -> int:
    return -(-int(n) // m) * m


def reduce_tiles(rows: int, cols: int, max_rows: int = 256) -> tuple[int, int, int, int]:
    """Tiles for kernels with an inner loop over rows (column reductions):
    -> (row_tile, col_tile, padded_rows, padded_cols). Pallas interpret mode cannot run
    an inner tile loop over a partial edge tile (dynamic slice sizes), so callers
    zero-pad to whole tiles; aligned shapes need no padding."""
    bm = min(max_rows, next_pow2(max(rows, 8)))
    cp = round_up(cols, 128)
    bn = 512 if cp % 512 == 0 else 256 if cp % 256 == 0 else 128
    return bm, bn, round_up(rows, bm), cp


def pad2(x, rows: int, cols: int, value=0):
    if x.shape == (rows, cols):
        return x
    return jnp.pad(x, ((0, rows - x.shape[0]), (0, cols - x.shape[1])), constant_values=value)
