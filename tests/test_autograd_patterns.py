"""Autograd machinery on tpu tensors, written as users write it, against CPU torch.

Each case runs once with ``d = "cpu"`` and once with ``d = "tpu"`` from the same seeded
inputs and returns what a user would look at (values, gradients, flags, error messages);
the two must agree. Covered: torch.func (grad, vmap with in/out dims, chunks and
randomness, jacrev/jacfwd/hessian, vjp/jvp, linearize, functional_call over a stacked
ensemble), forward-mode dual tensors, higher-order gradients (gradient penalties, double
backward through softmax/layer_norm/conv/matmul/cross entropy), hooks (tensor, module,
saved-tensor), custom ``autograd.Function`` features, in-place/version-counter errors,
grad modes, anomaly detection, checkpointing and ``torch.autograd.functional``.

Regressions fixed with these tests: forward AD with a Python number operand
(``dual * 3``: torch's zero-tangent kernel asks ``tpu_tensor.to("meta")``), per-sample
gradients and dual inputs through ``F.cross_entropy`` (the fused op's autograd cannot
run under torch.func / forward AD), a silently zero second derivative through
``F.cross_entropy``, ``linearize``'s zero jvp (``make_fx`` of real tpu tensors) and CPU
gradients accepted for tpu tensors.
"""
from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.autograd.functional as AF
import torch.nn.functional as F
from torch import func as tf
from torch.autograd import Function
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from tpu_kernels.testing import assert_same, to_cpu

# chains of derivatives round in their own order on each device
TOL = {"atol": 1e-4, "rtol": 1e-4}
CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def rnd(d, *shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(d)


def msg(e: BaseException) -> str:
    """An error as its type and message, with the device's names made CPU's: the engine
    names a tpu tensor's type ``tpuFloatType`` where CPU's is ``torch.FloatTensor``
    (torch's own spelling for a PrivateUse1 backend)."""
    return f"{type(e).__name__}: {e}".replace("tpuFloatType", "torch.FloatTensor").replace("tpu:0", "cpu")


def raises(f) -> str:
    try:
        f()
    except Exception as e:   # noqa: BLE001  (the message is the result)
        return msg(e)
    return "no error"


# -- torch.func ------------------------------------------------------------------------
@case
def func_grad_and_value(d):
    x = rnd(d, 5)
    g, (v, aux) = tf.grad_and_value(lambda t: ((t.sin() * t).sum(), {"m": t.max()}), has_aux=True)(x)
    g2 = tf.grad(lambda a, b: (a * b).exp().sum(), argnums=(0, 1))(x, x * 2)
    return [g, v, aux["m"], *g2]


@case
def func_per_sample_grads_cross_entropy(d):
    """The functorch tutorial's per-sample gradients: vmap(grad(loss)) over a model whose
    loss is F.cross_entropy (the fused cross-entropy op cannot run under torch.func)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to(d)
    params = {k: v.detach() for k, v in m.named_parameters()}
    x, y = rnd(d, 6, 4), torch.tensor([0, 1, 2, 0, 1, 2]).to(d)

    def loss(p, xi, yi):
        return F.cross_entropy(tf.functional_call(m, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))
    return list(tf.vmap(tf.grad(loss), in_dims=(None, 0, 0))(params, x, y).values())


@case
def func_vmap_dims_and_chunks(d):
    x, y = rnd(d, 3, 4), rnd(d, 4, 3, seed=1)
    return [tf.vmap(torch.mv, in_dims=(None, 0))(rnd(d, 5, 4, seed=2), x),
            tf.vmap(lambda a, b: a @ b, in_dims=(0, 1))(x, y),
            tf.vmap(lambda a: (a, a * 2), out_dims=(0, 1))(x)[1],
            tf.vmap(tf.vmap(torch.dot))(x.unsqueeze(1).expand(3, 2, 4), x.unsqueeze(1).expand(3, 2, 4)),
            tf.vmap(lambda a: a.softmax(-1), chunk_size=1)(x),
            tf.vmap(lambda a: a.sum(0), in_dims=1, chunk_size=2)(x),
            tf.vmap(lambda a: {"n": a.norm()})(x)["n"],
            tf.vmap(F.layer_norm, in_dims=(0, None))(x, (4,)),
            tf.vmap(lambda a, i: a[i])(x, torch.tensor([0, 3, 1]).to(d)),
            tf.vmap(lambda dct: dct["a"] * dct["b"][0], in_dims=({"a": 0, "b": [1]},))({"a": x, "b": [x.T]}),
            tf.vmap(lambda a: a.clone().mul_(2).add_(1))(x)]


@case
def func_vmap_randomness(d):
    x = torch.ones(4, 6).to(d)
    same = tf.vmap(lambda a: F.dropout(a, 0.5), randomness="same")(x)
    diff = tf.vmap(lambda a: torch.rand_like(a) + a, randomness="different")(x)
    return [all(torch.equal(same[0].cpu(), same[i].cpu()) for i in range(4)),
            not torch.equal(diff[0].cpu(), diff[1].cpu()),
            raises(lambda: tf.vmap(torch.rand_like)(x)),
            raises(lambda: tf.vmap(lambda t: t.item())(x)),
            raises(lambda: tf.vmap(lambda t: t if t.sum() > 0 else -t)(x)),
            raises(lambda: tf.vmap(lambda a, b: a.add_(b), in_dims=(None, 0))(torch.zeros(6).to(d), x))]


@case
def func_jacobians(d):
    x, W = rnd(d, 3), rnd(d, 4, 3, seed=3)

    def f(v):
        return torch.tanh(W @ v)
    jac, aux = tf.jacrev(lambda t: (t.sin(), t.sum()), has_aux=True)(x)
    return [tf.jacrev(f)(x), tf.jacfwd(f)(x), tf.jacrev(f, chunk_size=1)(x), jac, aux,
            tf.jacrev(lambda a, b: a * b.sum(), argnums=1)(x, x), tf.jacfwd(lambda a: (a.sin(), a.cos()))(x)[1],
            tf.hessian(lambda v: (v.sin() * v.cos()).sum() + (v @ v) ** 2)(x),
            tf.jacfwd(tf.jacrev(lambda v: F.softplus(v).sum()))(x)]


@case
def func_vjp_jvp_linearize(d):
    """jvp of ``sigmoid(x) * 3`` multiplies a dual by a Python number (its zero tangent's
    kernel asks ``tpu_tensor.to("meta")``); linearize traces the jvp with make_fx over the
    real primal."""
    x = rnd(d, 4)
    out, fn = tf.vjp(lambda v: v.exp() * v, x)
    o2, fn2, aux = tf.vjp(lambda v: (v.sin(), v.cos()), x, has_aux=True)
    o3, t3 = tf.jvp(lambda v: torch.sigmoid(v) * 3 + 1, (x,), (torch.ones_like(x),))
    lo, jvp_fn = tf.linearize(lambda v: v.sin() * v.exp(), x)
    return [out, *fn(torch.ones_like(out)), aux, *fn2(torch.ones_like(o2)), o3, t3,
            lo, jvp_fn(torch.ones_like(x)), jvp_fn(x)]


@case
def func_stacked_ensemble(d):
    """torch.func's model-ensembling tutorial: stack_module_state, a 'meta' copy of the
    model as the stateless base, vmap over functional_call (and its gradient)."""
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.GELU(), torch.nn.Linear(6, 2)).to(d) for _ in range(3)]
    params, buffers = tf.stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")

    def fmodel(p, b, x):
        return tf.functional_call(base, (p, b), (x,))
    x, xs = rnd(d, 5, 4), rnd(d, 3, 5, 4, seed=4)
    grads = tf.grad(lambda p: tf.vmap(fmodel, in_dims=(0, 0, None))(p, buffers, x).square().sum())(params)
    return [tf.vmap(fmodel, in_dims=(0, 0, None))(params, buffers, x), tf.vmap(fmodel)(params, buffers, xs),
            *grads.values()]


@case
def func_functional_call_state(d):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).to(d)
    b = dict(m.named_buffers())
    out = tf.functional_call(m, (dict(m.named_parameters()), b), (rnd(d, 8, 4),))
    tied = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False)).to(d)
    tied[1].weight = tied[0].weight
    t = tf.functional_call(tied, {"0.weight": rnd(d, 5, 3, seed=3)}, (torch.tensor([1, 2]).to(d),), tie_weights=True)
    return [out, b["1.running_mean"], b["1.num_batches_tracked"], t]


@case
def func_control_flow_and_no_grad(d):
    x = rnd(d, 4)

    def f(t, scale=1.0):
        if t.sum() > 0:
            return (t * scale).sin().sum()
        return (t * scale).cos().sum()

    def g(t):
        with torch.no_grad():
            c = t.exp()
        return (c * t).sum()
    return [tf.grad(f)(x.abs(), scale=2.0), tf.grad(f)(-x.abs(), scale=2.0), tf.grad(g)(x),
            tf.grad(tf.grad(torch.sin))(torch.tensor(0.7).to(d))]


# -- forward-mode AD -------------------------------------------------------------------
_DUAL_OPS = {
    "scalar operands": lambda v: (v * 3 + 1) / 2 - 0.5,
    "matmul": lambda v: v @ torch.ones(4, 5, device=v.device),
    "softmax": lambda v: v.softmax(-1), "log_softmax": lambda v: v.log_softmax(1),
    "layer_norm": lambda v: F.layer_norm(v, (4,)), "gelu": F.gelu, "silu": F.silu,
    "reductions": lambda v: v.sum(0) + v.mean() + v.var(1).sum() + v.norm() + v.logsumexp(-1).sum(),
    "max": lambda v: v.max(1).values, "topk": lambda v: torch.topk(v, 2).values,
    "views": lambda v: v[1:, ::2].T.reshape(-1), "cat": lambda v: torch.cat([v, v * 2]),
    "cumsum": lambda v: v.cumsum(1), "where": lambda v: torch.where(v > 0, v, v * 0.1),
    "conv1d": lambda v: F.conv1d(v.unsqueeze(0), torch.ones(2, 3, 2, device=v.device)),
    "index": lambda v: v.index_select(0, torch.tensor([2, 0], device=v.device)).gather(1, torch.tensor([[0], [3]], device=v.device)),
    "normalize": lambda v: F.normalize(v, dim=-1) + F.pad(v, (0, 0)).clamp(-0.5, 0.5),
    "inverse": lambda v: torch.linalg.inv(v[:, :3] + 3 * torch.eye(3, device=v.device)),
    "cross_entropy": lambda v: F.cross_entropy(v, torch.tensor([1, 0, 3], device=v.device)),
    "mse": lambda v: F.mse_loss(v, torch.zeros_like(v)),
}


@case
def forward_ad_dual_ops(d):
    x, t = rnd(d, 3, 4), rnd(d, 3, 4, seed=5)
    out = []
    with fwAD.dual_level():
        dx = fwAD.make_dual(x, t)
        for f in _DUAL_OPS.values():
            out += list(fwAD.unpack_dual(f(dx)))
    return out


@case
def forward_ad_inplace_and_modules(d):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()).to(d)
    x = rnd(d, 2, 4)
    out = []
    with fwAD.dual_level():
        dx = fwAD.make_dual(x, torch.ones_like(x))
        out += list(fwAD.unpack_dual(m(dx)))
        z = dx.clone()
        z.mul_(2).add_(1).exp_()
        out.append(fwAD.unpack_dual(z).tangent)
        base = torch.zeros(2, 4).to(d)
        base[0].copy_(dx[1])            # a dual written into a view of a plain tensor
        out.append(fwAD.unpack_dual(base).tangent)
        params = {k: fwAD.make_dual(v.detach(), torch.ones_like(v)) for k, v in m.named_parameters()}
        out += list(fwAD.unpack_dual(tf.functional_call(m, params, (x,))))
        out.append(fwAD.unpack_dual(x).tangent is None)
    return out


# -- higher-order gradients --------------------------------------------------------------
def _double_backward(d, f, *shapes):
    xs = [rnd(d, *s, seed=i).requires_grad_() for i, s in enumerate(shapes)]
    gs = torch.autograd.grad(f(*xs), xs, create_graph=True)
    ggs = torch.autograd.grad(sum((g * g).sum() for g in gs), xs, allow_unused=True, materialize_grads=True)
    return [*gs, *ggs]


_DOUBLE_BACKWARD = {
    "softmax": (lambda x: (x.softmax(-1) * torch.arange(5.0, device=x.device)).sum(), (3, 5)),
    "log_softmax": (lambda x: (x.log_softmax(-1) ** 2).sum(), (3, 5)),
    "layer_norm": (lambda x, w, b: (F.layer_norm(x, (5,), w, b) ** 3).sum(), (3, 5), (5,), (5,)),
    "matmul": (lambda a, b: (a @ b).tanh().sum(), (3, 4), (4, 2)),
    "conv2d": (lambda x, w: (F.conv2d(x, w, padding=1) ** 2).sum(), (2, 3, 5, 5), (4, 3, 3, 3)),
    "conv1d": (lambda x, w: F.conv1d(x, w, stride=2).sigmoid().sum(), (2, 3, 9), (4, 3, 3)),
    "cross_entropy": (lambda x: F.cross_entropy(x, torch.tensor([1, 0, 4], device=x.device), label_smoothing=0.1), (3, 5)),
    "cross_entropy of a matmul": (lambda x, w: F.cross_entropy(x @ w, torch.tensor([1, 0, 4], device=x.device),
                                                               reduction="sum"), (3, 4), (4, 5)),
    "batch_norm": (lambda x, w: (F.batch_norm(x, None, None, w, None, training=True) ** 2).sum(), (4, 3), (3,)),
    "pools": (lambda x: (F.max_pool2d(x, 2) ** 2).sum() + (F.adaptive_avg_pool2d(x, 3) ** 3).sum(), (2, 3, 6, 6)),
    "group_norm": (lambda x, w, b: (F.group_norm(x, 2, w, b) ** 2).sum(), (2, 4, 3, 3), (4,), (4,)),
    "activations": (lambda x: (F.elu(x) * F.softplus(x) * F.silu(x) + F.leaky_relu(x, 0.2) ** 2 + F.gelu(x)
                               + F.logsigmoid(x)).sum(), (4, 5)),
    "losses": (lambda x: F.smooth_l1_loss(x, x.detach() * 0.5) + F.mse_loss(x.tanh(), torch.zeros_like(x)), (4, 5)),
}


@pytest.mark.parametrize("name", list(_DOUBLE_BACKWARD))
def test_double_backward_matches_cpu(name):
    f, *shapes = _DOUBLE_BACKWARD[name]
    assert_same(_double_backward("cpu", f, *shapes), _double_backward("tpu", f, *shapes), name, **TOL)


def test_sdpa_double_backward_refuses_as_on_cpu():
    """CPU's fused SDPA backward has no derivative: neither has the tpu one (the same op)."""
    f = lambda q, k, v: (F.scaled_dot_product_attention(q, k, v, is_causal=True) ** 2).sum()   # noqa: E731
    shapes = [(1, 2, 4, 8)] * 3
    assert raises(lambda: _double_backward("tpu", f, *shapes)) == raises(lambda: _double_backward("cpu", f, *shapes))


@case
def gradient_penalty_wgan_gp(d):
    torch.manual_seed(0)
    D = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 4, 2, 1), torch.nn.LeakyReLU(0.2), torch.nn.Conv2d(8, 16, 4, 2, 1),
                            torch.nn.InstanceNorm2d(16, affine=True), torch.nn.LeakyReLU(0.2), torch.nn.Flatten(),
                            torch.nn.Linear(64, 1)).to(d)
    real, fake = rnd(d, 4, 3, 8, 8), rnd(d, 4, 3, 8, 8, seed=1)
    eps = rnd(d, 4, 1, 1, 1, seed=2).abs().clamp(max=1)
    x = (eps * real + (1 - eps) * fake).requires_grad_(True)
    out = D(x)
    (g,) = torch.autograd.grad(out, x, grad_outputs=torch.ones_like(out), create_graph=True, retain_graph=True)
    gp = ((g.flatten(1).norm(2, dim=1) - 1) ** 2).mean()
    (D(fake).mean() - out.mean() + 10 * gp).backward()
    return [gp, *[p.grad for p in D.parameters()]]


@case
def gradient_penalty_on_cross_entropy(d):
    """An input-gradient penalty on a classifier's loss (R1 / double backprop): the second
    derivative through F.cross_entropy was silently zero on tpu."""
    torch.manual_seed(0)
    C = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 4)).to(d)
    x = rnd(d, 5, 6).requires_grad_()
    loss = F.cross_entropy(C(x), torch.tensor([0, 1, 2, 3, 0]).to(d))
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    (loss + g.pow(2).sum()).backward()
    return [g, x.grad, *[p.grad for p in C.parameters()],
            AF.hessian(lambda z: F.cross_entropy(z, torch.tensor([1, 0, 4]).to(d)), rnd(d, 3, 5))]


@case
def grad_api_options(d):
    x, y = rnd(d, 3).requires_grad_(), rnd(d, 3, seed=1).requires_grad_()
    z = (x * 2).sum()
    out = [torch.autograd.grad(z, [x, y], allow_unused=True, retain_graph=True)[1] is None,
           *torch.autograd.grad(z, [x, y], allow_unused=True, materialize_grads=True, retain_graph=True),
           *torch.autograd.grad(z, x, retain_graph=True), *torch.autograd.grad(z, x),
           raises(lambda: torch.autograd.grad(z, x)), raises(lambda: torch.autograd.grad((x * 2).sum(), y)),
           *torch.autograd.grad(x.exp(), x, grad_outputs=torch.tensor([1.0, 2.0, 3.0]).to(d)),
           *torch.autograd.grad(x * y, (x, y), grad_outputs=torch.eye(3).to(d), is_grads_batched=True)]
    (x * y).sum().backward(inputs=[y])
    out += [x.grad is None, y.grad.clone()]
    (x * y).sum().backward()
    (x * y).sum().backward()        # accumulates
    out += [x.grad.clone(), y.grad.clone()]
    x.grad = None
    (x * 3).backward(gradient=torch.full((3,), 2.0).to(d))
    return out + [x.grad, raises(lambda: (x * 3).backward())]


# -- hooks -----------------------------------------------------------------------------
@case
def hooks_on_tensors(d):
    x = rnd(d, 4).requires_grad_()
    seen = []
    y = x * 2
    y.retain_grad()
    h = y.register_hook(lambda g: g * 10)
    y.register_hook(lambda g: seen.append(g.clone()))
    z = (y ** 2).sum()
    z.backward(retain_graph=True)
    out = [x.grad.clone(), y.grad.clone(), *seen]
    h.remove()
    x.grad = None
    z.backward()
    out.append(x.grad)
    p = rnd(d, 4, seed=3).requires_grad_()
    acc = []

    def sgd_in_backward(t):
        acc.append(t.grad.clone())
        with torch.no_grad():
            t.sub_(0.1 * t.grad)
        t.grad = None
    p.register_post_accumulate_grad_hook(sgd_in_backward)
    (p * p).sum().backward()
    q = rnd(d, 3, seed=4).requires_grad_()
    q.register_hook(lambda g: g.clamp(max=0.5))
    q.exp().sum().backward()
    a, b = rnd(d, 2, seed=1).requires_grad_(), rnd(d, 2, seed=2).requires_grad_()
    multi = []
    torch.autograd.graph.register_multi_grad_hook((a, b), lambda grads: multi.append([g is not None for g in grads]))
    (a * 2).sum().backward()
    return out + [*acc, p.detach(), p.grad is None, q.grad, str(multi)]


@case
def hooks_on_modules(d):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3)).to(d)
    rec = []
    m[0].register_forward_pre_hook(lambda mod, inp: (inp[0] * 2,))
    m[0].register_forward_hook(lambda mod, inp, out: out + 1)
    m[2].register_forward_hook(lambda mod, args, kwargs, out: rec.append(out.sum().detach()), with_kwargs=True)
    m[2].register_full_backward_pre_hook(lambda mod, gout: (gout[0] * 3,))
    m[2].register_full_backward_hook(lambda mod, gin, gout: rec.extend([gin[0].clone(), gout[0].clone()]))
    m[1].register_full_backward_hook(lambda mod, gin, gout: (gin[0] * 0.5,))
    names = []
    h = torch.nn.modules.module.register_module_full_backward_hook(lambda mod, gi, go: names.append(type(mod).__name__))
    try:
        x = rnd(d, 2, 4).requires_grad_()
        m(x).sum().backward()
    finally:
        h.remove()
    return [*rec, x.grad, *[p.grad for p in m.parameters()], str(names)]


@case
def hooks_on_saved_tensors(d):
    x = rnd(d, 5).requires_grad_()
    packed = []

    def pack(t):
        packed.append(t.device.type == d)
        return t.cpu()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t.to(d)):
        y = (x.sin() * x.exp()).sum()
    y.backward()
    out = [x.grad.clone(), all(packed) and len(packed) > 0]
    x.grad = None
    for pin in (False, True):
        with torch.autograd.graph.save_on_cpu(pin_memory=pin):
            y = (x.sin() * x.exp() @ x).tanh()
        y.backward()
        out.append(x.grad.clone())
    out.append(x.exp().grad_fn._saved_result)
    with torch.autograd.graph.disable_saved_tensors_hooks("no hooks here"):
        out.append(raises(lambda: torch.autograd.graph.saved_tensors_hooks(pack, pack).__enter__()))
    with torch.autograd.graph.allow_mutation_on_saved_tensors():
        p = rnd(d, 3, seed=4).requires_grad_()
        q = p.clone()
        r = q.sin()
        q.mul_(2)
        r.sum().backward()
        out += [p.grad, q]
    return out


@case
def graph_nodes(d):
    x = rnd(d, 3).requires_grad_()
    y = (x.exp() * 2).sum()
    seen = []
    y.grad_fn.register_prehook(lambda gout: seen.append(gout[0].item()))
    y.grad_fn.register_hook(lambda gin, gout: seen.append(tuple(gin[0].shape)))
    y.backward()
    z = x * 3
    (gz,) = torch.autograd.grad(z.sin().sum(), torch.autograd.graph.get_gradient_edge(z))
    return [y.grad_fn.name(), str([type(n).__name__ for n, _ in y.grad_fn.next_functions]), str(seen), x.grad, gz]


# -- custom autograd.Function ----------------------------------------------------------
class MyExp(Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


class ScaleInPlace(Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.mark_dirty(x)
        ctx.k = k
        return x.mul_(k)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


class SortWithIndices(Function):
    @staticmethod
    def forward(ctx, x):
        v, i = x.sort(-1)
        ctx.mark_non_differentiable(i)
        ctx.save_for_backward(i)
        return v, i

    @staticmethod
    def backward(ctx, gv, gi):
        (i,) = ctx.saved_tensors
        return torch.zeros_like(gv).scatter(-1, i, gv)


class NoMaterialize(Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.set_materialize_grads(False)
        return x * 2, y * 3

    @staticmethod
    def backward(ctx, ga, gb):
        return None if ga is None else ga * 2, None if gb is None else gb * 3


class Square(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 2

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class Mul(Function):
    flags: list = []

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        Mul.flags.append(tuple(ctx.needs_input_grad))
        return g * b if ctx.needs_input_grad[0] else None, g * a if ctx.needs_input_grad[1] else None


class SinMatmul(Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, w):
        return x.sin() @ w

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return (g @ w.T) * x.cos(), x.sin().T @ g


class Double(Function):
    @staticmethod
    def forward(x):
        return x * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g * 2

    @staticmethod
    def vmap(info, in_dims, x):
        return x * 2, in_dims[0]

    @staticmethod
    def jvp(ctx, t):
        return t * 2


@case
def custom_functions(d):
    x = rnd(d, 4).requires_grad_()
    y = MyExp.apply(x)
    y.sum().backward()
    out = [y, x.grad]
    a = rnd(d, 4, seed=1).requires_grad_()
    b = a.clone()
    c = ScaleInPlace.apply(b, 3.0)
    (c * c).sum().backward()
    out += [c is b, a.grad]
    s = rnd(d, 2, 5, seed=2).requires_grad_()
    v, i = SortWithIndices.apply(s)
    (v * torch.arange(5.0).to(d)).sum().backward()
    out += [i.requires_grad, v.requires_grad, s.grad, i]
    p, q = rnd(d, 3, seed=3).requires_grad_(), rnd(d, 3, seed=4).requires_grad_()
    NoMaterialize.apply(p, q)[0].sum().backward()
    out += [p.grad, q.grad is None]
    r = rnd(d, 3, seed=5).requires_grad_()
    (g,) = torch.autograd.grad(Square.apply(r).sum(), r, create_graph=True)
    out += [g, raises(lambda: g.sum().backward())]
    Mul.flags.clear()
    a2, b2 = rnd(d, 3, seed=6).requires_grad_(), rnd(d, 3, seed=7)
    Mul.apply(a2, b2).sum().backward()
    out += [a2.grad, str(Mul.flags)]
    X, W = rnd(d, 3, 2, 4, seed=8), rnd(d, 4, 3, seed=9)
    out += [tf.vmap(SinMatmul.apply, in_dims=(0, None))(X, W), tf.grad(lambda w: SinMatmul.apply(X[0], w).sum())(W),
            tf.vmap(tf.grad(lambda x, w: SinMatmul.apply(x, w).sum()), in_dims=(0, None))(X, W),
            tf.jacrev(lambda x: SinMatmul.apply(x, W))(X[0, 0:1]), tf.vmap(Double.apply)(X),
            tf.jvp(Double.apply, (X,), (torch.ones_like(X),))[1]]
    xd = rnd(d, 3).double().requires_grad_()
    out += [torch.autograd.gradcheck(MyExp.apply, (xd,)), torch.autograd.gradgradcheck(lambda t: (t.sin() * t).sum(), (xd,)),
            torch.autograd.gradcheck(lambda t: t.softmax(-1), (xd,), check_forward_ad=True)]
    return out


@case
def custom_function_errors(d):
    x = rnd(d, 3).requires_grad_()

    class TwoGrads(Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g, g

    class WrongShape(Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g[:2]

    class WrongDtype(Function):
        @staticmethod
        def forward(ctx, t):
            return t * 1

        @staticmethod
        def backward(ctx, g):
            return g.double()       # autograd casts it back to the input's dtype
    y = MyExp.apply(x * 1)
    y.add_(1)
    out = [raises(lambda: TwoGrads.apply(x).sum().backward()), raises(lambda: WrongShape.apply(x).sum().backward()),
           raises(lambda: y.sum().backward())]
    WrongDtype.apply(x).sum().backward()
    return out + [x.grad, str(x.grad.dtype)]


# -- in place, versions, flags, grad modes --------------------------------------------
@case
def inplace_errors(d):
    x = rnd(d, 3).requires_grad_()
    out = [raises(f) for f in (lambda: x.add_(1), lambda: x.zero_(), lambda: x.__setitem__(0, 1.0),
                               lambda: x[1:].fill_(0), lambda: torch.relu_(x), lambda: x.view(3).add_(1))]
    a = rnd(d, 3, seed=1).requires_grad_()
    b = a.exp()
    b.add_(1)                               # exp saved its result
    out.append(raises(lambda: b.sum().backward()))
    c = (a * 2).sigmoid()
    c.mul_(2)
    out.append(raises(lambda: c.sum().backward()))
    e = a * 1
    f = e.pow(2)
    e[0] = 5.0                               # through a view of a saved input
    out += [raises(lambda: f.sum().backward()), e._version]
    k = a.sigmoid()
    k.detach().zero_()                       # a detached alias shares the version counter
    out.append(raises(lambda: k.sum().backward()))
    u0, _, _ = (a * 1).unbind()
    out.append(raises(lambda: u0.mul_(2)))
    g = a * 2
    g.add_(1).mul_(3)                        # allowed: nothing saved g
    g.sum().backward()
    out.append(a.grad.clone())
    a.grad = None
    h = a.clone()
    h[1:].mul_(10)
    h.view(3)[0] = 7.0                       # in place through views of a non-leaf (CopySlices)
    (h * h).sum().backward()
    out += [h, a.grad, type(h.grad_fn).__name__]
    with torch.no_grad():
        a.mul_(2)
    return out + [a._version]


@case
def detach_and_requires_grad(d):
    x = rnd(d, 3).requires_grad_()
    y = x * 2
    z = y.detach()
    out = [z.requires_grad, z.grad_fn is None, z._is_view()]
    z.add_(1)                                # writes y too
    out.append(y.detach().clone())
    w = x * 3
    w.detach_()
    out += [w.requires_grad, w.is_leaf]
    p = rnd(d, 3, seed=1).requires_grad_()
    (p * p).sum().backward()
    out.append(p.grad)
    p.requires_grad_(False)
    out += [(p * 2).requires_grad, raises(lambda: y.requires_grad_(False)),
            raises(lambda: torch.ones(2, dtype=torch.long).to(d).requires_grad_())]
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2).to(d)
    m.weight.requires_grad_(False)
    m(rnd(d, 2, 3)).sum().backward()
    lw = rnd(d, 4, 3).t().requires_grad_()   # a non-contiguous leaf: its grad has its strides
    (lw * rnd(d, 3, 4, seed=1)).sum().backward()
    return out + [m.weight.grad is None, m.bias.grad, lw.grad, lw.grad.stride()]


@case
def grad_mode_nesting(d):
    x = rnd(d, 3).requires_grad_()
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 2
            with torch.set_grad_enabled(False):
                c = x * 2
    out = [[t.requires_grad for t in (a, b, c)]]
    with torch.inference_mode():
        f = x * 2
        with torch.inference_mode(False):
            g = x * 2
    out += [[f.requires_grad, f.is_inference(), g.requires_grad, g.is_inference()],
            raises(lambda: (f * x).sum().backward()), raises(lambda: f.add_(1)), raises(lambda: f.requires_grad_())]
    out.append(torch.no_grad()(lambda t: t * 2)(x).requires_grad)
    w = rnd(d, 3, seed=1).requires_grad_()
    (w * w).sum().backward()
    with torch.no_grad():                    # an optimizer's update, then backward again
        w -= 0.1 * w.grad
        w.grad.zero_()
    (w * w).sum().backward()
    return out + [w.detach(), w.grad]


@case
def anomaly_detection(d):
    class NanBackward(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return g * float("nan")
    x = rnd(d, 3).requires_grad_()
    z = torch.zeros(3).to(d).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly():
            out = [raises(lambda: NanBackward.apply(x).sum().backward()),
                   raises(lambda: (z.sqrt() * 0).sum().backward()), torch.is_anomaly_enabled()]
        with torch.autograd.detect_anomaly(check_nan=False):
            (z.sqrt() * 0).sum().backward()
    return out + [z.grad]


# -- checkpointing and torch.autograd.functional ---------------------------------------
@case
def checkpoint_variants(d):
    torch.manual_seed(0)
    seq = torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(4)]).to(d)
    x = rnd(d, 3, 6).requires_grad_()
    y = checkpoint_sequential(seq, 2, x, use_reentrant=False)
    y.sum().backward()
    out = [y, x.grad.clone()]
    w = rnd(d, 6, seed=3).requires_grad_()
    z = checkpoint(lambda a, scale=1.0: (a * w).sin() * scale, x, scale=2.0, use_reentrant=False)
    (gw,) = torch.autograd.grad(z.sum(), w, create_graph=True)   # double backward through it
    (gw ** 2).sum().backward()
    out += [gw, w.grad]
    x.grad = None
    pair = checkpoint(lambda a, b: (a * b, a + b), x, torch.ones(6).to(d), use_reentrant=True)
    (pair[0].sum() + pair[1].sum()).backward()
    out.append(x.grad)

    def policy(ctx, op, *args, **kwargs):
        from torch.utils.checkpoint import CheckpointPolicy
        return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    x.grad = None
    y = checkpoint(lambda t: seq[0](t).relu().pow(2), x, use_reentrant=False,
                   context_fn=functools.partial(create_selective_checkpoint_contexts, policy))
    y.sum().backward()
    return out + [x.grad]


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_with_dropout_gives_the_unchecked_gradients(reentrant):
    """Checkpointing a block with dropout restores the device's RNG state for the
    recomputation: output and every gradient equal the plain run's from the same seed.
    (Within the device: tpu and CPU draw different masks.)"""
    def run(ck):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 4)).to("tpu")
        x = rnd("tpu", 5, 8).requires_grad_()
        torch.manual_seed(1)
        y = checkpoint(m, x, use_reentrant=reentrant) if ck else m(x)
        y.sum().backward()
        return [y, x.grad, *[p.grad for p in m.parameters()]]
    plain, ck = run(False), run(True)
    assert_same(to_cpu(plain), ck, "checkpointed", **TOL)


@case
def autograd_functional_api(d):
    x, v, W = rnd(d, 3), rnd(d, 3, seed=1), rnd(d, 3, 3, seed=2)

    def f(a):
        return torch.tanh(W @ a) * a

    def s(a):
        return (a.sin() * a.exp()).sum() + (W @ a).pow(2).sum()
    out = [AF.jacobian(f, x), AF.jacobian(f, x, vectorize=True), AF.jacobian(f, x, create_graph=True),
           AF.jacobian(f, x, strategy="forward-mode", vectorize=True), AF.hessian(s, x), AF.hessian(s, x, vectorize=True),
           AF.hessian(s, x, outer_jacobian_strategy="forward-mode", vectorize=True),
           *AF.vjp(f, x, v), *AF.jvp(f, x, v), *AF.hvp(s, x, v), *AF.vhp(s, x, v),
           *AF.jacobian(lambda a, b: a * b.sum(), (x, v))]
    return out + [t for row in AF.hessian(lambda a, b: (a * b).sum() ** 2, (x, v)) for t in row]


@pytest.mark.parametrize("name", list(CASES))
def test_matches_cpu(name):
    want = CASES[name]("cpu")
    got = CASES[name]("tpu")
    assert_same(want, got, name, **TOL)



# -- what CPU cannot show --------------------------------------------------------------
def test_gradients_on_the_wrong_device_raise_as_on_cuda():
    """The engine skips its device check for tensor subclasses, so a CPU gradient for a tpu
    tensor went on (``x.grad`` ended on the CPU). CUDA's errors, in its words; a 0-dim
    gradient moves to the device, as there."""
    x = torch.randn(3, device="tpu", requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^invalid gradient at index 0 - expected device tpu:0 but got cpu$"):
        torch.autograd.grad(x * 2, x, grad_outputs=torch.ones(3))
    with pytest.raises(RuntimeError, match="invalid gradient at index 0 - expected device tpu:0 but got cpu"):
        x.exp().backward(torch.ones(3))
    assert x.grad is None

    class ToCpu(Function):
        @staticmethod
        def forward(ctx, t):
            return t * 1

        @staticmethod
        def backward(ctx, g):
            return g.cpu()
    with pytest.raises(RuntimeError, match=r"Function ToCpuBackward returned an invalid gradient at index 0 - "
                                           r"expected device tpu:0 but got cpu"):
        ToCpu.apply(x).sum().backward()
    (x * 2).sum().backward(torch.tensor(1.0))
    assert x.grad.device.type == "tpu" and x.grad.cpu().tolist() == [2.0, 2.0, 2.0]
    c = torch.ones(3, requires_grad=True)    # a CPU leaf feeding the device: its grad stays on the CPU
    (c.to("tpu") * x).sum().backward()
    assert c.grad.device.type == "cpu" and torch.equal(c.grad, x.detach().cpu())


def test_make_fx_records_ops_on_real_tpu_tensors():
    """make_fx (real mode) of a function closing over a tpu weight: the graph holds the
    ops, with the weight as a constant (it held the runtime's meta computations and a
    constant result before)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    W = rnd("tpu", 3, 3)
    g = make_fx(lambda a: (a @ W).relu().sum(0) + torch.ones(3, device="tpu"))(rnd("tpu", 2, 3))
    targets = [str(n.target) for n in g.graph.nodes if n.op == "call_function"]
    assert targets == ["aten.mm.default", "aten.relu.default", "aten.sum.dim_IntList", "aten.ones.default",
                       "aten.add.Tensor"], targets
    a = rnd("cpu", 2, 3, seed=1)
    assert_same((a @ W.cpu()).relu().sum(0) + 1, g(a.to("tpu")), "make_fx graph", **TOL)


def test_to_meta_keeps_the_geometry():
    t, c = rnd("tpu", 2, 3).t(), rnd("cpu", 2, 3).t()
    for kw in ({}, {"memory_format": torch.contiguous_format}, {"dtype": torch.float16}):
        got, want = t.to("meta", **kw), c.to("meta", **kw)
        assert (got.device.type, got.shape, got.stride(), got.dtype) == ("meta", want.shape, want.stride(), want.dtype)
