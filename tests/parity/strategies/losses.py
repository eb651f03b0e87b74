"""Losses, linear algebra with unique answers, this library's custom ops, fused optimizers."""
from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st


from strategies.base import (BF16, Case, F32, FLOATS, FromSpec, I32, I64, Spec, Unsupported, broadcast_to, dtypes,
    shapes, tensors, thorough)

# -- losses ----------------------------------------------------------------------------------------------
@st.composite
def loss(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes(FLOATS))
    red = draw(st.sampled_from([0, 1, 2]))
    shape = draw(shapes(min_dims=0, max_dims=3))
    if name in ("mse_loss", "huber_loss", "smooth_l1_loss", "soft_margin_loss", "binary_cross_entropy",
                "binary_cross_entropy_with_logits"):
        vals = "prob" if name == "binary_cross_entropy" else None
        x = draw(tensors(shape, dtype, values=vals))
        y = draw(tensors(shape, dtype, values="prob" if "binary" in name else None))
        if name == "soft_margin_loss":
            y = draw(tensors(shape, dtype, values="int", low=0, high=2))
        if name in ("huber_loss", "smooth_l1_loss"):
            return Case((x, y, red, draw(st.sampled_from([1.0, 0.5, 2.0]))))
        if name == "binary_cross_entropy":
            w = draw(tensors(shape, dtype, values="positive")) if draw(st.booleans()) else None
            return Case((x, y, w, red))
        if name == "binary_cross_entropy_with_logits":
            w = draw(tensors(draw(broadcast_to(shape)), dtype, values="positive")) if draw(st.booleans()) else None
            pw = draw(tensors(shape[-1:], dtype, values="positive")) if shape and draw(st.booleans()) else None
            return Case((x, y, w, pw, red))
        return Case((x, y, red))
    n = draw(st.sampled_from([1, 3, 8]))
    c = draw(st.sampled_from([1, 2, 5, 33]))
    if name in ("nll_loss_forward", "nll_loss2d_forward"):
        extra = (draw(st.sampled_from([1, 3])), draw(st.sampled_from([2, 4]))) if "2d" in name else ()
        nbatch = (n,) if "2d" in name or draw(st.booleans()) else ()
        x = draw(tensors(nbatch + (c,) + extra, dtype))
        t = draw(tensors(nbatch + extra, I64, values="int", low=0, high=c, layout="contiguous"))
        w = draw(tensors((c,), dtype, values="positive")) if draw(st.booleans()) else None
        ign = draw(st.sampled_from([-100, 0]))
        return Case((x, t, w, red, ign))
    if name == "multi_margin_loss":
        x = draw(tensors((n, c), dtype))
        t = draw(tensors((n,), I64, values="int", low=0, high=c, layout="contiguous"))
        w = draw(tensors((c,), dtype, values="positive")) if draw(st.booleans()) else None
        return Case((x, t, draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 0.5])), w, red))
    if name == "multilabel_margin_loss_forward":
        x = draw(tensors((n, c), dtype))
        t = draw(tensors((n, c), I64, values="int", low=-1, high=c, layout="contiguous"))
        return Case((x, t, red))
    raise Unsupported(name)


# -- linear algebra with unique answers ---------------------------------------------------------------------
@st.composite
def linalg(draw, op):
    name = str(op).split(".")[1]
    dtype = F32 if not thorough() else draw(dtypes((F32,)))
    n = draw(st.sampled_from([1, 2, 3, 5, 8]))
    k = draw(st.sampled_from([1, 2, 4]))
    batch = draw(st.sampled_from([(), (2,)]))
    if name in ("linalg_solve_triangular", "triangular_solve"):
        upper = draw(st.booleans())
        a = _WellConditioned(draw(tensors(batch + (n, n), dtype, special=False)), "tri", upper)
        if name == "triangular_solve":
            b = draw(tensors(batch + (n, k), dtype, special=False))
            return Case((b, a, upper, draw(st.booleans()), draw(st.booleans())))
        left = draw(st.booleans())
        b = draw(tensors(batch + ((n, k) if left else (k, n)), dtype, special=False))
        return Case((a, b), {"upper": upper, "left": left, "unitriangular": draw(st.booleans())})
    if name in ("cholesky", "linalg_cholesky_ex"):
        a = _WellConditioned(draw(tensors(batch + (n, n), dtype, special=False)), "spd", False)
        if name == "cholesky":
            return Case((a, draw(st.booleans())))
        return Case((a,), {"upper": draw(st.booleans())})
    if name in ("linalg_inv_ex", "_linalg_det", "linalg_matrix_exp"):
        a = _WellConditioned(draw(tensors(batch + (n, n), dtype, special=False)), "diag", False)
        return Case((a,))
    if name == "_linalg_solve_ex":
        a = _WellConditioned(draw(tensors(batch + (n, n), dtype, special=False)), "diag", False)
        return Case((a, draw(tensors(batch + (n, k), dtype, special=False))))
    if name == "linalg_cross":
        shape = draw(shapes(max_dims=2)) + (3,)
        return Case((draw(tensors(shape, dtype)), draw(tensors(shape, dtype))), {"dim": -1})
    raise Unsupported(name)


@dataclasses.dataclass(frozen=True)
class _WellConditioned(FromSpec):
    """A square matrix made well conditioned: triangular with a dominant diagonal,
    symmetric positive definite, or diagonally dominant."""
    spec: Spec
    kind: str
    upper: bool

    def build(self, device="cpu"):
        a = self.spec.build("cpu").to(torch.float64)
        n = a.shape[-1]
        eye = torch.eye(n, dtype=torch.float64)
        if self.kind == "tri":
            a = (a.triu() if self.upper else a.tril()) / n + eye * 2
        elif self.kind == "spd":
            a = a @ a.transpose(-1, -2) / n + eye
        else:
            a = a / n + eye * 2
        a = a.to(self.spec.dtype)
        return a if device == "cpu" else a.to(device)


# -- custom ops and fused optimizers ---------------------------------------------------------------------------
@st.composite
def custom(draw, op):
    name = str(op).split(".")[1]
    dtype = draw(dtypes((F32, BF16)))
    n = draw(st.sampled_from([1, 8, 13]))
    v = draw(st.sampled_from([7, 128, 200]))
    red = draw(st.sampled_from(["mean", "sum", "none"]))
    ign = draw(st.sampled_from([-100, 0]))
    tgt = draw(tensors((n,), I64, values="int", low=0, high=v, layout="contiguous"))
    if name == "cross_entropy":
        logits = draw(tensors((n, v), dtype, special=False))
        return Case((logits, tgt, None, ign, red, draw(st.sampled_from([0.0, 0.1]))))
    if name == "linear_cross_entropy":
        h = draw(st.sampled_from([8, 128]))
        return Case((draw(tensors((n, h), dtype, special=False)), draw(tensors((v, h), dtype, special=False)),
                     tgt, ign, red, draw(st.sampled_from([0.0, 0.1]))))
    if name == "ragged_dot":
        g = draw(st.sampled_from([1, 2, 4]))
        m, k, nn = draw(st.sampled_from([8, 16])), draw(st.sampled_from([8, 128])), draw(st.sampled_from([8, 128]))
        sizes = _GroupSizes(m, g, draw(st.integers(0, 2 ** 16)))
        return Case((draw(tensors((m, k), dtype, special=False)), draw(tensors((g, k, nn), dtype, special=False)),
                     sizes))
    raise Unsupported(name)


@dataclasses.dataclass(frozen=True)
class _GroupSizes:
    m: int
    g: int
    seed: int
    dtype = I32

    @property
    def shape(self):
        return (self.g,)

    def build(self, device="cpu"):
        gen = torch.Generator().manual_seed(self.seed)
        cuts = torch.sort(torch.randint(0, self.m + 1, (self.g - 1,), generator=gen)).values
        edges = torch.cat([torch.tensor([0]), cuts, torch.tensor([self.m])])
        t = (edges[1:] - edges[:-1]).to(torch.int32)
        return t if device == "cpu" else t.to(device)


@st.composite
def fused_adam(draw, op):
    dtype = draw(dtypes((F32, BF16)))
    k = draw(st.integers(1, 3))
    shapes_ = [draw(shapes(max_dims=2, cap=256)) for _ in range(k)]

    def lst(values=None):
        return [draw(tensors(s, dtype, values=values, layout="contiguous", special=False)) for s in shapes_]
    amsgrad = draw(st.booleans())
    steps = [draw(tensors((), F32, values="int", low=1, high=9)) for _ in shapes_]
    kw = dict(lr=draw(st.sampled_from([1e-3, 0.1])), beta1=0.9, beta2=0.999,
              weight_decay=draw(st.sampled_from([0.0, 0.01])), eps=1e-8, amsgrad=amsgrad,
              maximize=draw(st.booleans()))
    return Case((lst(), lst(), lst(), lst("positive"), lst("positive") if amsgrad else [], steps), kw, grad=False)
