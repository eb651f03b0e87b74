"""CPU inputs a compiled graph updates from CPU values alone, updated on the host.

A CPU counter a compiled graph bumps (a custom optimizer's step count kept as a CPU
tensor; torch's own optimizers count on the device when compiled: ``optim_defaults.py``)
is a CPU input the graph adds one to and writes back (``copy_`` into the input). The
program computes that too, but reading its result back into the CPU tensor waits for
the whole program: a host sync every training step. The new value depends on
CPU tensors only, so the same ops run on the host with torch (a few scalar ops) while the
program runs; the program's copy is not read. The program is given a private copy of such
an input, so the host's write never races its read.
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch


class HostWrites:
    """The graph's ``copy_`` into a CPU input whose new value needs only CPU inputs."""

    def __init__(self, gm: torch.fx.GraphModule, tensor_positions: dict[torch.fx.Node, int]) -> None:
        on_host: set[torch.fx.Node] = {n for n in tensor_positions if cpu_valued(n)}
        self.nodes: list[torch.fx.Node] = []        # host ops, in graph order
        self.writes: list[tuple[int, torch.fx.Node]] = []   # (tensor position, new value)
        for n in gm.graph.nodes:
            if n.op != "call_function" or not _host_op(n, on_host):
                continue
            if n.target is torch.ops.aten.copy_.default and n.args[0] in tensor_positions:
                self.writes.append((tensor_positions[n.args[0]], n.args[1]))
                continue
            on_host.add(n)
            self.nodes.append(n)
        needed = _ancestors([v for _, v in self.writes])
        self.nodes = [n for n in self.nodes if n in needed]
        self.written = {k for k, _ in self.writes}
        self.inputs = [k for n, k in tensor_positions.items() if n in needed]   # what _fn takes
        self._fn = _generated(self.inputs, tensor_positions, self.nodes, [v for _, v in self.writes])

    def compute(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The new value of each written input (in ``writes``' order), from the inputs'
        current values."""
        with torch.no_grad():
            return self._fn(*[tensors[k] for k in self.inputs])

    def write(self, tensors: Sequence[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Write ``compute``'s values into their inputs."""
        torch._foreach_copy_([tensors[k] for k, _ in self.writes], values)


def _generated(inputs: list[int], positions: dict[torch.fx.Node, int], nodes: list[torch.fx.Node],
               results: list[torch.fx.Node]) -> Any:
    """``nodes`` as a Python function of the inputs at ``inputs``, returning ``results``."""
    g = torch.fx.Graph()
    by_position = {k: n for n, k in positions.items()}
    env: dict[torch.fx.Node, torch.fx.Node] = {by_position[k]: g.placeholder(f"in{k}") for k in inputs}
    for n in nodes:
        env[n] = g.node_copy(n, env.__getitem__)
    g.output([env[v] for v in results])
    return torch.fx.GraphModule(torch.nn.Module(), g).forward


def cpu_valued(n: Any) -> bool:
    """A CPU tensor, or a list of them (a foreach op's result)."""
    val = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    vals = val if isinstance(val, (list, tuple)) and val else [val]
    return all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in vals)


def _host_op(n: torch.fx.Node, on_host: set) -> bool:
    """An ATen op on host values giving CPU tensors, not a random one, or an item of a
    foreach op's results (an optimizer's ``_foreach_add_(steps, 1)``)."""
    target = n.target
    if target is not operator.getitem and (not isinstance(target, torch._ops.OpOverload)
                                           or torch.Tag.nondeterministic_seeded in target.tags):
        return False
    inputs = n.all_input_nodes
    return cpu_valued(n) and bool(inputs) and all(i in on_host for i in inputs)


def _ancestors(nodes: list[torch.fx.Node]) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen
