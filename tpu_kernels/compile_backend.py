"""``torch.compile(model, backend="tpu")``: Dynamo + AOTAutograd graphs as XLA programs.

Dynamo captures the Python code into an FX graph (tpu tensors are a traceable wrapper
subclass: see ``shadow.py``); AOTAutograd functionalizes it (in-place updates and buffer
mutations become outputs it writes back) and, for training, splits it into a forward and
a backward graph. Each graph becomes one ``GraphProgram``: one ``jax.jit`` whose nodes
run through the registry, so forward and backward are one XLA executable each. Graph
breaks, guards and recompiles are torch.compile's own. ``mode`` and ``options``: see
``compile_options.py``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from functorch.compile import make_boxed_func
from torch._dynamo import list_backends, register_backend
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.exc import exceptions_allowed_to_be_fallback
from torch._functorch._aot_autograd import runtime_wrappers
from torch._functorch._aot_autograd.runtime_wrappers import _AnalyzeCustomOpInputOutputMode

from tpu_kernels import errors, compile_fast_path, shadow, compile_output_bases, compile_step, compile_train_fast_path, compile_options, flex_attention, graph_patterns, optim_defaults
from tpu_kernels.compile_options import CompileOptions
from tpu_kernels.graph_program import GraphProgram
from tpu_kernels.tensor import TpuTensor
from tpu_kernels.registry import inductor_prims as _inductor_prims  # noqa: F401  (prims::fma in graphs)

flex_attention.pass_through_under(_AnalyzeCustomOpInputOutputMode)


def _plain_restrided_tangents() -> None:
    """A gradient that torch counts as contiguous but whose strides differ from the traced
    output's (zero-size; a size-1 dim's stride, as ``g.t()`` of shape (4, 1) has) reaches
    AOTAutograd's runtime path (the one ``compile_train_fast_path`` leaves to it), which
    restrides the tpu tensor's inner shadow with ``torch.empty_strided`` on its device: a
    tpu tensor, where a plain inner tensor is expected ('expected SubclassCreationMeta, got
    PlainTensorMeta'), and a shadow cannot be copied from. The shadow's tpu tensor is
    restrided instead, and its shadow is the plain tensor."""
    coerce = runtime_wrappers.coerce_to_expected_memory_format
    if getattr(coerce, "_tpu_kernels", False):
        return

    def coerce_to_expected_memory_format(x: torch.Tensor, memory_format: Any) -> torch.Tensor:
        if shadow.source(x) is None:            # not a real shadow: torch's own
            return coerce(x, memory_format)
        real = TpuTensor.__tensor_unflatten__({"_tpu_shadow": x}, None, x.shape, x.stride())
        out = coerce(real, memory_format)
        return x if out is real else out._tpu_shadow
    coerce_to_expected_memory_format._tpu_kernels = True
    runtime_wrappers.coerce_to_expected_memory_format = coerce_to_expected_memory_format


_plain_restrided_tangents()
optim_defaults.install_compiled()   # a compiled opt.step counts on the device, as on CUDA
PROGRAMS: list[GraphProgram] = []   # every graph compiled in this process, for tests and bench


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any],
                  options: CompileOptions | None = None, role: str = "inference") -> Callable:
    """AOTAutograd's compiler hook: one ATen graph -> one jitted program (boxed call).
    ``role``: "forward" or "backward" (of a training graph) or "inference"."""
    program = compile_step.program_for(role, gm, example_inputs, options)
    context = torch._guards.TracingContext.try_get()
    # what AOTAutograd's wrappers do around this graph (see compile_fast_path.py)
    program.aot_meta = context.fw_metadata if context is not None else None
    program.role = role
    PROGRAMS.append(program)
    return make_boxed_func(program)


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], mode: str | None = None,
                options: dict[str, Any] | None = None) -> Callable:
    """The ``tpu`` Dynamo backend (``mode`` and ``options`` as ``torch.compile`` passes them)."""
    parsed = compile_options.parse(mode, options)
    compiler = functools.partial(compile_graph, options=parsed)
    # in-place updates of inputs stay inside inference graphs (an optimizer step): the
    # program writes the new values into the inputs' storages instead of AOTAutograd
    # copying each one back op by op
    start = len(PROGRAMS)
    training = compile_fast_path.needs_autograd(example_inputs)
    gm = graph_patterns.rewrite(gm)
    # outputs that are views of one intermediate: AOTAutograd remakes them for tpu tensors
    # only from a returned tensor (compile_output_bases.py)
    extra = compile_output_bases.return_shared_bases(gm) if training else 0
    # what AOTAutograd passes before Dynamo's arguments: the graph module's own tensors
    # (an optimizer's state, installed as attributes), in its order
    lifted = [*dict(gm.named_parameters(remove_duplicate=False)).values(),
              *dict(gm.named_buffers(remove_duplicate=False)).values()]
    # a training graph's backward program is compiled now, not at the first backward, so
    # compile_train_fast_path can call both
    eager_backward = training and compile_train_fast_path.ON
    try:
        with torch._functorch.config.patch(force_non_lazy_backward_lowering=eager_backward), errors.tracing_for_tpu():
            compiled = aot_autograd(fw_compiler=functools.partial(compiler, role="forward" if training else "inference"),
                                    bw_compiler=functools.partial(compiler, role="backward"),
                                    keep_inference_input_mutations=True)(gm, example_inputs)
    finally:   # an op's error kept while the backward was traced: the cause, if AOTAutograd failed too
        _raise_traced_backward_error()
    if training:
        call = compile_train_fast_path.fast_path(PROGRAMS[start:], lifted, example_inputs) or compiled
        return compile_output_bases.dropping_last(call, extra)
    return compile_fast_path.fast_path(PROGRAMS[start:], lifted, example_inputs) or compiled


def _raise_traced_backward_error() -> None:
    """Raise an op's error kept while AOTAutograd traced the backward (tensor.py). A data-
    dependent shape (the gradient of ``h[mask] = v``: ``nonzero``) raises as itself, so
    Dynamo runs that code eagerly, as it does for any backend, instead of failing the
    compile."""
    try:
        errors.raise_pending()
    except errors.DeferredError as err:
        if isinstance(err.__cause__, exceptions_allowed_to_be_fallback):
            raise err.__cause__ from None
        raise


def register() -> None:
    if "tpu" not in list_backends(exclude_tags=()):
        register_backend(tpu_backend, name="tpu")
