"""torch.optim.Adam/AdamW(fused=True) on tpu: the fused op's lowering matches CPU's fused step."""
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
