"""FlexAttention on tpu: the work the block tables skip, this machine's timings as ratios,
and the real TPU compiler's figures per chip. One run; nothing here is a timed test.

    python -m tpu_kernels.bench.flex_attention [--seq 8192] [--no-compile] [--no-timing]

1. Skipped work: for masks at ``--seq`` (128-blocks, as ``create_block_mask`` makes them),
   the tiles the kernels fetch and compute against the dense grid, from the tables.
2. Timings (small shape, CPU): torch's CPU flex_attention, the tpu device's dense XLA
   impl and the Pallas kernels in interpret mode, forward and forward + backward, as
   ratios to CPU (interpret mode is a correctness run: its ratio is no speed claim).
3. Real compile (libtpu compile-only, no TPU needed) at ``--seq`` for v5e, v6e and v7x:
   whether forward and backward compile, the kernels' VMEM estimate against the chip's
   scoped limit, and the roofline time from XLA's cost analysis (the kernels'
   ``pl.CostEstimate`` scaled by the fraction of tiles the tables list).
"""
from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from tpu_kernels import aot, registry
from tpu_kernels.bench.timing import measure
from tpu_kernels.registry.xla.flex_attention import spec_of
from tpu_kernels.pallas import flex_attention as fk
from tpu_kernels.pallas import flex_blocks as fb
from tpu_kernels.pallas import tpu_info
from tpu_kernels.registry.bindings import flex_attention as binding

MASKS: dict[str, Callable[[int], Callable]] = {
    "causal": lambda n: (lambda b, h, q, kv: q >= kv),
    "sliding 1024": lambda n: (lambda b, h, q, kv: (q >= kv) & (q - kv < 1024)),
    "document x3": lambda n: _document(n),
    "prefix-LM 1/4": lambda n: (lambda b, h, q, kv: (kv <= q) | (kv < n // 4)),
    "random blocks": lambda n: (lambda b, h, q, kv: ((q // 128) * 7 + (kv // 128) * 3) % 5 < 2),
}


def _document(n: int) -> Callable:
    doc = (torch.arange(n) >= n // 3).long() + (torch.arange(n) >= 2 * n // 3).long()
    return lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)


def _softcap(s, b, h, q, kv):
    return 30 * torch.tanh(s / 30)


# -- 1. skipped work -------------------------------------------------------------------------------
def skipped(seq: int) -> list[dict]:

    rows = []
    for name, make in MASKS.items():
        bm = create_block_mask(make(seq), None, None, seq, seq, device="cpu")
        tl = fk.plan(seq, seq, 128, 128, jnp.bfloat16, bm.BLOCK_SIZE, (1, 1), chip=tpu_info.CHIPS["v6e"])
        lists = [jnp.asarray(t.numpy()) for t in (bm.kv_num_blocks, bm.kv_indices,
                                                  bm.full_kv_num_blocks, bm.full_kv_indices)]
        nonempty, full = fb.tile_state(fb.block_state(*lists, tl.nk), bm.BLOCK_SIZE, tl, seq, False)
        fetched, dense = fb.fetched(nonempty)
        rows.append({"mask": name, "tiles": f"{tl.bq}x{tl.bk}", "fetched": fetched, "dense": dense,
                     "full": int(full.sum()), "skipped": 1 - fetched / dense, "block_mask": bm,
                     "mask_mod": make(seq)})
    return rows


# -- 2. timings ------------------------------------------------------------------------------------
def timings(b: int = 1, h: int = 4, s: int = 512, d: int = 64) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, generator=g) for _ in range(3))
    mask = MASKS["causal"](s)
    rows = []
    cpu_bm = create_block_mask(mask, None, None, s, s, device="cpu")
    cpu = measure(lambda: flex_attention(q, k, v, score_mod=_softcap, block_mask=cpu_bm), warmup=1, iters=5)
    rows.append({"what": "forward", "impl": "cpu flex_attention", **cpu, "ratio": 1.0})
    tq, tk, tv = (x.to("tpu") for x in (q, k, v))
    bm = create_block_mask(mask, None, None, s, s, device="tpu")
    for impl, ctx in (("tpu xla (dense)", registry.only("xla")), ("tpu pallas (interpret)", registry.interpret())):
        with ctx:
            r = measure(lambda: flex_attention(tq, tk, tv, score_mod=_softcap, block_mask=bm),
                        warmup=1, iters=3)
        rows.append({"what": "forward", "impl": impl, **r, "ratio": r["median"] / cpu["median"]})

    def cpu_train():
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        sc = (leaves[0] @ leaves[1].transpose(-1, -2)) * d ** -0.5
        sc = 30 * torch.tanh(sc / 30)
        sc = sc.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
        (torch.softmax(sc, -1) @ leaves[2]).sum().backward()
        return leaves[0].grad
    base = measure(cpu_train, warmup=1, iters=5)
    rows.append({"what": "fwd+bwd", "impl": "cpu dense torch (autograd)", **base, "ratio": 1.0})
    for impl, ctx in (("tpu xla (dense)", registry.only("xla")), ("tpu pallas (interpret)", registry.interpret())):
        def train():
            leaves = [x.clone().requires_grad_() for x in (tq, tk, tv)]
            flex_attention(*leaves, score_mod=_softcap, block_mask=bm).sum().backward()
            return leaves[0].grad
        with ctx:
            r = measure(train, warmup=1, iters=3)
        rows.append({"what": "fwd+bwd", "impl": impl, **r, "ratio": r["median"] / base["median"]})
    return rows


# -- 3. real compile per chip ----------------------------------------------------------------------
def compiled(seq: int, masks: list[dict], heads: int = 8, kv_heads: int = 2, d: int = 128) -> list[dict]:

    rows = []
    for chip_name in tpu_info.CHECKED_GENERATIONS:
        chip = tpu_info.CHIPS[chip_name]
        sharding = aot.topology.sharding(chip)
        for m in masks:
            bm = m["block_mask"]
            q = torch.empty(1, heads, seq, d, dtype=torch.bfloat16, device="meta")
            kv = torch.empty(1, kv_heads, seq, d, dtype=torch.bfloat16, device="meta")
            spec = spec_of(q, kv, kv, _softcap, bm.as_tuple()[:-1] + (m["mask_mod"],), d ** -0.5, (), (), ())
            tl = binding.tiling(spec, chip)
            mods = binding.kernel_mods(spec)
            density = m["fetched"] / m["dense"]
            lists = [jnp.asarray(t.numpy()) for t in (bm.kv_num_blocks, bm.kv_indices,
                                                      bm.full_kv_num_blocks, bm.full_kv_indices)]
            tables = binding.block_tables(spec, lists, tl)

            def sds(shape, dtype=jnp.bfloat16):
                return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
            qs, kvs, stat = sds(q.shape), sds(kv.shape), sds((1, heads, seq), jnp.float32)
            tab = jax.tree.map(lambda a: sds(a.shape, a.dtype), tables)
            kw = dict(tiling=tl, density=density)
            fwd = (lambda q, k, v, t: fk.flex_attention_fwd(q, k, v, t, mods, **kw), (qs, kvs, kvs, tab))
            bwd = (lambda do, q, k, v, o, l, t: fk.flex_attention_bwd(do, None, q, k, v, o, l, t, mods, **kw),
                   (qs, qs, kvs, kvs, qs, stat, tab))
            for what, (fn, args) in (("forward", fwd), ("backward", bwd)):
                rows.append({"chip": chip_name, "mask": m["mask"], "what": what,
                             "vmem": fk.vmem_bytes(tl.bq, tl.bk, d, d, jnp.bfloat16, 0),
                             "vmem_limit": chip.scoped_vmem_bytes, **_compile(fn, args, chip)})
    return rows


def _compile(fn: Callable, args: tuple, chip: Any) -> dict:
    t0 = time.perf_counter()
    try:
        c = aot.compile_lowered(lambda: jax.jit(fn).lower(*args), chip.name).executable
    except Exception as exc:
        return {"ok": False, "error": str(exc).splitlines()[0][:200]}
    ca = c.cost_analysis() or {}
    flops, nbytes = ca.get("flops", 0.0), ca.get("bytes accessed", 0.0)
    est = max(flops / chip.bf16_flops, nbytes / chip.hbm_bytes_per_s)
    return {"ok": True, "compile_s": time.perf_counter() - t0, "flops": flops, "bytes": nbytes,
            "est_ms": est * 1e3}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    a = ap.parse_args(argv)
    masks = skipped(a.seq)
    print(f"\n1. work skipped at seq {a.seq} (tiles fetched / dense grid, from the block tables)")
    for r in masks:
        print(f"  {r['mask']:<15} tiles {r['tiles']}: {r['fetched']:>5} / {r['dense']} fetched "
              f"({r['full']} full), {100 * r['skipped']:.1f}% skipped")
    if not a.no_timing:
        print("\n2. timings on this machine (median s; ratio to the CPU row of the same kind)")
        for r in timings():
            print(f"  {r['what']:<8} {r['impl']:<28} {r['median']:.4f} s  x{r['ratio']:.2f}  "
                  f"(first call {r['first']:.2f} s)")
    if not a.no_compile:
        print(f"\n3. real TPU compile at seq {a.seq} (bf16, 8 q / 2 kv heads, d 128, softcap score_mod)")
        for r in compiled(a.seq, [m for m in masks if m["mask"] in ("causal", "sliding 1024")]):
            if not r["ok"]:
                print(f"  {r['chip']:<4} {r['mask']:<13} {r['what']:<8} FAIL {r['error']}")
                continue
            print(f"  {r['chip']:<4} {r['mask']:<13} {r['what']:<8} ok ({r['compile_s']:.1f} s)  "
                  f"VMEM ~{r['vmem'] / 2**20:.1f} / {r['vmem_limit'] / 2**20:.0f} MiB  "
                  f"{r['flops'] / 1e9:.1f} GFLOP  {r['bytes'] / 2**20:.0f} MiB  "
                  f"roofline {r['est_ms']:.3f} ms")


if __name__ == "__main__":
    main()
