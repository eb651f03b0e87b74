"""0-dim CPU inputs of a compiled graph cross into the program as one array per dtype
(``graph_inputs.py``): a compiled AdamW step packs its step counters and matches CPU."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from tpu_kernels import graph_program
from tpu_kernels.graph_inputs import HostScalars


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_pack_and_unpack_give_back_the_inputs_in_order():
    tensors = [torch.zeros(3), torch.tensor(1.0), torch.tensor(2), torch.tensor(3.0), torch.zeros(2),
               torch.tensor(4)]
    hs = HostScalars.of(tensors)
    assert hs.direct == [0, 4]
    arrays = [t.numpy() for t in tensors]
    args = hs.pack(arrays)
    assert len(args) == 4 and args[2].tolist() == [1.0, 3.0] and args[3].tolist() == [2, 4]
    back = hs.unpack(args)
    for a, b in zip(back, arrays):
        np.testing.assert_array_equal(np.asarray(a), b)
    abstract = hs.pack([jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays])
    assert [a.shape for a in abstract] == [(3,), (2,), (2,), (2,)]


def test_one_scalar_is_left_alone():
    assert HostScalars.of([torch.zeros(3), torch.tensor(1.0)]) is None


def test_a_compiled_adamw_step_packs_its_step_counters_and_matches_cpu(monkeypatch):
    made = []
    init = graph_program.GraphProgram.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(graph_program.GraphProgram, "__init__", spy)

    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    tpu = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).to("tpu")
    tpu.load_state_dict(cpu.state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1) for m in (cpu, tpu)]
    step = torch.compile(opts[1].step, backend="tpu")
    x = torch.randn(5, 4)
    for _ in range(3):
        for m, o in zip((cpu, tpu), opts):
            o.zero_grad()
            m(x.to(next(m.parameters()).device)).square().sum().backward()
        opts[0].step()
        step()
    for a, b in zip(tpu.parameters(), cpu.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), atol=1e-5, rtol=1e-5)
    assert [int(s.item()) for s in (opts[1].state[p]["step"] for p in tpu.parameters())] == [3] * 4
    packed = [p.scalars for p in made if p.scalars is not None]
    assert packed and [len(ks) for _, ks in packed[0].groups] == [4]   # one array of 4 counters
