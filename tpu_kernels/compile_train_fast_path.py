"""A compiled training graph called through an autograd.Function of our own.

For a training graph AOTAutograd's runtime wrappers flatten each tpu tensor into its shadow,
run the forward ``GraphProgram`` inside its ``CompiledFunction`` (an autograd.Function),
wrap the outputs again, and in backward coerce the gradients and run the backward
program: about 60 µs a call for a one-layer MLP. Where AOTAutograd's metadata and the
forward graph say those wrappers do nothing but the autograd.Function part (no output
aliases an input or another output, no input is mutated, no effect tokens, no
functionalized rng, no symbolic sizes or opaque objects saved for backward, autocast off),
``_Compiled`` does that part itself: its forward
calls the forward program on Dynamo's arguments, saves what the backward program takes
(inputs saved as themselves, so an in-place change before backward is caught by
autograd's version check, as eagerly) and marks outputs that need no gradient; its
backward lays the gradients out as traced and calls the backward program. Anything else
keeps AOTAutograd's path, with the reason logged. Both programs are compiled up front
(AOTAutograd compiles the backward lazily otherwise): ``compile_backend`` asks for it.
``TPU_KERNELS_COMPILE_TRAIN_FAST=0`` (or ``ON = False`` before compiling) turns this off.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Sequence

import torch
from torch._functorch._aot_autograd import utils as aot_utils
from torch._functorch._aot_autograd.schemas import MutationType
from torch.multiprocessing.reductions import StorageWeakRef

from tpu_kernels import compile_fast_path, compile_joint
from tpu_kernels.graph_outputs import tensor_of
from tpu_kernels.graph_program import GraphProgram

log = logging.getLogger(__name__)
ON = os.environ.get("TPU_KERNELS_COMPILE_TRAIN_FAST", "1") not in ("", "0")
_NO_DOUBLE = "torch.compile with aot_autograd does not currently support double backward"


def fast_path(programs: Sequence[GraphProgram], lifted: Sequence[torch.Tensor],
              example_inputs: Sequence[Any]) -> Callable | None:
    """A call of the forward and backward programs compiled for Dynamo's training graph
    through ``_Compiled`` (``lifted``: the graph module's parameters and buffers, passed
    first), or None where AOTAutograd's wrappers do more (the reason is logged)."""
    inputs = [*lifted, *example_inputs]
    why = _unfit(programs, inputs)
    if why is not None:
        log.debug("a compiled training graph keeps AOTAutograd's runtime wrappers: %s", why)
        return None
    return compile_fast_path.with_lifted(_function(programs[0], programs[1]).apply, lifted,
                                         programs[0].aot_meta)


def _unfit(programs: Sequence[GraphProgram], inputs: Sequence[Any]) -> str | None:
    if not ON:
        return "turned off (TPU_KERNELS_COMPILE_TRAIN_FAST=0)"
    if [getattr(p, "role", None) for p in programs] != ["forward", "backward"]:
        return f"{len(programs)} programs, not one forward and one backward"
    forward, backward = programs
    meta = forward.aot_meta
    if meta is None or backward.aot_meta is not meta:
        return "no AOTAutograd metadata shared by the forward and backward"
    why = compile_fast_path.unfit_metadata(forward, meta, inputs)
    if why is not None:
        return why
    if _outputs_alias(forward, meta.num_outputs):
        return "an output aliases another output or an intermediate"
    if meta.num_outputs_rng_offset:
        return "effect tokens, intermediate bases or functionalized rng"
    if aot_utils.saved_tensors_hooks_are_inlineable(aot_utils.top_saved_tensors_hooks()):
        return "saved-tensors hooks inlined into the graphs (AOTAutograd turns them off around the call)"
    if torch._dynamo.compiled_autograd.in_compiled_autograd_region \
            or any(type(x).__name__ == "BackwardState" for x in inputs):
        return "compiled autograd"
    if any(i.mutates_metadata or i.mutates_storage_metadata or i.mutation_inductor_storage_resize
           or i.mutation_type == MutationType.MUTATED_OUT_GRAPH for i in meta.input_info) \
            or meta.indices_of_inputs_that_requires_grad_with_mutations_in_bw:
        return "an input mutation done outside the graph (or in the backward)"
    if meta.num_symints_saved_for_bw != 0 or meta.num_opaque_objects_saved_for_bw \
            or meta.num_tensors_saved_with_no_vc_check is None:
        return "symbolic sizes or opaque objects saved for backward"
    if len(backward.gm.graph.output_node().args[0]) != len(inputs):
        return "the backward graph's gradients are not one per input"
    tangents = _tangents(backward)
    if tangents is None:
        return "a gradient the backward takes is not a user output's"
    n_saved = len(backward.gm.graph.find_nodes(op="placeholder")) - len(tangents)
    if len(forward.gm.graph.output_node().args[0]) != meta.num_outputs + n_saved \
            or meta.tensors_saved_for_backwards_slice != slice(meta.num_outputs, None):
        return "the forward's saved values are not the backward's first inputs"
    if _tangent_geometry(backward, len(tangents)) is None:
        return "the gradients' traced layout is symbolic"
    written = {k for k, i in enumerate(meta.input_info) if i.mutates_data}
    if written & set(_saved_inputs(forward, meta.tensors_saved_for_backwards_slice)):
        # the program writes the input's storage: its value before the write is gone
        return "an input the graph writes is saved for backward"
    return None


def _outputs_alias(forward: GraphProgram, n_out: int) -> bool:
    """Whether a user output of the forward graph is a view or shares its storage with
    another. AOTAutograd's metadata on the flattened graph (tpu tensors' shadows) calls such
    outputs plain; its wrappers know better and remake them as views of the output or
    intermediate they alias, so that gradients reach through them."""
    vals = [o.meta.get("val") if isinstance(o, torch.fx.Node) else None
            for o in forward.gm.graph.output_node().args[0][:n_out]]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    storages = {StorageWeakRef(v.untyped_storage()) for v in tensors}
    return len(storages) < len(tensors) or any(v._is_view() for v in tensors)


def _tangents(backward: GraphProgram) -> list[int] | None:
    """The user output each gradient the backward program takes belongs to (the
    backward graph's last placeholders, described by AOTAutograd), or None where one is
    not a user output's (a mutated input's, an intermediate base's) or is undescribed.
    AOTAutograd's metadata on the flattened graph does not know which outputs require grad:
    those with a gradient here do."""
    found = []
    for p in backward.gm.graph.find_nodes(op="placeholder"):
        desc = p.meta.get("desc")
        if type(desc).__name__ == "SubclassGetAttrAOTInput":     # a tpu tensor's shadow
            desc = desc.base
        if type(desc).__name__ != "TangentAOTInput":
            if found:
                return None      # a saved value after a gradient: not the order we know
            continue
        if type(desc.output).__name__ != "PlainAOTOutput":
            return None
        found.append(desc.output.idx)
    return found


def _tangent_vals(backward: GraphProgram, n: int) -> list[Any]:
    """The traced values (meta) of the ``n`` gradients the backward program takes."""
    placeholders = list(backward.gm.graph.find_nodes(op="placeholder"))
    return [p.meta.get("val") for p in placeholders[len(placeholders) - n:]] if n else []


def _tangent_geometry(backward: GraphProgram, n: int) -> list[tuple] | None:
    """(sizes, strides) of each of the ``n`` gradients as the backward graph was traced,
    or None if symbolic."""
    try:
        return [(tuple(int(s) for s in v.shape), tuple(int(s) for s in v.stride()))
                for v in _tangent_vals(backward, n)]
    except (TypeError, AttributeError):
        return None


def _saved_inputs(forward: GraphProgram, saved: slice) -> list[int | None]:
    """Per tensor saved for backward: the forward's input it is (saved as the input
    itself, so autograd checks its version), or None (an activation)."""
    placeholders = {n: k for k, n in enumerate(forward.gm.graph.find_nodes(op="placeholder"))}
    outs = forward.gm.graph.output_node().args[0][saved]
    return [placeholders.get(o) for o in outs]


def _viewed_inputs(forward: GraphProgram, saved: slice) -> list[int]:
    """The forward's inputs whose storage a saved activation views (read from the traced
    values: a view shares its base's storage)."""
    placeholders = list(forward.gm.graph.find_nodes(op="placeholder"))
    storages: dict = {}
    for k, p in enumerate(placeholders):
        v = p.meta.get("val")
        if isinstance(v, torch.Tensor):
            storages.setdefault(StorageWeakRef(v.untyped_storage()), k)
    found: list[int] = []
    for o in forward.gm.graph.output_node().args[0][saved]:
        v = o.meta.get("val") if isinstance(o, torch.fx.Node) and o.op != "placeholder" else None
        k = storages.get(StorageWeakRef(v.untyped_storage())) if isinstance(v, torch.Tensor) else None
        if k is not None and k not in found:
            found.append(k)
    return found


def _as_traced(g: Any, geometry: tuple) -> Any:
    """A gradient laid out as the backward graph was traced (its views were recorded
    against that layout), as AOTAutograd's runtime tangent coercion does."""
    shape, stride = geometry
    if not isinstance(g, torch.Tensor) or (tuple(g.shape) == shape and g.stride() == stride):
        return g
    out = torch.empty_strided(shape, stride, dtype=g.dtype, device=g.device)
    return out.copy_(g)


def _function(forward: GraphProgram, backward: GraphProgram) -> type:
    """The autograd.Function running ``forward`` and, in its backward, ``backward``."""
    meta = forward.aot_meta
    n_out = meta.num_outputs
    with_vc, no_vc = meta.tensors_saved_for_backwards_with_vc_check_slice, \
        meta.tensors_saved_for_backwards_no_vc_check_slice
    saved_inputs = _saved_inputs(forward, with_vc)
    # what each saved value is: an input's position, or None (an activation)
    kinds = saved_inputs + [None] * (len(forward.gm.graph.output_node().args[0]) - no_vc.start)
    at_inputs = [k for k in saved_inputs if k is not None]
    # saved activations that are views of inputs (a weight's transpose) are read from the
    # input's storage: the input is saved too, so autograd's version check covers a write
    # to it before backward, as eagerly (saved last: the backward reads at_inputs only)
    checked = at_inputs + [k for k in _viewed_inputs(forward, with_vc) if k not in at_inputs]
    # the saved values leave the forward program as (storage, geometry) sources: the
    # activations are read by the backward program only (no tpu tensor is made for them,
    # about 60 in a small GPT's step) and the inputs' own tensors are saved instead
    forward.raw_from = n_out
    top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
    tangents = _tangents(backward)
    non_diff = [i for i in range(n_out) if i not in tangents]
    geometry = _tangent_geometry(backward, len(tangents))
    nondeterministic = not torch.are_deterministic_algorithms_enabled()
    keep_graph = torch._C._autograd._get_current_graph_task_keep_graph
    spec = compile_joint.Speculation(forward, backward, n_out, tangents) if compile_joint.ON else None
    tangent_vals = _tangent_vals(backward, len(tangents))

    def _keep(ctx: Any, saved: list, outs: list) -> tuple:
        # a view is saved detached (it shares its version counter), as AOTAutograd does
        ctx.save_for_backward(*(x.detach() if x._is_view() else x for x in saved))
        if non_diff:
            ctx.mark_non_differentiable(*(outs[i] for i in non_diff if isinstance(outs[i], torch.Tensor)))
        return tuple(outs[:n_out])

    def _joint(ctx: Any, args: tuple) -> tuple:
        # the outputs and the gradients at once: the backward hands these back
        outs = spec.run(args)
        ctx.stash, ctx.args, ctx.raw, ctx.key = outs[n_out:], args, None, spec.program.last_key
        ctx.versions = [a._version for a in args if isinstance(a, torch.Tensor)]
        return _keep(ctx, [args[k] for k in checked], outs)

    class _Compiled(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> tuple:
            ctx.stash = None
            if spec is not None:
                ctx.set_materialize_grads(False)    # an output without a gradient: None
                if spec.ready() and top_hooks(True) is None:
                    return _joint(ctx, args)
            outs = forward(*args)
            if top_hooks(True) is None:
                # inputs saved as themselves: autograd's version check catches a write to
                # one before backward (an activation is a new value nobody else can write)
                saved, ctx.raw = [args[k] for k in checked], outs[n_out:]
            else:    # saved-tensors hooks (checkpointing, offloading) see every saved tensor
                saved = [tensor_of(outs[n_out + j]) if k is None else args[k] for j, k in enumerate(saved_inputs)]
                ctx.raw, ctx.no_vc = None, outs[no_vc]
            ctx._materialize_non_diff_grads = False
            return _keep(ctx, saved, outs)

        @staticmethod
        @torch._dynamo.disable(reason="a compiled graph's backward: it runs the compiled program")
        def backward(ctx: Any, *grads: Any) -> tuple:
            # disabled: when a compiled function calls loss.backward() (a graph break), the
            # autograd engine calls this with Dynamo's frame hook still set, and Dynamo would
            # compile this frame (AOTAutograd's own backward lives in torch, which Dynamo skips)
            if nondeterministic and torch.are_deterministic_algorithms_enabled():
                raise RuntimeError("This compiled backward function is being run with "
                                   "torch.use_deterministic_algorithms(True), but it was compiled "
                                   "while torch.use_deterministic_algorithms(False) was set.")
            if ctx.stash is not None:
                ctx.saved_tensors    # (raises as eagerly where a saved input was written since)
                if spec.hit(grads):
                    stash = ctx.stash
                    if not keep_graph():
                        ctx.maybe_clear_saved_tensors()
                        ctx.stash = ctx.args = None
                    return tuple(stash)
                ctx.raw, ctx.stash = compile_joint.rerun(forward, ctx.args, ctx.versions, ctx.key)[n_out:], None
            elif spec is not None:
                spec.observe(grads)
            if ctx.raw is not None:
                inputs = iter(ctx.saved_tensors)
                saved = [s if k is None else next(inputs) for s, k in zip(ctx.raw, kinds)]
            else:
                saved = [*ctx.saved_tensors, *ctx.no_vc]
            args = [*saved, *(_as_traced(grads[i], g) for i, g in zip(tangents, geometry))]
            if spec is not None:      # (grads are not materialized: a missing one is zeros)
                args[len(saved):] = [compile_joint.zeros(v) if a is None else a
                                     for a, v in zip(args[len(saved):], tangent_vals)]
            if not keep_graph():      # the saved values go with this backward, as AOTAutograd frees them
                ctx.maybe_clear_saved_tensors()
                ctx.raw = ctx.no_vc = None
            if torch.is_grad_enabled():       # create_graph=True: a backward of this backward raises
                return _NoDoubleBackward.apply(backward, _requiring_grad(), *args)
            return tuple(backward(*args))

    return _Compiled


class _NoDoubleBackward(torch.autograd.Function):
    """The backward program run under ``create_graph=True``: its result is connected to
    the graph, and differentiating it raises, as AOTAutograd's compiled backward does."""

    @staticmethod
    def forward(ctx: Any, program: GraphProgram, connect: torch.Tensor, *args: Any) -> tuple:
        return tuple(program(*args))

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> None:
        raise RuntimeError(_NO_DOUBLE)


def _requiring_grad() -> torch.Tensor:
    """An empty tensor that requires grad: the results of ``_NoDoubleBackward`` require
    grad under ``create_graph=True`` even when none of its arguments do (as AOTAutograd's)."""
    return torch.empty(0, requires_grad=True)
