"""Fused optimizer steps (``torch.optim.Adam/AdamW(fused=True)``) as XLA lowerings: the
per-tensor math of the Pallas kernel's reference, run for every tensor in one jit."""
from __future__ import annotations

from tpu_kernels.pallas.reference.fused_adam import adam_step
from tpu_kernels.registry.decorator import xla


def _fused(adamw: bool):
    def fused(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
              beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        vmax = list(max_exp_avg_sqs) if amsgrad else [None] * len(self)
        new = [adam_step(p, g, m, v, mx, s, lr=lr, beta1=beta1, beta2=beta2,
                         weight_decay=weight_decay, eps=eps, amsgrad=amsgrad, maximize=maximize,
                         adamw=adamw, grad_scale=grad_scale, found_inf=found_inf)
               for p, g, m, v, mx, s in zip(self, grads, exp_avgs, exp_avg_sqs, vmax, state_steps)]
        params, ms, vs, mxs = (list(t) for t in zip(*new)) if new else ([], [], [], [])
        # mutated args in schema order: self, grads (unchanged), exp_avgs, exp_avg_sqs, max_exp_avg_sqs
        return params, [None] * len(grads), ms, vs, (mxs if amsgrad else [None] * len(max_exp_avg_sqs))
    fused.__name__ = "fused_adamw" if adamw else "fused_adam"
    return fused


xla("aten::_fused_adamw_.default", "aten::_fused_adamw_.tensor_lr")(_fused(adamw=True))
xla("aten::_fused_adam_.default", "aten::_fused_adam_.tensor_lr")(_fused(adamw=False))
