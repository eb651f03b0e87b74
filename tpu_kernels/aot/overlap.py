"""Compiler options that make libtpu run a pod step's collectives asynchronously, in
flight while compute runs (passed as ``compiler_options`` to ``Lowered.compile``: they
reach a compile-only client, unlike ``LIBTPU_INIT_ARGS`` read once at backend start).

libtpu 0.0.42 overlaps a collective with compute by *async collective fusion*: the
collective is started by a fusion rooted at an ``AsyncCollectiveStart`` custom call,
continues inside the following compute fusions (its steps fused with their work) and ends
at an ``AsyncCollectiveDone`` fusion (``collectives.py`` reads the chain). Its defaults do
this for all-gathers on v5e but not on v6e (checked on a four-layer FSDP matmul chain on
v5e:2x2 and v6e:2x2); these options ask for it on every chip, for all-reduces and
reduce-scatters too, with the latency-hiding scheduler placing starts early.
"""
from __future__ import annotations

# option -> value; every name was checked to exist in libtpu 0.0.42's flags (an unknown
# name fails the compile: "No such compile option")
ASYNC_COLLECTIVES: dict[str, str] = {
    "xla_tpu_enable_async_collective_fusion": "true",
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": "true",
    "xla_tpu_enable_async_collective_fusion_fuse_all_reduce": "true",
    "xla_tpu_enable_async_collective_fusion_fuse_reduce_scatter": "true",
    "xla_tpu_enable_async_collective_fusion_multiple_steps": "true",
    "xla_tpu_overlap_compute_collective_tc": "true",
    "xla_enable_async_all_gather": "true",
    "xla_enable_async_all_reduce": "true",
    "xla_enable_async_reduce_scatter_fusion": "true",
    "xla_tpu_enable_latency_hiding_scheduler": "true",
    "xla_tpu_enable_data_parallel_all_reduce_opt": "true",
    "xla_tpu_data_parallel_opt_different_sized_ops": "true",
    # a collective fused with a matmul needs more scoped VMEM than the default 16 MiB
    # (Llama-3-8B on v5e:16x16: an async collective fusion of an f32[1024,4096] collective
    # with the dot of an f32[4096,4096] weight gradient needed 16.19 MiB, "Scoped
    # allocation ... exceeded scoped vmem limit"); 32 MiB is
    # within every pod chip's VMEM (v5e/v6e 128 MiB, v5p/v7x 64 MiB)
    "xla_tpu_scoped_vmem_limit_kib": "32768",
}


def compiler_options(async_collectives: bool = True) -> dict[str, str]:
    """The options a pod step compiles with: the async-collective ones unless turned off
    (``--sync-collectives``: libtpu's defaults)."""
    return dict(ASYNC_COLLECTIVES) if async_collectives else {}
