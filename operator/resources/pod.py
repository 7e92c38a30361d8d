"""The pod template: the runtime container, its probes, volumes, security and placement."""

from __future__ import annotations

import copy
from typing import Any

from pagoda.contract import (
    CACHE_DIR,
    HTTP_PORT,
    IMAGE_MODEL_DIR,
    MODELS_DIR,
    POD_IP_ENV,
    POD_UID_ENV,
    PORT_NAME,
    TERMINATION_MESSAGE_ENV,
    TERMINATION_MESSAGE_PATH,
)
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.api.model import NODE_CACHE_ROOT
from pagoda.operator.api.rules import API_KEY_ENV, WRITABLE_ENV

from .args import COMMAND, runtime_args
from .chattemplate import (
    CHAT_TEMPLATE_HASH_ANNOTATION,
    chat_template_mount,
    chat_template_text,
    chat_template_volume,
)
from .management import management_mount, management_volume
from .meta import CONTAINER_NAME, GPU_PRODUCT_LABEL, content_hash, labels, selector
from .quantity import canonical
from .tls import scheme, tls_mount, tls_volume

DEFAULT_RUNTIME_IMAGE = "ghcr.io/pagoda-dev/pagoda-runtime:0.2.0-dev"
PRESTOP_SLEEP_SECONDS = 5  # endpoints controllers and proxies drop the pod before SIGTERM arrives
# After the drain, the runtime (runtime/serving/lifecycle.py) waits up to 15 s for its HTTP server to stop and
# 30 s for the engine to shut down, then reaps its children: the grace period covers all of it, so the kubelet
# never needs SIGKILL.
GRACE_MARGIN_SECONDS = 50
RUN_AS_USER = 65532  # the runtime images' user (runtime/Dockerfile, runtime/Dockerfile.cpu)
# How often the kubelet asks a loading runtime whether it is ready. The pod turns Ready at the first probe
# after the model is loaded (the kubelet runs the readiness probe at once after the startup probe passes),
# so half the period is what a start waits on average: status.startup's `readiness` phase was 6.1 s at 10 s
# and 0 at 2 s (e2e, real node); one GET of /readyz every 2 s costs the runtime nothing.
STARTUP_PERIOD_SECONDS = 2
# Which pod the runtime is (the downward API), for a pod that mounts the operator's public key: the runtime
# accepts only management calls signed for its own UID and addressed to its own IP (contract/management.py).
IDENTITY_ENV = [
    {"name": POD_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
]


def pod_template(
    name: str,
    namespace: str,
    spec: InferenceServiceSpec,
    default_image: str,
    chat_template: str | None = None,
    management: bool = False,
) -> dict[str, Any]:
    """`namespace`: the object's, which names its node cache folder. `chat_template`: the template read
    from the ConfigMap spec.engine.chatTemplate.configMap names (an inline one is in the spec). `management`:
    mount the operator's public key (resources/management.py), without which the runtime's management API
    answers 403."""
    pod: dict[str, Any] = {
        "enableServiceLinks": False,  # a Service named vllm would inject VLLM_PORT, which vLLM misreads
        # The runtime never calls the Kubernetes API: a token in the pod would only be something to steal.
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container(spec, default_image, management)],
        **_cache_owner(spec, default_image),
        "volumes": volumes(name, namespace, spec, management),
        "tolerations": tolerations(spec),
    }
    node_selector = dict(spec.scheduling.node_selector)
    if spec.resources.gpu.product:
        node_selector[GPU_PRODUCT_LABEL] = spec.resources.gpu.product
    if node_selector:
        pod["nodeSelector"] = node_selector
    if spec.scheduling.affinity:
        pod["affinity"] = spec.scheduling.affinity
    spread = topology_spread(name, spec)
    if spread:
        pod["topologySpreadConstraints"] = spread
    if spec.scheduling.priority_class_name:
        pod["priorityClassName"] = spec.scheduling.priority_class_name
    if spec.runtime.image_pull_secrets:  # the runtime image's, and an oci:// model's (an image volume)
        pod["imagePullSecrets"] = [{"name": secret.name} for secret in spec.runtime.image_pull_secrets]
    metadata: dict[str, Any] = {"labels": labels(name)}
    template = chat_template_text(spec, chat_template)
    if template is not None:  # the engine reads it once, at start: a new template rolls the pods
        metadata["annotations"] = {CHAT_TEMPLATE_HASH_ANNOTATION: content_hash(template)}
    return {"metadata": metadata, "spec": pod}


def termination_grace_seconds(spec: InferenceServiceSpec) -> int:
    """preStop sleep + the runtime's drain + a margin for the engine to shut down."""
    return PRESTOP_SLEEP_SECONDS + spec.runtime.drain_timeout_seconds + GRACE_MARGIN_SECONDS


def container(spec: InferenceServiceSpec, default_image: str, management: bool = False) -> dict[str, Any]:
    runtime = spec.runtime
    result: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": runtime.image or default_image,
        "command": list(COMMAND),
        "args": runtime_args(spec, management),
        "ports": [{"name": PORT_NAME, "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "resources": resources(spec),
        "startupProbe": _probe(spec, "/readyz", STARTUP_PERIOD_SECONDS, _startup_failures(spec), 5),
        "livenessProbe": _probe(spec, "/livez", 10, 3, 5),
        "readinessProbe": _probe(spec, "/readyz", 5, 2, 3),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_SECONDS}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": volume_mounts(spec, management),
        # The runtime writes `<Reason>: <message>` there when it cannot start; else the log's tail is used.
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if runtime.image_pull_policy:
        result["imagePullPolicy"] = runtime.image_pull_policy
    # Every name the operator sets here is in rules.OPERATOR_ENV, which spec.runtime.env may not redefine.
    env: list[dict[str, Any]] = [{"name": TERMINATION_MESSAGE_ENV, "value": TERMINATION_MESSAGE_PATH}]
    if management:
        env += copy.deepcopy(IDENTITY_ENV)
    env += [{"name": name, "value": value} for name, value in WRITABLE_ENV.items()]
    env += [var.model_dump(by_alias=True, exclude_none=True) for var in runtime.env]
    if runtime.api_key_secret:
        ref = runtime.api_key_secret
        env.append({"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    result["env"] = env
    if spec.model.credentials_secret:
        result["envFrom"] = [{"secretRef": {"name": spec.model.credentials_secret}}]
    return result


def _startup_failures(spec: InferenceServiceSpec) -> int:
    return -(-spec.runtime.startup_timeout_seconds // STARTUP_PERIOD_SECONDS)


def _probe(spec: InferenceServiceSpec, path: str, period: int, failures: int, timeout: int) -> dict[str, Any]:
    """HTTPS with spec.runtime.tls (the kubelet does not verify a probe's certificate)."""
    return {
        "httpGet": {"path": path, "port": PORT_NAME, "scheme": scheme(spec).upper()},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
        "successThreshold": 1,
    }


def resources(spec: InferenceServiceSpec) -> dict[str, Any]:
    """GPUs and memory: requests equal limits (GPUs cannot be overcommitted, and a pod past its memory is
    killed rather than the node). CPU: a request only, as for the picker: a CFS quota would throttle the
    engine's bursts (tokenisation, sampling, start-up) while the node has idle cores, and the request alone
    already decides scheduling and the pod's share under contention. Canonical quantities, so the API
    server's defaulting leaves the template as written."""
    limits = {spec.resources.gpu.resource_name: str(spec.resources.gpu.count)}
    if spec.resources.memory is not None:
        limits["memory"] = canonical(spec.resources.memory)
    requests = dict(limits)
    if spec.resources.cpu is not None:
        requests["cpu"] = canonical(spec.resources.cpu)
    return {"limits": limits, "requests": requests}


def topology_spread(name: str, spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The spec's spread constraints as written, or by default the replicas across nodes where there is room.

    Preferred (ScheduleAnyway), never required: on a one-node cluster, or when the other nodes have no free
    GPU, a replica still starts where it fits rather than staying Pending. maxSkew 1 is what makes two
    replicas land on two nodes (the scheduler's built-in default spreading, maxSkew 3, would not). Counted
    among the pods of one template revision (matchLabelKeys pod-template-hash), so a rolling update spreads
    the new pods by themselves instead of around the old ones it is about to remove."""
    if spec.scheduling.topology_spread_constraints is not None:
        return spec.scheduling.topology_spread_constraints
    return [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector(name)},
            "matchLabelKeys": ["pod-template-hash"],
        }
    ]


def tolerations(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    gpu = {"key": spec.resources.gpu.resource_name, "operator": "Exists", "effect": "NoSchedule"}
    result = [gpu]
    for toleration in spec.scheduling.tolerations:
        item = toleration.model_dump(by_alias=True, exclude_none=True)
        if item != gpu:
            result.append(item)
    return result


def volume_mounts(spec: InferenceServiceSpec, management: bool = False) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}, _cache_mount()]
    claim = spec.model.pvc_claim
    if claim:
        mounts.append({"name": "model-source", "mountPath": f"{MODELS_DIR}/{claim}", "readOnly": True})
    if spec.model.oci_reference:
        mounts.append({"name": "model-source", "mountPath": IMAGE_MODEL_DIR, "readOnly": True})
    for volume, adapter_claim in adapter_claims(spec):
        mounts.append({"name": volume, "mountPath": f"{MODELS_DIR}/{adapter_claim}", "readOnly": True})
    if spec.engine.chat_template is not None:
        mounts.append(chat_template_mount())
    if management:
        mounts.append(management_mount())
    if spec.runtime.tls is not None:
        mounts.append(tls_mount())
    return mounts


def adapter_claims(spec: InferenceServiceSpec) -> list[tuple[str, str]]:
    """(volume name, claim) of each pvc:// claim the adapters use that the model does not: mounted like the
    model's claim, so adding an adapter on a new claim changes the pod template (and rolls the pods)."""
    if spec.lora is None:
        return []
    claims = sorted({a.pvc_claim for a in spec.lora.adapters if a.pvc_claim} - {spec.model.pvc_claim})
    return [(f"adapter-source-{i}", claim) for i, claim in enumerate(claims)]


def volumes(
    name: str, namespace: str, spec: InferenceServiceSpec, management: bool = False
) -> list[dict[str, Any]]:
    shm: dict[str, Any] = {"medium": "Memory"}
    if spec.resources.shared_memory_size is not None:
        shm["sizeLimit"] = canonical(spec.resources.shared_memory_size)
    result: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": shm}, _cache_volume(name, namespace, spec)]
    claim = spec.model.pvc_claim
    if claim:
        result.append(
            {"name": "model-source", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
    if spec.model.oci_reference:  # the kubelet pulls it like a container image; the node keeps it
        pull = spec.runtime.image_pull_policy or "IfNotPresent"
        result.append(
            {"name": "model-source", "image": {"reference": spec.model.oci_reference, "pullPolicy": pull}}
        )
    for volume, adapter_claim in adapter_claims(spec):
        result.append(
            {"name": volume, "persistentVolumeClaim": {"claimName": adapter_claim, "readOnly": True}}
        )
    if spec.engine.chat_template is not None:
        result.append(chat_template_volume(name))
    if management:
        result.append(management_volume(name))
    if spec.runtime.tls is not None:
        result.append(tls_volume(spec))
    return result


def _cache_mount() -> dict[str, Any]:
    return {"name": "model-cache", "mountPath": CACHE_DIR}


def node_cache_host_path(namespace: str) -> dict[str, str]:
    """The namespace's own folder on the node, which the operator names from the object's namespace: a model
    fetched with one namespace's credentials is not readable from another's pods. Nothing in the pod (no
    variable, no subPathExpr) can move the mount elsewhere under NODE_CACHE_ROOT; the API server already
    refuses a namespace name with a '/' or '..'."""
    if not namespace or "/" in namespace or namespace in (".", ".."):
        raise ValueError(f"namespace {namespace!r} cannot name a node cache folder")
    return {"path": f"{NODE_CACHE_ROOT}/{namespace}", "type": "DirectoryOrCreate"}


def _cache_owner(spec: InferenceServiceSpec, default_image: str) -> dict[str, Any]:
    """The init container of a node cache: the kubelet creates hostPath folders owned by root, and the
    runtime runs as RUN_AS_USER; this hands the namespace's folder (only it, not what is inside) to that
    user. It runs as root with one capability, CHOWN, and nothing else of the pod's."""
    if not spec.model.node_cache:
        return {}
    owner = f"{RUN_AS_USER}:{RUN_AS_USER}"
    init = {
        "name": "cache-owner",
        "image": spec.runtime.image or default_image,
        "command": ["chown", owner, CACHE_DIR],
        "volumeMounts": [_cache_mount()],
        "resources": {"limits": {"memory": "32Mi"}, "requests": {"cpu": "10m", "memory": "32Mi"}},
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
            "readOnlyRootFilesystem": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if spec.runtime.image_pull_policy:
        init["imagePullPolicy"] = spec.runtime.image_pull_policy
    return {"initContainers": [init]}


def _cache_volume(name: str, namespace: str, spec: InferenceServiceSpec) -> dict[str, Any]:
    cache = spec.model.cache
    if spec.model.node_cache:
        return {"name": "model-cache", "hostPath": node_cache_host_path(namespace)}
    if cache is not None and cache.pvc:
        return {"name": "model-cache", "persistentVolumeClaim": {"claimName": cache.pvc}}
    if cache is not None and cache.size is not None and cache.storage_class:
        claim_spec = {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": cache.storage_class,
            "resources": {"requests": {"storage": canonical(cache.size)}},
        }
        template = {"metadata": {"labels": labels(name)}, "spec": claim_spec}
        return {"name": "model-cache", "ephemeral": {"volumeClaimTemplate": template}}
    empty: dict[str, Any] = {}
    if cache is not None and cache.size is not None:
        empty["sizeLimit"] = canonical(cache.size)
    return {"name": "model-cache", "emptyDir": empty}
