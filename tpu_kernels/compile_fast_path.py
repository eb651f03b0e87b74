"""A compiled inference graph called without AOTAutograd's runtime wrappers.

AOTAutograd's wrappers around a compiled graph flatten each tpu tensor into its shadow
(``shadow.py``), regenerate outputs that alias inputs, copy back mutations made outside
the graph, and wrap the outputs again: about 20 µs a call for a 64x64 add and 80 µs for a
one-layer MLP, more than the program's own run. For an inference graph (no input needs a
gradient, or grad mode is off: Dynamo guards both; training graphs: compile_train_fast_path.py) whose AOTAutograd metadata says none of
that is needed, the graph's ``GraphProgram`` takes Dynamo's arguments directly: a tpu
tensor is read as its storage and geometry, as its shadow would be, and the program's
outputs are already tpu tensors. Anything else keeps AOTAutograd's path.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch
from torch._functorch._aot_autograd.schemas import MutationType, OutputType

from tpu_kernels.graph_program import GraphProgram

log = logging.getLogger(__name__)


def needs_autograd(example_inputs: Sequence[Any]) -> bool:
    """AOTAutograd's own test: a training graph (forward + backward) is traced when grad
    mode is on and some tensor input requires grad."""
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def fast_path(programs: Sequence[GraphProgram], lifted: Sequence[torch.Tensor],
              example_inputs: Sequence[Any]) -> Callable | None:
    """A direct call of the one program compiled for Dynamo's inference graph (``lifted``:
    the graph module's parameters and buffers, passed first), or None where AOTAutograd's
    wrappers do something for this graph (the reason is logged)."""
    why = _unfit(programs, [*lifted, *example_inputs])
    if why is not None:
        log.debug("a compiled graph keeps AOTAutograd's runtime wrappers: %s", why)
        return None
    program = programs[0]
    return with_lifted(program, lifted, program.aot_meta)


def with_lifted(fn: Callable, lifted: Sequence[torch.Tensor], meta: Any) -> Callable:
    """``fn`` called on ``lifted`` then Dynamo's arguments, the versions of the inputs the
    graph writes bumped first (``meta``: AOTAutograd's metadata of the graph)."""
    bumped = tuple(meta.mutated_graph_handled_indices_seen_by_autograd)
    if not lifted and not bumped:
        return fn
    lifted = tuple(lifted)
    increment_version = torch.autograd.graph.increment_version

    def call(*args: Any) -> Any:
        args = lifted + args
        if bumped:
            # what AOTAutograd's wrapper does for inputs the graph writes: autograd sees them
            # change (a tensor saved for a backward and written after is an error there)
            increment_version(tuple(args[i] for i in bumped))
        return fn(*args)
    call.__wrapped__ = fn   # what it calls (tests tell the paths apart by it)
    return call


def _unfit(programs: Sequence[GraphProgram], example_inputs: Sequence[Any]) -> str | None:
    if len(programs) != 1:
        return f"{len(programs)} programs for one graph"
    program = programs[0]
    meta = program.aot_meta
    if meta is None:
        return "no AOTAutograd metadata"
    why = unfit_metadata(program, meta, example_inputs)
    if why is not None:
        return why
    if any(i.mutates_metadata or i.mutation_type == MutationType.MUTATED_OUT_GRAPH for i in meta.input_info):
        return "an input mutation done outside the graph"
    return None


def unfit_metadata(program: GraphProgram, meta: Any, inputs: Sequence[Any]) -> str | None:
    """What, in AOTAutograd's metadata ``meta`` of ``program``'s graph, makes its runtime
    wrappers do more than call it (inference and training graphs alike), or None."""
    if torch._C._is_any_autocast_enabled():
        return "autocast is on (AOTAutograd runs the graph with it off)"
    if program.is_tensor != [isinstance(x, torch.Tensor) for x in inputs] \
            or len(meta.input_info) != len(inputs):
        return (f"the graph's inputs are not Dynamo's (tokens, synthetic bases or flattening): "
                f"{len(program.is_tensor)} graph inputs, {len(meta.input_info)} in its metadata, "
                f"{len(inputs)} from Dynamo")
    if meta.tokens or meta.num_intermediate_bases or meta.is_rng_op_functionalized \
            or getattr(meta, "num_graphsafe_rng_states", 0):
        return "effect tokens, intermediate bases or functionalized rng"
    if any(o.output_type != OutputType.non_alias for o in meta.output_info):
        return "an output aliases an input or another output"
    return None
