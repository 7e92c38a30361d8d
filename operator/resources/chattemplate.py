"""spec.engine.chatTemplate: the ConfigMap the operator copies the template into, and how the pods get it.

Both forms (inline, or a key of the user's ConfigMap) end the same way: the operator writes the template,
once it compiled, into its own ConfigMap `<name>-chat-template`, which the runtime container mounts
read-only, and the engine gets the file (--chat-template). A copy rather than the user's ConfigMap itself:
a ConfigMap volume follows its ConfigMap's edits, so a broken edit would reach every container that starts
after it (a crash, a new replica, a drained node) although the operator refused it; the copy only ever holds
a template that compiled. The engine reads the file once, at start: a hash of the template on the pod
template rolls the pods when it changes.
"""

from __future__ import annotations

from typing import Any

from pagoda.operator.api import InferenceServiceSpec

from .meta import labels

CHAT_TEMPLATE_VOLUME = "chat-template"
CHAT_TEMPLATE_DIR = "/etc/pagoda/chat-template"
CHAT_TEMPLATE_FILE = "chat-template.jinja"
CHAT_TEMPLATE_PATH = f"{CHAT_TEMPLATE_DIR}/{CHAT_TEMPLATE_FILE}"
CHAT_TEMPLATE_HASH_ANNOTATION = "pagoda.dev/chat-template-hash"


def chat_template_name(name: str) -> str:
    """The operator's ConfigMap holding the template of InferenceService `name`."""
    return f"{name}-chat-template"


def chat_template_text(spec: InferenceServiceSpec, from_config_map: str | None) -> str | None:
    """The template the engine gets: spec.engine.chatTemplate.inline, or `from_config_map`, what the operator
    read from the ConfigMap spec.engine.chatTemplate.configMap names (reconcile/chattemplate.py); None
    without a chatTemplate."""
    template = spec.engine.chat_template
    if template is None:
        return None
    if template.inline is not None:
        return template.inline
    if from_config_map is None:
        raise ValueError("spec.engine.chatTemplate.configMap: the ConfigMap's template was not read")
    return from_config_map


def chat_template_config_map(name: str, namespace: str, text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": chat_template_name(name), "namespace": namespace, "labels": labels(name)},
        "data": {CHAT_TEMPLATE_FILE: text},
    }


def chat_template_volume(name: str) -> dict[str, Any]:
    return {"name": CHAT_TEMPLATE_VOLUME, "configMap": {"name": chat_template_name(name)}}


def chat_template_mount() -> dict[str, Any]:
    return {"name": CHAT_TEMPLATE_VOLUME, "mountPath": CHAT_TEMPLATE_DIR, "readOnly": True}
