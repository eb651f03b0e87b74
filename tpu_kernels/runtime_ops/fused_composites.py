"""Composite torch calls the tpu device runs as one op.

``F.scaled_dot_product_attention`` picks its kernel through a C++ choice function that
a Python backend cannot register, so on tpu it would always take the math path (mask
building, two bmm, softmax). Catching ``scaled_dot_product_attention`` at
``AutogradPrivateUse1`` sends it to ``_scaled_dot_product_flash_attention_for_cpu``, one
fused op each way (its backward is torch's own derivative formula), which the registry
runs as the Pallas flash kernel or the fused XLA lowering. Dropout takes the math path.

``F.cross_entropy`` is CompositeImplicitAutograd: torch would split it into
``log_softmax`` + ``nll_loss`` before the tpu tensor sees it, and the fused kernels
(one pass over the vocabulary) could never run. Catching ``cross_entropy_loss`` at the
``AutogradPrivateUse1`` key takes the whole call on tpu tensors to
``tpu_kernels::cross_entropy`` (which has its own autograd); anything the fused op does
not cover (probability targets, spatial [N, C, d...] inputs, integer logits) takes torch's
own decomposition, unchanged. The fused call first makes CPU's argument checks, in CPU's
order and words: torch's meta functions skip its kernels' dtype checks.

``F.linear`` of an input with more than two dims is CompositeImplicitAutograd as well:
torch flattens the input to 2-D, runs ``addmm`` and views the result back, and on TPU
that reshape between the matmul and its neighbours keeps XLA from fusing them (a split
of the result, the concatenation of the gradients that meet at it): JAX's own medium-GPT
training step, rewritten with flattening linears, moves 16% more bytes (v5e compiler
figures). Caught whole, such a call (plain tpu tensors, one
floating dtype) runs ``tpu_kernels::linear``, an N-d contraction, whose backward is the
same op and its weight gradient; every other call takes torch's decomposition. A call
with no gradient to record (an inference forward) goes straight to the tpu tensors'
dispatch: torch.library's autograd layer is Python and would only pass it on.

``F.one_hot`` is CompositeImplicitAutograd too, and for a device other than the CPU its
decomposition (``arange == x``) checks no class value: a label past ``num_classes`` or
below 0 gave a row of zeros, silently (CUDA fails a device-side assert). Caught whole, it
runs the registry's lowering, whose device-side checks raise CPU's errors at the next sync.

``silu_backward`` and ``mish_backward`` (what autograd calls for ``F.silu``/``F.mish``) have
CPU and CUDA kernels and a CompositeImplicitAutograd one for other devices: eight or eleven
ops, each result rounded to a half type's precision. In float16 and bfloat16 that lost up to
a few ulps against CPU's kernel (float32 inside, rounded once): silu's gradient at x = 8.5
came out as the incoming gradient itself (sigmoid rounded to 1). Caught whole, a call with no
gradient to record runs the registry's lowering (float32 inside, as CPU's).
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD

from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

from tpu_kernels.dispatch import run_call
from tpu_kernels.registry import runtime_handler
from tpu_kernels.tensor import TpuTensor
from tpu_kernels.registry.xla.loss import check_label_smoothing, check_nll_args, check_weight_dtype

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}
aten = torch.ops.aten


def _check_class_targets(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                         label_smoothing: float) -> None:
    """CPU's checks of cross entropy over [n, C] logits with class-index targets, in its
    order: label smoothing, nll_loss_nd's batch sizes, nll_loss's meta, the kernel's
    weight dtype. Static, so they run before anything does."""
    check_label_smoothing(label_smoothing)
    if input.shape[0] != target.shape[0]:
        raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target batch_size "
                         f"({target.shape[0]}).")
    check_nll_args(input, target, weight)
    check_weight_dtype(input.dtype, None if weight is None else weight.dtype)


def _transformed(*tensors: torch.Tensor | None) -> bool:
    """Under a torch.func transform (per-sample gradients: ``vmap(grad(loss))``) or with
    forward-AD dual inputs, which the fused op's autograd (torch.library's) cannot run: it
    has no setup_context for torch.func and no forward derivative (the tangent was lost)."""
    if torch._C._are_functorch_transforms_active():
        return True
    if fwAD._current_level < 0:   # no dual level open: no tensor has a tangent
        return False
    return any(t is not None and fwAD.unpack_dual(t).tangent is not None for t in tensors)


def _cross_entropy_loss(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                        reduction: int = 1, ignore_index: int = -100,
                        label_smoothing: float = 0.0) -> torch.Tensor:
    # equal shapes are probability targets; integer logits fail in log_softmax, as on CPU
    indices = input.shape != target.shape and input.is_floating_point()
    if indices and input.dim() == 2 and target.dim() >= 1 and not _transformed(input, weight):
        _check_class_targets(input, target, weight, label_smoothing)
        return torch.ops.tpu_kernels.cross_entropy(input, target, weight, ignore_index,
                                                   _REDUCTIONS[reduction], label_smoothing)
    return aten.cross_entropy_loss.default.decompose(input, target, weight, reduction,
                                                     ignore_index, label_smoothing)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    gqa_ok = query.shape[-3] == key.shape[-3] or enable_gqa
    # the fused op's derivative gives no gradient to the mask (T5's learned position bias
    # needs one): a mask that requires grad takes the math path
    mask_ok = attn_mask is None or not (attn_mask.requires_grad and torch.is_grad_enabled())
    fusable = dropout_p == 0.0 and query.dim() == 4 and gqa_ok and not (is_causal and attn_mask is not None)
    if fusable and value.shape[-1] != query.shape[-1]:
        # multi-head latent attention (DeepSeek-V2/V3, MiniCPM3): the CPU flash op requires
        # one head size (torch's CPU math path handles this case); the overrideable fused
        # op's meta function gives the output value's head size, and its derivative gives
        # the mask's gradient too
        return aten._scaled_dot_product_fused_attention_overrideable(
            query, key, value, attn_mask, 0.0, is_causal, scale=scale)[0]
    if fusable and mask_ok:
        # a bool mask stays bool (torch's CPU kernel would refuse it, its meta function and
        # the tpu impls take it): the flash kernel reads it as int8, a quarter of an f32
        # additive mask's HBM traffic, and with no full-size masked_fill pass before it
        return aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale)[0]
    return aten.scaled_dot_product_attention.default.decompose(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _plain(t: torch.Tensor | None) -> bool:
    """A tpu tensor, or the fake / functional stand-in ``torch.compile`` traces with; not
    another subclass (a DTensor's ops go through its sharding rules, which know aten ops)."""
    return t is None or type(t) is TpuTensor or isinstance(t, (FakeTensor, FunctionalTensor))


def _linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    dtypes = {input.dtype, weight.dtype} | (set() if bias is None else {bias.dtype})
    if (input.dim() > 2 and weight.dim() == 2 and (bias is None or bias.dim() == 1)
            and input.shape[-1] == weight.shape[1] and len(dtypes) == 1 and input.is_floating_point()
            and _plain(input) and _plain(weight) and _plain(bias) and not _transformed(input, weight, bias)):
        if _no_autograd(input, weight, bias):
            return TpuTensor.__torch_dispatch__(_LINEAR, _TYPES, (input, weight, bias))
        return torch.ops.tpu_kernels.linear(input, weight, bias)
    return aten.linear.default.decompose(input, weight, bias)


_LINEAR = torch.ops.tpu_kernels.linear.default
_TYPES = (TpuTensor,)


def _no_autograd(*tensors: torch.Tensor | None) -> bool:
    """True when a call of a declared op on ``tensors`` would pass its autograd layer
    (torch.library's, in Python: ~8 µs a call) untouched and land in the tpu tensors'
    ``__torch_dispatch__``: plain tpu tensors, no gradient wanted, no dispatch mode to
    see the op. An inference forward's every N-d ``F.linear`` takes this way."""
    if torch._C._len_torch_dispatch_stack():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not TpuTensor or (grad and t.requires_grad)):
            return False
    return True


@runtime_handler("aten::linear", catch_at="AutogradPrivateUse1")
def linear(op, args, kwargs):
    return _linear(*args, **kwargs)


@runtime_handler("aten::cross_entropy_loss", catch_at="AutogradPrivateUse1")
def cross_entropy_loss(op, args, kwargs):
    return _cross_entropy_loss(*args, **kwargs)


@runtime_handler("aten::scaled_dot_product_attention", catch_at="AutogradPrivateUse1")
def scaled_dot_product_attention(op, args, kwargs):
    return _sdpa(*args, **kwargs)


@runtime_handler("aten::one_hot", catch_at="AutogradPrivateUse1")
def one_hot(op, args, kwargs):
    x = args[0]
    n = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
    # num_classes=-1 reads the largest value (torch's decomposition does); a traced or
    # fake tensor (torch.compile) takes the decomposition as before
    if n < 0 or type(x) is not TpuTensor or torch.compiler.is_compiling():
        return aten.one_hot.default.decompose(*args, **kwargs)
    return run_call(op, args, kwargs)


@runtime_handler("aten::silu_backward", "aten::mish_backward", catch_at="AutogradPrivateUse1")
def activation_backward(op, args, kwargs):
    if _no_autograd(*args, *kwargs.values()) and not torch.compiler.is_compiling():
        return run_call(op, args, kwargs)
    return op.decompose(*args, **kwargs)
