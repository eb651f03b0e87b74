"""An error in a tpu op during backward() is raised on the user's thread, never aborts."""
from __future__ import annotations

import pytest
import torch

from tpu_kernels import errors
from tpu_kernels.registry import tpu_kernel, unregister


def test_backward_error_is_raised_at_next_op_naming_the_op():
    @tpu_kernel("aten::soft_margin_loss_backward", priority=1000)
    def broken(grad, x, target, reduction):
        raise ValueError("deliberately broken backward")
    try:
        x = torch.randn(3).to("tpu").requires_grad_()
        loss = torch.nn.functional.soft_margin_loss(x, torch.ones(3).to("tpu"))
        loss.backward()                     # the process survives
        with pytest.raises(errors.DeferredError, match="soft_margin_loss_backward.*deliberately"):
            (x * 2).cpu()
        assert not errors.pending()
        assert (x * 2).cpu().shape == (3,)  # later ops work
    finally:
        unregister(broken)


def test_sparse_embedding_gradient_says_what_to_do():
    """nn.Embedding(sparse=True) makes a sparse gradient, which the device cannot hold: the
    error (at the next op, as every backward error) names the layer option to change."""
    e = torch.nn.Embedding(10, 3, sparse=True).to("tpu")
    e(torch.tensor([1, 2], device="tpu")).sum().backward()
    with pytest.raises(errors.DeferredError, match=r"no sparse tensors.*nn\.Embedding\(sparse=True\).*use sparse=False"):
        torch.optim.SGD(e.parameters(), lr=0.1).step()
