"""A small serving engine (not a server): a paged KV cache, continuous batching, and a
Llama-shaped model's steps with attention through ``tpu_kernels::ragged_paged_attention``.
See ``docs/serving.md``."""
from tpu_kernels.serving.engine import Engine, EngineConfig, EngineStats
from tpu_kernels.serving.kv_cache import PageAllocator, PagedKVCache
from tpu_kernels.serving.scheduler import Request, Scheduler

__all__ = ["Engine", "EngineConfig", "EngineStats", "PageAllocator", "PagedKVCache", "Request",
           "Scheduler"]
