"""The kernel manifest: every Pallas and Helion kernel, and the files that make it.

Adding a kernel means writing the files its entry names, and the entry:

    kernel     pallas/<name>.py | helion_kernels/<name>.py   the kernel, supports(), cost
    reference  pallas/reference/<name>.py                    plain jax.numpy (Pallas kernels)
    bindings   registry/bindings/<file>.py                   @tpu_kernel(op, kind=..., supports=...)
    bench      bench/defs/<file>.py                          KernelBench entries (their names here);
               a higher-order op's kernel: its own bench script  (no names: its calls are not op arguments)
    tests      tests/kernels/<file>.py                       the kernel against its reference
    examples   below: small CPU arguments per bound op       every impl of the op must match CPU

What discovers kernels here instead of keeping its own table: the binding-parity test
(``tests/kernels/test_kernel_bindings.py``: ``examples``), the bench (its definitions are
the entries' ``bench_module``s; ``bench.runner.kernel_cases(k)``: the shapes a kernel is
written for, which the TPU lowering check compiles), and ``tests/kernels/test_manifest.py``
(every named file exists, every kernel impl in the registry belongs to an entry).
A custom op a kernel binds to is declared in ``registry/custom_ops/library.py`` first.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

Example = Callable[[], tuple]   # builds the op's CPU arguments


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    kind: str                        # "pallas" | "helion"
    module: str                      # the kernel's module
    bindings: str                    # its bindings' module in registry/bindings
    ops: tuple[str, ...]             # the ops it is bound to (registry spelling)
    bench_module: str                # its module in bench/defs (or its bench script)
    bench: tuple[str, ...]           # the KernelBench names there (none in a bench script)
    tests: str                       # its test file, from the repo root
    reference: str | None = None     # its plain-JAX reference (Helion kernels: the XLA lowering)
    examples: dict[str, Example] = dataclasses.field(default_factory=dict)
    no_example: str = ""             # why an op-level example cannot check it, when none is given


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _x() -> torch.Tensor:
    return _randn(7, 129)


def _paged_step() -> tuple:
    """A decode sequence (context 20) and a 4-token prefill chunk (context 40), pages of 16."""
    pages = (6, 2, 16, 128)
    return (_randn(5, 4, 128), _randn(*pages, seed=1), _randn(*pages, seed=2),
            torch.tensor([20, 40], dtype=torch.int32), torch.tensor([[4, 0, 5], [1, 3, 2]], dtype=torch.int32),
            torch.tensor([0, 1, 5], dtype=torch.int32), torch.tensor([2], dtype=torch.int32))


_P, _H = "tpu_kernels.pallas", "tpu_kernels.helion_kernels"
_B, _D = "tpu_kernels.registry.bindings", "tpu_kernels.bench.defs"

KERNELS: tuple[Kernel, ...] = (
    Kernel("matmul", "pallas", f"{_P}.matmul", f"{_B}.matmul",
           ("aten::mm", "aten::addmm", "aten::bmm", "tpu_kernels::linear", "tpu_kernels::linear_weight_grad"),
           f"{_D}.matmul", ("mm", "bmm", "addmm"), "tests/kernels/test_matmul_kernel.py",
           f"{_P}.reference.matmul",
           {"aten::mm": lambda: (_randn(33, 70), _randn(70, 129, seed=1)),
            "aten::addmm": lambda: (_randn(129), _randn(33, 70, seed=1), _randn(70, 129, seed=2)),
            "aten::bmm": lambda: (_randn(2, 9, 16), _randn(2, 16, 130, seed=1)),
            "tpu_kernels::linear": lambda: (_randn(2, 5, 70), _randn(129, 70, seed=1), _randn(129, seed=2)),
            "tpu_kernels::linear_weight_grad": lambda: (_randn(2, 5, 129), _randn(2, 5, 70, seed=1))}),
    Kernel("embedding", "pallas", f"{_P}.embedding", f"{_B}.embedding",
           ("aten::embedding", "aten::embedding_dense_backward"), f"{_D}.embedding",
           ("embedding", "embedding_dense_backward"), "tests/kernels/test_embedding_kernel.py",
           f"{_P}.reference.embedding",
           {"aten::embedding": lambda: (_randn(50, 128), torch.randint(0, 50, (9,), generator=torch.Generator()))}),
    Kernel("flash_attention", "pallas", f"{_P}.flash_attention", f"{_B}.flash_attention",
           ("aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
            "tpu_kernels::flash_attention", "tpu_kernels::flash_attention_backward"),
           f"{_D}.flash_attention", ("flash_attention",), "tests/kernels/test_flash_attention_kernel.py",
           f"{_P}.reference.flash_attention",
           {"tpu_kernels::flash_attention": lambda: (
               _randn(2, 2, 40, 64), _randn(2, 1, 40, 64, seed=1), _randn(2, 1, 40, 64, seed=2),
               torch.tensor([[0] * 15 + [1] * 25, [3] * 40]),
               torch.tensor([[0] * 15 + [1] * 25, [3] * 40]), True)},
           no_example="F.scaled_dot_product_attention reaches the aten ops: tests/test_fused_composites.py "
                      "runs them forward and backward against CPU"),
    Kernel("cross_entropy", "pallas", f"{_P}.cross_entropy", f"{_B}.cross_entropy",
           ("tpu_kernels::cross_entropy",), f"{_D}.cross_entropy", ("cross_entropy",),
           "tests/kernels/test_cross_entropy_kernel.py", f"{_P}.reference.cross_entropy",
           {"tpu_kernels::cross_entropy": lambda: (_randn(6, 300), torch.tensor([0, 3, -100, 299, 2, 2]))}),
    Kernel("linear_cross_entropy", "pallas", f"{_P}.linear_cross_entropy", f"{_B}.cross_entropy",
           ("tpu_kernels::linear_cross_entropy",), f"{_D}.linear_cross_entropy", ("linear_cross_entropy",),
           "tests/kernels/test_linear_cross_entropy_kernel.py", f"{_P}.reference.linear_cross_entropy",
           {"tpu_kernels::linear_cross_entropy": lambda: (_randn(6, 128), _randn(300, 128, seed=1),
                                                         torch.tensor([0, 3, -100, 299, 2, 2]))}),
    Kernel("grouped_matmul", "pallas", f"{_P}.grouped_matmul", f"{_B}.grouped_matmul",
           ("tpu_kernels::ragged_dot", "aten::_grouped_mm"), f"{_D}.grouped_matmul", ("ragged_dot",),
           "tests/kernels/test_grouped_matmul_kernel.py", f"{_P}.reference.grouped_matmul",
           {"tpu_kernels::ragged_dot": lambda: (_randn(7, 8), _randn(3, 8, 5, seed=1), torch.tensor([2, 0, 5])),
            "aten::_grouped_mm": lambda: (_randn(7, 8), _randn(3, 8, 8, seed=1),
                                          torch.tensor([2, 2, 7], dtype=torch.int32))}),
    Kernel("fused_adam", "pallas", f"{_P}.fused_adam", f"{_B}.fused_adam",
           ("aten::_fused_adam_.default", "aten::_fused_adam_.tensor_lr", "aten::_fused_adamw_.default",
            "aten::_fused_adamw_.tensor_lr"), f"{_D}.fused_adam", ("fused_adamw",),
           "tests/kernels/test_fused_adam_kernel.py", f"{_P}.reference.fused_adam",
           no_example="an in-place op returning nothing (check_parity compares results): "
                      "tests/ops/test_fused_optim.py runs torch.optim.Adam(W)(fused=True) against CPU"),
    Kernel("rms_norm", "helion", f"{_H}.rms_norm", f"{_B}.helion",
           ("aten::_fused_rms_norm", "aten::_fused_rms_norm_backward"), f"{_D}.helion", ("helion_rms_norm",),
           "tests/kernels/test_helion_rms_norm.py",
           examples={"aten::_fused_rms_norm": lambda: (_x(), [129], _randn(129, seed=1), 1e-6)}),
    Kernel("layer_norm", "helion", f"{_H}.layer_norm", f"{_B}.helion",
           ("aten::native_layer_norm", "aten::native_layer_norm_backward"), f"{_D}.helion", ("helion_layer_norm",),
           "tests/kernels/test_helion_layer_norm.py",
           examples={"aten::native_layer_norm": lambda: (_x(), [129], _randn(129, seed=1), _randn(129, seed=2),
                                                         1e-5)}),
    Kernel("softmax", "helion", f"{_H}.softmax", f"{_B}.helion",
           ("aten::_softmax", "aten::_log_softmax", "aten::_softmax_backward_data",
            "aten::_log_softmax_backward_data"), f"{_D}.helion", ("helion_softmax", "helion_log_softmax"),
           "tests/kernels/test_helion_softmax.py",
           examples={"aten::_softmax": lambda: (_x(), -1, False), "aten::_log_softmax": lambda: (_x(), -1, False)}),
    Kernel("glu", "helion", f"{_H}.glu", f"{_B}.helion",
           ("aten::glu", "tpu_kernels::swiglu", "tpu_kernels::geglu", "tpu_kernels::swiglu_backward",
            "tpu_kernels::geglu_backward"), f"{_D}.helion", ("helion_swiglu",), "tests/kernels/test_helion_glu.py",
           examples={"aten::glu": lambda: (_randn(7, 258), -1),
                     "tpu_kernels::swiglu": lambda: (_x(), _randn(7, 129, seed=1)),
                     "tpu_kernels::geglu": lambda: (_x(), _randn(7, 129, seed=1))}),
    Kernel("rope", "helion", f"{_H}.rope", f"{_B}.helion", ("tpu_kernels::rope",), f"{_D}.helion",
           ("helion_rope",), "tests/kernels/test_helion_rope.py",
           examples={"tpu_kernels::rope": lambda: (_randn(1, 2, 7, 64), _randn(1, 2, 7, 64, seed=1),
                                                   _randn(7, 64, seed=2), _randn(7, 64, seed=3))}),
    Kernel("var_mean", "helion", f"{_H}.var_mean", f"{_B}.helion",
           ("aten::var_mean.correction", "aten::var.correction", "aten::std.correction"), f"{_D}.helion",
           ("helion_var_mean",), "tests/kernels/test_helion_var_mean.py",
           examples={"aten::var_mean.correction": lambda: (_x(), [-1])}),
    Kernel("cumsum", "helion", f"{_H}.cumsum", f"{_B}.helion", ("aten::cumsum",), f"{_D}.helion",
           ("helion_cumsum",), "tests/kernels/test_helion_cumsum.py",
           examples={"aten::cumsum": lambda: (_x(), -1)}),
    Kernel("ragged_paged_attention", "pallas", f"{_P}.ragged_paged_attention", f"{_B}.ragged_paged_attention",
           ("tpu_kernels::ragged_paged_attention",), f"{_D}.paged_attention", ("ragged_paged_attention",),
           "tests/kernels/test_ragged_paged_attention_kernel.py", f"{_P}.reference.ragged_paged_attention",
           examples={"tpu_kernels::ragged_paged_attention": lambda: _paged_step()}),
    Kernel("topk", "helion", f"{_H}.topk", f"{_B}.helion", ("aten::topk",), f"{_D}.helion", ("helion_topk",),
           "tests/kernels/test_helion_topk.py",
           examples={"aten::topk": lambda: (torch.randperm(7 * 129, generator=torch.Generator()).float()
                                            .reshape(7, 129), 5)}),
    Kernel("flex_attention", "pallas", f"{_P}.flex_attention", f"{_B}.flex_attention",
           ("higher_order::flex_attention", "higher_order::flex_attention_backward"),
           "tpu_kernels.bench.flex_attention", (), "tests/kernels/test_flex_attention_kernel.py",
           f"{_P}.reference.flex_attention",
           no_example="a higher-order op (score_mod/mask_mod callables and a BlockMask in its arguments): "
                      "tests/ops/test_flex_attention.py runs each impl forward and backward against CPU; "
                      "its real compile: tests/kernels/test_flex_attention_compile.py"),
)


def kernel(name: str) -> Kernel:
    return next(k for k in KERNELS if k.name == name)


def bench_modules() -> list[str]:
    """The bench/defs modules of every kernel (those with KernelBench entries), once each,
    in manifest order."""
    return list(dict.fromkeys(k.bench_module for k in KERNELS if k.bench))


def kernel_of(op_name: str) -> Kernel | None:
    """The kernel bound to ``op_name`` (registry spelling), or None."""
    return next((k for k in KERNELS if op_name in k.ops), None)
