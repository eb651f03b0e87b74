"""Parity tests for convolution, convolution_backward, im2col/col2im, and a small CNN step."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_same, check, to_tpu

aten = torch.ops.aten


def _r(*shape, dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)


@pytest.mark.parametrize("case", [
    dict(x=(2, 4, 7, 9), w=(6, 2, 3, 3), stride=2, padding=1, groups=2),
    dict(x=(1, 3, 5, 6), w=(4, 3, 2, 3), stride=(1, 2), padding=(0, 2), dilation=(2, 1)),
    dict(x=(2, 3, 8, 8), w=(3, 1, 3, 3), padding=1, groups=3),     # depthwise
])
def test_conv2d_fwd_bwd(case):
    case = dict(case)
    x, w = _r(*case.pop("x"), grad=True), _r(*case.pop("w"), grad=True)
    b = _r(w.shape[0], grad=True)
    check(lambda x, w, b: F.conv2d(x, w, b, **case), x, w, b, grad=True)


def test_conv1d_3d_and_no_bias():
    check(lambda x, w: F.conv1d(x, w, stride=2, padding=2), _r(2, 3, 11, grad=True), _r(5, 3, 4, grad=True),
          grad=True)
    check(lambda x, w, b: F.conv3d(x, w, b, padding=1), _r(1, 2, 4, 5, 3, grad=True),
          _r(3, 2, 3, 3, 2, grad=True), _r(3, grad=True), grad=True)


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_conv_transpose(nd):
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]
    x = _r(2, 4, *(5, 4, 3)[:nd], grad=True)
    w = _r(4, 3, *(3, 2, 2)[:nd], grad=True)
    b = _r(6, grad=True)
    check(lambda x, w, b: fn(x, w, b, stride=2, padding=1, output_padding=1, groups=2), x, w, b, grad=True)


@pytest.mark.parametrize("call", [
    lambda x, w, b: F.conv2d(x, w.double()),                                  # weight dtype
    lambda x, w, b: F.conv1d(x[..., 0], w[..., 0].bfloat16()),
    lambda x, w, b: F.conv2d(x, w, b.double()),                               # bias dtype
    lambda x, w, b: F.conv_transpose2d(x, w.transpose(0, 1), output_padding=1),    # >= stride
    lambda x, w, b: F.conv_transpose1d(x[..., 0], w[..., 0].transpose(0, 1), stride=2, output_padding=(2,)),
    lambda x, w, b: F.conv_transpose3d(x[..., None], w[..., None].transpose(0, 1), output_padding=(0, 1, 0)),
])
def test_conv_bad_arguments_raise_cpus_error(call):
    """torch's meta function checks neither dtypes nor output_padding: the lowering raised
    jax's TypeError for mixed dtypes and gave a result for output_padding >= stride."""
    x, w, b = _r(1, 2, 5, 5), _r(3, 2, 3, 3), _r(3)
    with pytest.raises(RuntimeError) as cpu:
        call(x, w, b)
    with pytest.raises(RuntimeError) as tpu:
        call(*to_tpu((x, w, b)))
    assert str(tpu.value) == str(cpu.value)


def test_conv_noncontiguous_bf16_unbatched():
    x = _r(2, 3, 9, 7).transpose(2, 3)
    check(lambda x, w: F.conv2d(x, w, padding=1), x, _r(4, 3, 3, 3))
    check(lambda x, w: F.conv2d(x, w, padding=1), _r(3, 6, 5, dtype=torch.bfloat16),
          _r(2, 3, 3, 3, dtype=torch.bfloat16))


def test_conv_zero_batch_no_retrace():
    check(lambda x, w: F.conv2d(x, w, padding=1), _r(0, 3, 5, 5), _r(4, 3, 3, 3))
    from tpu_kernels.dispatch import TRACES
    x, w = to_tpu(_r(2, 3, 6, 6)), to_tpu(_r(4, 3, 3, 3))
    F.conv2d(x, w)
    before = TRACES[aten.convolution.default]
    F.conv2d(x + 1, w)
    assert TRACES[aten.convolution.default] == before


def test_convolution_backward_mask():
    x, w, g = _r(2, 3, 6, 6), _r(4, 3, 3, 3), _r(2, 4, 4, 4)
    for mask in ([True, False, False], [False, True, True], [True, True, False]):
        check(lambda g, x, w: aten.convolution_backward(g, x, w, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                        mask), g, x, w)


def test_im2col_col2im():
    x = _r(2, 3, 7, 6)
    check(lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)), x)
    check(lambda x: F.unfold(x, 3), _r(3, 5, 5))
    cols = _r(2, 3 * 2 * 3, 16)
    check(lambda c: F.fold(c, (7, 6), (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)), cols)
    check(lambda c: F.fold(c, (4, 5), 2), _r(8, 12), grad=False)


def _cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 6, 3, groups=2), torch.nn.AdaptiveAvgPool2d((2, 2)),
        torch.nn.Flatten(), torch.nn.Linear(24, 5))


def test_small_cnn_train_step():
    cpu = _cnn()
    tpu = _cnn().to("tpu")
    x, y = _r(4, 3, 10, 10), torch.tensor([0, 3, 1, 4])
    for m, xx, yy in ((cpu, x, y), (tpu, to_tpu(x), to_tpu(y))):
        F.cross_entropy(m(xx), yy).backward()
    for (name, p), (_, tp) in zip(cpu.named_parameters(), tpu.named_parameters()):
        assert_same(p.grad, tp.grad, name, atol=1e-5, rtol=1e-4)
    for (name, b), (_, tb) in zip(cpu.named_buffers(), tpu.named_buffers()):
        assert_same(b, tb, name)
    cpu.eval(), tpu.eval()
    assert_same(cpu(x), tpu(to_tpu(x)), "eval", atol=1e-5, rtol=1e-4)
