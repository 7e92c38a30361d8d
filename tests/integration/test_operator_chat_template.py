"""spec.engine.chatTemplate against a real API server: a template that does not compile (or a ConfigMap that
is missing) is reported in the status, naming the field, the line and jinja2's message, and nothing rolls;
a fixed template converges, and a changed one rolls the pods."""

from __future__ import annotations

import hashlib
from typing import Any

from harness import OperatorProcess, wait_until
from isvc import condition, create, create_ready, get, is_true, patch, wait_ready
from kubernetes import client

from pagoda.operator.kube.client import Kube
from pagoda.operator.resources.chattemplate import CHAT_TEMPLATE_HASH_ANNOTATION, CHAT_TEMPLATE_PATH

GOOD = "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
GOOD_AGAIN = "{{ bos_token }}" + GOOD + "{% if add_generation_prompt %}<|assistant|>{% endif %}"
BROKEN = "{% for message in messages %}\n{{ message['content'] }\n{% endfor %}"  # line 2: unexpected '}'


def reference(config_map: str) -> dict[str, Any]:
    return {"chatTemplate": {"configMap": {"name": config_map, "key": "chat.jinja"}}}


def template_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def degraded(kube: client.CustomObjectsApi, name: str, namespace: str, reason: str) -> dict[str, Any]:
    cond = condition(get(kube, name, namespace), "Degraded")
    return cond if cond.get("status") == "True" and cond.get("reason") == reason else {}


def warned(cluster_api: Any, namespace: str, name: str, reason: str) -> bool:
    events = client.CoreV1Api(cluster_api).list_namespaced_event(namespace).items
    return any(e.type == "Warning" and e.reason == reason and e.involved_object.name == name for e in events)


def pod_template(raw: Kube, namespace: str, name: str) -> dict[str, Any]:
    deployment = raw.get("apps/v1", "deployments", namespace, name)
    assert deployment is not None
    template: dict[str, Any] = deployment["spec"]["template"]
    return template


def test_a_broken_config_map_template_rolls_nothing_and_a_fixed_one_converges(
    operator: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, raw: Kube, namespace: str
) -> None:
    core = client.CoreV1Api(cluster_api)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "templates"}, "data": {"chat.jinja": GOOD}}
    )
    create_ready(kube, "chat", namespace, replicas=1, engine=reference("templates"))
    # The operator's copy, mounted read-only, passed as the file, hashed onto the pod template.
    copied = raw.get("v1", "configmaps", namespace, "chat-chat-template")
    assert copied is not None and copied["data"] == {"chat-template.jinja": GOOD}
    assert copied["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    before = raw.get("apps/v1", "deployments", namespace, "chat")
    assert before is not None
    template = before["spec"]["template"]
    assert template["metadata"]["annotations"][CHAT_TEMPLATE_HASH_ANNOTATION] == template_hash(GOOD)
    (container,) = template["spec"]["containers"]
    assert container["args"][container["args"].index("--chat-template") + 1] == CHAT_TEMPLATE_PATH
    assert {
        "name": "chat-template",
        "mountPath": "/etc/pagoda/chat-template",
        "readOnly": True,
    }.items() <= next(m for m in container["volumeMounts"] if m["name"] == "chat-template").items()
    assert next(v for v in template["spec"]["volumes"] if v["name"] == "chat-template")["configMap"][
        "name"
    ] == ("chat-chat-template")

    # A broken edit: reported with the field, the line and jinja2's message, at the latest one resync later.
    core.patch_namespaced_config_map("templates", namespace, {"data": {"chat.jinja": BROKEN}})
    cond = wait_until(lambda: degraded(kube, "chat", namespace, "ChatTemplateInvalid"), "ChatTemplateInvalid")
    assert cond["message"].startswith("spec.engine.chatTemplate.configMap: the Jinja template in ConfigMap ")
    assert "key chat.jinja does not compile: line 2: unexpected '}'" in cond["message"]
    wait_until(lambda: warned(cluster_api, namespace, "chat", "ChatTemplateInvalid"), "a Warning Event")
    # Nothing rolls, over two more resyncs: the Deployment and the copy are as they were, the pods serve.
    resyncs = operator.resyncs()
    wait_until(lambda: operator.resyncs() >= resyncs + 2, "two more resyncs", timeout=30)
    after = raw.get("apps/v1", "deployments", namespace, "chat")
    assert after is not None
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"]["template"] == before["spec"]["template"]
    copied = raw.get("v1", "configmaps", namespace, "chat-chat-template")
    assert copied is not None and copied["data"] == {"chat-template.jinja": GOOD}
    assert is_true(get(kube, "chat", namespace), "Ready")

    # Fixed with a new template: the copy follows, the pods roll, and the service converges.
    core.patch_namespaced_config_map("templates", namespace, {"data": {"chat.jinja": GOOD_AGAIN}})
    wait_until(
        lambda: (
            pod_template(raw, namespace, "chat")["metadata"]["annotations"][CHAT_TEMPLATE_HASH_ANNOTATION]
            == template_hash(GOOD_AGAIN)
        ),
        "the pod template's hash of the fixed template",
    )
    wait_ready(kube, "chat", namespace, "Ready with Degraded=False after the fix")
    copied = raw.get("v1", "configmaps", namespace, "chat-chat-template")
    assert copied is not None and copied["data"] == {"chat-template.jinja": GOOD_AGAIN}
    rolled = raw.get("apps/v1", "deployments", namespace, "chat")
    assert rolled is not None and rolled["metadata"]["generation"] == before["metadata"]["generation"] + 1


def test_a_missing_config_map_creates_nothing_until_its_template_compiles(
    operator: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, raw: Kube, namespace: str
) -> None:
    create(kube, "late", namespace, replicas=1, engine=reference("late-templates"))
    cond = wait_until(
        lambda: degraded(kube, "late", namespace, "ChatTemplateNotFound"), "ChatTemplateNotFound"
    )
    assert cond["message"].startswith(
        "spec.engine.chatTemplate.configMap: ConfigMap late-templates does not exist in namespace "
    )
    core = client.CoreV1Api(cluster_api)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "late-templates"}, "data": {"chat.jinja": BROKEN}}
    )
    wait_until(lambda: degraded(kube, "late", namespace, "ChatTemplateInvalid"), "ChatTemplateInvalid")
    assert raw.get("apps/v1", "deployments", namespace, "late") is None
    assert raw.get("v1", "configmaps", namespace, "late-chat-template") is None

    core.patch_namespaced_config_map("late-templates", namespace, {"data": {"chat.jinja": GOOD}})
    wait_ready(kube, "late", namespace, "Ready once the template compiles")
    assert pod_template(raw, namespace, "late")["metadata"]["annotations"][CHAT_TEMPLATE_HASH_ANNOTATION] == (
        template_hash(GOOD)
    )
    # Removing the field removes the copy, the volume and the flag.
    patch(kube, "late", namespace, {"engine": {"chatTemplate": None}})
    wait_until(
        lambda: raw.get("v1", "configmaps", namespace, "late-chat-template") is None,
        "the operator's copy deleted",
    )
    container = pod_template(raw, namespace, "late")["spec"]["containers"][0]
    assert "--chat-template" not in container["args"]
    assert all(m["name"] != "chat-template" for m in container["volumeMounts"])


def test_an_inline_template_that_does_not_compile_passes_admission_and_is_refused_by_the_operator(
    operator: OperatorProcess, kube: client.CustomObjectsApi, raw: Kube, namespace: str
) -> None:
    """CEL cannot parse Jinja: the API server stores the object, the operator refuses it as InvalidSpec."""
    create(kube, "inline", namespace, replicas=1, engine={"chatTemplate": {"inline": BROKEN}})
    cond = wait_until(lambda: degraded(kube, "inline", namespace, "InvalidSpec"), "InvalidSpec")
    assert cond["message"] == (
        "The spec is invalid, fix it: spec.engine.chatTemplate.inline: the Jinja template does not compile: "
        "line 2: unexpected '}'"
    )
    assert raw.get("apps/v1", "deployments", namespace, "inline") is None
