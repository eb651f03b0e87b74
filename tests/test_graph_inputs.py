"""0-dim CPU inputs of a compiled graph cross into the program as one array per dtype
(``graph_inputs.py``): a compiled function with four CPU scalar arguments packs them and
matches CPU."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from tpu_kernels import graph_program
from tpu_kernels.graph_inputs import HostScalars, source_of


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


def test_a_compiled_function_packs_its_cpu_scalars_and_matches_cpu(monkeypatch):
    # (a compiled AdamW step no longer has CPU counters: it counts on the device, as for
    # CUDA; a custom optimizer's CPU counters, or CPU scalar arguments, still cross packed)
    made = []
    init = graph_program.GraphProgram.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(graph_program.GraphProgram, "__init__", spy)

    def f(x, a, b, c, d):
        return (x * a + b - c * d).relu()

    cf = torch.compile(f, backend="tpu")
    x = torch.randn(3, 4)
    for k in range(3):
        scalars = [torch.tensor(v + k) for v in (0.5, -1.0, 2.0, 0.25)]
        torch.testing.assert_close(cf(x.to("tpu"), *scalars).cpu(), f(x, *scalars))
    packed = [p.scalars for p in made if p.scalars is not None]
    assert packed and [len(ks) for _, ks in packed[0].groups] == [4]   # one array of 4 scalars


def test_a_cpu_input_is_read_as_a_copy():
    """A program may run after its call returns (XLA:CPU dispatches asynchronously and can
    read host memory in place): a CPU input the caller writes next (an lr scheduler's
    ``fill_`` of a tensor learning rate) must not change what the program reads."""
    lr = torch.tensor(0.01)
    st, _ = source_of(lr)
    assert not np.shares_memory(st.array, lr.numpy())
    lr.fill_(0.5)
    assert float(st.array) == np.float32(0.01)
