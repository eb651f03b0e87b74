"""Moving a model to tpu keeps its structure: tied parameters stay one parameter."""
from __future__ import annotations

import pytest
import torch

from model_harness import move_to_tpu


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight            # as in GPT-2, Gemma, T5, OPT, ...


@pytest.mark.xfail(strict=True, reason=(
    "Module.to('tpu') unties shared parameters: Module._apply cannot set a CPU Parameter's "
    ".data to a tpu tensor (torch._has_compatible_shallow_copy_type is False and TpuTensor "
    "is not a traceable wrapper subclass, so swap_tensors is not used) and makes one new "
    "Parameter per module"))
def test_to_tpu_keeps_tied_weights():
    model = Tied().to("tpu")
    assert model.head.weight is model.embed.weight


def test_to_tpu_with_swap_keeps_tied_weights():
    model = move_to_tpu(Tied())
    assert model.head.weight is model.embed.weight
    assert len(list(model.parameters())) == 1
    model.head(model.embed(torch.tensor([[1, 2]], device="tpu"))).sum().backward()
    assert model.embed.weight.grad.device.type == "tpu"
