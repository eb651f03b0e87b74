"""``t.data = other`` between tpu tensors: the tensor takes the other's values, shape and
storage, as on CPU (torch's own setter swaps only the C++ metadata of a wrapper tensor)."""
import torch
import torch.nn.functional as F

import tpu_kernels  # noqa: F401


def test_parameter_data_takes_new_values_and_shape():
    p = torch.nn.Parameter(torch.zeros(3, device="tpu"))
    p.data = torch.arange(6.0, device="tpu").reshape(2, 3)
    assert p.shape == (2, 3) and p.requires_grad and isinstance(p, torch.Tensor)
    torch.testing.assert_close(p.cpu(), torch.arange(6.0).reshape(2, 3), check_dtype=True)
    (p * p).sum().backward()
    torch.testing.assert_close(p.grad.cpu(), 2 * torch.arange(6.0).reshape(2, 3))


def test_data_shares_storage_with_the_source_like_cpu():
    for dev in ("cpu", "tpu"):
        a, b = torch.zeros(4, device=dev), torch.ones(4, device=dev)
        a.data = b
        b.add_(1)                       # one storage: a sees it
        torch.testing.assert_close(a.cpu(), torch.full((4,), 2.0), msg=dev)


def test_weight_swapped_through_data_is_used_by_the_module():
    lin = torch.nn.Linear(4, 2).to("tpu")
    w = torch.randn(2, 4)
    lin.weight.data = w.to("tpu")
    x = torch.randn(3, 4)
    torch.testing.assert_close(lin(x.to("tpu")).cpu(), F.linear(x, w, lin.bias.detach().cpu()))


def test_data_read_inside_compile():
    x = torch.randn(5)
    f = torch.compile(lambda t: t.data * 2 + 1, backend="tpu")
    torch.testing.assert_close(f(x.to("tpu")).cpu(), x * 2 + 1)
