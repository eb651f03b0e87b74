"""Parity tests for layer/group/batch/RMS/weight norm and their backwards."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_same, check, to_tpu

aten = torch.ops.aten


def _r(*shape, dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)


def check_bf16_vs_f32(fn, *args):
    """bf16 on tpu against the float32 computation rounded to bf16.

    Torch's CPU kernels keep the saved statistics of bf16 norms in bf16 while its meta
    functions (our spec) make them float32; the float32 reference is the accurate one."""
    ref_args = [a.detach().float().requires_grad_(a.requires_grad) for a in args]
    ref = fn(*ref_args)
    targs = to_tpu(args)
    out = fn(*targs)
    assert_same(ref.to(torch.bfloat16), out, "value")
    cot = _r(*ref.shape, seed=5).to(torch.bfloat16)
    ins = [a for a in ref_args if a.requires_grad]
    tins = [a for a in targs if a.requires_grad]
    ge = torch.autograd.grad(ref, ins, cot.float())
    ga = torch.autograd.grad(out, tins, to_tpu(cot))
    assert_same([g.to(torch.bfloat16) for g in ge], ga, "grad")


def test_layer_norm():
    x, w, b = _r(3, 5, 7, grad=True), _r(5, 7, grad=True), _r(5, 7, grad=True)
    check(lambda x, w, b: F.layer_norm(x, (5, 7), w, b, eps=1e-3), x, w, b, grad=True)
    check(lambda x: F.layer_norm(x, (7,)), x, grad=True)


def test_layer_norm_bf16():
    bf = torch.bfloat16
    x, w, b = _r(3, 5, 7, dtype=bf, grad=True), _r(7, dtype=bf, grad=True), _r(7, dtype=bf, grad=True)
    check(lambda x, w, b: F.layer_norm(x, (7,), w, b), x, w, b)
    check_bf16_vs_f32(lambda x, w, b: F.layer_norm(x, (7,), w, b), x, w, b)


def test_layer_norm_noncontiguous_and_ops():
    x = _r(7, 4, grad=False).t()
    check(lambda x, w: F.layer_norm(x, (7,), w), x, _r(7, grad=True))
    check(lambda x: aten.native_layer_norm(x, [6], None, None, 1e-5), _r(2, 0, 6))
    x, w, b = _r(4, 6), _r(6), _r(6)
    mean, rstd = aten.native_layer_norm(x, [6], w, b, 1e-5)[1:]
    g = _r(4, 6, seed=1)
    for mask in ([True, False, False], [False, True, True]):
        check(lambda g, x, m, r, w, b: aten.native_layer_norm_backward(g, x, [6], m, r, w, b, mask),
              g, x, mean, rstd, w, b)


def test_group_norm():
    x, w, b = _r(2, 6, 5, 3, grad=True), _r(6, grad=True), _r(6, grad=True)
    check(lambda x, w, b: F.group_norm(x, 3, w, b), x, w, b, grad=True)
    check(lambda x: F.group_norm(x, 2), _r(3, 4, 7, grad=True), grad=True)
    bf = torch.bfloat16
    xb, wb, bb = _r(2, 6, 5, dtype=bf, grad=True), _r(6, dtype=bf, grad=True), _r(6, dtype=bf, grad=True)
    # group norm's saved statistics are bf16 for bf16 input (meta and CPU agree)
    check(lambda x, w, b: F.group_norm(x, 3, w, b), xb, wb, bb, grad=True)


def test_group_norm_empty_batch():
    """A batch of 0 samples (the lowering's reshape to (N, groups, -1) divided by zero)."""
    check(lambda x, w: F.group_norm(x, 2, w), _r(0, 4, 3, grad=True), _r(4, grad=True), grad=True)


def _bn_case(training, dtype=torch.float32, shape=(4, 3, 5, 6)):
    x = _r(*shape, dtype=dtype, grad=True)
    w, b = _r(shape[1], grad=True), _r(shape[1], grad=True)
    rm, rv = _r(shape[1], seed=3), _r(shape[1], seed=4).abs() + 0.5
    return x, w, b, rm, rv


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (5, 3), (2, 3, 4)])
def test_batch_norm(training, shape):
    x, w, b, rm, rv = _bn_case(training, shape=shape)
    trm, trv = to_tpu(rm), to_tpu(rv)
    check(lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, training, 0.3, 1e-4), x, w, b, rm.clone(),
          rv.clone(), grad=True)
    # running stats, mutated in place
    F.batch_norm(x.detach(), rm, rv, w.detach(), b.detach(), training, 0.3, 1e-4)
    F.batch_norm(to_tpu(x.detach()), trm, trv, to_tpu(w.detach()), to_tpu(b.detach()), training, 0.3, 1e-4)
    assert_same(rm, trm, "running_mean")
    assert_same(rv, trv, "running_var")


def test_batch_norm_no_stats_bf16():
    # the half-type batch norm rounds as torch's CPU kernel does (statistics rounded to
    # bfloat16 before normalising): equal to CPU, not to float32 rounded once (28 of these
    # 60 values differ from that by an ulp or a few, in CPU's result as in tpu's)
    x = _r(4, 3, 5, dtype=torch.bfloat16, grad=True)
    check(lambda x: F.batch_norm(x, None, None, training=True), x, grad=True)


def test_batch_norm_legit_ops():
    x, w, b, rm, rv = _bn_case(True)
    x, w, b = x.detach(), w.detach(), b.detach()
    check(aten._native_batch_norm_legit.no_stats, x, w, b, True, 0.1, 1e-5)
    check(aten._batch_norm_with_update_functional.default, x, w, b, rm, rv, 0.1, 1e-5)
    # in eval mode torch's meta (accelerator) convention saves the running stats where the
    # CPU kernel saves empty tensors: compare the normalised output only
    check(lambda *a: aten._native_batch_norm_legit_no_training(*a)[0], x, w, b, rm, rv, 0.1, 1e-5)
    for op, args, saved in [
        (aten._native_batch_norm_legit.default, (x, w, b, rm.clone(), rv.clone(), True, 0.2, 1e-5), 3),
        (aten._native_batch_norm_legit.default, (x, w, b, rm.clone(), rv.clone(), False, 0.2, 1e-5), 1),
        (aten._batch_norm_with_update.default, (x, w, b, rm.clone(), rv.clone(), 0.2, 1e-5), 3),
    ]:
        targs = to_tpu(args)
        assert_same(op(*args)[:saved], op(*targs)[:saved], str(op))
        assert_same(args[3:5], targs[3:5], f"{op} running stats")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_batch_norm_with_update_without_weight_keeps_the_input_dtype(dtype):
    # torch's meta for this op fails without a weight (its backend selection wants one), so
    # the impl's own result types stand: the output was float32 for a half input before
    x = _r(4, 3, 5, dtype=dtype)
    rm, rv = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
    args = (x, None, None, rm.clone(), rv.clone(), 0.1, 1e-5)
    targs = to_tpu(args)
    op = aten._batch_norm_with_update.default
    expected, actual = op(*args)[0], op(*targs)[0]
    assert actual.dtype == dtype
    assert_same(expected, actual, str(op))
    assert_same(args[3:5], targs[3:5], f"{op} running stats")


def test_batch_norm_no_update_without_weight():
    # torch's meta raises for a None weight/bias (backend selection); the impl is traced
    # without it. Saved stats follow the accelerators' [C] layout (CPU: empty): y only
    x, _, _, rm, rv = (t.detach() for t in _bn_case(False))
    op = aten._batch_norm_no_update.default
    args = (x, None, None, rm, rv, 0.1, 1e-5)
    out = op(*to_tpu(args))
    assert [tuple(t.shape) for t in out] == [tuple(x.shape), (3,), (3,), (0,)]
    assert_same(op(*args)[0], out[0], str(op))


def test_batch_norm_backward_ops():
    x, w, b, rm, rv = (t.detach() for t in _bn_case(True))
    g = _r(*x.shape, seed=9)
    _, sm, si = aten.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
    for train in (True, False):
        for mask in ([True, True, True], [True, False, False], [False, True, True]):
            # meta returns grad_input even when unmasked (CPU: None): compare what was asked
            check(lambda g, x, w, rm, rv, sm, si: [t for t, m in zip(aten.native_batch_norm_backward(
                g, x, w, rm, rv, sm, si, train, 1e-5, mask), mask) if m], g, x, w, rm, rv, sm, si)
    check(lambda g, x, w, rm, rv, sm, si, r: aten.batch_norm_backward(
        g, x, w, rm, rv, sm, si, True, 1e-5, [True, True, True], r),
        g, x, w, rm, rv, sm, si, torch.empty(0, dtype=torch.uint8))


def test_rms_norm():
    x, w = _r(3, 4, 6, grad=True), _r(6, grad=True)
    check(lambda x, w: F.rms_norm(x, (6,), w, eps=1e-5), x, w, grad=True)
    check(lambda x: F.rms_norm(x, (4, 6)), x, grad=True)
    xd, wd = x.detach(), w.detach()
    check(lambda x, w: aten._fused_rms_norm(x, [6], w, 1e-6), xd, wd)


@pytest.mark.parametrize("shapes", [((3, 8), (5,), None), ((3, 8), (8,), (5,)), ((3, 8), (2, 8), None),
                                    ((3, 8), (3, 8, 1), None), ((3, 8), (), None)])
def test_rms_norm_bad_shapes_raise_cpus_error(shapes):
    """_fused_rms_norm's meta function checks no shapes: a wrong normalized_shape gave a result."""
    x_shape, normalized_shape, w_shape = shapes
    x, w = torch.randn(x_shape), None if w_shape is None else torch.randn(w_shape)
    with pytest.raises((RuntimeError, ValueError)) as cpu:
        F.rms_norm(x, normalized_shape, w)
    with pytest.raises(cpu.type) as tpu:
        F.rms_norm(to_tpu(x), normalized_shape, to_tpu(w))
    assert str(tpu.value) == str(cpu.value)


def test_weight_norm():
    v, g = _r(5, 3, 2, grad=True), _r(5, 1, 1, grad=True)
    check(lambda v, g: torch._weight_norm(v, g, 0), v, g, grad=True)
    v2, g2 = _r(4, 6, grad=True), _r(1, 6, grad=True)
    check(lambda v, g: torch._weight_norm(v, g, 1), v2, g2, grad=True)
    vd, gd = v.detach(), g.detach()
    w, norms = aten._weight_norm_interface(vd, gd, 0)
    check(lambda gw, v, g, n: aten._weight_norm_interface_backward(gw, v, g, n, 0), _r(5, 3, 2, seed=2), vd, gd,
          norms)


def test_layer_norm_centred_input_not_written_on_xla_cpu():
    """XLA:CPU computes the variance's ``x - mean`` inside its reduction and the output's
    in the output's fusion: the only array of the input's size it writes is the output
    (a shared ``x - mean`` cost a full extra write and read between the reductions)."""
    import jax
    import jax.numpy as jnp

    from tpu_kernels.registry.xla.norm import native_layer_norm

    x, w = jnp.ones((64, 96), jnp.float32), jnp.ones((96,), jnp.float32)
    hlo = jax.jit(lambda x, w, b: native_layer_norm(x, (96,), w, b, 1e-5)).lower(x, w, w).compile().as_text()
    assert len(_full_size_fusions(hlo, "f32[64,96]")) == 1, hlo


def _full_size_fusions(hlo: str, shape: str) -> list[str]:
    """The fusions of an optimized module's entry computation that write a ``shape`` array."""
    import re

    entry = hlo[hlo.index("\nENTRY"):]
    return re.findall(re.escape(shape) + r"\{1,0\} fusion\(", entry)


def test_layer_norm_backward_arrays_written_on_xla_cpu():
    """XLA:CPU's layer norm backward writes dx and two arrays of the input's size (x-hat and
    grad_out * weight, each read by two reductions and dx's fusion); dw reads the x-hat dx
    computes (written as go * (x - mean) * rstd it also wrote x - mean and rstd's broadcast)."""
    import jax
    import jax.numpy as jnp

    from tpu_kernels.registry.context import Call, OutMeta, lowering
    from tpu_kernels.registry.xla.norm import native_layer_norm_backward

    x, w, s = jnp.ones((64, 96), jnp.float32), jnp.ones((96,), jnp.float32), jnp.ones((64, 1), jnp.float32)
    outs = (OutMeta((64, 96), torch.float32), OutMeta((96,), torch.float32), OutMeta((96,), torch.float32))

    def bwd(g, x, m, r, w):
        with lowering(Call(outs)):
            return native_layer_norm_backward(g, x, (96,), m, r, w, w, [True] * 3)
    hlo = jax.jit(bwd).lower(x, x, s, s, w).compile().as_text()
    assert len(_full_size_fusions(hlo, "f32[64,96]")) == 3, hlo
