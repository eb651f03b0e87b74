"""Random chains of 1-d convolutions on the default JAX device against XLA:CPU: the sweep
that found XLA:TPU computing chained strided and transposed 1-d convolutions wrongly
(``registry/xla/conv_strided.py``; ``bench/results/tpu_v5e/2026-12-07-s41.md``).

On a chip (the CPU device gives the reference)::

    JAX_PLATFORMS=tpu,cpu python -m tpu_kernels.bench.conv_chains --kinds strided,transposed,padded
    JAX_PLATFORMS=tpu,cpu python -m tpu_kernels.bench.conv_chains --dims 2   # square 2-d chains

Each chain has 2-3 layers with tanh between; its forward and the gradients of the input and
every weight run as one jitted program, float32, HIGHEST precision. A chain is wrong when
its output or a gradient is off the CPU's by more than ``--bound`` of its largest value.
Kinds: ``strided`` (strides 1-5, no padding), ``transposed`` (ConvTranspose1d-shaped,
strides 1-5, padded), ``padded`` (stride 1, padding up to kernel-1: a layer whose output
is longer than its input after the first is what XLA:TPU got wrong, ``2026-12-07-s42.md``).
``--dims 2``: the same chains in 2-d, square (k x k kernels, the same stride and padding
along both dimensions, sides of 8-48). Forms: ``xla`` (XLA's own strided/dilated
convolution), ``lowered`` (the registry's ``conv_nd``, what tpu_kernels runs). XLA's form
of some transposed 2-d chains of stride 4 aborts XLA:TPU's compiler and so the process
(``aborts_on_tpu``; ``--dims 2`` meets one at its third transposed chain): ``--forms lowered``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tpu_kernels.registry.xla.conv import conv_nd, transposed_weight

KINDS = ("strided", "transposed", "padded")
FORMS = ("xla", "lowered")
HIGHEST = lax.Precision.HIGHEST


@dataclasses.dataclass
class Chain:
    kind: str
    length: int
    channels: tuple[int, ...]                 # input's, then each layer's output
    layers: tuple[tuple[int, int, int], ...]  # (kernel, stride, padding) per layer
    dims: int = 1                             # spatial dimensions, each of ``length``

    def weight_shapes(self) -> list[tuple[int, ...]]:
        pairs = zip(self.channels, self.channels[1:])
        return [((i, o) if self.kind == "transposed" else (o, i)) + (k,) * self.dims
                for (i, o), (k, _, _) in zip(pairs, self.layers)]

    def out_length(self) -> int:
        n = self.length
        for k, s, p in self.layers:
            n = (n - 1) * s - 2 * p + k if self.kind == "transposed" else (n + 2 * p - k) // s + 1
        return n


def random_chain(kind: str, rng: np.random.Generator, dims: int = 1) -> Chain:
    """A chain of ``kind`` with sizes drawn as in the chip sweeps (2-d: sides of 8-48)."""
    n = int(rng.choice([2, 2, 3]))
    layers = []
    for i in range(n):
        if kind == "transposed":
            s = int(rng.integers(1, 6))
            k = int(rng.integers(max(2, s), 2 * s + 2))
            p = int(rng.integers(0, (k - s) // 2 + 1)) if k > s else 0
        elif kind == "strided":
            k, s, p = int(rng.integers(2, 11 if i == 0 else 6)), int(rng.integers(1, 6 if i == 0 else 4)), 0
        else:
            k = int(rng.integers(2, 8))
            s, p = 1, int(rng.integers(0, k))
        layers.append((k, s, p))
    channels = (int(rng.choice([1, 2, 8, 16])),) + (int(rng.choice([8, 16, 32, 128])),) * n
    if dims == 1:
        length = int(rng.integers(20, 400) if kind == "transposed" else rng.integers(60, 3000))
    else:
        length = int(rng.integers(8, 24) if kind == "transposed" else rng.integers(16, 48))
    return Chain(kind, length, channels, tuple(layers), dims)


def _layer(form: str, transposed: bool) -> Callable:
    def xla(x, w, k, s, p):
        nd = x.ndim - 2
        if not transposed:
            return lax.conv_general_dilated(x, w, (s,) * nd, [(p, p)] * nd, precision=HIGHEST)
        return lax.conv_general_dilated(x, transposed_weight(w, 1), (1,) * nd,
                                        [(k - 1 - p, k - 1 - p)] * nd, lhs_dilation=(s,) * nd,
                                        precision=HIGHEST)

    def lowered(x, w, k, s, p):
        return conv_nd(x, w, (s,), (p,), (1,), transposed, (0,), 1)
    return xla if form == "xla" else lowered


def program(chain: Chain, form: str) -> Callable:
    """The jitted forward-and-gradients program of ``chain`` in ``form``."""
    layer = _layer(form, chain.kind == "transposed")

    def run(x, g, *ws):
        h = x
        for w, (k, s, p) in zip(ws, chain.layers):
            h = jnp.tanh(layer(h, w, k, s, p))
        return (h * g).sum(), h
    argnums = (0,) + tuple(range(2, 2 + len(chain.layers)))
    return jax.jit(jax.value_and_grad(run, argnums=argnums, has_aux=True))


def _relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def check(chain: Chain, forms: tuple[str, ...], rng: np.random.Generator) -> dict:
    """``chain`` on the default device in each form vs the ``xla`` form on the CPU device:
    the worst relative error of the output and of the gradients, per form."""
    x = rng.standard_normal((2, chain.channels[0]) + (chain.length,) * chain.dims).astype(np.float32)
    ws = [(rng.standard_normal(s) / np.sqrt(s[0 if chain.kind == "transposed" else 1] * np.prod(s[2:])))
          .astype(np.float32) for s in chain.weight_shapes()]
    g = rng.standard_normal((2, chain.channels[-1]) + (chain.out_length(),) * chain.dims).astype(np.float32)
    cpu = jax.devices("cpu")[0]
    with jax.default_matmul_precision("highest"):
        (_, want), want_grads = jax.device_get(program(chain, "xla")(*jax.device_put((x, g, *ws), cpu)))
        row = {"chain": dataclasses.asdict(chain)}
        for form in forms:
            (_, got), grads = program(chain, form)(x, g, *ws)
            row[form] = {"output": _relative(got, want),
                         "gradients": max(_relative(a, b) for a, b in zip(grads, want_grads))}
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--chains", type=int, default=30, help="chains per kind")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bound", type=float, default=1e-3)
    ap.add_argument("--dims", type=int, choices=(1, 2), default=1, help="spatial dimensions")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    forms = tuple(args.forms.split(","))
    rng = np.random.default_rng(args.seed)
    print(f"device {jax.devices()[0].platform}, reference cpu; wrong: off by > {args.bound:g}", flush=True)
    rows = []
    for kind in args.kinds.split(","):
        wrong = dict.fromkeys(forms, 0)
        for i in range(args.chains):
            chain = random_chain(kind, rng, args.dims)
            if chain.out_length() < 1:
                continue
            row = check(chain, forms, rng)
            rows.append(row)
            marks = []
            for form in forms:
                bad = max(row[form].values()) > args.bound
                wrong[form] += bad
                marks.append(f"{form} out {row[form]['output']:.0e} grad {row[form]['gradients']:.0e}"
                             + (" WRONG" if bad else ""))
            print(f"{kind} {i + 1}/{args.chains} L={chain.length}{'' if args.dims == 1 else ' (2-d)'} ch={chain.channels} "
                  f"(k,s,p)={chain.layers} | " + " | ".join(marks), flush=True)
        print(f"{kind}: wrong chains " + ", ".join(f"{f} {n}" for f, n in wrong.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
