"""Serving throughput on this machine: the engine against eager ``generate()``, one run.

    python -m tpu_kernels.bench.serving [--requests 32] [--new-tokens 32] [--layers 2] [--threads 1]

A tiny Llama (random weights) answers ``--requests`` prompts of 8-40 tokens with
``--new-tokens`` greedy tokens each. Rows: transformers' eager ``generate()`` on CPU torch,
one request at a time and all requests as one left-padded batch; the serving engine
(``tpu_kernels.serving``: continuous batching, paged KV cache, compiled steps) on the tpu
device (JAX's CPU backend here, so attention runs the XLA reference of
``tpu_kernels::ragged_paged_attention``). Generated tokens per second after a warm-up
(compiles excluded), the ratio to the first row, and whether the engine's tokens equal
per-request generate's. For the kernel on TPU see ``bench/paged_attention.py``.

torch runs on ``--threads`` threads (default 1): on a loaded 2-core machine two OpenMP
threads spin against other processes and a tiny model's decode step takes ~100x longer.
"""
from __future__ import annotations

import argparse
import copy
import time
from typing import Callable

import torch
import transformers as tf

from tpu_kernels.serving import Engine, EngineConfig


def _model(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, eos_token_id=None, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    return tf.LlamaForCausalLM(cfg).eval()


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 41, (n,), generator=g).tolist()
    return [torch.randint(1, 512, (k,), generator=g).tolist() for k in lengths]


def per_request(model, prompts, new: int) -> list[list[int]]:
    return [model.generate(torch.tensor([p]), max_new_tokens=new, do_sample=False)[0, len(p):]
            .tolist() for p in prompts]


def batched(model, prompts, new: int) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False)
    return out[:, width:].tolist()


def _timed(fn: Callable[[], list[list[int]]]) -> tuple[float, list[list[int]]]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run(requests: int, new: int, layers: int) -> list[dict]:
    model = _model(layers)
    prompts = _prompts(requests)
    engine = Engine(copy.deepcopy(model).to("tpu"), EngineConfig(
        page_size=16, num_pages=requests * 6 + 1, max_num_seqs=requests,
        max_num_batched_tokens=256, max_model_len=96))
    rows = []
    with torch.no_grad():
        per_request(model, prompts[:1], 2)                       # warm-ups
        batched(model, prompts[:2], 2)
        engine.generate(prompts, 2)                              # compiles both buckets
        for name, fn in [("cpu generate, per request", lambda: per_request(model, prompts, new)),
                         ("cpu generate, padded batch", lambda: batched(model, prompts, new)),
                         ("engine (tpu, compiled steps)", lambda: engine.generate(prompts, new))]:
            seconds, out = _timed(fn)
            rows.append({"name": name, "seconds": seconds,
                         "tokens_per_s": requests * new / seconds, "tokens": out})
    base = rows[0]
    for row in rows:
        row["ratio"] = row["tokens_per_s"] / base["tokens_per_s"]
        row["equal_to_per_request"] = row["tokens"] == base["tokens"]
    for row in rows:
        del row["tokens"]
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = run(args.requests, args.new_tokens, args.layers)
    print(f"{args.requests} requests x {args.new_tokens} greedy tokens, tiny Llama "
          f"({args.layers} layers), {torch.get_num_threads()} torch threads")
    for r in rows:
        print(f"{r['name']:<30} {r['seconds']:8.2f} s  {r['tokens_per_s']:9.1f} tok/s  "
              f"x{r['ratio']:.2f}  tokens equal per-request: {r['equal_to_per_request']}")


if __name__ == "__main__":
    main()
