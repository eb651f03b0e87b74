"""A model's ``torch.compile(backend="tpu")`` graphs, captured without running them, on
tensors that hold no data.

An *abstract* tpu tensor is a tpu tensor whose storage is a ``jax.ShapeDtypeStruct``:
torch sees its shape, dtype and strides, Dynamo fakes it like any tpu tensor, and nothing
ever reads it. A model built on the meta device and moved to abstract tensors therefore
costs no memory whatever its size. ``capture`` runs Dynamo and AOTAutograd on it with the
``tpu`` backend's own settings (fullgraph; the backward graph compiled with the forward)
and stops before anything would run; each graph becomes the ``GraphProgram`` the ``tpu``
backend would build, ready to be lowered for a chip.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import torch
from torch import nn

from tpu_kernels import graph_patterns
from tpu_kernels.graph_program import GraphProgram
from tpu_kernels.registry import inductor_prims as _inductor_prims  # noqa: F401  (prims::fma in graphs)
from tpu_kernels.registry.dtypes import to_jax_dtype
from tpu_kernels.tensor import Storage, TpuTensor


def abstract(shape: tuple[int, ...], dtype: torch.dtype, requires_grad: bool = False) -> TpuTensor:
    """A contiguous tpu tensor with no data behind it (its storage is a ShapeDtypeStruct)."""
    spec = jax.ShapeDtypeStruct(tuple(shape), to_jax_dtype(dtype))
    return TpuTensor(Storage(spec), tuple(shape), None, 0, dtype, requires_grad=requires_grad)


def to_abstract(module: nn.Module) -> nn.Module:
    """Replace every parameter and buffer of ``module`` (e.g. built on the meta device) by an
    abstract tpu tensor of the same shape, dtype and ``requires_grad``."""
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None:
                sub._parameters[name] = nn.Parameter(abstract(p.shape, p.dtype),
                                                     requires_grad=p.requires_grad)
        for name, b in list(sub._buffers.items()):
            if b is not None:
                sub._buffers[name] = abstract(b.shape, b.dtype)
    return module


@dataclasses.dataclass
class Graph:
    """One graph AOTAutograd produced: "forward", "backward" or "inference"."""
    kind: str
    program: GraphProgram
    example_inputs: list[Any]
    # the real tensor behind each input (parameters, buffers, the batch), for forward and
    # inference graphs: Dynamo's inputs in order (AOTAutograd keeps it); None if unknown
    sources: list[Any] | None = None


class _Stop(Exception):
    """Raised by a captured graph instead of running it."""


def capture(fn: Callable[..., Any], *args: Any) -> list[Graph]:
    """The graphs ``torch.compile(fn, backend="tpu")`` compiles for ``fn(*args)``:
    forward and backward when ``fn`` needs gradients, else one inference graph."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[Graph] = []
    sources: list[Any] = []

    def compiler(kind: str):
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]):
            known = sources if kind != "backward" and len(sources) == len(example_inputs) else None
            graphs.append(Graph(kind, GraphProgram(gm, example_inputs), example_inputs, known))

            def stop(*_):
                raise _Stop()
            return make_boxed_func(stop)
        return compile_graph

    aot = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                       inference_compiler=compiler("inference"),
                       keep_inference_input_mutations=True)

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]):
        sources[:] = [getattr(n.meta.get("grapharg"), "example", None)
                      for n in gm.graph.nodes if n.op == "placeholder"]
        return aot(graph_patterns.rewrite(gm), example_inputs)   # as the tpu backend does
    # a cached compile of the same code (an earlier capture's stopping graphs) must not
    # answer for this one: start from empty caches, as a fresh process would
    torch.compiler.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    # A checkpointed layer (--remat) whose forward sets and resets a scoped variable
    # (transformers >= 5.25 routes each attention call through one) is a side effect
    # Dynamo refuses inside the checkpoint under fullgraph; the pair leaves no trace, so
    # the recomputation need not replay it.
    with torch._functorch.config.patch(force_non_lazy_backward_lowering=True), \
            torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        try:
            compiled(*args)
        except _Stop:
            pass
    if not graphs:
        raise RuntimeError("torch.compile produced no graph for this function")
    return graphs


def lower(graph: Graph, sharding: jax.sharding.Sharding) -> jax.stages.Lowered:
    """``graph``'s program lowered for abstract inputs placed by ``sharding``."""
    arrays = [_storage_spec(x, sharding) for x, t in
              zip(graph.example_inputs, graph.program.is_tensor) if t]
    key = jax.ShapeDtypeStruct((3,), jax.numpy.uint32, sharding=sharding)
    return graph.program.lower(graph.example_inputs, key, arrays)


def _storage_spec(t: torch.Tensor, sharding: jax.sharding.Sharding) -> jax.ShapeDtypeStruct:
    """The storage a graph input is read from: its own shape when it is contiguous from
    offset 0, else a flat storage just large enough for its strides."""
    dtype = to_jax_dtype(t.dtype)
    shape, stride = tuple(t.shape), t.stride()
    if t.is_contiguous() and t.storage_offset() == 0:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
    extent = t.storage_offset() + 1 + sum((s - 1) * st for s, st in zip(shape, stride) if s)
    return jax.ShapeDtypeStruct((extent,), dtype, sharding=sharding)
