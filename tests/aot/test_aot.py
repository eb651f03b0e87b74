"""tpu_kernels.aot: compiling for a named chip, the summary it reads from the compiler, what
the compiler's errors mean, and where kernels are told to run (tpu_info.target)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_kernels import aot
from tpu_kernels.pallas import tpu_info

needs_libtpu = pytest.mark.skipif(aot.unavailable_reason() is not None,
                                  reason=str(aot.unavailable_reason()))
S = jax.ShapeDtypeStruct


@pytest.fixture(autouse=True)
def _x32():
    # the raw pallas_calls below are written for 32-bit tracing (the library's own kernels
    # trace in 32-bit whatever the process says; conftest's runtime turns x64 on)
    with jax.enable_x64(False):
        yield


def _double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def _doubled(x, block=(256, 512), **kw):
    return pl.pallas_call(_double, out_shape=S(x.shape, x.dtype), grid=(x.shape[0] // block[0],),
                          in_specs=[pl.BlockSpec(block, lambda i: (i, 0))],
                          out_specs=pl.BlockSpec(block, lambda i: (i, 0)), **kw)(x)


@needs_libtpu
def test_summary_reads_the_compiler():
    cost = pl.CostEstimate(flops=1024 * 512, transcendentals=0, bytes_accessed=2 * 1024 * 512 * 4)
    c = aot.compile(lambda x: _doubled(x, name="double", cost_estimate=cost) + 1,
                    S((1024, 512), jnp.float32), chip="v5e")
    s = c.summary
    assert s.chip == "v5e" and s.argument_bytes == s.output_bytes == 1024 * 512 * 4
    [k] = s.kernels
    assert k.name == "double" and k.flops == 1024 * 512 and k.bytes_accessed == cost.bytes_accessed
    block = 256 * 512 * 4
    assert block <= k.vmem_bytes <= 4 * block       # Mosaic's buffers for the blocks
    assert s.optimal_seconds > 0 and s.flops >= 1024 * 512 and "double" in s.format()
    assert "tpu_custom_call" in c.as_text()


@needs_libtpu
def test_int64_index_maps_are_explained():
    with jax.enable_x64(True):   # what the runtime sets; a raw pallas_call leaks it
        with pytest.raises(Exception) as info:
            aot.compile(_doubled, S((1024, 512), jnp.float32), chip="v6e")
    assert "int64" in aot.explain(info.value)


@needs_libtpu
def test_vmem_overflow_is_explained():
    def big(x):    # 4 x 8 MiB blocks: over v5e's default 16 MiB scoped limit
        return _doubled(x, block=(4096, 512))
    with pytest.raises(Exception) as info:
        aot.compile(big, S((8192, 512), jnp.float32), chip="v5e")
    reason = aot.explain(info.value)
    assert reason.startswith("VMEM") and "16.00M" in reason, reason
    # the same kernel with a raised limit compiles
    ok = aot.compile(lambda x: _doubled(x, block=(4096, 512), compiler_params=pltpu.CompilerParams(
        vmem_limit_bytes=64 * tpu_info.MiB)), S((8192, 512), jnp.float32), chip="v5e")
    assert ok.summary.kernels[0].vmem_bytes == 32 * tpu_info.MiB


@needs_libtpu
def test_unaligned_packed_dma_is_explained():
    def one_row(i_ref, x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(i_ref[0], 1)], buf, sem)
        copy.start()
        copy.wait()
        o_ref[...] = jnp.broadcast_to(buf[...], o_ref.shape)

    def gather(i, x):
        return pl.pallas_call(one_row, out_shape=S((8, 128), x.dtype),
                              grid_spec=pltpu.PrefetchScalarGridSpec(
                                  num_scalar_prefetch=1, grid=(1,),
                                  in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                                  out_specs=pl.BlockSpec((8, 128), lambda g, i: (0, 0)),
                                  scratch_shapes=[pltpu.VMEM((1, 128), x.dtype),
                                                  pltpu.SemaphoreType.DMA(())]))(i, x)
    aot.compile(gather, S((1,), jnp.int32), S((64, 128), jnp.float32), chip="v6e")  # 32-bit: ok
    with pytest.raises(Exception) as info:    # bf16 rows are packed in pairs: whole tiles only
        aot.compile(gather, S((1,), jnp.int32), S((64, 128), jnp.bfloat16), chip="v6e")
    assert "tile-aligned" in aot.explain(info.value), aot.explain(info.value)


def test_target_is_decided_in_one_place(monkeypatch):
    monkeypatch.setattr(tpu_info, "on_tpu", lambda: False)
    assert tpu_info.target() == tpu_info.Target(tpu_info.CHIPS[tpu_info.INTERPRET_CHIP], True)
    with pytest.raises(ValueError, match="aot.compile"):
        tpu_info.target(interpret=False)          # Mosaic off TPU, but for which chip?
    with tpu_info.compile_for("v7"):              # an alias of v7x
        assert tpu_info.target() == tpu_info.Target(tpu_info.CHIPS["v7x"], False)
        assert tpu_info.pinned() is tpu_info.CHIPS["v7x"]
    assert tpu_info.pinned() is None and tpu_info.target().interpret
    with pytest.raises(ValueError, match="unknown TPU chip"):
        tpu_info.chip("v9z")


def test_compile_for_names_the_chip_to_pallas():
    from jax._src.pallas.mosaic import tpu_info as jax_info
    before = jax_info.registry.get("cpu")
    with tpu_info.compile_for("v5e"):
        assert jax_info.get_tpu_info().chip_version == jax_info.ChipVersion.TPU_V5E
    assert jax_info.registry.get("cpu") is before


def test_explain_keeps_unknown_errors_short():
    assert aot.explain(RuntimeError("first line\nsecond")) == "RuntimeError: first line"


def test_every_kernel_impl_has_production_arguments():
    """The coverage report's "compiles on" column compiles every Pallas/Helion impl at
    production shapes: each kernel-bound op needs its arguments in aot/impls.py."""
    from tpu_kernels.aot.impls import ARGS
    from tpu_kernels.registry import REGISTRY
    bound = {op.name() for op in REGISTRY.ops()
             if any(i.kind in ("pallas", "helion") for i in REGISTRY.impls(op))}
    assert bound - set(ARGS) == set()


@needs_libtpu
def test_check_impls_compiles_registry_impls():
    [r] = aot.check_impls(["v6e"], ops=["aten::mm"])
    assert (r.op, r.impl, r.chip, r.status) == ("aten::mm", "pallas:mm", "v6e", "ok"), r
    assert r.vmem_bytes and r.vmem_bytes <= tpu_info.CHIPS["v6e"].vmem_bytes


@needs_libtpu
def test_report_tables(tmp_path):
    """bench/aot_report.py: the kernel x chip table with VMEM and compile time, and each
    program's HBM figures, from a real compile."""
    from tpu_kernels.bench import aot_report
    out = tmp_path / "aot.md"
    assert aot_report.main(["--chips", "v6e", "--models", "", "--kernels", "bmm", "-o", str(out)]) == 0
    text = out.read_text()
    assert "| kernel | v6e |" in text and "Compile time of the whole set" in text
    [row] = [line for line in text.splitlines() if line.startswith("| bmm | ok ")]
    assert "MiB" in row and row.rstrip(" |").endswith(" s"), row
    assert any(line.startswith("| bmm | v6e | ") for line in text.splitlines())


def test_step_report_keeps_each_programs_failure():
    """A training step whose backward does not fit still reports the programs that compiled,
    and says why the step does not run; no step time or MFU is claimed for it."""
    from tpu_kernels.aot.summary import Summary
    from tpu_kernels.aot.training import StepReport
    fwd = Summary(chip="v5e", kernels=(), argument_bytes=1 << 30, output_bytes=1 << 20, alias_bytes=0,
                  temp_bytes=2 << 30, generated_code_bytes=0, flops=1e12, bytes_accessed=1e9,
                  transcendentals=0.0, optimal_seconds=0.01, compile_seconds=1.0,
                  unknown_calls=("SomeCall",))
    why = "HBM: the program's temporaries need 20G, the chip has 16G"
    r = StepReport("m", "v5e", params=10, tokens=8, model_flops=1e12, programs=[("forward", fwd)],
                   failures=[("backward", why)])
    assert not r.ok and r.step_seconds is None and r.mfu is None
    assert r.peak_hbm_bytes == fwd.hbm_bytes
    text = r.format()
    assert f"backward  does not compile: {why}" in text and "does not fit one v5e" in text
    ok = StepReport("m", "v5e", params=10, tokens=8, model_flops=1e12, programs=[("forward", fwd)])
    assert ok.ok and ok.step_seconds == 0.01 and "uncertain: custom calls SomeCall" in ok.format()


def test_uncosted_calls_are_corrected_in_the_entry_computation_only():
    """XLA's estimate counts -1 s per uncosted custom call in the entry computation, and for
    some of those in a loop body (v7x's SparseCore offloads put PrepareAsyncCall pairs
    there, never counted: the correction once added them too and reported
    qwen3-moe-small's forward as 16 s)."""
    from tpu_kernels.aot import summary

    call = '  %{0} = s32[] custom-call(), custom_call_target="{1}"\n'
    text = ("HloModule m\n\n%body (p: s32[]) -> s32[] {\n"
            + call.format("a", "PrepareAsyncCallStart") + call.format("b", "PrepareAsyncCallDone")
            + "}\n\nENTRY %main () -> s32[] {\n" + call.format("c", "X64Combine")
            + call.format("d", "PrepareAsyncCallStart") + "  ROOT %w = s32[] while(%c)\n}\n")

    class Fake:
        def memory_analysis(self):
            return type("M", (), dict(argument_size_in_bytes=0, output_size_in_bytes=0,
                                      alias_size_in_bytes=0, temp_size_in_bytes=0,
                                      generated_code_size_in_bytes=0))()

        def cost_analysis(self):
            return {"optimal_seconds": -2.0 + 1e-4, "flops": 1.0}

        def as_text(self):
            return text

    s = summary.summarize(Fake(), "v7x", 0.0)
    assert s.optimal_seconds == pytest.approx(1e-4) and s.loops == 1
    # a ConcatBitcast in a loop body: counted by XLA in a windowed einsum's loop (-1 s
    # more), not in a routing loop's: added back only where the estimate is still short
    text = text.replace('"PrepareAsyncCallDone"', '"ConcatBitcast"')
    assert summary.summarize(Fake(), "v5e", 0.0).optimal_seconds == pytest.approx(1e-4)
    Fake.cost_analysis = lambda self: {"optimal_seconds": -3.0 + 1e-4, "flops": 1.0}
    assert summary.summarize(Fake(), "v6e", 0.0).optimal_seconds == pytest.approx(1e-4)
