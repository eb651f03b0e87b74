"""torch.optim.Adam/AdamW/SGD/Adagrad(fused=True) on tpu: the fused ops' lowerings match CPU's
fused steps."""
from __future__ import annotations

import copy

import pytest
import torch

from tpu_kernels import registry


@pytest.mark.parametrize("kind", ["xla", "pallas"])
@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("cls", [torch.optim.AdamW, torch.optim.Adam])
def test_fused_adam_matches_cpu(cls, amsgrad, kind):
    torch.manual_seed(0)
    cpu = torch.nn.Linear(8, 4)
    tpu = copy.deepcopy(cpu).to("tpu")
    kw = dict(lr=1e-2, fused=True, amsgrad=amsgrad, weight_decay=0.1)
    opt_cpu, opt_tpu = cls(cpu.parameters(), **kw), cls(tpu.parameters(), **kw)
    x = torch.randn(3, 8)
    ctx = registry.interpret() if kind == "pallas" else registry.only("xla")
    with ctx:
        for _ in range(3):
            for model, opt, inp in ((cpu, opt_cpu, x), (tpu, opt_tpu, x.to("tpu"))):
                opt.zero_grad()
                model(inp).sum().backward()
                opt.step()
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(q.cpu(), p)


@pytest.mark.parametrize("cls,kw", [
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, maximize=True)),
    (torch.optim.SGD, dict(lr=0.1)),
    (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.01)),
], ids=["sgd nesterov", "sgd dampening maximize", "sgd plain", "adagrad"])
def test_fused_sgd_and_adagrad_match_cpu(cls, kw):
    torch.manual_seed(0)
    cpu = torch.nn.Linear(8, 4)
    tpu = copy.deepcopy(cpu).to("tpu")
    opt_cpu, opt_tpu = cls(cpu.parameters(), fused=True, **kw), cls(tpu.parameters(), fused=True, **kw)
    x = torch.randn(3, 8)
    for _ in range(3):
        for model, opt, inp in ((cpu, opt_cpu, x), (tpu, opt_tpu, x.to("tpu"))):
            opt.zero_grad()
            (model(inp) ** 2).sum().backward()
            opt.step()
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(q.cpu(), p)


def _fused_call(op: str, device: str, found_inf: float) -> list[torch.Tensor]:
    """One fused step with a grad scale: every list it updates, after the call."""
    g = torch.Generator().manual_seed(0)
    lists = [[torch.randn(3, 4, generator=g).abs().to(device)] for _ in range(4)]
    scale, inf = torch.tensor(2.0, device=device), torch.tensor(found_inf, device=device)
    step = [torch.tensor(3.0, device=device)]
    if op == "adam":
        torch._fused_adam_(*lists, [], step, lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8,
                           amsgrad=False, maximize=False, grad_scale=scale, found_inf=inf)
    elif op == "sgd":
        torch._fused_sgd_(*lists[:3], weight_decay=0.0, momentum=0.9, lr=0.1, dampening=0.0, nesterov=False,
                          maximize=False, is_first_step=False, grad_scale=scale, found_inf=inf)
    else:
        torch._fused_adagrad_(*lists[:3], step, lr=0.1, lr_decay=0.0, weight_decay=0.0, eps=1e-10, maximize=False,
                              grad_scale=scale, found_inf=inf)
    return [t[0].cpu() for t in lists]


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
@pytest.mark.parametrize("op", ["adam", "sgd", "adagrad"])
def test_fused_steps_unscale_the_gradients_and_skip_on_inf(op, found_inf):
    """As torch's kernels: given a grad scale the gradients are left unscaled, and a found
    inf leaves parameters, state and gradients untouched."""
    for got, want in zip(_fused_call(op, "tpu", found_inf), _fused_call(op, "cpu", found_inf)):
        torch.testing.assert_close(got, want)
