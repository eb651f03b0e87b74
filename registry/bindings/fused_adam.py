"""Pallas fused Adam/AdamW bound to ``_fused_adam_`` / ``_fused_adamw_`` (optimizer fused=True)."""
from __future__ import annotations

from tpu_kernels.registry.kernel_modules import kernel_module
from tpu_kernels.registry.decorator import tpu_kernel
from tpu_kernels.registry.dtypes import to_jax_dtype

kernel = kernel_module("tpu_kernels.pallas.fused_adam")


def _supports(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **kw):
    return kernel.supports([p.shape for p in self], [to_jax_dtype(p.dtype) for p in self],
                           state_dtypes=[to_jax_dtype(t.dtype) for t in (*exp_avgs, *exp_avg_sqs)])


def _bind(adamw: bool):
    def fused(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
              beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        p, m, v, vmax = kernel.fused_adam(
            self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr=lr, beta1=beta1,
            beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=amsgrad, maximize=maximize,
            adamw=adamw, grad_scale=grad_scale, found_inf=found_inf)
        # mutated args in schema order: self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs
        return list(p), [None] * len(grads), list(m), list(v), list(vmax) if amsgrad else [None] * len(max_exp_avg_sqs)
    fused.__name__ = "fused_adamw" if adamw else "fused_adam"
    return fused


tpu_kernel("aten::_fused_adamw_.default", "aten::_fused_adamw_.tensor_lr", kind="pallas", supports=_supports)(_bind(adamw=True))
tpu_kernel("aten::_fused_adam_.default", "aten::_fused_adam_.tensor_lr", kind="pallas", supports=_supports)(_bind(adamw=False))
