"""Tuned block sizes as data (``pallas/tuned.py``): the shipped tables' lookup, the
heuristics as the fallback, and ``python -m tpu_kernels tune`` on one tiny shape."""
from __future__ import annotations

import jax.numpy as jnp
import pytest

from tpu_kernels import aot
from tpu_kernels.pallas import flash_attention as fa
from tpu_kernels.pallas import matmul as mm
from tpu_kernels.pallas import tpu_info, tuned
from tpu_kernels.pallas.launch import max_vmem_bytes, vmem_limit


def test_shape_class_buckets_each_dim_to_a_power_of_two():
    assert tuned.shape_class(jnp.bfloat16, m=520, n=1408, k=1100) == "bfloat16 m=1024 n=2048 k=2048"
    assert tuned.representative("bfloat16 m=1024 n=2048 k=2048") == ("bfloat16", {"m": 1024, "n": 2048, "k": 2048})


@pytest.mark.parametrize("kernel", ["matmul", "flash_attention"])
def test_shipped_tables_cover_the_checked_generations(kernel):
    t = tuned.table(kernel)
    chips = {k.split("|")[0] for k in t["entries"]}
    assert set(tpu_info.CHECKED_GENERATIONS) <= chips
    for entry in t["entries"].values():
        assert all(isinstance(entry[p], int) and entry[p] > 0 for p in t["params"])
        assert entry["vmem_bytes"] is None or entry["vmem_bytes"] > 0


def test_matmul_takes_the_tuned_entry_and_clamps_it():
    chip = tpu_info.chip("v6e")
    entry_key = next(k for k in tuned.table("matmul")["entries"] if k.startswith("v6e|"))
    dtype, dims = tuned.representative(entry_key.split("|", 1)[1])
    want = tuned.params("matmul", "v6e", entry_key.split("|", 1)[1])
    assert mm.choose_blocks(dims["m"], dims["n"], dims["k"], jnp.dtype(dtype), chip) == want
    # A smaller problem of the same class: as many row blocks as the tuned bm needs,
    # each as small as that allows (a multiple of 16 rows), never bigger than tuned.
    m = dims["m"] // 2 + 8
    bm, bn, bk = mm.choose_blocks(m, dims["n"], dims["k"], jnp.dtype(dtype), chip)
    assert (bn, bk) == want[1:] and bm == tuned.fit(want[0], m, 16) <= want[0]
    assert tpu_info.round_up(m, bm) - m < 16 * -(-m // bm)


@pytest.mark.parametrize("block,dim,align,want", [
    (512, 520, 16, 272), (1024, 1408, 128, 768), (512, 1100, 128, 384), (4096, 14336, 128, 3584),
    (2048, 1100, 128, 1152), (512, 512, 16, 512), (1024, 8192, 16, 1024)])
def test_fit_keeps_the_block_count_and_pads_least(block, dim, align, want):
    assert tuned.fit(block, dim, align) == want


def test_without_an_entry_the_heuristic_decides(monkeypatch):
    chip = tpu_info.chip("v6e")
    with tuned.heuristics_only():
        heuristic = mm.choose_blocks(8192, 14336, 4096, jnp.bfloat16, chip)
        flash = fa.choose_blocks(4096, 4096, 128, jnp.bfloat16, chip)
    monkeypatch.setattr(tuned, "table", lambda kernel: {"params": [], "entries": {}})
    assert mm.choose_blocks(8192, 14336, 4096, jnp.bfloat16, chip) == heuristic
    assert fa.choose_blocks(4096, 4096, 128, jnp.bfloat16, chip) == flash
    assert tuned.lookup("matmul", "v6e", "bfloat16 m=8 n=128 k=128") is None
    assert tuned.helion_config("rms_norm", "v6e", jnp.bfloat16, (8192, 4096)) is None


def test_a_fake_entry_reaches_flash_attention_but_not_masked_calls(monkeypatch):
    cls = tuned.shape_class(jnp.bfloat16, sq=2048, skv=2048, d=128)
    table = {"params": ["bq", "bk"], "entries": {tuned.key("v5e", cls): {"bq": 1024, "bk": 256}}}
    monkeypatch.setattr(tuned, "table", lambda kernel: table)
    chip = tpu_info.chip("v5e")
    with tuned.heuristics_only():
        masked = fa.choose_blocks(2048, 2048, 128, jnp.bfloat16, chip, mask_itemsize=1)
    assert fa.choose_blocks(2048, 2048, 128, jnp.bfloat16, chip) == (1024, 256)
    assert fa.choose_blocks(1100, 1100, 128, jnp.bfloat16, chip) == (640, 256)    # same class, fitted
    assert fa.choose_blocks(2048, 2048, 128, jnp.bfloat16, chip, mask_itemsize=1) == masked


def test_tuned_blocks_may_use_the_raised_vmem_limit():
    for name in tpu_info.CHECKED_GENERATIONS:
        chip = tpu_info.chip(name)
        assert tuned.vmem_budget(chip, None) == tpu_info.vmem_budget(chip)
        assert tuned.vmem_budget(chip, (1, 1, 1)) == max_vmem_bytes(chip) > tpu_info.vmem_budget(chip)
        assert vmem_limit(chip, max_vmem_bytes(chip)) <= chip.vmem_bytes * 3 // 4


@pytest.mark.slow
@pytest.mark.skipif(aot.unavailable_reason() is not None, reason=str(aot.unavailable_reason()))
def test_tune_one_tiny_class_compiles_ranks_and_writes(tmp_path, monkeypatch, capsys):
    """``python -m tpu_kernels tune matmul --chip v6e --shapes ... --write`` (one compile)."""
    from tpu_kernels.__main__ import main
    from tpu_kernels.aot import tune

    monkeypatch.setattr(tuned, "DIR", str(tmp_path))
    tuned.table.cache_clear()
    try:
        assert main(["tune", "matmul", "--chip", "v6e", "--shapes", "m=256,n=512,k=256", "--write"]) == 0
        out = capsys.readouterr().out
        assert "[1/1] matmul v6e bfloat16 m=256 n=512 k=256" in out and "legal candidates" in out
        assert "| v6e | bfloat16 m=256 n=512 k=256 |" in out and "written:" in out
        cls = "bfloat16 m=256 n=512 k=256"
        e = tuned.lookup("matmul", "v6e", cls)
        assert e is not None and e["basis"] == "compiled+modelled" and e["compiled"] >= 1
        assert e["vmem_bytes"] > 0 and 0 < e["modelled_s"] <= e["score_s"]
        assert e["score_s"] <= e["heuristic_score_s"] * (1 + tune.TOLERANCE)
        blocks = tuned.params("matmul", "v6e", cls)
        assert blocks == (e["bm"], e["bn"], e["bk"])
        assert mm.choose_blocks(256, 512, 256, jnp.bfloat16, tpu_info.chip("v6e")) == blocks
    finally:
        tuned.table.cache_clear()


def test_a_forced_entry_reaches_a_kernel_without_a_block_argument(monkeypatch):
    """The tuner tries cross entropy's configurations through the lookup itself."""
    from tpu_kernels.pallas import cross_entropy as ce

    monkeypatch.setattr(tuned, "table", lambda kernel: {"params": [], "entries": {}})
    chip = tpu_info.chip("v5e")
    heuristic = ce.block_sizes(8192, 128256, jnp.bfloat16, chip)
    with tuned.forced("cross_entropy", {"bn": 64, "bv": 512}):
        assert ce.block_sizes(8192, 128256, jnp.bfloat16, chip) == (64, 512)
        assert tuned.lookup("matmul", chip, "bfloat16 m=8192 n=16384 k=4096") is None   # others untouched
    assert ce.block_sizes(8192, 128256, jnp.bfloat16, chip) == heuristic
