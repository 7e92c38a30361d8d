"""The contract between the operator and the runtime, defined once: what the pods the operator writes and the
runtime inside them must agree on.

Only the standard library, like vllmflags.py: the operator imports it without the engine, the runtime
without the operator. tests/unit/test_contract.py fails when operator/ or runtime/ spells one of these values
out again instead of importing it. The JSON the two send each other is typed in payloads.py (pydantic, which
both have).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

# The container: its HTTP port (the OpenAI API, /metrics, the probes, the management API), where downloaded
# models go (a volume: the root filesystem is read-only), where pvc:// claims are mounted.
HTTP_PORT = 8000
PORT_NAME = "http"
CACHE_DIR = "/var/cache/pagoda"
MODELS_DIR = "/mnt/models"
# An oci:// model: the image is mounted read-only here (a Kubernetes image volume), its files at the top.
IMAGE_MODEL_DIR = "/mnt/model-image"
# An OCI image reference after oci://: registry host[:port], a repository path, then a tag and/or a digest.
# RE2-compatible (also a CEL rule of the CRD) and unanchored.
OCI_REFERENCE_PATTERN = (
    r"[A-Za-z0-9]([-.A-Za-z0-9]*[A-Za-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)+"
    r"(:[A-Za-z0-9_][-.A-Za-z0-9_]{0,127})?(@sha256:[a-f0-9]{64})?"
)

# The name a model is served under when none is given (spec.model.servedName, --served-model-name), from its
# URI alone: an hf:// model its repository id (hf://org/name serves `org/name`, hf://gpt2 `gpt2`); an oci://
# model the last part of IMAGE_MODEL_DIR, where the image is mounted (`model-image`); a file://, pvc:// or
# s3:// model the last part of its path that is neither empty nor `.` (file:///models/tiny/ serves `tiny`,
# pvc://claim `claim`). default_served_name is the rule in Python (the runtime, the operator's models),
# default_served_name_cel the same rule in CEL (the CRD's admission); tests/unit/test_served_name.py holds
# the two spellings to each other and to the runtime.
IMAGE_MODEL_NAME = IMAGE_MODEL_DIR.rsplit("/", 1)[-1]
_HF_SCHEME = "hf://"
_OCI_SCHEME = "oci://"
_SCHEME_END = "://"


def default_served_name(uri: str) -> str:
    """The name the runtime serves the model of `uri` under when it is given none (string only: nothing is
    read). A bare path is a file:// one; the last part of a path is what pathlib's Path.name reads."""
    _, sep, rest = uri.partition(_SCHEME_END)
    if not sep:
        rest = uri
    elif uri.startswith(_OCI_SCHEME):
        return IMAGE_MODEL_NAME
    elif uri.startswith(_HF_SCHEME):
        return rest.strip("/")
    parts = [part for part in rest.split("/") if part not in ("", ".")]
    return parts[-1] if parts else rest


def default_served_name_cel(uri: str) -> str:
    """default_served_name in CEL, `uri` being the CEL expression of the URI (always with a scheme, as the
    CRD's pattern has it; an hf:// one with at most one trailing '/'). Uses the Kubernetes CEL strings
    library (split, substring, indexOf), which the API server has in every version the CRD supports."""
    # The URI's parts, less the empty ones and `.`: the first is the scheme's ('file:'), the path's follow.
    parts = f"{uri}.split('/').filter(p, p != '' && p != '.')"
    rest = f"{uri}.substring({uri}.indexOf('{_SCHEME_END}') + {len(_SCHEME_END)})"
    hf_end = f"size({uri}) - ({uri}.endsWith('/') ? 1 : 0)"
    return (
        f"({uri}.startsWith('{_OCI_SCHEME}') ? '{IMAGE_MODEL_NAME}'"
        f" : {uri}.startsWith('{_HF_SCHEME}') ? {uri}.substring({len(_HF_SCHEME)}, {hf_end})"
        f" : size({parts}) > 1 ? {parts}[size({parts}) - 1] : {rest})"
    )


# Why a runtime could not start: it writes a short reason to the file this variable names (the container's
# terminationMessagePath); the kubelet keeps it in lastState.terminated.message, the operator puts it in the
# Degraded condition.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_ENV = "PAGODA_TERMINATION_MESSAGE_PATH"

# The inference API: the routes of vLLM's app the runtime forwards (runtime/serving/routes.py), each with its
# methods; every other path of vLLM's app answers 404. With spec.runtime.apiKeySecret each needs the key.
INFERENCE_API = {
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
    "/v1/embeddings": ("POST",),
    "/v1/models": ("GET",),
}
# The runtime's default request body limit (`--max-request-body-bytes`; spec.runtime.maxRequestBodyBytes
# when unset): a chat request with 128k tokens of English context is about 0.5 MB, and 16 MiB leaves room
# for a few inline base64 images.
MAX_REQUEST_BODY_BYTES = 16 * 1024**2

# The runtime's management API, which the operator calls on each Ready pod.
ADAPTERS_PATH = "/v1/pagoda/adapters"  # GET the loaded adapters; PUT/DELETE /{name}
CAPACITY_PATH = "/v1/pagoda/capacity"  # GET the KV cache's size and limits, and the start-up phases
# What these paths answer is typed in payloads.py (Capacity, AdapterList, AdapterEntry).
# The runtime's start-up phases, in order (runtime/serving/startup.py), as CAPACITY_PATH reports them under
# `startup` (payloads.StartupRecord) and the operator copies them into status.startup between the kubelet's
# phases.
STARTUP_PHASES = ("imports", "modelFetch", "engineSetup", "weightLoad", "engineInit", "apiServer")
# Calls to ADAPTERS_PATH must be signed by the operator (contract/management.py); the pod holds the public key
# in this file, mounted from the ConfigMap the operator writes per service.
MANAGEMENT_KEY_DIR = "/etc/pagoda/management"
MANAGEMENT_KEY_FILE = "public-key.pem"
MANAGEMENT_PUBLIC_KEY_PATH = f"{MANAGEMENT_KEY_DIR}/{MANAGEMENT_KEY_FILE}"

# TLS (spec.runtime.tls): the Secret (type kubernetes.io/tls, cert-manager's key names) is mounted read-only
# here; the runtime gets the two files as --tls-cert-file and --tls-key-file and reloads them when the kubelet
# swaps in a renewed certificate. ca.crt, when the Secret has one, is what clients verify the pods against.
TLS_DIR = "/etc/pagoda/tls"
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"
TLS_CA_KEY = "ca.crt"
TLS_CERT_PATH = f"{TLS_DIR}/{TLS_CERT_KEY}"
TLS_KEY_PATH = f"{TLS_DIR}/{TLS_KEY_KEY}"

# The runtime's gauges the ScaledObject's Prometheus queries read (docs/observability.md).
QUEUE_DEPTH_METRIC = "pagoda_queue_depth"
RUNNING_REQUESTS_METRIC = "pagoda_running_requests"
KV_CACHE_USAGE_METRIC = "pagoda_kv_cache_usage_ratio"

# The capacity profile's defaults (spec.slo, `pagoda-runtime profile`): the concurrency steps, the synthetic
# request shape in tokens, and how long each step runs.
PROFILE_STREAMS = (1, 2, 4, 8, 16)
PROFILE_PROMPT_TOKENS = 256
PROFILE_OUTPUT_TOKENS = 128
PROFILE_STEP_SECONDS = 30
# Engine tuning (`profile --tune-engine`, spec.slo.tuneEngine): the most servers one profile starts and
# measures, the spec's own engine settings first, then candidates for the batch settings it leaves unset.
TUNE_MAX_RUNS = 6

# Values the spec may give and the runtime accepts (the CRD's enums, the runtime's checks).
DTYPES = ("auto", "float16", "bfloat16", "float32")
QUANTIZATIONS = ("awq", "gptq", "fp8")  # the spec adds "none" for no quantization
BLOCK_SIZES = (8, 16, 32, 64, 128)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
S3_BUCKET_PATTERN = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"  # unanchored: also part of the spec's URI pattern

# The same values as types for pydantic (a Literal of a tuple is the Literal of its items, with the enum in
# the CRD's schema); mypy, which cannot read a Literal built from a variable, sees the plain type.
if TYPE_CHECKING:
    Dtype = str
    Quantization = str
    BlockSize = int
    LoraRank = int
else:
    Dtype = Literal[DTYPES]
    Quantization = Literal[QUANTIZATIONS]
    BlockSize = Literal[BLOCK_SIZES]
    LoraRank = Literal[LORA_RANKS]

# The management API's signatures (contract/management.py): the Authorization scheme, the version of the
# signed string (a new one whenever what is signed changes: operator and runtime are then upgraded together,
# docs/install.md), the clock skew a signature may have, and the downward-API variables that tell a runtime
# which pod it is, so that a call signed for one pod is refused by every other (operator/resources/pod.py
# sets them on a pod that mounts the operator's public key).
MANAGEMENT_AUTH_SCHEME = "Pagoda-Ed25519"
MANAGEMENT_SIGNATURE_VERSION = 2
MANAGEMENT_MAX_SKEW_SECONDS = 60
POD_UID_ENV = "POD_UID"  # metadata.uid
POD_IP_ENV = "POD_IP"  # status.podIP


def rfc3339(epoch: float) -> str:
    """A time in the runtime's payloads (start-up phases, the model cache): `2026-12-04T06:01:02.345Z`, in UTC
    with milliseconds (the Pod's own timestamps have whole seconds only)."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
