"""torch's flex_attention on tpu tensors: every score_mod / mask variant against CPU.

Forward: tpu against CPU's own ``flex_attention``. Backward: CPU's eager flex_attention
has none, so each variant is also written as dense torch math (the same score_mod and
mask_mod applied to broadcast index tensors) and differentiated on CPU in float64.
Every case runs on the dense XLA impl and on the Pallas kernel (interpret mode: slow on
CPU, a trace per variant); CI runs the cases' ``ci`` impls, ``--thorough`` the rest.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from tpu_kernels import flex_attention as tpu_flex
from tpu_kernels import registry
from tpu_kernels.registry import Impl
from tpu_kernels.registry.kinds import DEFAULT_PRIORITY
from tpu_kernels.registry.xla.flex_attention import XLA_FORWARD, spec_of

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
GRAD_TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=6e-2, rtol=6e-2)}


# -- the variants: score_mods and mask_mods over captured tensors ------------------------------
def _doc_ids(n: int) -> torch.Tensor:
    """Packed sequences: documents of lengths 37, 70, 50, ... (boundaries off the blocks)."""
    return (torch.arange(n)[:, None] >= torch.tensor([37, 107, 157, 230])).sum(-1)


def _rand_blocks(nq: int, nk: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    keep = torch.rand(nq, nk, generator=g) < 0.4
    return keep | torch.eye(nq, nk, dtype=torch.bool)


SCORES = {   # name -> (score_mod(score, b, h, q, kv, *bufs), bufs(h, sq, skv), bufs needing grad)
    "none": (None, lambda h, sq, skv: [], ()),
    "relpos": (lambda s, b, h, q, kv: s + (q - kv) * 0.01, lambda h, sq, skv: [], ()),
    "alibi": (lambda s, b, h, q, kv, sl: s + sl[h] * (kv - q),
              lambda h, sq, skv: [torch.exp2(-torch.arange(1, h + 1) * 8.0 / h)], ()),
    "softcap": (lambda s, b, h, q, kv: 5.0 * torch.tanh(s / 5.0), lambda h, sq, skv: [], ()),
    "bias": (lambda s, b, h, q, kv, bias: s + bias[h, q, kv],
             lambda h, sq, skv: [torch.randn(h, sq, skv) * 0.5], (0,)),
    "head_scale": (lambda s, b, h, q, kv, w: s * w[h],
                   lambda h, sq, skv: [torch.rand(h) + 0.5], (0,)),
    "rel_table": (lambda s, b, h, q, kv, t: s + t[h, q - kv + 512],   # a gather by q - kv
                  lambda h, sq, skv: [torch.randn(h, 1024) * 0.3], (0,)),
}

MASKS = {    # name -> (mask_mod(b, h, q, kv, *bufs), bufs(sq, skv))
    "full": (None, lambda sq, skv: []),
    "causal": (lambda b, h, q, kv: q >= kv, lambda sq, skv: []),
    "sliding": (lambda b, h, q, kv: (q >= kv) & (q - kv <= 70), lambda sq, skv: []),
    "prefix_lm": (lambda b, h, q, kv: (kv <= q) | (kv < 45), lambda sq, skv: []),
    "document": (lambda b, h, q, kv, d: (d[q] == d[kv]) & (q >= kv),
                 lambda sq, skv: [_doc_ids(max(sq, skv))]),
    "random_hash": (lambda b, h, q, kv: ((q // 64) * 7 + (kv // 64) * 3) % 5 < 3,
                    lambda sq, skv: []),
    "random_table": (lambda b, h, q, kv, r: r[q // 64, kv // 64],   # a gather by q // 64
                     lambda sq, skv: [_rand_blocks(-(-sq // 64), -(-skv // 64))]),
}


@dataclasses.dataclass(frozen=True)
class Case:
    score: str
    mask: str
    dtype: torch.dtype = torch.float32
    b: int = 1
    hq: int = 2
    hkv: int = 2
    sq: int = 256
    skv: int = 256
    d: int = 64
    block: int | tuple[int, int] = 128
    scale: float | None = None
    lse: bool = False
    ci: tuple[str, ...] = ("xla",)  # impls run in CI (all run with --thorough)
    refusal: str | None = None      # the kernel must refuse the call with this reason

    @property
    def id(self) -> str:
        return (f"{self.score}-{self.mask}-{str(self.dtype)[6:]}-h{self.hq}x{self.hkv}-"
                f"{self.sq}x{self.skv}-d{self.d}-blk{self.block}")


CASES = [
    Case("softcap", "causal", hkv=1, hq=4, lse=True, ci=("pallas",)),
    Case("bias", "document", sq=200, skv=300, d=80, block=64, scale=0.2, ci=("xla", "pallas")),
    Case("head_scale", "sliding", dtype=torch.bfloat16, d=128, block=256, ci=("pallas",)),
    Case("alibi", "prefix_lm", scale=0.3, block=(128, 64), hq=4, hkv=2, ci=()),
    Case("relpos", "random_hash", sq=130, skv=190, ci=()),
    Case("none", "full", b=2, sq=100, skv=77, ci=()),
    Case("alibi", "sliding", dtype=torch.bfloat16, d=80, sq=192, skv=192, lse=True, ci=()),
    Case("bias", "causal", dtype=torch.bfloat16, hq=4, hkv=2, ci=()),
    Case("softcap", "document", block=256, ci=()),
    Case("rel_table", "prefix_lm", refusal="indexed by computed values", ci=("pallas",)),
    Case("none", "random_table", refusal="indexed by computed values", ci=("xla",)),
]


# -- helpers ---------------------------------------------------------------------------------------
def _inputs(c: Case):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(c.b, c.hq, c.sq, c.d, generator=g).to(c.dtype)
    k = torch.randn(c.b, c.hkv, c.skv, c.d, generator=g).to(c.dtype)
    v = torch.randn(c.b, c.hkv, c.skv, c.d, generator=g).to(c.dtype)
    torch.manual_seed(1)
    sbufs = SCORES[c.score][1](c.hq, c.sq, c.skv)
    mbufs = MASKS[c.mask][1](c.sq, c.skv)
    return q, k, v, sbufs, mbufs


def _score(fn: Callable | None, bufs: list) -> Callable | None:
    return None if fn is None else (lambda s, b, h, q, kv: fn(s, b, h, q, kv, *bufs))


def _mask(fn: Callable | None, bufs: list) -> Callable | None:
    return None if fn is None else (lambda b, h, q, kv: fn(b, h, q, kv, *bufs))


def _run(c: Case, device: str, q, k, v, sbufs, mbufs):
    """flex_attention as users call it: captured tensors closed over, mask from create_block_mask."""
    mask_mod = _mask(MASKS[c.mask][0], mbufs)
    bm = None if mask_mod is None else create_block_mask(
        mask_mod, None, None, c.sq, c.skv, device=device, BLOCK_SIZE=c.block)
    return flex_attention(q, k, v, score_mod=_score(SCORES[c.score][0], sbufs), block_mask=bm,
                          scale=c.scale, enable_gqa=c.hq != c.hkv, return_lse=c.lse)


def _dense(c: Case, q, k, v, sbufs, mbufs):
    """The same attention in plain torch ops (float64), differentiable everywhere."""
    rep = c.hq // c.hkv
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scale = 1 / math.sqrt(c.d) if c.scale is None else c.scale
    s = (q @ k.transpose(-1, -2)) * scale
    b, h, qi, ki = (torch.arange(n).view([-1 if a == i else 1 for a in range(4)])
                    for i, n in enumerate((c.b, c.hq, c.sq, c.skv)))
    if SCORES[c.score][0] is not None:
        s = SCORES[c.score][0](s, b, h, qi, ki, *sbufs)
    if MASKS[c.mask][0] is not None:
        s = s.masked_fill(~MASKS[c.mask][0](b, h, qi, ki, *mbufs).expand(s.shape), -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(lse.isinf(), 0, lse)[..., None])
    return p @ v, lse


def _tpu(t: torch.Tensor, grad: bool = False) -> torch.Tensor:
    t = t.to("tpu")
    return t.requires_grad_() if grad else t


def _impl_context(impl: str):
    return registry.only("xla") if impl == "xla" else registry.interpret()


@functools.lru_cache(maxsize=None)
def _cpu_result(c: Case):
    """CPU flex_attention's output (and lse): computed once per case."""
    with torch.no_grad():
        want = _run(c, "cpu", *_inputs(c))
    return want if c.lse else (want, None)


def _check(c: Case, impl: str) -> None:
    q, k, v, sbufs, mbufs = _inputs(c)
    want_out, want_lse = _cpu_result(c)

    grads_for = SCORES[c.score][2]
    tq, tk, tv = (_tpu(x, True) for x in (q, k, v))
    tsb = [_tpu(x, i in grads_for and x.is_floating_point()) for i, x in enumerate(sbufs)]
    tmb = [_tpu(x) for x in mbufs]
    before = dict(tpu_flex.RUNS)
    ran_impl = "xla" if c.refusal else impl
    with _impl_context(impl):
        got = _run(c, "tpu", tq, tk, tv, tsb, tmb)
        out, lse = got if c.lse else (got, None)
        ran = {k_: n - before.get(k_, 0) for k_, n in tpu_flex.RUNS.items()}
        assert ran.get(("flex_attention", ran_impl)) == 1, (ran, tpu_flex.LAST_SKIPPED)
        if c.refusal and impl == "pallas":   # the kernel said why, the dense impl ran
            (name, reason), = tpu_flex.LAST_SKIPPED["flex_attention"]
            assert name == "pallas:flex_attention" and c.refusal in reason, reason
        torch.testing.assert_close(out.cpu(), want_out, **TOL[c.dtype])
        if c.lse:
            torch.testing.assert_close(lse.cpu(), want_lse, **TOL[c.dtype])

        # backward vs the dense math in float64, from the same (rounded) inputs
        leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
        dsb = [x.detach().double().requires_grad_(i in grads_for) if x.is_floating_point() else x
               for i, x in enumerate(sbufs)]
        ref_out, ref_lse = _dense(c, *leaves, dsb, mbufs)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        gl = torch.randn(ref_lse.shape, generator=torch.Generator().manual_seed(3))
        ref_loss = (ref_out * g).sum() + ((ref_lse * gl).nan_to_num(0, 0, 0).sum() if c.lse else 0)
        tpu_loss = (out.float() * g.to("tpu")).sum()
        if c.lse:
            tpu_loss = tpu_loss + (lse.nan_to_num(0, 0, 0) * gl.to("tpu")).sum()
        want_grads = torch.autograd.grad(ref_loss, leaves + [dsb[i] for i in grads_for])
        tpu_loss.backward()
        got_grads = [tq.grad, tk.grad, tv.grad] + [tsb[i].grad for i in grads_for]
        ran = {k_: n - before.get(k_, 0) for k_, n in tpu_flex.RUNS.items()}
        assert ran.get(("flex_attention_backward", ran_impl)) == 1, (ran, tpu_flex.LAST_SKIPPED)
    for name, a, e in zip(("dq", "dk", "dv", "dbuf"), got_grads, want_grads):
        torch.testing.assert_close(a.cpu().double(), e, **GRAD_TOL[c.dtype], msg=lambda m: f"{name}: {m}")


# -- the tests ----------------------------------------------------------------------------------
def _params():
    return [pytest.param(c, impl, id=f"{impl}-{c.id}",
                         marks=[] if impl in c.ci else [pytest.mark.thorough])
            for c in CASES for impl in ("xla", "pallas")]


@pytest.mark.parametrize("case,impl", _params())
def test_flex_attention_matches_cpu(case: Case, impl: str):
    """``impl``: "xla" runs the dense impl alone; "pallas" enables the kernel (interpret
    mode), which takes the call unless the case expects its refusal."""
    _check(case, impl)


# -- the one route answers for the flex_attention HOPs -----------------------------------------------
FLEX = torch.ops.higher_order.flex_attention


def _spec(k_dtype: torch.dtype = torch.float32):
    """The spec of a causal, soft-capped call, from meta tensors (what ``which`` sees)."""
    q = torch.empty(1, 2, 128, 64, device="meta")
    k = torch.empty(1, 2, 128, 64, dtype=k_dtype, device="meta")
    bm = create_block_mask(MASKS["causal"][0], None, None, 128, 128, device="cpu")
    return spec_of(q, k, k, SCORES["softcap"][0], bm.as_tuple(), 0.125, (), (), ())


def test_registry_impls_and_which_answer_for_flex_attention():
    for op, names in ((FLEX, ["pallas:flex_attention", "xla:flex_attention_dense"]),
                      ("higher_order::flex_attention_backward",
                       ["pallas:flex_attention_backward", "xla:flex_attention_dense_backward"])):
        assert [f"{i.kind}:{i.name}" for i in registry.impls(op)] == names
    static = registry.route(FLEX)
    assert static.kind == "impl" and static.impl is None   # the kernel's supports() decides per spec
    with registry.interpret():
        impl, skipped = registry.which(FLEX, _spec())
        assert (impl.kind, skipped) == ("pallas", [])
        impl, skipped = registry.which(FLEX, _spec(torch.bfloat16))   # the kernel refuses
        assert impl.kind == "xla"
        assert [(i.kind, why) for i, why in skipped] == [("pallas", "query, key and value dtypes differ")]
    with registry.only("xla"):
        impl, skipped = registry.which(FLEX, _spec())
        assert impl.kind == "xla" and skipped[0][1] == "kind 'pallas' disabled"
    with registry.only("user"):
        refused = registry.route(FLEX, (_spec(),))
        assert refused.kind == "refused" and refused.impl is None
        msg = str(refused.error())
        assert "higher_order::flex_attention has no implementation" in msg and "kind 'xla' disabled" in msg


def test_flex_path_runs_the_impl_the_route_picks():
    """A user impl of the HOP, above the built-in ones, takes eager calls on tpu tensors."""
    specs = []

    def counted(spec, *arrays):
        specs.append(spec)
        return XLA_FORWARD.fn(spec, *arrays)
    user = registry.REGISTRY.add(Impl(FLEX, counted, "user", "counted", priority=DEFAULT_PRIORITY["user"]))
    try:
        q = torch.randn(1, 1, 128, 16, generator=torch.Generator().manual_seed(0))
        before = tpu_flex.RUNS[("flex_attention", "user")]
        out = flex_attention(q.to("tpu"), q.to("tpu"), q.to("tpu"))
        assert tpu_flex.RUNS[("flex_attention", "user")] == before + 1 and specs[-1].q_shape == (1, 1, 128, 16)
        torch.testing.assert_close(out.cpu(), flex_attention(q, q, q), **TOL[torch.float32])
    finally:
        registry.REGISTRY.remove(user)
    assert registry.impls(FLEX)[0].kind == "pallas"


def test_compiled_training_step_matches_eager():
    """Under torch.compile(backend="tpu") flex_attention is a HOP node of the forward and
    backward graphs; both run through the same impls as eager."""
    c = Case("alibi", "sliding", hq=4, hkv=2)
    q, k, v, sbufs, _ = _inputs(c)
    slopes = _tpu(sbufs[0], True)
    bm = create_block_mask(_mask(MASKS["sliding"][0], []), None, None, c.sq, c.skv, device="tpu")

    def loss(q, k, v, sl):
        out = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s + sl[h] * (ki - qi),
                             block_mask=bm, enable_gqa=True)
        return (out * out).sum()

    grads = []
    with registry.only("xla"):
        for fn in (loss, torch.compile(loss, backend="tpu")):
            leaves = [_tpu(x, True) for x in (q, k, v)] + [slopes.detach().clone().requires_grad_()]
            value = fn(*leaves)
            value.backward()
            grads.append([value.detach().cpu()] + [x.grad.cpu() for x in leaves])
    for a, e in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


def test_untraceable_score_mod_names_the_problem():
    # flex_attention's own torch.compile turns dynamic after other shapes in this process,
    # and then Dynamo refuses .item() itself: start from a fresh Dynamo, as a program does
    torch._dynamo.reset()
    q = torch.randn(1, 1, 16, 8, device="tpu")

    def data_dependent(s, b, h, qi, ki):
        return s * float(qi.sum().item())
    with pytest.raises(NotImplementedError, match="cannot trace the score_mod"):
        flex_attention(q, q, q, score_mod=data_dependent)
