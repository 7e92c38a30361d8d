"""The contract between the operator and the runtime, defined once: what the pods the operator writes and the
runtime inside them must agree on.

Only the standard library, like vllmflags.py: the operator imports it without the engine, the runtime
without the operator. tests/unit/test_contract.py fails when operator/ or runtime/ spells one of these values
out again instead of importing it.
"""

from __future__ import annotations

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

# Why a runtime could not start: it writes a short reason to the file this variable names (the container's
# terminationMessagePath); the kubelet keeps it in lastState.terminated.message, the operator puts it in the
# Degraded condition.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_ENV = "PAGODA_TERMINATION_MESSAGE_PATH"

# The runtime's management API, which the operator calls on each Ready pod.
ADAPTERS_PATH = "/v1/pagoda/adapters"  # GET the loaded adapters; PUT/DELETE /{name}
CAPACITY_PATH = "/v1/pagoda/capacity"  # GET the KV cache's size and limits, and the start-up phases
# The runtime's start-up phases, in order (runtime/startup.py), as CAPACITY_PATH reports them under `startup`
# and the operator copies them into status.startup between the kubelet's phases.
STARTUP_PHASES = ("imports", "modelFetch", "engineSetup", "weightLoad", "engineInit", "apiServer")
# Calls to ADAPTERS_PATH must be signed by the operator (runtime/management.py); the pod holds the public key
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
