"""What the loaded engine's KV cache holds (tokens, and full-length requests at once) and its batch limits.

vLLM sizes the cache after profiling (num_gpu_blocks blocks of block_size tokens) in its EngineCore process
and hands the numbers back to the runtime's process in the start-up handshake; from then on they are in
the engine's `vllm_config.cache_config` (`kv_cache_size_tokens`, `kv_cache_max_concurrency`: the numbers
vLLM logs as "KV cache size: N tokens, Maximum concurrency for M tokens per request: Xx"). The batch limits
are the scheduler's, as vLLM resolved them (its defaults depend on the device: 2048 tokens and 128 sequences a
step on CPU, 8192 and 1024 on an H100): the capacity profile reads them to tune them (profile.py). None of
this changes for the life of the pod. `/metrics` exports the cache's numbers as gauges and
`/v1/pagoda/capacity` all of them as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagoda import contract
from pagoda.contract import payloads

PATH = contract.CAPACITY_PATH


@dataclass(frozen=True)
class KvCacheCapacity:
    tokens: int  # tokens the KV cache holds
    max_model_len: int  # tokens per request at most
    max_concurrency: float  # requests of max_model_len tokens that fit at once
    block_size: int  # tokens per KV-cache block
    max_num_seqs: int | None = None  # sequences in one engine step, at most
    max_num_batched_tokens: int | None = None  # tokens in one engine step, at most

    def payload(
        self,
        startup: payloads.StartupRecord | None = None,
        model_cache: payloads.ModelCacheReport | None = None,
    ) -> payloads.Capacity:
        """What /v1/pagoda/capacity answers: these numbers, with the start-up record and the model cache
        when there are (server.py); a batch limit vLLM did not report is left out."""
        optional: dict[str, Any] = {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "startup": startup,
            "model_cache": model_cache,
        }
        return payloads.Capacity(
            kv_cache_tokens=self.tokens,
            max_model_len=self.max_model_len,
            max_concurrency=self.max_concurrency,
            block_size=self.block_size,
            **{name: value for name, value in optional.items() if value is not None},
        )


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
    scheduler = getattr(vllm_config, "scheduler_config", None)
    seqs = getattr(scheduler, "max_num_seqs", None)
    budget = getattr(scheduler, "max_num_batched_tokens", None)
    return KvCacheCapacity(
        int(tokens),
        max_model_len,
        float(concurrency),
        block_size,
        int(seqs) if seqs else None,
        int(budget) if budget else None,
    )
