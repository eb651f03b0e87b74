"""Pallas fused Adam/AdamW (interpret mode) vs torch's fused CPU optimizer and the jnp
reference, plus TPU export and VMEM checks."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tpu_kernels.pallas import fused_adam as fa
from tpu_kernels.pallas import tpu_info
from helpers import tpu_compile
from tpu_kernels.pallas.reference import fused_adam as ref
from tpu_kernels.testing import tol

jax.config.update("jax_enable_x64", True)

SHAPES = [(7,), (33, 5), (256, 128), (3, 1, 130)]
HP = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, eps=1e-8)


def _j(t):
    return jnp.asarray(t.detach().float().numpy()).astype(
        jnp.bfloat16 if t.dtype == torch.bfloat16 else jnp.float32)


def _close(got, want):
    np.testing.assert_allclose(np.asarray(jnp.asarray(got).astype(jnp.float32)),
                               want.detach().float().numpy(), **tol(want.dtype, kernel=True))


@pytest.mark.parametrize("adamw", [True, False])
@pytest.mark.parametrize("amsgrad,maximize,dtype", [
    (False, False, torch.float32), (True, True, torch.float32), (True, False, torch.bfloat16)])
def test_matches_torch_optimizer(adamw, amsgrad, maximize, dtype):
    """Three steps of torch.optim.Adam(W)(fused=True) on CPU vs the kernel."""
    g = torch.Generator().manual_seed(0)
    tp = [torch.randn(s, generator=g).to(dtype) for s in SHAPES]
    cls = torch.optim.AdamW if adamw else torch.optim.Adam
    opt = cls(tp, amsgrad=amsgrad, maximize=maximize, fused=True, **HP)
    p = [_j(t) for t in tp]
    m, v, vmax = ([jnp.zeros_like(x) for x in p] for _ in range(3))
    for step in (1, 2, 3):
        grads = [torch.randn(s, generator=g).to(dtype) for s in SHAPES]
        for t, gr in zip(tp, grads):
            t.grad = gr
        opt.step()
        p, m, v, vmax = fa.fused_adam(
            p, [_j(gr) for gr in grads], m, v, vmax, [jnp.float32(step)] * len(p),
            lr=HP["lr"], beta1=0.9, beta2=0.99, weight_decay=0.1, eps=1e-8,
            amsgrad=amsgrad, maximize=maximize, adamw=adamw)
    for k, t in enumerate(tp):
        assert p[k].shape == t.shape and p[k].dtype == _j(t).dtype
        _close(p[k], t)
        _close(m[k], opt.state[t]["exp_avg"])
        _close(v[k], opt.state[t]["exp_avg_sq"])
        if amsgrad:
            _close(vmax[k], opt.state[t]["max_exp_avg_sq"])


@pytest.mark.parametrize("found", [0.0, 1.0])
def test_grad_scale_found_inf_per_param_steps(found):
    """torch._fused_adamw_ directly: grads / grad_scale, skip on found_inf, own step per
    tensor, lr given as a tensor."""
    g = torch.Generator().manual_seed(1)
    n = len(SHAPES)
    ps, gs, ms = ([torch.randn(s, generator=g) for s in SHAPES] for _ in range(3))
    vs = [torch.rand(s, generator=g) for s in SHAPES]
    steps = [torch.tensor(float(k + 2)) for k in range(n)]
    before = [[_j(t) for t in ts] for ts in (ps, gs, ms, vs)]
    scale, inf = torch.tensor(64.0), torch.tensor(found)
    torch._fused_adamw_(ps, gs, ms, vs, [], steps, lr=torch.tensor(3e-3), beta1=0.8,
                        beta2=0.95, weight_decay=0.05, eps=1e-6, amsgrad=False,
                        maximize=False, grad_scale=scale, found_inf=inf)
    kw = dict(lr=jnp.float32(3e-3), beta1=0.8, beta2=0.95, weight_decay=0.05, eps=1e-6)
    p, m, v, _ = fa.fused_adamw(*before, [], [jnp.float32(s.item()) for s in steps],
                                grad_scale=jnp.float32(64.0), found_inf=jnp.float32(found),
                                **kw)
    for k in range(n):
        _close(p[k], ps[k]), _close(m[k], ms[k]), _close(v[k], vs[k])
        r = ref.adam_step(*(b[k] for b in before), None, float(steps[k]), adamw=True,
                          grad_scale=64.0, found_inf=found, **kw)
        np.testing.assert_allclose(np.asarray(p[k]), np.asarray(r[0]), **tol(jnp.float32))  # elementwise
        if found:
            np.testing.assert_array_equal(np.asarray(p[k]), np.asarray(before[0][k]))


def _pallas_calls(jaxpr) -> int:
    return sum(1 for e in jaxpr.eqns if e.primitive.name == "pallas_call")


def test_small_tensors_share_one_call():
    """A model-like list (embedding, matrices, many biases/norm weights of odd sizes, bf16
    and f32): one pallas_call per large tensor, one per dtype for all the small ones, and the
    results match per-tensor reference steps (own step per tensor)."""
    f32, bf16 = jnp.float32, jnp.bfloat16
    specs = [((50, 40), f32), ((9,), f32), ((40, 40), f32), ((40,), f32), ((3, 5, 7), f32),
             ((1,), f32), ((100, 130), f32), ((2, 20, 384), f32), ((13,), bf16), ((40, 3), bf16)]
    big = sum(1 for s, _ in specs if -(-int(np.prod(s)) // fa.LANES) > fa.PACK_ROWS)
    rng = np.random.default_rng(0)
    ts = [[jnp.asarray(rng.standard_normal(s), f32).astype(d) for s, d in specs]
          for _ in range(4)]
    ts[3] = [jnp.abs(v) for v in ts[3]]
    steps = [float(k % 3 + 1) for k in range(len(specs))]
    kw = dict(lr=1e-2, beta1=0.9, beta2=0.99, weight_decay=0.1, eps=1e-8)

    def step(*flat):
        p, g, m, v = (list(flat[i::4]) for i in range(4))
        return fa.fused_adamw(p, g, m, v, [], steps, **kw)

    flat = [t for k in range(len(specs)) for t in (ts[0][k], ts[1][k], ts[2][k], ts[3][k])]
    assert _pallas_calls(jax.make_jaxpr(step)(*flat).jaxpr) == big + 2    # + f32 and bf16 packs
    p, m, v, _ = step(*flat)
    for k, (shape, dtype) in enumerate(specs):
        want = ref.adam_step(*(ts[r][k] for r in range(4)), None, steps[k], adamw=True, **kw)
        for got, w in zip((p[k], m[k], v[k]), want[:3]):
            assert got.shape == shape and got.dtype == dtype
            np.testing.assert_allclose(np.asarray(got.astype(f32)), np.asarray(w.astype(f32)),
                                       **tol(dtype, kernel=True))


def test_empty_param_passes_through():
    e = jnp.zeros((0, 3), jnp.float32)
    p, m, v, vm = fa.fused_adamw([e], [e], [e], [e], [e], [1.0], lr=1e-3, beta1=0.9,
                                 beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=True)
    assert p[0].shape == (0, 3) and vm[0].shape == (0, 3)


@pytest.mark.parametrize("dtype,amsgrad", [(jnp.float32, True), (jnp.bfloat16, False)])
def test_compiles_for_tpu(dtype, amsgrad):
    a = [jax.ShapeDtypeStruct(s, dtype) for s in ((33, 5), (1024, 256))]
    sc = jax.ShapeDtypeStruct((), jnp.float32)
    fn = functools.partial(fa.fused_adamw, beta1=0.9, beta2=0.999, weight_decay=0.01,
                           eps=1e-8, amsgrad=amsgrad, maximize=True)

    def step(p, g, m, v, vm, steps, lr, gs, fi):
        return fn(p, g, m, v, vm, steps, lr=lr, grad_scale=gs, found_inf=fi)

    tpu_compile(step, a, a, a, a, a if amsgrad else [], [sc, sc], sc, sc, sc, kernels=2)  # own + packed


@pytest.mark.parametrize("gen", tpu_info.CHECKED_GENERATIONS)
@pytest.mark.parametrize("numel", [7, 4096 * 4096, 128256 * 8192])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_blocks_fit_vmem(gen, numel, dtype, amsgrad):
    chip = tpu_info.CHIPS[gen]
    br = fa.block_rows(-(-numel // fa.LANES), dtype, amsgrad, chip)
    assert br % tpu_info.sublane(dtype) == 0
    assert fa.vmem_bytes(br, dtype, amsgrad) <= tpu_info.vmem_budget(chip)
    br = fa.block_rows(-(-numel // fa.MAX_WIDTH), dtype, amsgrad, chip, fa.MAX_WIDTH)
    assert fa.vmem_bytes(br, dtype, amsgrad, fa.MAX_WIDTH) <= tpu_info.vmem_budget(chip)


def test_supports():
    assert fa.supports([(3, 4), (5,)], ["float32", jnp.bfloat16]) is None
    assert "float16" in fa.supports([(3,)], ["float16"])
    assert "2**31" in fa.supports([(2**16, 2**15)], ["float32"])
    assert "state" in fa.supports([(3,)], ["float32"], state_dtypes=["float64"])
    with pytest.raises(ValueError, match="float64"):
        x = jnp.zeros((3,), jnp.float64)
        fa.fused_adam([x], [x], [x], [x], [], [1.0], lr=1e-3, beta1=0.9, beta2=0.999,
                      weight_decay=0.0, eps=1e-8)
