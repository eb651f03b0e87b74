"""Helion kernels (``tpu_kernels.helion_kernels``) bound to ATen ops and this library's
custom ops. Each binding adapts the ATen signature and asks the kernel's ``supports``."""
from __future__ import annotations

import jax

from tpu_kernels.registry.kernel_modules import kernel_module
from tpu_kernels.registry.context import out_dtype
from tpu_kernels.registry.decorator import tpu_kernel
from tpu_kernels.registry.dtypes import to_jax_dtype

hcumsum = kernel_module("tpu_kernels.helion_kernels.cumsum")
hglu = kernel_module("tpu_kernels.helion_kernels.glu")
hln = kernel_module("tpu_kernels.helion_kernels.layer_norm")
hrms = kernel_module("tpu_kernels.helion_kernels.rms_norm")
hrope = kernel_module("tpu_kernels.helion_kernels.rope")
hsm = kernel_module("tpu_kernels.helion_kernels.softmax")
htopk = kernel_module("tpu_kernels.helion_kernels.topk")
hvm = kernel_module("tpu_kernels.helion_kernels.var_mean")


def helion(op: str, supports, **kw):
    return tpu_kernel(op, kind="helion", supports=supports, **kw)


def _shape_of(weight):
    return None if weight is None else weight.shape


# -- norms ----------------------------------------------------------------------------------
@helion("aten::_fused_rms_norm", lambda input, normalized_shape, weight, eps: hrms.supports(
    input.shape, to_jax_dtype(input.dtype), _shape_of(weight), None if weight is None else to_jax_dtype(weight.dtype),
    len(normalized_shape)), static=("eps",))
def fused_rms_norm(input, normalized_shape, weight, eps):
    return hrms.rms_norm_fwd(input, weight, eps, len(normalized_shape))


@helion("aten::_fused_rms_norm_backward",
        lambda grad_out, input, normalized_shape, rstd, weight, output_mask: hrms.supports(
            input.shape, to_jax_dtype(input.dtype), _shape_of(weight), None if weight is None else to_jax_dtype(weight.dtype),
            len(normalized_shape)))
def fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    dx, dw = hrms.rms_norm_bwd(grad_out, input, weight, rstd, len(normalized_shape))
    return (dx if output_mask[0] else None), (dw if output_mask[1] else None)


@helion("aten::native_layer_norm", lambda input, normalized_shape, weight, bias, eps: hln.supports(
    input.shape, to_jax_dtype(input.dtype), _shape_of(weight), None if weight is None else to_jax_dtype(weight.dtype),
    None if bias is None else to_jax_dtype(bias.dtype), len(normalized_shape)), static=("eps",))
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    out, mean, rstd = hln.layer_norm_fwd(input, weight, bias, eps, len(normalized_shape))
    return out, mean, rstd


@helion("aten::native_layer_norm_backward",
        lambda grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask: hln.supports(
            input.shape, to_jax_dtype(input.dtype), _shape_of(weight), None if weight is None else to_jax_dtype(weight.dtype),
            None if bias is None else to_jax_dtype(bias.dtype), len(normalized_shape)))
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    dx, dw, db = hln.layer_norm_bwd(grad_out, input, mean, rstd, weight, bias, len(normalized_shape))
    return tuple(g if m else None for g, m in zip((dx, dw, db), output_mask))


# -- softmax -------------------------------------------------------------------------------
def _softmax_supports(self, dim, half_to_float):
    return "half_to_float needs a float32 result" if half_to_float else hsm.supports(self.shape, to_jax_dtype(self.dtype), dim)


@helion("aten::_softmax", _softmax_supports)
def softmax(self, dim, half_to_float):
    return hsm.softmax_fwd(self, log=False)


@helion("aten::_log_softmax", _softmax_supports)
def log_softmax(self, dim, half_to_float):
    return hsm.softmax_fwd(self, log=True)


def _softmax_bwd_supports(grad_output, output, dim, input_dtype):
    return hsm.supports(output.shape, to_jax_dtype(output.dtype), dim)


@helion("aten::_softmax_backward_data", _softmax_bwd_supports)
def softmax_backward(grad_output, output, dim, input_dtype):
    return hsm.softmax_bwd(grad_output, output, log=False)


@helion("aten::_log_softmax_backward_data", _softmax_bwd_supports)
def log_softmax_backward(grad_output, output, dim, input_dtype):
    return hsm.softmax_bwd(grad_output, output, log=True)


# -- gated activations -------------------------------------------------------------------------
@helion("aten::glu", lambda self, dim=-1: hglu.supports(self.shape, to_jax_dtype(self.dtype), dim, glu_halves=True))
def glu(self, dim=-1):
    return hglu.glu(self, dim)


@helion("tpu_kernels::swiglu", lambda a, b: hglu.supports(a.shape, to_jax_dtype(a.dtype)))
def swiglu(a, b):
    return hglu.swiglu(a, b)


@helion("tpu_kernels::geglu", lambda a, b, approximate="none": hglu.supports(
    a.shape, to_jax_dtype(a.dtype), approximate=approximate))
def geglu(a, b, approximate="none"):
    return hglu.geglu(a, b, approximate)


@helion("tpu_kernels::rope", lambda q, k, cos, sin, interleaved=False: hrope.supports(
    q.shape, to_jax_dtype(q.dtype), cos.shape, to_jax_dtype(cos.dtype), interleaved) or hrope.supports(
    k.shape, to_jax_dtype(k.dtype), cos.shape, to_jax_dtype(cos.dtype), interleaved))
def rope(q, k, cos, sin, interleaved=False):
    return hrope.rope_qk(q, k, cos, sin, interleaved)


# -- reductions and scans ----------------------------------------------------------------------
def _last_dim_only(self, dim) -> str | None:
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    if dim is None and self.dim() != 1:
        return "reduces over all dims (the kernel reduces the last dim)"
    if any(d % max(self.dim(), 1) != self.dim() - 1 for d in dims):
        return f"dim {dim} is not the last dim"
    return None


def _var_supports(self, dim=None, *, correction=None, keepdim=False):
    return _last_dim_only(self, dim) or hvm.supports(self.shape, to_jax_dtype(self.dtype), -1)


def _correction(correction) -> float:
    return 1 if correction is None else correction


@helion("aten::var_mean.correction", _var_supports, static=("correction",))
def var_mean(self, dim=None, *, correction=None, keepdim=False):
    return hvm.var_mean(self, _correction(correction), keepdim)


@helion("aten::var.correction", _var_supports, static=("correction",))
def var(self, dim=None, *, correction=None, keepdim=False):
    return hvm.var(self, _correction(correction), keepdim)


@helion("aten::std.correction", _var_supports, static=("correction",))
def std(self, dim=None, *, correction=None, keepdim=False):
    return hvm.std(self, _correction(correction), keepdim)


@helion("aten::cumsum", lambda self, dim, *, dtype=None: _last_dim_only(self, dim) or hcumsum.supports(
    self.shape, to_jax_dtype(self.dtype), -1, None if dtype is None else to_jax_dtype(dtype)))
def cumsum(self, dim, *, dtype=None):
    return hcumsum.cumsum(self, -1, out_dtype())


@helion("aten::topk", lambda self, k, dim=-1, largest=True, sorted=True: _last_dim_only(self, dim)
        or htopk.supports(self.shape, to_jax_dtype(self.dtype), k, -1, largest, sorted))
def topk(self, k, dim=-1, largest=True, sorted=True):
    return htopk.topk(self, k, -1, largest, sorted)




# -- backward of the gated custom ops (the Helion kernels' own custom_vjp) -----------------------
@helion("tpu_kernels::swiglu_backward", lambda grads, a, b: hglu.supports(a.shape, to_jax_dtype(a.dtype)))
def swiglu_backward(grads, a, b):
    return list(jax.vjp(hglu.swiglu, a, b)[1](grads[0]))


@helion("tpu_kernels::geglu_backward", lambda grads, a, b, approximate="none": hglu.supports(
    a.shape, to_jax_dtype(a.dtype), approximate=approximate))
def geglu_backward(grads, a, b, approximate="none"):
    return list(jax.vjp(lambda x, y: hglu.geglu(x, y, approximate), a, b)[1](grads[0]))
