"""Fatal errors as a termination message a person can act on.

When `pagoda-runtime serve` cannot start, or its engine stalls while serving, it exits non-zero and writes one
short message to the file named by `PAGODA_TERMINATION_MESSAGE_PATH` (the operator sets it to the container's
terminationMessagePath, /dev/termination-log). Kubernetes shows the message in the pod's
`status.containerStatuses[].lastState.terminated.message`, and the operator copies it into the
InferenceService's Degraded condition. The message is `<Reason>: <what happened>; <what to change>`: the
reason is a stable CamelCase word (documented in docs/runtime.md), the rest names the InferenceService field
to change.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from pagoda import contract
from pagoda.runtime.serving.enginefailure import EngineFailure
from pagoda.runtime.serving.startup import StartupClock

log = logging.getLogger("pagoda.runtime")

PATH_ENV = contract.TERMINATION_MESSAGE_ENV
MAX_BYTES = 4096  # what the kubelet keeps of a termination message
MAX_DETAIL_CHARS = 1500  # of an error text quoted from vLLM

# vLLM 0.32 (v1/core/kv_cache_utils.py, _check_enough_kv_cache_memory) when the KV cache is too small for
# one request of max_model_len tokens; and when no memory is left for the cache at all.
_KV_TOO_SMALL = re.compile(
    r"max seq len \((?P<len>\d+)\), \((?P<need>[\d.]+) GiB KV cache is needed, which is larger than "
    r"the available KV cache memory \((?P<have>[\d.]+) GiB\)"
)
_KV_ESTIMATE = re.compile(r"estimated maximum model length is (?P<fit>\d+)")
_NO_KV_MEMORY = "No available memory for the cache blocks"
# vLLM 0.32 (config/model.py, _get_and_verify_max_len) when max_model_len exceeds the model's context.
_LONGER_THAN_MODEL = re.compile(
    r"User-specified max_model_len \((?P<len>\d+)\) is greater than the derived max_model_len "
    r"\((?P<key>\w+)=(?P<limit>[\d.]+)"
)


@dataclass(frozen=True)
class Fatal:
    """Why the runtime cannot start: a stable CamelCase `reason` and a message naming what to change."""

    reason: str
    message: str

    def text(self) -> str:
        return f"{self.reason}: {self.message}"


def write(fatal: Fatal, path: str | None = None, *, error: bool = True) -> None:
    """Log the failure (`error`: as one) and write it to the termination-message file (when one is
    configured)."""
    if error:
        log.error("Exiting on a fatal error reason=%s message=%r", fatal.reason, fatal.message)
    path = path or os.environ.get(PATH_ENV)
    if not path:
        return
    data = fatal.text().encode("utf-8")[:MAX_BYTES].decode("utf-8", "ignore")
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(data)
    except OSError as exc:
        log.warning("Failed to write termination message path=%s error=%s", path, exc)


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 3] + "..."


def invalid_config(message: str) -> Fatal:
    return Fatal(
        "InvalidConfig",
        f"{_quote(message)}; the runtime's flags come from the InferenceService's spec.model, spec.engine "
        "and spec.runtime, the arguments after -- from spec.engine.extraArgs: fix the one named",
    )


def tls_invalid(message: str) -> Fatal:
    """--tls-cert-file or --tls-key-file cannot be served (tls.TlsError's text names the flag)."""
    return Fatal(
        "TlsCertificateInvalid",
        f"{_quote(message)}; the files come from the Secret spec.runtime.tls.secretName names (keys tls.crt "
        "and tls.key: a PEM certificate and its unencrypted private key, as cert-manager writes them): fix "
        "the Secret or the Certificate that writes it",
    )


_MODEL_HINTS = {
    "ModelNotFound": "fix spec.model.uri (and spec.model.revision for hf://), or put the model there",
    "ModelInvalid": "spec.model.uri must point at a Hugging Face-format model directory "
    "(config.json, weights, tokenizer)",
    "ModelAccessDenied": "put valid credentials in the Secret named by spec.model.credentialsSecret",
    "ModelDownloadFailed": "check spec.model.uri and that the store is reachable from the pod; "
    "the pod retries on restart",
}


def model_source(reason: str, message: str) -> Fatal:
    """A model that cannot be resolved (modeluri.ModelSourceError's reason and text)."""
    hint = _MODEL_HINTS.get(reason, "fix spec.model.uri")
    return Fatal(reason, f"{_quote(message)} (spec.model.uri); {hint}")


def engine_stalled(seconds: float, timeout: float) -> Fatal:
    return Fatal(
        "EngineStalled",
        f"the vLLM engine had requests and completed no step for {seconds:.0f}s (the limit is "
        f"{timeout:.0f}s); the container restarts; if one engine step can take that long, raise "
        "spec.runtime.stallTimeoutSeconds",
    )


def stopped_while_loading(clock: StartupClock) -> Fatal:
    """Stopped before the model was loaded: the kubelet does that when the startup probe runs out, and then
    keeps this message; the phase it was in says where the start-up budget went."""
    return Fatal(
        "StoppedWhileLoading",
        f"stopped {clock.total() + clock.in_phase():.0f}s after the process started, in start-up phase "
        f"{clock.current} for {clock.in_phase():.0f}s (done before it: {clock.summary()})",
    )


def bind_failed(host: str, port: int, error: str) -> Fatal:
    return Fatal("BindFailed", f"could not listen on {host}:{port} ({error}); another process holds the port")


def engine_start(
    error: BaseException,
    root: EngineFailure | None,
    max_model_len: int | None,
    cpu_kv_space: str | None = None,
) -> Fatal:
    """The engine did not start: `root` is what its own process reported (enginefailure.py), `error` what
    the runtime saw. The first that says something specific wins; else a generic EngineStartFailed.
    `cpu_kv_space`: VLLM_CPU_KVCACHE_SPACE on vLLM's CPU backend (what sizes its KV cache there)."""
    seen = [root] if root is not None else []
    seen.append(EngineFailure(type(error).__name__, str(error)))
    for failure in seen:
        fatal = _specific(failure, max_model_len, cpu_kv_space)
        if fatal is not None:
            return fatal
    first = seen[0]
    return Fatal(
        "EngineStartFailed",
        f"the vLLM engine failed to start: {first.type}: {_quote(first.message)}; "
        "see the container log for the traceback",
    )


def _grow_cache(cpu_kv_space: str | None) -> str:
    """The knobs that give the KV cache more memory."""
    knobs = "raise spec.engine.gpuMemoryUtilization, or add GPUs with spec.engine.tensorParallelSize"
    if cpu_kv_space is not None:
        knobs += f" (on CPU: raise VLLM_CPU_KVCACHE_SPACE in spec.runtime.env, now {cpu_kv_space} GiB)"
    return knobs


def _specific(failure: EngineFailure, max_model_len: int | None, cpu_kv_space: str | None) -> Fatal | None:
    text = failure.message
    grow = _grow_cache(cpu_kv_space)
    if match := _KV_TOO_SMALL.search(text):
        return _kv_too_small(match, _KV_ESTIMATE.search(text), max_model_len, grow)
    if _NO_KV_MEMORY in text:
        return Fatal(
            "ModelDoesNotFit",
            f"the model's weights leave no memory for the KV cache; {grow}, "
            "or serve a quantized model (spec.engine.quantization)",
        )
    if failure.type == "OutOfMemoryError" or "CUDA out of memory" in text:
        return Fatal(
            "ModelDoesNotFit",
            f"the GPU ran out of memory while loading the model ({_quote(text)}); {grow}, "
            "or serve a quantized model (spec.engine.quantization)",
        )
    if failure.type == "SafetensorError":
        return Fatal(
            "ModelInvalid",
            f"the model's weights cannot be read ({_quote(text)}) (spec.model.uri); the copy is broken or "
            "incomplete: copy the model there again",
        )
    if match := _LONGER_THAN_MODEL.search(text):
        limit = int(float(match["limit"]))
        return Fatal(
            "MaxModelLenTooLarge",
            f"maxModelLen {match['len']} is longer than the model's context ({match['key']}={limit} in its "
            f"config.json); lower spec.engine.maxModelLen to at most {limit}",
        )
    return None


def _kv_too_small(
    match: re.Match[str], estimate: re.Match[str] | None, max_model_len: int | None, grow: str
) -> Fatal:
    """`spec.engine.maxModelLen=X needs Y GiB of KV cache but Z GiB is available; lower
    spec.engine.maxModelLen to at most N, or ...`, with vLLM's numbers (N: its estimate of the longest
    request that fits)."""
    length = int(match["len"])
    if max_model_len is not None:
        which, lower = f"spec.engine.maxModelLen={length}", "lower spec.engine.maxModelLen"
    else:
        which = f"the model's context length {length} (spec.engine.maxModelLen unset)"
        lower = "set spec.engine.maxModelLen"
    fit = int(estimate["fit"]) if estimate else 0
    need, have = match["need"], match["have"]  # vLLM's GiB, rounded to 0.01: 0.0 says nothing
    if float(need) > 0 and float(have) > 0:
        what = f"{which} needs {need} GiB of KV cache but {have} GiB is available"
    elif fit > 0:
        what = f"{which} needs KV cache for {length} tokens but only {fit} fit"
    else:
        what = f"{which} needs KV cache for {length} tokens but not even one block fits"
    if fit > 0:
        return Fatal("ModelDoesNotFit", f"{what}; {lower} to at most {fit}, or {grow}")
    return Fatal("ModelDoesNotFit", f"{what}; {grow}")
