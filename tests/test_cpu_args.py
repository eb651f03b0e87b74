"""CPU tensors in tpu ops, by CUDA's rules: CPU index tensors and 0-dim CPU tensors are
taken (the results match the same code on CPU), any other CPU tensor raises torch's error."""
from __future__ import annotations

import pytest
import torch

import tpu_kernels  # noqa: F401  (registers the tpu device)
from helpers import assert_same

IDX = torch.tensor([0, 2, 2])
MASK = torch.tensor([True, False, True])


def _setitem(x, key, v):
    x = x.clone()
    x[key] = v
    return x


# each case: f(x) with x on the device under test; every other tensor is a CPU tensor
TAKEN = {
    "index_cpu_long": lambda x: x[IDX],
    "index_cpu_two_dims": lambda x: x[IDX, torch.tensor([1, 0, 3])],
    "index_cpu_and_device": lambda x: x[IDX, torch.tensor([1, 0, 3]).to(x.device)],
    "index_cpu_bool_mask": lambda x: x[MASK],
    "index_cpu_slice_then_index": lambda x: x[:, torch.tensor([3, 1])],
    "index_put_cpu_indices": lambda x: _setitem(x, IDX, 5.0),
    "index_put_cpu_mask": lambda x: _setitem(x, MASK, -1.0),
    "index_put_0dim_cpu_value": lambda x: _setitem(x, IDX, torch.tensor(3.0)),
    "index_put_accumulate": lambda x: x.index_put((IDX,), torch.ones(4).to(x.device), accumulate=True),
    "masked_fill_0dim_cpu_value": lambda x: x.masked_fill(x > 5, torch.tensor(-2.0)),
    "masked_fill_0dim_cpu_int_value": lambda x: x.masked_fill(x > 5, torch.tensor(7)),
    "add_0dim_cpu": lambda x: x + torch.tensor(2.5),
    "rsub_0dim_cpu": lambda x: torch.tensor(2.5) - x,
    "mul_0dim_cpu_double": lambda x: x * torch.tensor(3.0, dtype=torch.float64),
    "where_0dim_cpu": lambda x: torch.where(x > 4, x, torch.tensor(0.5)),
    "clamp_0dim_cpu": lambda x: torch.clamp(x, min=torch.tensor(2.0), max=torch.tensor(8.0)),
    "tensor_split_cpu_indices": lambda x: torch.tensor_split(x, torch.tensor([1, 2])),
    "tensor_split_cpu_sections": lambda x: torch.tensor_split(x, torch.tensor(2), dim=1),
}


@pytest.mark.parametrize("name", sorted(TAKEN))
def test_cpu_tensor_taken_like_cuda(name):
    x = torch.arange(12.0).reshape(3, 4)
    assert_same(TAKEN[name](x), TAKEN[name](x.to("tpu")), name)


SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu!"
REFUSED = {
    "add_1dim_cpu": (lambda x: x + torch.ones(4), SAME_DEVICE),
    "mm_cpu": (lambda x: x @ torch.ones(4, 2), SAME_DEVICE),
    "index_select_cpu_index": (lambda x: x.index_select(0, IDX), SAME_DEVICE),
    "gather_cpu_index": (lambda x: x.gather(0, torch.zeros(3, 4, dtype=torch.long)), SAME_DEVICE),
    "index_put_1dim_cpu_values": (lambda x: x.index_put((IDX,), torch.ones(4)), SAME_DEVICE),
    "masked_fill_cpu_mask": (lambda x: x.masked_fill(torch.ones(3, 4, dtype=torch.bool), 1.0), SAME_DEVICE),
    "nextafter_0dim_cpu": (lambda x: torch.nextafter(x, torch.tensor(1.0)), SAME_DEVICE),
    "tensor_split_device_indices": (
        lambda x: torch.tensor_split(x, torch.tensor([1, 2]).to(x.device)),
        "tensor_split expected tensor_indices_or_sections to be on cpu, but it's on tpu:0"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_cpu_tensor_refused_like_cuda(name):
    fn, message = REFUSED[name]
    fn(torch.arange(12.0).reshape(3, 4))   # the same call on CPU is fine
    with pytest.raises(RuntimeError) as info:
        fn(torch.arange(12.0).reshape(3, 4).to("tpu"))
    assert message in str(info.value)
