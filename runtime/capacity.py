"""What the loaded engine's KV cache holds: tokens, and full-length requests at once.

vLLM sizes the cache after profiling (num_gpu_blocks blocks of block_size tokens) in its EngineCore process
and hands the numbers back to the runtime's process in the start-up handshake; from then on they are in
the engine's `vllm_config.cache_config` (`kv_cache_size_tokens`, `kv_cache_max_concurrency`: the numbers
vLLM logs as "KV cache size: N tokens, Maximum concurrency for M tokens per request: Xx"). They do not change
for the life of the pod. `/metrics` exports them as gauges and `/v1/pagoda/capacity` as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagoda.runtime import contract

PATH = contract.CAPACITY_PATH


@dataclass(frozen=True)
class KvCacheCapacity:
    tokens: int  # tokens the KV cache holds
    max_model_len: int  # tokens per request at most
    max_concurrency: float  # requests of max_model_len tokens that fit at once
    block_size: int  # tokens per KV-cache block

    def as_json(self) -> dict[str, int | float]:
        return {
            "kvCacheTokens": self.tokens,
            "maxModelLen": self.max_model_len,
            "maxConcurrency": self.max_concurrency,
            "blockSize": self.block_size,
        }


def from_vllm_config(vllm_config: Any) -> KvCacheCapacity | None:
    """The capacity of a started engine (its `vllm_config`); None when vLLM did not report one.

    vLLM's own token count is group-aware (hybrid models); an engine without it (older vLLM) falls back to
    num_gpu_blocks * block_size, the same number for a plain transformer."""
    cache, model = vllm_config.cache_config, vllm_config.model_config
    max_model_len = int(model.max_model_len or 0)
    block_size = int(cache.block_size or 0)
    tokens = getattr(cache, "kv_cache_size_tokens", None)
    concurrency = getattr(cache, "kv_cache_max_concurrency", None)
    if tokens is None:
        blocks = cache.num_gpu_blocks
        if not blocks or not block_size:
            return None
        tokens = int(blocks) * block_size
    if concurrency is None:
        concurrency = tokens / max_model_len if max_model_len else 0.0
    return KvCacheCapacity(int(tokens), max_model_len, float(concurrency), block_size)
