"""spec.engine.chatTemplate.configMap: the template read from the user's ConfigMap and compiled, or why not.

ConfigMaps are not watched (that would mean reading every ConfigMap in the cluster, as for Secrets): a pass
GETs the one the spec names, unless the cache holds its template from an earlier pass since the last resync.
So an edit reaches the pods at the latest one resync (--resync-seconds) later. A ConfigMap that is missing,
lacks the key, or holds a template that does not compile is a Problem that keeps the pass from applying
anything, as an invalid spec does (the pods keep what they run), and is read again on every pass until it is
fixed (the pass is retried every 30 s meanwhile). An inline template was compiled when the spec was parsed
(api/engine.py), with the same function.
"""

from __future__ import annotations

from pagoda.contract.chattemplate import compile_error
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.client import Kube, KubeError
from pagoda.operator.reconcile.problems import INVALID_SPEC_PREFIX
from pagoda.operator.resources.chattemplate import chat_template_name
from pagoda.operator.status.report import Problem

FIELD = "spec.engine.chatTemplate.configMap"
UNTIL_FIXED = "nothing is applied until then, and the pods keep the template they have"


def read_chat_template(
    kube: Kube, cache: ObjectCache | None, namespace: str, name: str, spec: InferenceServiceSpec
) -> tuple[str | None, Problem | None]:
    """The template of the ConfigMap spec.engine.chatTemplate.configMap names, once it compiled; (None, the
    reason) when it cannot be had; (None, None) without such a reference."""
    ref = spec.engine.chat_template
    if ref is None or ref.config_map is None:
        return None, None
    source, key = ref.config_map.name, ref.config_map.key
    if source == chat_template_name(name):  # the operator's own copy: applying it would overwrite the source
        return None, Problem(
            "InvalidSpec",
            f"{INVALID_SPEC_PREFIX}{FIELD}.name: {source} is the ConfigMap the operator copies the template "
            "into; keep the template in a ConfigMap of another name",
            retry=False,
        )
    if cache is not None and (seen := cache.chat_template(namespace, source, key)) is not None:
        return seen, None
    try:
        found = kube.get("v1", "configmaps", namespace, source)
    except KubeError as exc:
        if exc.status == 403:
            return None, Problem(
                "Forbidden",
                f"The operator may not read ConfigMap {source} ({FIELD}) (RBAC: get on configmaps, which the "
                f"Helm chart grants): {exc.message}",
            )
        raise
    if found is None:
        return None, not_found(
            f"ConfigMap {source} does not exist in namespace {namespace}: create it or fix {FIELD}.name"
        )
    data = found.get("data") or {}
    if key not in data:
        if key in (found.get("binaryData") or {}):
            return None, not_found(
                f"ConfigMap {source} has key {key} in binaryData, which is not read: put the template in data"
            )
        keys = ", ".join(sorted(data)) or "none"
        return None, not_found(
            f"ConfigMap {source} has no key {key} in its data (its keys: {keys}): add it or fix {FIELD}.key"
        )
    text = str(data[key])
    if not text.strip():
        return None, invalid(f"ConfigMap {source} key {key} is empty: put the template in it")
    error = compile_error(text)
    if error is not None:
        return None, invalid(f"the Jinja template in ConfigMap {source} key {key} does not compile: {error}")
    if cache is not None:
        cache.saw_chat_template(namespace, source, key, text)
    return text, None


def not_found(what: str) -> Problem:
    return Problem("ChatTemplateNotFound", f"{FIELD}: {what}; {UNTIL_FIXED}")


def invalid(what: str) -> Problem:
    return Problem("ChatTemplateInvalid", f"{FIELD}: {what}; fix it: {UNTIL_FIXED}")
