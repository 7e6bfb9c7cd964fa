"""kvpolicy: KV-cache policies for LLM inference (TRIM-KV, DBTrimKV, WG-KV, EpiKV and the
baselines) as a Cache that keeps, per (layer, kv head), exactly what its policy keeps.

    import numpy as np, kvpolicy
    cache = kvpolicy.Cache("streamingllm", layers=2, kv_heads=2, q_heads=4, head_dim=64,
                           max_tokens=4096, budget=256, buffer=16, sinks=4)
    cache.add_sequence(0)
    report = cache.step(0, keys, values, queries=queries)   # [layers, heads, T, head_dim] float32
    report.out, report.evicted, cache.total_length(0)

kvpolicy.policies() lists every policy with its options and defaults; kvpolicy.__version__ is the
library's version. Errors are kvpolicy.Error
(a ValueError) with the library's message; a call that fails changes nothing.
"""
from ._core import Cache, Error, Producer, Report, example_gate, policies
from ._core import __version__

__all__ = ["Cache", "Error", "Producer", "Report", "example_gate", "policies"]
