"""``F.rms_norm`` (and ``nn.RMSNorm``) on tpu reaches ``aten::_fused_rms_norm`` and its
backward, the ops the Helion RMSNorm kernel is bound to, in eager and under
``torch.compile(backend="tpu")``; results match CPU."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import tpu_kernels  # noqa: F401
from tpu_kernels import compile_backend, dispatch, registry
from tpu_kernels.testing import tol


def _pair(*shape, seed=0):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return x.clone().requires_grad_(), x.to("tpu").requires_grad_()


def test_eager_rms_norm_is_one_fused_op_each_way():
    (xc, xt), (wc, wt) = _pair(4, 64), _pair(64, seed=1)
    before = dict(dispatch.op_counts())
    out = F.rms_norm(xt, [64], wt, 1e-6)
    out.square().sum().backward()
    ref = F.rms_norm(xc, [64], wc, 1e-6)
    ref.square().sum().backward()
    grew = {op for op, n in dispatch.op_counts().items() if n > before.get(op, 0)}
    assert ("aten._fused_rms_norm.default", "xla") in grew
    assert ("aten._fused_rms_norm_backward.default", "xla") in grew
    assert not any(op.startswith(("aten.rsqrt", "aten.mean")) for op, _ in grew), grew   # no decomposition
    torch.testing.assert_close(out.cpu(), ref.detach(), **tol(torch.float32))
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, **tol(torch.float32))
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, **tol(torch.float32))


def test_the_kernel_is_what_the_route_offers():
    with registry.interpret():
        impl, _ = registry.which("aten::_fused_rms_norm", torch.randn(4, 128), [128], torch.randn(128), 1e-6)
    assert impl.kind == "helion"


def test_compiled_rms_norm_records_the_fused_ops():
    m = torch.nn.RMSNorm(64, eps=1e-6)
    mt = torch.nn.RMSNorm(64, eps=1e-6).to("tpu")
    xc, xt = _pair(3, 64)
    n = len(compile_backend.PROGRAMS)
    loss = torch.compile(lambda x: mt(x).square().sum(), backend="tpu")(xt)
    loss.backward()
    ref = m(xc).square().sum()
    ref.backward()
    targets = {str(node.target) for p in compile_backend.PROGRAMS[n:] for node in p.gm.graph.nodes}
    assert {"aten._fused_rms_norm.default", "aten._fused_rms_norm_backward.default"} <= targets
    torch.testing.assert_close(loss.cpu(), ref.detach(), **tol(torch.float32))
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, **tol(torch.float32))
