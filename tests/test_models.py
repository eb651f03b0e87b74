"""The small GPT and CNN: forward parity with CPU, and 10 AdamW steps with the same losses."""
from __future__ import annotations

import copy

import pytest
import torch

from helpers import assert_same
from tpu_kernels.models import CNN, GPT, GPTConfig, train


def _pair(make):
    torch.manual_seed(0)
    cpu = make()
    return cpu, copy.deepcopy(cpu).to("tpu")


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_gpt_forward_matches_cpu(attention):
    cpu, tpu = _pair(lambda: GPT(GPTConfig(attention=attention)))
    tokens = torch.randint(0, 256, (2, 32))
    with torch.no_grad():
        assert_same(cpu(tokens), tpu(tokens.to("tpu")), "GPT forward", atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("foreach", [False, True])
def test_gpt_training_matches_cpu(foreach):
    cpu, tpu = _pair(GPT)
    tokens = torch.randint(0, 256, (4, 33))
    expected = train(cpu, (tokens,), 10, foreach=foreach)
    got = train(tpu, (tokens.to("tpu"),), 10, foreach=foreach)
    assert all(p.device.type == "tpu" and p.grad.device.type == "tpu" for p in tpu.parameters())
    # float32 with a different summation order: losses agree to ~1e-5 relative over 10 steps
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-4, rtol=1e-4)
    assert expected[-1] < expected[0]


def test_cnn_forward_and_training_match_cpu():
    cpu, tpu = _pair(CNN)
    images = torch.randn(4, 3, 16, 16)
    labels = torch.randint(0, 10, (4,))
    with torch.no_grad():
        assert_same(cpu.eval()(images), tpu.eval()(images.to("tpu")), "CNN eval", atol=1e-4, rtol=1e-4)
    cpu.train(), tpu.train()
    # one step: BatchNorm running statistics are updated in place on tpu, as on CPU
    train(cpu, (images, labels), 1)
    train(tpu, (images.to("tpu"), labels.to("tpu")), 1)
    bn_cpu, bn_tpu = cpu.features[1], tpu.features[1]
    torch.testing.assert_close(bn_tpu.running_mean.cpu(), bn_cpu.running_mean, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(bn_tpu.running_var.cpu(), bn_cpu.running_var, atol=1e-5, rtol=1e-4)
    # nine more: the losses stay together (the stats drift apart with the weights, by
    # float32 rounding compounded over steps, so they are not compared after training)
    expected = train(cpu, (images, labels), 9)
    got = train(tpu, (images.to("tpu"), labels.to("tpu")), 9)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-4, rtol=1e-4)
    assert bn_tpu.num_batches_tracked.item() == 10


def test_issue_example():
    """The snippet from the tpu device issue, verbatim in spirit."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=1000, seq=128, dim=32, heads=2, layers=1)).to("tpu")
    x = torch.randint(0, 1000, (4, 128), device="tpu")
    loss = model(x).logsumexp(-1).mean()
    loss.backward()
    torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    assert isinstance(loss.item(), float)
    assert model.fc.weight.grad.device == torch.device("tpu", 0)
