"""torch.compile on tpu models runs correctly (Dynamo graph-breaks at tpu ops; see
tpu_kernels/compile_backend.py for why whole-graph capture does not work yet)."""
from __future__ import annotations

import copy

import pytest
import torch

from tpu_kernels.models import GPT, GPTConfig


@pytest.mark.parametrize("backend", ["tpu", "eager"])
def test_compiled_gpt_forward_and_step_match_cpu(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    cpu = GPT(GPTConfig(layers=1))
    tpu = copy.deepcopy(cpu).to("tpu")
    tokens = torch.randint(0, 256, (2, 17))
    compiled = torch.compile(tpu, backend=backend)
    loss = compiled.loss(tokens.to("tpu"))
    expected = cpu.loss(tokens)
    torch.testing.assert_close(loss.cpu(), expected, atol=1e-5, rtol=1e-5)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(tpu.fc.weight.grad.cpu(), cpu.fc.weight.grad, atol=1e-5, rtol=1e-4)
