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


@pytest.mark.parametrize("move", [lambda m: m.to("tpu"), lambda m: m.tpu(), move_to_tpu],
                         ids=["to", "tpu", "harness"])
def test_moving_to_tpu_keeps_tied_weights(move):
    model = move(Tied())
    assert model.head.weight is model.embed.weight
    assert not torch.__future__.get_swap_module_params_on_conversion()  # only for the move
    assert len(list(model.parameters())) == 1
    model.head(model.embed(torch.tensor([[1, 2]], device="tpu"))).sum().backward()
    assert model.embed.weight.grad.device.type == "tpu"
