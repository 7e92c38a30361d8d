"""The runtime container's command line, built from the engine fields (runtime CLI contract)."""

from __future__ import annotations

from kubernetes.utils.quantity import parse_quantity

from pagoda.contract import CACHE_DIR, HTTP_PORT, MANAGEMENT_PUBLIC_KEY_PATH, TLS_CERT_PATH, TLS_KEY_PATH
from pagoda.operator.api import InferenceServiceSpec

from .chattemplate import CHAT_TEMPLATE_PATH

COMMAND = ["pagoda-runtime"]


def runtime_args(spec: InferenceServiceSpec, management: bool = False) -> list[str]:
    """`serve ...` arguments for `pagoda-runtime`; extraArgs go after `--` verbatim. `management`: the pod
    mounts the operator's public key (resources/management.py)."""
    engine = spec.engine
    args = ["serve", "--model", spec.model.uri]
    if spec.model.served_name:
        args += ["--served-model-name", spec.model.served_name]
    if spec.model.revision:
        args += ["--revision", spec.model.revision]
    args += ["--host", "0.0.0.0", "--port", str(HTTP_PORT), "--dtype", engine.dtype]
    if engine.quantization != "none":
        args += ["--quantization", engine.quantization]
    args += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    args += ["--gpu-memory-utilization", _float(engine.gpu_memory_utilization)]
    args += ["--block-size", str(engine.block_size)]
    args.append("--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching")
    if engine.max_num_seqs is not None:
        args += ["--max-num-seqs", str(engine.max_num_seqs)]
    if engine.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    if engine.chat_template is not None:  # the operator's copy, mounted into the pod (chattemplate.py)
        args += ["--chat-template", CHAT_TEMPLATE_PATH]
    if spec.lora is not None:  # the limits only: the adapters are loaded at run time (no restart)
        args += ["--max-loras", str(spec.lora.max_loras), "--max-lora-rank", str(spec.lora.max_lora_rank)]
        if spec.lora.max_cpu_loras is not None:
            args += ["--max-cpu-loras", str(spec.lora.max_cpu_loras)]
    args += ["--drain-timeout", str(spec.runtime.drain_timeout_seconds), "--cache-dir", CACHE_DIR]
    if spec.runtime.stall_timeout_seconds is not None:  # else the runtime's default, scaled to the engine
        args += ["--stall-timeout", str(spec.runtime.stall_timeout_seconds)]
    if spec.runtime.max_request_body_bytes is not None:  # else the runtime's default
        args += ["--max-request-body-bytes", str(spec.runtime.max_request_body_bytes)]
    if spec.model.node_cache and spec.model.cache and spec.model.cache.size is not None:
        bound = parse_quantity(str(spec.model.cache.size))  # type: ignore[no-untyped-call]
        args += ["--cache-max-bytes", str(int(bound))]
    if management:
        args += ["--management-public-key-file", MANAGEMENT_PUBLIC_KEY_PATH]
    if spec.runtime.tls is not None:  # the Secret, mounted by pod.py
        args += ["--tls-cert-file", TLS_CERT_PATH, "--tls-key-file", TLS_KEY_PATH]
    if engine.extra_args:
        args += ["--", *engine.extra_args]
    return args


def _float(value: float) -> str:
    """Shortest exact text for a float (0.9, not 0.9000000000000001)."""
    return repr(float(value))
