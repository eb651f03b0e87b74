"""Loss lowerings: nll_loss (1d/2d), pointwise losses (mse, huber, smooth_l1, soft_margin,
binary cross entropy), margin losses, and their backward ops (CTC: ``ctc.py``).

``reduction`` is torch's enum: 0 none, 1 mean, 2 sum. Half types compute in float32.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import torch
from torch._decomp import decompositions as torch_decomps

from tpu_kernels.pallas.reference.cross_entropy import class_indices
from tpu_kernels.registry.context import check, out_dtype, out_shape
from tpu_kernels.registry.decorator import xla
from tpu_kernels.registry.dtypes import kernel_error, scalar_type_name, to_torch_dtype
from tpu_kernels.registry.xla._util import float_compute, meta_like

NONE, MEAN, SUM = 0, 1, 2

# Torch ships no Meta kernel for these backward ops; each result is shaped like an input.
for _op, _like in (("multi_margin_loss_backward", "self"),
                   ("multilabel_margin_loss_backward", "self")):
    meta_like(_op, _like)


def _reduce(loss: jax.Array, reduction: int) -> jax.Array:
    if reduction == MEAN:
        return jnp.mean(loss)
    if reduction == SUM:
        return jnp.sum(loss)
    return loss


def _mean_norm(x: jax.Array, reduction: int) -> float:
    """The factor a mean reduction puts on each element's gradient."""
    return 1.0 / x.size if reduction == MEAN and x.size else 1.0


def _ct():
    """Compute dtype: float32 for half outputs, else torch's output dtype."""
    return float_compute(out_dtype())


# -- argument checks: torch's words ------------------------------------------------------------
def _sizes(shape: Sequence[int]) -> str:
    return f"[{', '.join(str(n) for n in shape)}]"


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def check_label_smoothing(label_smoothing: float) -> None:
    """torch bounds label smoothing only from above: a negative or nan one is no smoothing."""
    _require(not label_smoothing > 1.0, f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing:g}")


def check_target_dtype(dtype: torch.dtype) -> None:
    _require(dtype in (torch.int64, torch.uint8),
             f"expected target dtype to be Long or Byte, but got {scalar_type_name(dtype)}")


def check_weight_dtype(input_dtype: torch.dtype, weight_dtype: Optional[torch.dtype]) -> None:
    """CPU's kernels read the class weights as the input's dtype."""
    _require(weight_dtype is None or weight_dtype == input_dtype,
             f"expected scalar type {scalar_type_name(input_dtype)} but found {scalar_type_name(weight_dtype)}")


def check_nll_args(self: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor]) -> None:
    """nll_loss_forward's checks in the order and words of torch's C++ meta function."""
    _require(0 < self.dim() <= 2, "input tensor should be 1D or 2D")
    _require(target.dim() <= 1, "0D or 1D target tensor expected, multi-target not supported")
    check_target_dtype(target.dtype)
    no_batch_dim = self.dim() == 1 and target.dim() == 0
    _require(no_batch_dim or (target.dim() == 1 and self.shape[0] == target.shape[0]),
             f"size mismatch (got input: {_sizes(self.shape)}, target: {_sizes(target.shape)})")
    n_cls = self.shape[-1]
    _require(weight is None or (weight.dim() == 1 and weight.numel() == n_cls),
             f"weight tensor should be defined either for all {n_cls} classes or no classes but got "
             f"weight tensor of shape: {_sizes(() if weight is None else weight.shape)}")


def _check_kernel_dtypes(self: jax.Array, target: jax.Array, weight: Optional[jax.Array]) -> None:
    """The dtype checks of torch's CPU nll_loss kernels, which the meta functions skip (the
    lowering would compute with int32 targets, int logits or another weight dtype)."""
    check_target_dtype(to_torch_dtype(target.dtype))
    x = to_torch_dtype(self.dtype)
    if not x.is_floating_point:
        frame = "nll_loss2d_forward_out_frame" if self.ndim == 4 else "nll_loss_out_frame"
        raise kernel_error(frame, x)
    check_weight_dtype(x, None if weight is None else to_torch_dtype(weight.dtype))


# torch's Meta key runs Python decompositions for nll_loss: their gather/scatter refuse the
# uint8 targets CPU takes, and they raise AssertionError where CPU raises RuntimeError.
_META_OVERRIDES = torch.library.Library("aten", "IMPL")


def _nll_loss_forward_meta(self, target, weight, reduction, ignore_index):
    """torch's C++ meta function of nll_loss_forward (checks, then result shapes)."""
    check_nll_args(self, target, weight)
    out = (self.shape[0],) if reduction == NONE and self.dim() == 2 else ()
    return self.new_empty(out), self.new_empty(())


def _nll_loss_backward_meta(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    """torch's Python meta, with a uint8 target read as int64 (its scatter refuses uint8)."""
    target = target.long() if target.dtype == torch.uint8 else target
    return torch_decomps.nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index,
                                           total_weight)


_META_OVERRIDES.impl("nll_loss_forward", _nll_loss_forward_meta, "Meta")
_META_OVERRIDES.impl("nll_loss_backward", _nll_loss_backward_meta, "Meta")


# -- nll_loss ---------------------------------------------------------------------------------
def _nll_pick(self, target, weight, ignore_index, ct):
    """Per-target -x[target]*w and w, with ignored targets giving 0 (class axis 1, or 0 for 1-D)."""
    cdim = 0 if self.ndim < 2 else 1
    target = class_indices(target)
    valid = target != ignore_index
    n_cls = self.shape[cdim]
    check(~valid | ((target >= 0) & (target < n_cls)), f"Target is out of bounds (classes: {n_cls})")
    safe = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(self.astype(ct), jnp.expand_dims(safe, cdim), axis=cdim)
    picked = jnp.squeeze(picked, cdim)
    w = weight.astype(ct)[safe] if weight is not None else jnp.ones(safe.shape, ct)
    w = jnp.where(valid, w, jnp.zeros((), ct))
    return -picked * w, w


@xla("aten::nll_loss_forward", "aten::nll_loss2d_forward")
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    _check_kernel_dtypes(self, target, weight)
    ct = _ct()
    loss, w = _nll_pick(self, target, weight, ignore_index, ct)
    if reduction == NONE and self.ndim > 1:
        return loss, jnp.zeros((), ct)
    total = jnp.sum(w)
    if reduction == SUM:
        return jnp.sum(loss), total
    if reduction == MEAN:
        return jnp.sum(loss) / total, total
    return loss, total


@xla("aten::nll_loss_backward", "aten::nll_loss2d_backward")
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    ct = _ct()
    cdim = 0 if self.ndim < 2 else 1
    target = class_indices(target)
    if self.ndim == 1 and target.ndim > 0:  # torch's kernel reads target[0] for unbatched input
        target = target[0]
    g = grad_output.astype(ct)
    if reduction != NONE or self.ndim < 2:
        g = g.reshape(())
    if reduction == MEAN:
        g = g / total_weight.astype(ct)
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    w = weight.astype(ct)[safe] if weight is not None else jnp.ones((), ct)
    coef = jnp.where(valid, -g * w, jnp.zeros((), ct))
    classes = jax.lax.broadcasted_iota(safe.dtype, self.shape, cdim)
    hit = classes == jnp.expand_dims(safe, cdim)
    return jnp.where(hit, jnp.expand_dims(coef, cdim), jnp.zeros((), ct))


# -- pointwise losses ---------------------------------------------------------------------------
def _pointwise_loss(elem: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """A loss ``reduce(elem(x, t, *params))`` over broadcast ``self`` and ``target``."""
    def lower(self, target, reduction=MEAN, *params):
        ct = _ct()
        return _reduce(elem(self.astype(ct), target.astype(ct), *params), reduction)
    return lower


def _pointwise_grad(elem_grad: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """d loss / d self = g * elem_grad(x, t, *params), scaled by 1/numel for a mean."""
    def lower(grad_output, self, target, reduction, *params):
        ct = _ct()
        x, t, g = self.astype(ct), target.astype(ct), grad_output.astype(ct)
        r = elem_grad(x, t, *params) * (g * _mean_norm(x, reduction))
        return jnp.broadcast_to(r, out_shape())
    return lower


def _huber(x, t, delta=1.0):
    z = jnp.abs(x - t)
    return jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta))


def _huber_grad(x, t, delta):
    d = x - t
    return jnp.where(d < -delta, -delta, jnp.where(d > delta, delta, d))


def _smooth_l1(x, t, beta=1.0):
    z = jnp.abs(x - t)
    return jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)


def _smooth_l1_grad(x, t, beta):
    d = x - t
    return jnp.where(jnp.abs(d) < beta, d / beta, jnp.sign(d))


_POINTWISE = {
    # name: (elementwise loss, its derivative in self)
    "mse_loss": (lambda x, t: (x - t) ** 2, lambda x, t: 2.0 * (x - t)),
    "huber_loss": (_huber, _huber_grad),
    "smooth_l1_loss": (_smooth_l1, _smooth_l1_grad),
    "soft_margin_loss": (lambda x, t: jnp.log1p(jnp.exp(-x * t)),
                         lambda x, t: t * (jax.nn.sigmoid(t * x) - 1.0)),
}
for _name, (_f, _df) in _POINTWISE.items():
    xla(f"aten::{_name}", name=_name)(_pointwise_loss(_f))
    xla(f"aten::{_name}_backward", name=f"{_name}_backward")(_pointwise_grad(_df))


@xla("aten::binary_cross_entropy")
def binary_cross_entropy(self, target, weight=None, reduction=MEAN):
    ct = _ct()
    x, t = self.astype(ct), target.astype(ct)
    # a probability outside [0, 1] (no sigmoid before the loss): CPU's kernel refuses it
    check((x >= 0) & (x <= 1), "all elements of input should be between 0 and 1", RuntimeError)
    # torch clamps each log at -100 so that x in {0, 1} gives a finite loss
    loss = (t - 1) * jnp.maximum(jnp.log1p(-x), -100.0) - t * jnp.maximum(jnp.log(x), -100.0)
    if weight is not None:
        loss = loss * weight.astype(ct)
    return _reduce(loss, reduction)


@xla("aten::binary_cross_entropy_backward")
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=MEAN):
    ct = _ct()
    x, t, g = self.astype(ct), target.astype(ct), grad_output.astype(ct)
    r = g * (x - t) / jnp.maximum(x * (1 - x), 1e-12)
    if weight is not None:
        r = r * weight.astype(ct)
    return jnp.broadcast_to(r * _mean_norm(x, reduction), out_shape())


@xla("aten::binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=MEAN):
    ct = _ct()
    x, t = self.astype(ct), target.astype(ct)
    # log(1 + exp(-x)) computed stably as max(-x, 0) + log1p(exp(-|x|))
    softplus_neg = jnp.maximum(-x, 0) + jnp.log1p(jnp.exp(-jnp.abs(x)))
    if pos_weight is not None:
        softplus_neg = ((pos_weight.astype(ct) - 1) * t + 1) * softplus_neg
    loss = (1 - t) * x + softplus_neg
    if weight is not None:
        loss = loss * weight.astype(ct)
    return _reduce(loss, reduction)


# -- margin losses -----------------------------------------------------------------------------------
def _relu(z):
    """max(z, 0) with a zero gradient at 0 (torch's margin kernels test z > 0)."""
    return jnp.where(z > 0, z, jnp.zeros((), z.dtype))


def _multi_margin(x, target, p, margin, weight, reduction, shape):
    x2 = jnp.atleast_2d(x)
    t = jnp.atleast_1d(target).reshape(-1)
    n, c = x2.shape
    check((t >= 0) & (t < c), "target out of range", RuntimeError)   # XLA would clamp it
    picked = jnp.take_along_axis(x2, t[:, None], axis=1)
    z = _relu(margin - picked + x2)
    z = z if p == 1 else z * z
    if weight is not None:
        z = z * weight.astype(x2.dtype)[t][:, None]
    z = jnp.where(jnp.arange(c)[None, :] == t[:, None], jnp.zeros((), z.dtype), z)
    per_sample = jnp.sum(z, axis=1) / c
    if reduction == MEAN:
        return jnp.mean(per_sample)
    if reduction == SUM:
        return jnp.sum(per_sample)
    return per_sample.reshape(shape)


@xla("aten::multi_margin_loss", static=("p",))
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=MEAN):
    ct = _ct()
    return _multi_margin(self.astype(ct), target, p, jnp.asarray(margin, ct), weight, reduction,
                         out_shape())


@xla("aten::multi_margin_loss_backward", static=("p",))
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=MEAN):
    ct = _ct()
    g = grad_output.astype(ct)
    f = lambda x: _multi_margin(x, target, p, jnp.asarray(margin, ct), weight, reduction, g.shape)
    return jax.vjp(f, self.astype(ct))[1](g)[0]


def _multilabel_margin(x, target, reduction, shape):
    """Loss and is_target: labels are target's entries up to the first -1."""
    x2, t = jnp.atleast_2d(x), jnp.atleast_2d(target)
    c = x2.shape[1]
    idx = jnp.arange(c)
    end = jnp.min(jnp.where(t == -1, idx, c), axis=-1, keepdims=True)
    is_label = idx < end
    picked = jnp.take_along_axis(x2, jnp.where(is_label, t, 0), axis=-1)      # (n, c)
    is_target = jnp.any((jnp.where(is_label, t, -1)[:, :, None] == idx), axis=1)   # (n, c)
    # z[n, k, j] = 1 - x[n, label_k] + x[n, j], for labels k and non-target classes j
    z = _relu(1.0 - picked[:, :, None] + x2[:, None, :]) / c
    keep = is_label[:, :, None] & ~is_target[:, None, :]
    per_sample = jnp.sum(jnp.where(keep, z, jnp.zeros((), z.dtype)), axis=(1, 2))
    if reduction == MEAN:
        loss = jnp.mean(per_sample)
    elif reduction == SUM:
        loss = jnp.sum(per_sample)
    else:
        loss = per_sample.reshape(shape)
    return loss, is_target.reshape(x.shape)


@xla("aten::multilabel_margin_loss_forward")
def multilabel_margin_loss_forward(self, target, reduction):
    ct = _ct()
    loss, is_target = _multilabel_margin(self.astype(ct), target, reduction, out_shape(0))
    return loss, is_target.astype(ct)


@xla("aten::multilabel_margin_loss_backward")
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    ct = _ct()
    g = grad_output.astype(ct)
    f = lambda x: _multilabel_margin(x, target, reduction, g.shape)[0]
    return jax.vjp(f, self.astype(ct))[1](g)[0]
