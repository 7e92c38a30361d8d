"""Pure-ish translation of failures into `Problem`s a person can act on (the Degraded condition)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from pagoda.operator.api import describe
from pagoda.operator.kube.client import Kube, KubeError
from pagoda.operator.status.report import Problem

Obj = dict[str, Any]
INVALID_SPEC_PREFIX = "The spec is invalid, fix it: "


def invalid_spec(exc: ValidationError) -> Problem:
    """Every validation error with the field it concerns, e.g. `spec.engine.dtype: Input should be ...`; a
    cross-field rule's error is its message exactly as the API server gives it at admission (api/rules.py)."""
    return Problem("InvalidSpec", INVALID_SPEC_PREFIX + describe(exc), retry=False)


def secret_names(manifests: list[Obj]) -> list[str]:
    """Names of the Secrets the pod template needs (non-optional references), in first-seen order."""
    names: list[str] = []

    def add(name: Any, optional: Any) -> None:
        if isinstance(name, str) and name and not optional and name not in names:
            names.append(name)

    for manifest in manifests:
        if manifest.get("kind") != "Deployment":
            continue
        pod = manifest.get("spec", {}).get("template", {}).get("spec", {})
        for container in (pod.get("containers") or []) + (pod.get("initContainers") or []):
            for env in container.get("env") or []:
                ref = (env.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    add(ref.get("name"), ref.get("optional"))
            for source in container.get("envFrom") or []:
                ref = source.get("secretRef")
                if ref:
                    add(ref.get("name"), ref.get("optional"))
        for volume in pod.get("volumes") or []:
            ref = volume.get("secret")
            if ref:
                add(ref.get("secretName"), ref.get("optional"))
        # A missing pull secret only earns a warning event: the kubelet pulls without it, and a private
        # image then fails with ErrImagePull, which names no Secret.
        for ref in pod.get("imagePullSecrets") or []:
            add(ref.get("name"), False)
    return names


def missing_secrets(kube: Kube, namespace: str, names: list[str]) -> list[str]:
    """Those of the Secrets `names` that do not exist: one metadata-only GET each (never the data). A Secret
    the operator may not look at counts as present: its pods will report it."""
    missing = []
    for name in names:
        try:
            found = kube.get_metadata("v1", "secrets", namespace, name)
        except KubeError as exc:
            if exc.status == 403:
                continue
            raise
        if found is None:
            missing.append(name)
    return missing


def secret_not_found(namespace: str, missing: list[str]) -> Problem:
    listed = ", ".join(missing)
    return Problem(
        "SecretNotFound",
        f"Secret(s) {listed} referenced by the spec do not exist in namespace {namespace}: "
        "create them or fix the secret reference in the spec",
    )


_DEFAULT_HINT = "install its CRD, or turn off the feature that needs it"
# What to install for each optional API a child needs, and the spec field that asks for it.
INSTALL_HINTS = {
    "ScaledObject": "install KEDA, or remove spec.autoscaling",
    "ServiceMonitor": "install the Prometheus Operator's CRDs, or set spec.monitoring.serviceMonitor.enabled "
    "to false",
    "InferencePool": "install the Gateway API Inference Extension's CRDs (v1.5.0, see docs/routing.md), or "
    "remove spec.routing",
    "HTTPRoute": "install the Gateway API CRDs and a Gateway implementation, or remove spec.routing.gateway",
}


def apply_problem(manifest: Obj, exc: KubeError) -> Problem:
    kind = manifest["kind"]
    api_version = manifest["apiVersion"]
    if exc.status == 404:
        return Problem(
            "ApiNotInstalled",
            f"The API server has no {kind} ({api_version}): {INSTALL_HINTS.get(kind, _DEFAULT_HINT)}",
        )
    if exc.status in (400, 422):
        return Problem("ApplyRejected", f"The API server rejected the {kind}: {exc.message}", retry=False)
    if exc.status == 403:
        return Problem("Forbidden", f"The operator may not apply {kind} objects (RBAC): {exc.message}")
    return Problem("ApplyFailed", f"Applying the {kind} failed: {exc}")
