"""The registry's Pallas and Helion impls compiled for chips: the coverage report's
"compiles on v5e / v6e / v7x" column.

Each kernel-bound op has production-shape arguments here (meta tensors: ``supports``
judges them as dispatch would, then they become abstract arrays on the chip), and every
Pallas/Helion impl of the op that accepts them is compiled for each chip exactly as
dispatch calls it: ``impl.fn`` on jax values.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable

import torch

from tpu_kernels.aot.check import check
from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry import REGISTRY
from tpu_kernels.registry.costs.program import program as impl_program

B, F, L = torch.bfloat16, torch.float32, torch.int64
N, H, FFN, V = 8192, 4096, 14336, 128256


def _t(*shape: int, dtype: torch.dtype = B) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _attention() -> tuple:
    q = _t(1, 32, 4096, 128)
    return (q, q, q), {"dropout_p": 0.0, "is_causal": True}


def _attention_backward() -> tuple:
    q = _t(1, 32, 4096, 128)
    return (q, q, q, q, q, _t(1, 32, 4096, dtype=F), 0.0, True), {}


def _packed_attention(backward: bool) -> tuple:
    """tpu_kernels::flash_attention over packed sequences: segment ids, causal, GQA 32/8."""
    q, kv, ids = _t(1, 32, 4096, 128), _t(1, 8, 4096, 128), _t(1, 4096, dtype=torch.int32)
    args = (q, kv, kv, ids, ids, True)
    return ([q], *args) if backward else args, {}


def _adam(tensor_lr: bool) -> tuple:
    params = [_t(H, FFN, dtype=F), _t(H, dtype=F)]
    steps = [_t(dtype=F) for _ in params]
    lr = _t(dtype=F) if tensor_lr else 1e-3
    return (params, params, params, params, [], steps), dict(
        lr=lr, beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)


def _paged_decode() -> tuple:
    """A serving decode step: 256 sequences of context up to 8192 in pages of 16 (Llama-3-8B
    attention: 32 query heads, 8 kv heads)."""
    seqs, pages = 256, 8192 // 16
    kv = _t(seqs * pages, 8, 16, 128)
    i32 = torch.int32
    return (_t(seqs, 32, 128), kv, kv, _t(seqs, dtype=i32), _t(seqs, pages, dtype=i32),
            _t(seqs + 1, dtype=i32), _t(1, dtype=i32)), {}


# op -> () -> (args, kwargs): production shapes (Llama-3-8B-like, bf16; MoE of 8 experts)
ARGS: dict[str, Callable[[], tuple]] = {
    "aten::mm": lambda: ((_t(N, H), _t(H, FFN)), {}),
    "aten::addmm": lambda: ((_t(FFN), _t(N, H), _t(H, FFN)), {}),
    "aten::bmm": lambda: ((_t(32, 4096, 128), _t(32, 128, 4096)), {}),
    "tpu_kernels::linear": lambda: ((_t(4, N // 4, H), _t(FFN, H), _t(FFN)), {}),
    "tpu_kernels::linear_weight_grad": lambda: ((_t(4, N // 4, FFN), _t(4, N // 4, H)), {}),
    "aten::_scaled_dot_product_flash_attention_for_cpu": _attention,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _attention_backward,
    "tpu_kernels::flash_attention": lambda: _packed_attention(False),
    "tpu_kernels::flash_attention_backward": lambda: _packed_attention(True),
    "tpu_kernels::cross_entropy": lambda: ((_t(N, V), _t(N, dtype=L)), {}),
    "tpu_kernels::linear_cross_entropy": lambda: ((_t(4096, H), _t(V, H), _t(4096, dtype=L)),
                                                  {}),
    "tpu_kernels::ragged_dot": lambda: ((_t(2 * N, H), _t(8, H, FFN),
                                         _t(8, dtype=torch.int32)), {}),
    "aten::_grouped_mm": lambda: ((_t(2 * N, H), _t(8, H, FFN)),
                                  {"offs": _t(8, dtype=torch.int32)}),
    "tpu_kernels::ragged_paged_attention": _paged_decode,
    "aten::embedding": lambda: ((_t(V, H), _t(N, dtype=L)), {}),
    "aten::embedding_dense_backward": lambda: ((_t(N, H), _t(N, dtype=L), V, -1, False), {}),
    "aten::native_layer_norm": lambda: ((_t(N, H), [H], _t(H), _t(H), 1e-5), {}),
    "aten::native_layer_norm_backward": lambda: (
        (_t(N, H), _t(N, H), [H], _t(N, 1, dtype=F), _t(N, 1, dtype=F), _t(H), _t(H),
         [True, True, True]), {}),
    "aten::_fused_rms_norm": lambda: ((_t(N, H), [H], _t(H), 1e-6), {}),
    "aten::_fused_rms_norm_backward": lambda: (
        (_t(N, H), _t(N, H), [H], _t(N, 1, dtype=F), _t(H), [True, True]), {}),
    "aten::_softmax": lambda: ((_t(N, 8192), -1, False), {}),
    "aten::_log_softmax": lambda: ((_t(N, V), -1, False), {}),
    "aten::_softmax_backward_data": lambda: ((_t(N, 8192), _t(N, 8192), -1, B), {}),
    "aten::_log_softmax_backward_data": lambda: ((_t(N, V), _t(N, V), -1, B), {}),
    "aten::glu": lambda: ((_t(N, 2 * FFN), -1), {}),
    "tpu_kernels::swiglu": lambda: ((_t(N, FFN), _t(N, FFN)), {}),
    "tpu_kernels::swiglu_backward": lambda: (([_t(N, FFN)], _t(N, FFN), _t(N, FFN)), {}),
    "tpu_kernels::geglu": lambda: ((_t(N, FFN), _t(N, FFN)), {"approximate": "tanh"}),
    "tpu_kernels::geglu_backward": lambda: (([_t(N, FFN)], _t(N, FFN), _t(N, FFN)),
                                            {"approximate": "tanh"}),
    "tpu_kernels::rope": lambda: ((_t(1, 32, 8192, 128), _t(1, 8, 8192, 128),
                                   _t(8192, 128, dtype=F), _t(8192, 128, dtype=F)), {}),
    "aten::var.correction": lambda: ((_t(N, H), [-1]), {}),
    "aten::std.correction": lambda: ((_t(N, H), [-1]), {}),
    "aten::var_mean.correction": lambda: ((_t(N, H), [-1]), {}),
    "aten::cumsum": lambda: ((_t(N, H, dtype=F), -1), {}),
    "aten::topk": lambda: ((_t(N, 64, dtype=F), 8), {}),
    "aten::_fused_adamw_": lambda: _adam(False),
    "aten::_fused_adamw_.tensor_lr": lambda: _adam(True),
    "aten::_fused_adam_": lambda: _adam(False),
    "aten::_fused_adam_.tensor_lr": lambda: _adam(True),
}


@dataclasses.dataclass(frozen=True)
class ImplResult:
    """One registry impl compiled (or not) for one chip."""
    op: str
    impl: str                 # "pallas:mm"
    chip: str
    status: str               # "ok" | "fail" | "n/a" (no production input it accepts)
    reason: str
    vmem_bytes: int | None
    seconds: float


def check_impls(chips: Iterable[str] = tpu_info.CHECKED_GENERATIONS,
                ops: Iterable[str] | None = None,
                progress: Callable[[ImplResult], None] | None = None) -> list[ImplResult]:
    """Every Pallas/Helion impl in the registry compiled for each chip at production
    shapes: per (impl, chip) ok / fail with the reason / n/a, and the largest kernel VMEM."""
    wanted = None if ops is None else set(ops)
    results = []
    for op in REGISTRY.ops():
        key = op.name()               # "aten::mm", "aten::var.correction"
        if wanted is not None and key not in wanted:
            continue
        for impl in REGISTRY.impls(op):
            if impl.kind not in ("pallas", "helion"):
                continue
            for chip in chips:
                r = _check_impl(op, key, impl, tpu_info.chip(chip).name)
                results.append(r)
                if progress:
                    progress(r)
    return results


def _check_impl(op: Any, key: str, impl: Any, chip: str) -> ImplResult:
    label = f"{impl.kind}:{impl.name}"
    make = ARGS.get(key)
    if make is None:
        return ImplResult(key, label, chip, "n/a", "no production-shape input for this op "
                          "(tpu_kernels/aot/impls.py)", None, 0.0)
    args, kwargs = make()
    with tpu_info.compile_for(chip):
        refused = impl.check(*args, **kwargs)
    if refused:
        return ImplResult(key, label, chip, "n/a", f"refuses the production input: {refused}",
                          None, 0.0)
    start = time.perf_counter()
    program, specs = impl_program(op, impl, args, kwargs)
    r = check(label, program, specs, chip)
    return ImplResult(key, label, chip, "ok" if r.ok else "fail", r.reason, r.vmem_bytes,
                      time.perf_counter() - start)
