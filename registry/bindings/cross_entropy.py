"""Pallas cross entropy and fused linear cross entropy, bound to this library's custom ops
(``tpu_kernels::cross_entropy`` is what ``F.cross_entropy`` on tpu tensors reaches: see
``tpu_kernels/patterns.py``)."""
from __future__ import annotations

from tpu_kernels.registry.kernel_modules import kernel_module
from tpu_kernels.registry.decorator import tpu_kernel
from tpu_kernels.registry.dtypes import to_jax_dtype

ce = kernel_module("tpu_kernels.pallas.cross_entropy")
lce = kernel_module("tpu_kernels.pallas.linear_cross_entropy")


def _ce_supports(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return ce.supports(logits.shape, to_jax_dtype(logits.dtype), to_jax_dtype(target.dtype),
                       None if weight is None else weight.shape, reduction=reduction,
                       label_smoothing=label_smoothing)


@tpu_kernel("tpu_kernels::cross_entropy", kind="pallas", supports=_ce_supports,
            static=("label_smoothing",))
def cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return ce.cross_entropy(logits, target, weight, ignore_index=ignore_index, reduction=reduction,
                            label_smoothing=label_smoothing)


def _lce_supports(hidden, weight, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    if weight.dtype != hidden.dtype:
        return f"weight dtype {weight.dtype} != hidden dtype {hidden.dtype}"
    return lce.supports(hidden.shape, weight.shape, to_jax_dtype(hidden.dtype), to_jax_dtype(target.dtype), reduction=reduction,
                        label_smoothing=label_smoothing)


@tpu_kernel("tpu_kernels::linear_cross_entropy", kind="pallas", supports=_lce_supports,
            static=("label_smoothing",))
def linear_cross_entropy(hidden, weight, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return lce.linear_cross_entropy(hidden, weight, target, ignore_index=ignore_index,
                                    reduction=reduction, label_smoothing=label_smoothing)
