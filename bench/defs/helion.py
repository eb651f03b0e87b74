"""Benchmarks for the ops the Helion kernels serve (norms, softmax, SwiGLU, var_mean,
cumsum, topk, RoPE). FLOPs count the elementwise/reduction work per element (an exp or
rsqrt is one FLOP); bytes are the minimal HBM traffic (inputs read once, outputs written
once, statistics in float32)."""
from __future__ import annotations

import torch

from tpu_kernels.bench.spec import Case, KernelBench, case, nbytes

# FLOPs per element
RMS_NORM_FLOPS = 4      # square, add (sum), * rstd, * weight
LAYER_NORM_FLOPS = 7    # add (mean), sub, square, add (var), * rstd, * weight, + bias
SOFTMAX_FLOPS = 5       # max, sub, exp, add (sum), div (log_softmax: sub log instead)
SWIGLU_FLOPS = 6        # silu: neg, exp, add, div, mul; * b
VAR_MEAN_FLOPS = 4      # add (mean), sub, square, add
CUMSUM_FLOPS = 1        # add
TOPK_FLOPS = 1          # one compare per element (selection lower bound)
ROPE_FLOPS = 3          # x*cos + rot(x)*sin


def _gen():
    return torch.Generator().manual_seed(0)


def _randn(c: Case, *shape):
    return torch.randn(*shape, generator=_gen(), dtype=torch.float32).to(c.dtype)


# ---------------------------------------------------------------- norms ([t, h])

def _rms_args(c):
    return (_randn(c, c["t"], c["h"]), [c["h"]], _randn(c, c["h"]), 1e-6), {}


def _rms_flops(c):
    return RMS_NORM_FLOPS * c["t"] * c["h"]


def _rms_bytes(c):
    # x read, weight read, out written; rstd [t, 1] float32 written
    return nbytes(c.dtype, 2 * c["t"] * c["h"], c["h"]) + nbytes(torch.float32, c["t"])


def _ln_args(c):
    return (_randn(c, c["t"], c["h"]), [c["h"]], _randn(c, c["h"]), _randn(c, c["h"]), 1e-5), {}


def _ln_flops(c):
    return LAYER_NORM_FLOPS * c["t"] * c["h"]


def _ln_bytes(c):
    # x, weight, bias read; out written; mean and rstd [t, 1] float32 written
    return nbytes(c.dtype, 2 * c["t"] * c["h"], 2 * c["h"]) + nbytes(torch.float32, 2 * c["t"])


_NORM_CASES = (
    case(t=16, h=128, quick=True),
    case(t=64, h=384, dtype=torch.bfloat16, quick=True),
    case(t=1024, h=1024, dtype=torch.bfloat16),
    case(t=4096, h=4096, dtype=torch.bfloat16),
    case(t=4096, h=4096),
    case(t=16384, h=8192, dtype=torch.bfloat16),
)

# ---------------------------------------------------------------- softmax ([t, v])


def _softmax_args(c):
    return (_randn(c, c["t"], c["v"]), -1, False), {}


def _softmax_flops(c):
    return SOFTMAX_FLOPS * c["t"] * c["v"]


def _softmax_bytes(c):
    return nbytes(c.dtype, 2 * c["t"] * c["v"])


_SOFTMAX_CASES = (
    case(t=16, v=128, quick=True),
    case(t=64, v=1000, dtype=torch.bfloat16, quick=True),
    case(t=4096, v=4096, dtype=torch.bfloat16),     # attention-score sized rows
    case(t=1024, v=32000, dtype=torch.bfloat16),    # vocab rows (column-tiled path)
    case(t=1024, v=32000),
    case(t=2048, v=128256, dtype=torch.bfloat16),
)

# ---------------------------------------------------------------- swiglu ([t, f])


def _swiglu_args(c):
    return (_randn(c, c["t"], c["f"]), _randn(c, c["t"], c["f"])), {}


def _swiglu_flops(c):
    return SWIGLU_FLOPS * c["t"] * c["f"]


def _swiglu_bytes(c):
    return nbytes(c.dtype, 3 * c["t"] * c["f"])


# ---------------------------------------------------------------- var_mean / cumsum / topk


def _var_mean_args(c):
    return (_randn(c, c["t"], c["h"]), [-1]), {"correction": 1, "keepdim": False}


def _var_mean_flops(c):
    return VAR_MEAN_FLOPS * c["t"] * c["h"]


def _var_mean_bytes(c):
    return nbytes(c.dtype, c["t"] * c["h"], 2 * c["t"])


def _cumsum_args(c):
    return (_randn(c, c["t"], c["h"]), -1), {}


def _cumsum_flops(c):
    return CUMSUM_FLOPS * c["t"] * c["h"]


def _cumsum_bytes(c):
    return nbytes(c.dtype, 2 * c["t"] * c["h"])


def _topk_args(c):
    return (_randn(c, c["t"], c["v"]), c["k"], -1, True, True), {}


def _topk_flops(c):
    return TOPK_FLOPS * c["t"] * c["v"]


def _topk_bytes(c):
    # x read; values (input dtype) and int64 indices [t, k] written
    return nbytes(c.dtype, c["t"] * c["v"], c["t"] * c["k"]) + nbytes(torch.int64, c["t"] * c["k"])


# ---------------------------------------------------------------- rope (q, k [b, h, s, d]; cos, sin [s, d])


def _rope_args(c):
    b, h, s, d = c["b"], c["h"], c["s"], c["d"]
    q, k = _randn(c, b, h, s, d), _randn(c, b, h, s, d)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.arange(s, dtype=torch.float32)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return (q, k, ang.cos().to(c.dtype), ang.sin().to(c.dtype)), {}


def _rope_flops(c):
    return ROPE_FLOPS * 2 * c["b"] * c["h"] * c["s"] * c["d"]


def _rope_bytes(c):
    qk = 2 * c["b"] * c["h"] * c["s"] * c["d"]
    return nbytes(c.dtype, 2 * qk, 2 * c["s"] * c["d"])   # q, k read + written; cos, sin read


BENCHMARKS: list[KernelBench] = [
    KernelBench(name="helion_rms_norm", op="aten::_fused_rms_norm",
                make_args=_rms_args, flops=_rms_flops, bytes=_rms_bytes, cases=_NORM_CASES),
    KernelBench(name="helion_layer_norm", op="aten::native_layer_norm",
                make_args=_ln_args, flops=_ln_flops, bytes=_ln_bytes, cases=_NORM_CASES),
    KernelBench(name="helion_softmax", op="aten::_softmax",
                make_args=_softmax_args, flops=_softmax_flops, bytes=_softmax_bytes,
                cases=_SOFTMAX_CASES),
    KernelBench(name="helion_log_softmax", op="aten::_log_softmax",
                make_args=_softmax_args, flops=_softmax_flops, bytes=_softmax_bytes,
                cases=_SOFTMAX_CASES),
    KernelBench(name="helion_swiglu", op="tpu_kernels::swiglu",
                make_args=_swiglu_args, flops=_swiglu_flops, bytes=_swiglu_bytes,
                cases=(
                    case(t=16, f=128, quick=True),
                    case(t=64, f=384, dtype=torch.bfloat16, quick=True),
                    case(t=4096, f=11008, dtype=torch.bfloat16),
                    case(t=4096, f=14336, dtype=torch.bfloat16),
                    case(t=1024, f=4096),
                )),
    KernelBench(name="helion_var_mean", op="aten::var_mean.correction",
                make_args=_var_mean_args, flops=_var_mean_flops, bytes=_var_mean_bytes,
                cases=_NORM_CASES),
    KernelBench(name="helion_cumsum", op="aten::cumsum",
                make_args=_cumsum_args, flops=_cumsum_flops, bytes=_cumsum_bytes,
                cases=(
                    case(t=16, h=128, quick=True),
                    case(t=64, h=384, dtype=torch.bfloat16, quick=True),
                    case(t=4096, h=4096),
                    case(t=1024, h=8192, dtype=torch.bfloat16),
                )),
    KernelBench(name="helion_topk", op="aten::topk",
                make_args=_topk_args, flops=_topk_flops, bytes=_topk_bytes,
                cases=(
                    case(t=16, v=128, k=4, quick=True),
                    case(t=64, v=1000, k=8, dtype=torch.bfloat16, quick=True),
                    case(t=1024, v=32000, k=50, dtype=torch.bfloat16),
                    case(t=4096, v=4096, k=8),
                )),
    KernelBench(name="helion_rope", op="tpu_kernels::rope",
                make_args=_rope_args, flops=_rope_flops, bytes=_rope_bytes,
                cases=(
                    case(b=1, h=2, s=16, d=64, quick=True),
                    case(b=1, h=4, s=64, d=128, dtype=torch.bfloat16, quick=True),
                    case(b=1, h=32, s=4096, d=128, dtype=torch.bfloat16),
                    case(b=4, h=32, s=2048, d=128, dtype=torch.bfloat16),
                    case(b=1, h=64, s=8192, d=128, dtype=torch.bfloat16),
                )),
]
