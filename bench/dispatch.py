"""Eager dispatch cost, deferred mode's gain, first-call latency: one run, ratios.

    python -m tpu_kernels.bench.dispatch [--quick] [--json out.json] [--compare old.json]
                                         [--first-call]

Rows (every ratio is a cost ratio: lower is better, and all come from this one run):
- eager ops and a decoder forward, tpu vs torch CPU (``tpu/cpu``); the add, softmax and
  layer norm also vs a bare cached ``jax.jit`` call of the same jnp function (``tpu/jit``,
  the dispatch floor) and that jit call vs torch CPU (``jit/cpu``: XLA's CPU code itself);
- deferred mode vs plain eager on the small GPT forward, its training step and a tiny
  Llama's training step (``deferred/eager``; 0.67 is a 1.5x gain);
- the stage split of an eager add (``dispatch_stages.py``), in wall time and in the
  calling thread's CPU time (steady when the machine is loaded);
- with ``--first-call``: the decoder forward's first call in a fresh process, with empty
  caches (cold), with the persistent caches that run left (warm), and with JAX's
  persistent compile cache only (``first_call``).
Timings alternate between the sides of a ratio call by call and take the median of
every call, so a busy machine slows both sides alike; each row also gives the ratio of
process CPU time (``cpu``), steadier than wall time when the machine is loaded. ``--compare OLD.json`` flags
ratios more than 10% worse than the old run's and exits 1 if any is, with a note when the old run
was on another machine (``machine.py``: its CPU, cores and backend are recorded).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import jax
import torch
import torch.nn.functional as F

from tpu_kernels.bench import dispatch_stages, machine
from tpu_kernels.bench.timing import sync
from tpu_kernels.deferred_mode import deferred
from tpu_kernels.dispatch import cache as dispatch_cache
from tpu_kernels.models import GPT, GPTConfig
from tpu_kernels.registry.xla.norm import native_layer_norm
from tpu_kernels.registry.xla.softmax import softmax_along

FORMAT = "tpu_kernels-dispatch-bench/1"
SLOWER = 1.10      # --compare flags a ratio this much worse than before
DECODER = GPTConfig(vocab=256, seq=128, dim=256, heads=8, layers=2)


def _ops() -> dict[str, Callable[[str], Callable[[], Any]]]:
    def add(d):
        a, b = torch.randn(64, 64, device=d), torch.randn(64, 64, device=d)
        return lambda: a + b

    def mm(d):
        a, b = torch.randn(256, 256, device=d), torch.randn(256, 256, device=d)
        return lambda: a @ b

    def softmax(d):
        a = torch.randn(1024, 1024, device=d)
        return lambda: a.softmax(-1)

    def layer_norm(d):
        x, w, b = torch.randn(512, 768, device=d), torch.randn(768, device=d), torch.randn(768, device=d)
        return lambda: F.layer_norm(x, (768,), w, b)

    def decoder(d):
        torch.manual_seed(0)
        model = GPT(DECODER).to(d).eval()
        tokens = torch.randint(0, DECODER.vocab, (4, DECODER.seq)).to(d)

        def fwd():
            with torch.no_grad():
                return model(tokens)
        return fwd
    return {"add 64x64": add, "matmul 256": mm, "softmax 1024x1024": softmax,
            "layer_norm 512x768": layer_norm, "decoder (2 blocks, d256, b4 s128) forward": decoder}


def _jit_add() -> Callable[[], Any]:
    a, b = torch.randn(64, 64, device="tpu").jax(), torch.randn(64, 64, device="tpu").jax()
    f = jax.jit(lambda x, y: x + y)
    return lambda: f(a, b)


def _jit_softmax() -> Callable[[], Any]:
    """A bare cached ``jax.jit`` of the jnp function the tpu softmax runs."""
    a = torch.randn(1024, 1024, device="tpu").jax()
    f = jax.jit(lambda x: softmax_along(x, 1))
    return lambda: f(a)


def _jit_layer_norm() -> Callable[[], Any]:
    """A bare cached ``jax.jit`` of the jnp function the tpu layer norm runs (its three results)."""
    x, w, b = (torch.randn(*s, device="tpu").jax() for s in ((512, 768), (768,), (768,)))
    f = jax.jit(lambda x, w, b: native_layer_norm(x, (768,), w, b, 1e-5))
    return lambda: f(x, w, b)


# the same computation as a bare jit call: what the tpu path costs over JAX itself, and
# (jit/cpu) how XLA's CPU code compares with torch's kernel
JIT_OF = {"add 64x64": _jit_add, "softmax 1024x1024": _jit_softmax, "layer_norm 512x768": _jit_layer_norm}


def _gpt_forward(defer: bool) -> Callable[[], Any]:
    torch.manual_seed(0)
    model = GPT(GPTConfig()).to("tpu").eval()
    tokens = torch.randint(0, 256, (4, 32)).to("tpu")

    def fwd():
        with torch.no_grad(), deferred() if defer else contextlib.nullcontext():
            return model(tokens)
    return fwd


def _train(model: torch.nn.Module, loss_of: Callable[[], torch.Tensor], defer: bool) -> Callable[[], Any]:
    """A training step that returns its loss and the updated parameters, so a timed call
    waits for the whole step: eager's optimizer updates are still running when its loss
    is ready, and the next timed call (the other side's, often) would pay for them."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = list(model.parameters())

    def step():
        with deferred() if defer else contextlib.nullcontext():
            opt.zero_grad()
            loss = loss_of()
            loss.backward()
            opt.step()
        return [loss, *params]
    return step


def _gpt_step(defer: bool) -> Callable[[], Any]:
    torch.manual_seed(0)
    model = GPT(GPTConfig()).to("tpu").train()
    tokens = torch.randint(0, 256, (4, 32)).to("tpu")
    return _train(model, lambda: model.loss(tokens), defer)


def _llama_step(defer: bool) -> Callable[[], Any]:
    import transformers   # heavy, and only this workload needs it

    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to("tpu").train()
    tokens = torch.randint(0, 256, (2, 32)).to("tpu")
    return _train(model, lambda: model(input_ids=tokens, labels=tokens).loss, defer)


DEFERRED = {"small GPT forward": _gpt_forward, "small GPT training step": _gpt_step,
            "tiny Llama training step": _llama_step}


def side_by_side(fns: dict[str, Callable[[], Any]], rounds: int, iters: int) -> dict[str, dict]:
    """Seconds per call of each fn (result waited for), ``rounds * iters`` calls of each,
    alternating call by call, the order running through every permutation of the sides:
    each side follows every other side equally often (torch CPU's worker threads spin on
    after its call and slow whatever runs next; a rotation of three sides keeps their cyclic
    order, so "jit" followed torch CPU in two rounds of three and "tpu" in one)."""
    first = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        sync(fn())
        first[name] = time.perf_counter() - t0
        for _ in range(2):
            sync(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    orders = list(itertools.permutations(fns))
    for i in range(rounds * iters):   # call by call, so a load spike hits every side alike
        for name in orders[i % len(orders)]:
            fn = fns[name]
            t0, c0 = time.perf_counter(), time.process_time()
            sync(fn())
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return {name: {"median_s": statistics.median(ts), "cpu_s": statistics.median(cpu[name]),
                   "first_s": first[name]} for name, ts in times.items()}


def _row(case: str, kind: str, num: str, den: str, t: dict) -> dict:
    """A ratio of wall times (what ``--compare`` checks) and, beside it, of process CPU
    times (every thread's work: steadier than wall time on a loaded machine)."""
    return {"case": case, "kind": kind, "num": num, "den": den, "num_s": t[num]["median_s"],
            "den_s": t[den]["median_s"], "ratio": t[num]["median_s"] / t[den]["median_s"],
            "cpu_ratio": t[num]["cpu_s"] / max(t[den]["cpu_s"], 1e-9)}


def eager_rows(rounds: int, iters: int, out: Callable[[str], None]) -> list[dict]:
    rows = []
    for case, make in _ops().items():
        fns = {"tpu": make("tpu"), "cpu": make("cpu")}
        if case in JIT_OF:
            fns["jit"] = JIT_OF[case]()
        n = iters if "decoder" not in case else max(iters // 10, 3)
        t = side_by_side(fns, rounds, n)
        new = [_row(case, "eager tpu/cpu", "tpu", "cpu", t)]
        if "jit" in fns:
            new += [_row(case, "eager tpu/jit", "tpu", "jit", t), _row(case, "jit/cpu", "jit", "cpu", t)]
        for r in new:
            out(_line(r))
        rows += new
    return rows


def deferred_rows(rounds: int, iters: int, out: Callable[[str], None]) -> list[dict]:
    rows = []
    for case, make in DEFERRED.items():
        t = side_by_side({"deferred": make(True), "eager": make(False)}, rounds, iters)
        rows.append(_row(case, "deferred/eager", "deferred", "eager", t))
        out(_line(rows[-1]) + f"   ({1 / rows[-1]['ratio']:.2f}x faster deferred)")
    return rows


def _line(r: dict) -> str:
    return (f"{r['case']:<44} {r['kind']:<15} {r['num_s'] * 1e6:>10.1f} us {r['den_s'] * 1e6:>10.1f} us"
            f" {r['ratio']:>7.2f} {r['cpu_ratio']:>7.2f}")


def first_call(out: Callable[[str], None]) -> dict[str, float]:
    """The decoder forward's first call in a new process (``_first_call_child``): cold (empty
    caches), warm (the caches the cold run left: JAX's persistent compile cache and the
    call cache, ``dispatch/call_cache.py``), and warm with JAX's cache only
    (``TPU_KERNELS_CALL_CACHE=0``, its own directory filled by one run first). Wall
    seconds; beside them process CPU seconds (``*_cpu``: steadier on a loaded machine),
    the programs traced (``*_traces``) and the 1-minute load average (``*_load``)."""
    res = {}
    with tempfile.TemporaryDirectory() as both, tempfile.TemporaryDirectory() as jax_only:
        runs = [("cold", both, "1"), ("warm", both, "1"), (None, jax_only, "0"),
                ("warm, JAX's cache only", jax_only, "0")]
        for label, cache_dir, call_cache in runs:
            env = dict(os.environ, TPU_KERNELS_JAX_CACHE=cache_dir, TPU_KERNELS_CALL_CACHE=call_cache)
            proc = subprocess.run([sys.executable, "-m", "tpu_kernels.bench.dispatch", "--first-call-child"],
                                  env=env, capture_output=True, text=True, check=True)
            if label is None:   # fills the JAX-only cache
                continue
            wall, cpu, traces = (float(x) for x in proc.stdout.strip().splitlines()[-1].split())
            load = os.getloadavg()[0]
            res[label], res[label + "_cpu"], res[label + "_traces"], res[label + "_load"] = wall, cpu, traces, load
            out(f"decoder forward, first call, {label}: {wall:.3f} s (process CPU {cpu:.3f} s, "
                f"{traces:.0f} programs traced, load average {load:.1f})")
    return res


def _first_call_child() -> None:
    """Time the decoder's first forward in this fresh process: wall and process CPU
    seconds and the number of programs traced."""
    fwd = _ops()["decoder (2 blocks, d256, b4 s128) forward"]("tpu")
    t0, c0 = time.perf_counter(), time.process_time()
    sync(fwd())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    sys.stdout.write(f"{wall} {cpu} {sum(dispatch_cache.TRACES.values())}\n")


def compare(new: dict, old: dict) -> list[str]:
    """Rows whose ratio is more than 10% worse (higher) than in ``old``."""
    before = {(r["case"], r["kind"]): r["ratio"] for r in old.get("rows", [])}
    flagged = []
    for r in new["rows"]:
        was = before.get((r["case"], r["kind"]))
        if was is not None and r["ratio"] > was * SLOWER:
            flagged.append(f"SLOWER: {r['case']} {r['kind']}: {was:.2f} -> {r['ratio']:.2f}")
    return flagged


def run(quick: bool = False, first: bool = False, out: Callable[[str], None] = print) -> dict:
    rounds, iters = (2, 5) if quick else (5, 20)
    out(f"{'case':<44} {'ratio':<15} {'numerator':>13} {'denominator':>13} {'ratio':>7} {'cpu':>7}")
    result: dict[str, Any] = {"format": FORMAT, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                              **machine.describe(), "rows": eager_rows(rounds, iters, out)}
    result["rows"] += deferred_rows(rounds, max(iters // 4, 3), out)
    result["stages_us"] = dispatch_stages.stage_split(n=200 if quick else 2000, rounds=1 if quick else 3)
    result["stages_thread_us"] = dispatch_stages.thread_split(n=200 if quick else 1000, rounds=3 if quick else 7)
    out("eager add 64x64, microseconds per stage (every cache hit): wall (waited for), thread CPU (not waited for)")
    for k, v in result["stages_us"].items():
        out(f"  {k:<54} {v:>8.2f} {result['stages_thread_us'][k]:>8.2f}")
    if first:
        result["first_call_s"] = first_call(out)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--compare", help="a JSON file of an earlier run: flag ratios >10%% worse")
    p.add_argument("--first-call", action="store_true", help="time the decoder's first call, cold and warm")
    p.add_argument("--first-call-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.first_call_child:
        _first_call_child()
        return 0
    result = run(args.quick, args.first_call)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.compare:
        with open(args.compare) as f:
            old = json.load(f)
        flagged = compare(result, old)
        note = machine.mismatch(result, old)
        for line in flagged + ([note] if flagged and note else []):
            print(line)
        return 1 if flagged else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
