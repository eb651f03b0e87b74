"""torch <-> jax dtype mapping (JAX runs with x64 on, so int64/float64 are real)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

_T2J = {
    torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16, torch.int8: jnp.int8, torch.int16: jnp.int16,
    torch.int32: jnp.int32, torch.int64: jnp.int64, torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16, torch.uint32: jnp.uint32, torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_, torch.complex64: jnp.complex64, torch.complex128: jnp.complex128,
    torch.float8_e4m3fn: jnp.float8_e4m3fn, torch.float8_e5m2: jnp.float8_e5m2,
    torch.float8_e4m3fnuz: jnp.float8_e4m3fnuz, torch.float8_e5m2fnuz: jnp.float8_e5m2fnuz,
    torch.float8_e8m0fnu: jnp.float8_e8m0fnu,
}
_J2T = {np.dtype(v): k for k, v in _T2J.items()}
# torch dtypes numpy has no type for: they cross the host boundary as their bits
BITS = {torch.bfloat16: torch.int16, **{t: torch.uint8 for t in _T2J if t.is_floating_point and t.itemsize == 1}}


def to_jax_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return np.dtype(_T2J[dtype])
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no JAX equivalent on the tpu device") from None


def to_torch_dtype(dtype) -> torch.dtype:
    try:
        return _J2T[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"JAX dtype {dtype} has no torch equivalent") from None


# torch's ScalarType names, as its "not implemented for" errors spell them
_SCALAR_TYPE_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble", torch.bool: "Bool",
    torch.int8: "Char", torch.int16: "Short", torch.int32: "Int", torch.int64: "Long", torch.uint8: "Byte",
    torch.uint16: "UInt16", torch.uint32: "UInt32", torch.uint64: "UInt64",
    torch.float8_e4m3fn: "Float8_e4m3fn", torch.float8_e5m2: "Float8_e5m2",
    torch.float8_e4m3fnuz: "Float8_e4m3fnuz", torch.float8_e5m2fnuz: "Float8_e5m2fnuz",
    torch.float8_e8m0fnu: "Float8_e8m0fnu",
}

def scalar_type_name(dtype) -> str:
    """torch's name of ``dtype`` (a torch or JAX/numpy dtype) in its errors: 'Float', 'Long'..."""
    t = dtype if isinstance(dtype, torch.dtype) else to_torch_dtype(dtype)
    return _SCALAR_TYPE_NAMES.get(t, str(t))


def cast_error(result, out) -> RuntimeError:
    """torch's error for a result that cannot be written into an output (``out=``, or
    ``self`` of an in-place op) of another dtype: 'result type Float can't be cast to the
    desired output type Long'."""
    return RuntimeError(f"result type {scalar_type_name(result)} can't be cast to the desired "
                        f"output type {scalar_type_name(out)}")


def kernel_error(kernel: str, dtype) -> NotImplementedError:
    """torch's error for a kernel with no version for ``dtype``:
    ``"kernel" not implemented for 'Float'``."""
    return NotImplementedError(f'"{kernel}" not implemented for \'{scalar_type_name(dtype)}\'')


# Ops whose torch kernels exist for some kinds of dtype only: op -> (torch's kernel name, the
# numpy kinds its kernels take: b bool, i/u integers). Other dtypes raise torch's error.
KERNEL_DTYPES: dict[str, tuple[str, str]] = {
    "bitwise_and": ("bitwise_and", "biu"), "bitwise_or": ("bitwise_or", "biu"),
    "bitwise_xor": ("bitwise_xor", "biu"), "bitwise_not": ("bitwise_not", "biu"),
    "bitwise_left_shift": ("lshift", "iu"), "bitwise_right_shift": ("rshift", "iu"),
}


def check_kernel_dtype(op: str, dtype) -> None:
    """Raise torch's NotImplementedError when ``op`` (a ``KERNEL_DTYPES`` key; others pass)
    has no kernel for ``dtype`` (the op's computation dtype), naming the tpu device as CUDA's
    error names itself ("bitwise_and_cuda")."""
    entry = KERNEL_DTYPES.get(op)
    if entry is not None and np.dtype(dtype).kind not in entry[1]:
        raise kernel_error(f"{entry[0]}_tpu", dtype)
