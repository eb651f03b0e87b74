"""Per-op eager latency on tpu vs torch CPU eager: what an eager user feels.

    python -m tpu_kernels.bench.dispatch
"""
from __future__ import annotations

import argparse

import torch

from tpu_kernels.deferred_mode import deferred
from tpu_kernels.bench.timing import measure
from tpu_kernels.models import GPT, GPTConfig


def cases() -> list[tuple[str, callable]]:
    def add(d):
        a, b = torch.randn(64, 64, device=d), torch.randn(64, 64, device=d)
        return lambda: a + b

    def mm(d):
        a, b = torch.randn(256, 256, device=d), torch.randn(256, 256, device=d)
        return lambda: a @ b

    def softmax(d):
        a = torch.randn(1024, 1024, device=d)
        return lambda: a.softmax(-1)

    def gpt(d):
        torch.manual_seed(0)
        model = GPT(GPTConfig()).to(d).eval()
        tokens = torch.randint(0, 256, (4, 32)).to(d)

        def fwd():
            with torch.no_grad():
                return model(tokens)
        return fwd
    def gpt_deferred(d):
        fwd = gpt(d)
        if d == "cpu":
            return fwd

        def deferred_fwd():
            with deferred():
                return fwd()
        return deferred_fwd
    return [("add 64x64", add), ("mm 256x256", mm), ("softmax 1024x1024", softmax),
            ("small GPT forward", gpt), ("GPT forward, deferred", gpt_deferred)]


def run(iters: int = 50, out=print) -> list[dict]:
    rows = []
    out(f"{'case':<20} {'cpu us':>10} {'tpu us':>10} {'tpu/cpu':>8} {'tpu first call ms':>18}")
    for name, make in cases():
        cpu = measure(make("cpu"), iters=iters)
        tpu = measure(make("tpu"), iters=iters)
        ratio = tpu["median"] / cpu["median"]
        rows.append({"case": name, "cpu_s": cpu["median"], "tpu_s": tpu["median"], "ratio": ratio,
                     "tpu_first_s": tpu["first"]})
        out(f"{name:<20} {cpu['median'] * 1e6:>10.1f} {tpu['median'] * 1e6:>10.1f} {ratio:>8.2f} "
            f"{tpu['first'] * 1e3:>18.1f}")
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=50)
    run(p.parse_args().iters)
