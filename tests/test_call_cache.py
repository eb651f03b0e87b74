"""The persistent call cache (dispatch/call_cache.py): a second process loads what the
first stored and gets the same results without tracing; a damaged entry is ignored and
rebuilt; ``TPU_KERNELS_CALL_CACHE=0`` turns it off. Each run is a fresh process with its
own cache directory and a few tiny ops."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax

from tpu_kernels.dispatch import call_cache

_CODE = """
import json, sys, torch, tpu_kernels
import torch.nn.functional as F
from tpu_kernels.dispatch import cache
torch.manual_seed(0)
x, w = torch.randn(4, 8), torch.randn(8)
t = x.to('tpu')
outs = [F.layer_norm(t, (8,), w.to('tpu')), (t * 2.5 + 1).softmax(-1), t.t() @ t,
        torch.max(t, dim=1).values, t[:, 1:5].sum(0)]
print(json.dumps({"traces": sum(cache.TRACES.values()), "outs": [o.cpu().tolist() for o in outs]}))
"""


def _run(cache_dir, **env) -> dict:
    e = dict(os.environ, TPU_KERNELS_JAX_CACHE=str(cache_dir), TPU_KERNELS_CALL_CACHE="1")
    e.update(env)
    out = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=600, env=e)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _entries(cache_dir) -> list:
    d = cache_dir / "tpu_kernels_calls"
    return sorted(d.iterdir()) if d.exists() else []


def test_second_process_loads_entries_and_matches(tmp_path):
    first = _run(tmp_path)
    stored = _entries(tmp_path)
    assert first["traces"] >= 5 and len(stored) >= 5
    second = _run(tmp_path)
    assert second["traces"] == 0          # every signature came from the cache
    assert second["outs"] == first["outs"]
    # a damaged entry is ignored: that signature is traced and its entry written again
    damaged = stored[0].read_bytes()[:-7] + b"garbage"
    stored[0].write_bytes(damaged)
    third = _run(tmp_path)
    assert third["traces"] == 1 and third["outs"] == first["outs"]
    assert stored[0].read_bytes() != damaged
    # a setting the dispatcher reads while tracing is part of the key
    assert _run(tmp_path, TPU_KERNELS_INDEX_CHECKS="0")["traces"] > 0


def test_off_switch(monkeypatch, tmp_path):
    old = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    try:
        monkeypatch.setenv("TPU_KERNELS_CALL_CACHE", "1")
        assert call_cache.directory() == str(tmp_path / call_cache.SUBDIR)
        monkeypatch.setenv("TPU_KERNELS_CALL_CACHE", "0")
        assert call_cache.directory() is None
    finally:
        jax.config.update("jax_compilation_cache_dir", old)


def test_entries_load_only_intact_and_for_their_key(tmp_path):
    entry = call_cache.Entry(str(tmp_path), "some key")
    assert entry.load() is None                     # missing
    f = jax.jit(lambda x: ([x + 1], None))
    f.checks = []
    exe, fresh = call_cache._compile_fresh(f, (jax.numpy.ones(3),))
    assert fresh
    entry.store(exe, [(IndexError, "index out of range")], None, [])
    got = entry.load()
    assert got["checks"] == [(IndexError, "index out of range")]
    assert got["exe"](jax.numpy.ones(3))[0][0].tolist() == [2.0, 2.0, 2.0]
    other = call_cache.Entry(str(tmp_path), "another key")
    with open(entry.path, "rb") as src, open(other.path, "wb") as dst:
        dst.write(src.read())
    assert other.load() is None                     # an entry of another key
    blob = bytearray(open(entry.path, "rb").read())
    blob[-1] ^= 1
    with open(entry.path, "wb") as dst:
        dst.write(bytes(blob))
    assert entry.load() is None                     # damaged


def test_pruning_removes_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_KERNELS_CALL_CACHE_MB", str(10 / 1024))   # 10 KiB
    for i in range(6):
        p = tmp_path / f"{i}.call"
        p.write_bytes(b"x" * 3000)
        os.utime(p, (1000 + i, 1000 + i))
    (tmp_path / "dead.tmp").write_bytes(b"x")
    os.utime(tmp_path / "dead.tmp", (1000, 1000))
    call_cache._prune_once(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["4.call", "5.call"]   # 6 KiB <= 7.5 KiB


_LAID_OUT = """
import json, jax, torch, tpu_kernels
import torch.nn.functional as F
torch.manual_seed(0)
q, k, v = (torch.randn(1, 8, 2, 4).transpose(1, 2) for _ in range(3))   # (B, H, S, D) in (B, S, H, D) memory
tq, tk, tv = (x.to('tpu') for x in (q, k, v))
traces = [0]
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: traces.__setitem__(0, traces[0] + (event == "/jax/core/compile/jaxpr_trace_duration")))
out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
print(json.dumps({"traces": traces[0], "stride": out.stride(), "want": ref.stride(),
                  "close": torch.allclose(out.cpu(), ref, atol=1e-5)}))
"""


def test_a_result_laid_out_like_its_query_is_traced_by_nothing_warm(tmp_path):
    """An attention output keeps torch's (transposed) strides; its executable writes it in
    that layout, so a warm process runs it from the call cache without tracing any program
    (it once took a separate permuting program, traced in every process)."""
    e = dict(os.environ, TPU_KERNELS_JAX_CACHE=str(tmp_path), TPU_KERNELS_CALL_CACHE="1")
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _LAID_OUT], capture_output=True, text=True, timeout=600, env=e)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for r in runs:
        assert r["close"] and r["stride"] == r["want"] and r["want"] != [64, 32, 4, 1], r
    assert runs[0]["traces"] >= 1 and runs[1]["traces"] == 0, runs


_LINALG = """
import json, torch, tpu_kernels
from tpu_kernels.dispatch import cache
a = torch.tensor([[4., 1, 0], [1, 3, 0], [0, 0, 2]])
t = a.to('tpu')
outs = [torch.linalg.cholesky(t), torch.linalg.solve(t, t[:, :1]), torch.linalg.eigh(t).eigenvalues]
print(json.dumps({"traces": sum(cache.TRACES.values()), "outs": [o.cpu().tolist() for o in outs]}))
"""


def test_linalg_executables_load_in_a_fresh_process(tmp_path):
    """A stored executable that calls LAPACK runs in a process that has lowered no linalg
    op (XLA:CPU's LAPACK handlers are registered before it loads): it crashed the process
    (SIGSEGV) before."""
    e = dict(os.environ, TPU_KERNELS_JAX_CACHE=str(tmp_path), TPU_KERNELS_CALL_CACHE="1")
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _LINALG], capture_output=True, text=True, timeout=600, env=e)
        assert out.returncode == 0, f"rc {out.returncode}: {out.stderr[-3000:]}"
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[1]["traces"] == 0 and runs[1]["outs"] == runs[0]["outs"], runs
