import torch

from helpers import check


def test_add_mul_parity():
    x = torch.randn(3, 4)
    check(lambda a: a + a * 2, x)


def test_view_aliasing():
    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    y = x[:, 0]
    y.mul_(2)
    assert x.cpu()[:, 0].tolist() == [0.0, 8.0, 16.0]
