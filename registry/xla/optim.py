"""Fused optimizer steps (``torch.optim.Adam/AdamW/SGD/Adagrad(fused=True)``) as XLA
lowerings, every tensor in one jit (Adam's per-tensor math is the Pallas kernel's
reference). As torch's kernels, given a ``grad_scale`` they write the unscaled gradients
back, and a nonzero ``found_inf`` leaves everything as it was."""
from __future__ import annotations

import jax.numpy as jnp

from tpu_kernels.pallas.reference.fused_adam import adam_step
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.xla._util import meta_nothing


def _skip(found_inf):
    return found_inf is not None and jnp.asarray(found_inf) != 0


def _unscaled(grads, grad_scale, found_inf) -> list:
    """The gradients torch's fused kernels leave behind: divided by ``grad_scale`` unless
    the step is skipped (None for each: unchanged)."""
    if grad_scale is None:
        return [None] * len(grads)
    skip = _skip(found_inf)
    return [jnp.where(skip, g, (g.astype(jnp.float32) / grad_scale).astype(g.dtype)) for g in grads]


def _fused(adamw: bool):
    def fused(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
              beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        vmax = list(max_exp_avg_sqs) if amsgrad else [None] * len(self)
        new = [adam_step(p, g, m, v, mx, s, lr=lr, beta1=beta1, beta2=beta2,
                         weight_decay=weight_decay, eps=eps, amsgrad=amsgrad, maximize=maximize,
                         adamw=adamw, grad_scale=grad_scale, found_inf=found_inf)
               for p, g, m, v, mx, s in zip(self, grads, exp_avgs, exp_avg_sqs, vmax, state_steps)]
        params, ms, vs, mxs = (list(t) for t in zip(*new)) if new else ([], [], [], [])
        # mutated args in schema order: self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs
        return (params, _unscaled(grads, grad_scale, found_inf), ms, vs,
                (mxs if amsgrad else [None] * len(max_exp_avg_sqs)))
    fused.__name__ = "fused_adamw" if adamw else "fused_adam"
    return fused


xla("aten::_fused_adamw_.default", "aten::_fused_adamw_.tensor_lr")(_fused(adamw=True))
xla("aten::_fused_adam_.default", "aten::_fused_adam_.tensor_lr")(_fused(adamw=False))


def _direction(p, g, grad_scale, maximize, weight_decay):
    """The float32 step direction of SGD and Adagrad: the gradient unscaled, negated for
    ``maximize``, plus weight decay (numbers arrive traced: nothing branches on them)."""
    d = g.astype(jnp.float32)
    d = d / grad_scale if grad_scale is not None else d
    d = -d if maximize else d
    return d + weight_decay * p.astype(jnp.float32)


for _op in ("_fused_sgd_", "_fused_sgd_.tensor_lr", "_fused_adagrad_", "_fused_adagrad_.tensor_lr"):
    meta_nothing(_op)


@xla("aten::_fused_sgd_.default", "aten::_fused_sgd_.tensor_lr")
def fused_sgd(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov,
              maximize, is_first_step, grad_scale=None, found_inf=None):
    skip, f = _skip(found_inf), jnp.float32
    params, bufs = [], []
    for k, (p, g) in enumerate(zip(self, grads)):
        d = _direction(p, g, grad_scale, maximize, weight_decay)
        if momentum_buffer_list:                 # torch passes buffers only with momentum
            b = d if is_first_step else momentum * momentum_buffer_list[k].astype(f) + (1 - dampening) * d
            bufs.append(jnp.where(skip, momentum_buffer_list[k], b.astype(momentum_buffer_list[k].dtype)))
            d = d + momentum * b if nesterov else b
        params.append(jnp.where(skip, p, (p.astype(f) - lr * d).astype(p.dtype)))
    return params, _unscaled(grads, grad_scale, found_inf), bufs


@xla("aten::_fused_adagrad_.default", "aten::_fused_adagrad_.tensor_lr")
def fused_adagrad(self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize,
                  grad_scale=None, found_inf=None):
    skip, f = _skip(found_inf), jnp.float32
    params, sums = [], []
    for p, g, s, step in zip(self, grads, state_sums, state_steps):
        d = _direction(p, g, grad_scale, maximize, weight_decay)
        clr = lr / (1 + (jnp.asarray(step, f) - 1) * lr_decay)     # (the step is already counted)
        total = s.astype(f) + d * d
        sums.append(jnp.where(skip, s, total.astype(s.dtype)))
        params.append(jnp.where(skip, p, (p.astype(f) - clr * d / (jnp.sqrt(total) + eps)).astype(p.dtype)))
    return params, _unscaled(grads, grad_scale, found_inf), sums, [None] * len(state_steps)
