"""Rewrites a ``GraphProgram`` makes to its graph before tracing it: ops the graph records
on the CPU that must run in the program instead.

Inside a program every input is a tpu tensor, a CPU one's too, but an op that makes a CPU
tensor from no tensor input (``torch.zeros(3)``, ``torch.rand([])``) runs as a plain
torch CPU op while the program is traced: its value is baked into the program. That is
right for a constant, and wrong for a random op, which would return the same draw on
every call (a layer-drop test ``torch.rand([]) < p`` decided once for all training).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from tpu_kernels import devices
from tpu_kernels.host_writes import cpu_valued

_SEEDED = torch.Tag.nondeterministic_seeded


def constants_on_device(gm: torch.fx.GraphModule) -> None:
    """``torch.tensor(data, device="tpu")`` inside the compiled code is recorded as a CPU
    constant copied into a device tensor (``tensor._lift_constant``): the program moves
    the constant first (a value baked into it), so the copy is one between tpu tensors."""
    for node in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy.default):
        dst, src = node.args[:2]
        if _device_type(src) == "cpu" and _device_type(dst) == "tpu":
            with gm.graph.inserting_before(node):
                moved = gm.graph.call_function(torch.ops.aten._to_copy.default, (src,),
                                               {"device": dst.meta["val"].device})
            node.replace_input_with(src, moved)
    gm.recompile()


def random_on_device(gm: torch.fx.GraphModule, device: torch.device) -> int:
    """Random ops with a CPU result draw in the program, from its random key, on ``device``:
    a factory's ``device`` becomes it, a CPU tensor made in the graph that one reads is
    moved to it first (inputs already are). Each node keeps its recorded CPU value, so
    a graph output still leaves on the CPU. Returns how many ops moved."""
    moved = 0
    for node in list(gm.graph.nodes):
        target = node.target
        if (node.op != "call_function" or not isinstance(target, torch._ops.OpOverload)
                or _SEEDED not in target.tags or not cpu_valued(node)):
            continue
        if any(a.name == "device" for a in target._schema.arguments):
            node.update_kwarg("device", device)
        for arg in node.all_input_nodes:
            if arg.op != "placeholder" and cpu_valued(arg):
                with gm.graph.inserting_before(node):
                    on_device = gm.graph.call_function(torch.ops.aten._to_copy.default, (arg,),
                                                       {"device": device})
                on_device.meta["val"] = arg.meta["val"]
                node.replace_input_with(arg, on_device)
        moved += 1
    if moved:
        gm.recompile()
    return moved


def program_device(example_inputs: Sequence[Any]) -> torch.device:
    """The tpu device a graph's inputs are on (the current one for a graph with none)."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return x.device
    return torch.device("tpu", devices.current_device())


def _device_type(n: Any) -> str | None:
    """The device type of the value an FX node recorded (None for a non-tensor)."""
    val = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    return val.device.type if isinstance(val, torch.Tensor) else None
