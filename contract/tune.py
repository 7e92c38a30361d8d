"""The engine's batch settings that the capacity profile may choose (`pagoda-runtime profile --tune-engine`,
runtime/profiling/tune.py) and the operator applies to the replicas (operator/resources/profile.py): their
serve flags, their keys in the result and in status.profile.engine, and which of them a replica leaves free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pagoda.contract import vllmflags

# The batch settings' serve flags (runtime/serving/config.py) and their fields; their keys in the result's
# `engine` and in status.profile.engine.
FLAGS = {"--max-num-batched-tokens": "max_num_batched_tokens", "--max-num-seqs": "max_num_seqs"}
KEYS = {"max_num_batched_tokens": "maxNumBatchedTokens", "max_num_seqs": "maxNumSeqs"}


def unset(values: Mapping[str, object], extra_args: Sequence[str]) -> frozenset[str]:
    """The batch fields (FLAGS' values) left unset: None in `values` (by field) and not among `extra_args`
    (the vLLM arguments after `--`, in any spelling vLLM accepts)."""
    given = {vllmflags.normalised(arg) for arg in extra_args if arg.startswith("--")}
    return frozenset(
        field
        for flag, field in FLAGS.items()
        if values.get(field) is None and vllmflags.normalised(flag) not in given
    )
