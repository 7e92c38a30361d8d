"""spec.engine.chatTemplate: compiled as vLLM renders it, refused with its line when it cannot compile, and
given to the pods as a file of the operator's own ConfigMap whose hash rolls them (no cluster in this tier;
tests/integration/test_operator_chat_template.py runs the same against a real API server)."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import subprocess
import sys
from typing import Any

import pytest
from fakekube import StampingWrites, owner_object
from pydantic import ValidationError

from pagoda.contract.chattemplate import compile_error
from pagoda.operator.api import InferenceServiceSpec, error_messages
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.client import KubeError
from pagoda.operator.reconcile import core
from pagoda.operator.reconcile.chattemplate import read_chat_template
from pagoda.operator.resources import ChildInputs, RestartStamps, desired_children
from pagoda.operator.resources.chattemplate import (
    CHAT_TEMPLATE_HASH_ANNOTATION,
    CHAT_TEMPLATE_PATH,
    chat_template_text,
)
from pagoda.operator.resources.meta import RESTARTED_AT_ANNOTATION
from pagoda.runtime.tools.tinymodel import CHAT_TEMPLATE as TINY

Obj = dict[str, Any]
NOW = "2026-12-01T00:00:00Z"
GOOD = "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
# Line 2 closes an expression with one brace: jinja2 says "unexpected '}'" at line 2.
BROKEN = "{% for message in messages %}\n{{ message['content'] }\n{% endfor %}"
REF = {"configMap": {"name": "templates", "key": "chat.jinja"}}
BASE: Obj = {
    "model": {"uri": "hf://pagoda-test/tiny-llama"},
    "resources": {"gpu": {"count": 1}},
    "replicas": 1,
}


def spec_with(chat_template: Obj | None) -> InferenceServiceSpec:
    spec = copy.deepcopy(BASE)
    if chat_template is not None:
        spec["engine"] = {"chatTemplate": chat_template}
    return InferenceServiceSpec.model_validate(spec)


# --- Compiling (contract/chattemplate.py, shared by the operator and the runtime) ---


@pytest.mark.parametrize(
    "template",
    [
        TINY,
        GOOD,
        # transformers' extensions: loop controls and the {% generation %} block, and its tojson arguments.
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m | tojson(indent=2) }}"
        "{% endfor %}",
        "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
        "{{ raise_exception('only user and assistant roles') if messages[0].role == 'tool' }}",
        "a plain prompt without any Jinja",
    ],
)
def test_templates_vllm_can_render_compile(template: str) -> None:
    assert compile_error(template) is None


@pytest.mark.parametrize(
    ("template", "error"),
    [
        (BROKEN, "line 2: unexpected '}'"),
        ("{% for m in messages %}{{ m }}", "line 1: Unexpected end of template. Jinja was looking for"),
        ("hello\n\n{{ messages | shout }}", "line 3: No filter named 'shout'."),
        ("{{ x is loud }}", "line 1: No test named 'loud'."),
        ("{% for m in messages %}\n{% endif %}", "line 2: Encountered unknown tag 'endif'."),
    ],
)
def test_a_template_that_does_not_compile_gets_its_line_and_jinjas_message(template: str, error: str) -> None:
    found = compile_error(template)
    assert found is not None and found.startswith(error), found


# Compiles each template of stdin's JSON list in transformers' own chat-template environment; prints whether.
_TRANSFORMERS_COMPILES = """
import json, sys
from transformers.utils.chat_template_utils import _cached_compile_jinja_template as compile_there
results = []
for template in json.load(sys.stdin):
    try:
        compile_there(template)
        results.append(True)
    except Exception:
        results.append(False)
print(json.dumps(results))
"""


def test_compiling_agrees_with_transformers_which_vllm_renders_with() -> None:
    """The same templates compile in transformers' own chat-template environment (where vLLM renders them)
    and fail there; a transformers upgrade that adds an extension or a filter fails this. In a subprocess:
    importing transformers imports huggingface_hub, which reads HF_HUB_OFFLINE once, at import, and other
    tests of this process set it later."""
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    cases = [TINY, GOOD, BROKEN, "{% for m in messages %}{% continue %}{% endfor %}", "{{ x | shout }}"]
    cases += [
        "{% generation %}{{ x }}{% endgeneration %}",
        "{% for m in messages %}{{ m }}",
        "{{ x is loud }}",
    ]
    ran = subprocess.run(
        [sys.executable, "-c", _TRANSFORMERS_COMPILES],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    compiles_there = json.loads(ran.stdout.strip().splitlines()[-1])
    assert [compile_error(template) is None for template in cases] == compiles_there


def test_a_template_is_never_rendered() -> None:
    """Compiling runs nothing of the template: a call that would raise when rendered compiles."""
    assert compile_error("{{ raise_exception('rendered') }}{{ range(10**12) | list }}") is None


# --- The API: the inline form in the pydantic model, one form exactly ---


def test_a_valid_inline_template_is_accepted() -> None:
    spec = spec_with({"inline": TINY})
    assert spec.engine.chat_template is not None and spec.engine.chat_template.inline == TINY


def test_an_inline_template_that_does_not_compile_is_an_invalid_spec_naming_the_field_and_line() -> None:
    with pytest.raises(ValidationError) as caught:
        spec_with({"inline": BROKEN})
    assert error_messages(caught.value) == [
        "spec.engine.chatTemplate.inline: the Jinja template does not compile: line 2: unexpected '}'"
    ]
    owner = {"metadata": {"name": "llm"}, "spec": {**BASE, "engine": {"chatTemplate": {"inline": BROKEN}}}}
    spec, problems = core.parse_spec(owner)
    assert spec is None
    (problem,) = problems
    assert problem.reason == "InvalidSpec" and not problem.retry
    assert problem.message == (
        "The spec is invalid, fix it: spec.engine.chatTemplate.inline: the Jinja template does not compile: "
        "line 2: unexpected '}'"
    )


# --- The builders: the operator's ConfigMap, the volume, the mount, the flag and the hash ---


def by_kind(children: list[Obj]) -> dict[str, Obj]:
    found: dict[str, Obj] = {}
    for child in children:
        found.setdefault(child["kind"], child)
    return found


def runtime_pod(children: list[Obj]) -> Obj:
    pod: Obj = by_kind(children)["Deployment"]["spec"]["template"]
    return pod


def test_a_config_map_template_builds_the_copy_the_volume_the_mount_the_flag_and_the_hash() -> None:
    children = desired_children("llm", "ns", spec_with(REF), ChildInputs(chat_template=GOOD))
    kinds = [c["kind"] for c in children]
    assert kinds.index("ConfigMap") < kinds.index("Deployment")  # the copy before its pods
    copy_ = by_kind(children)["ConfigMap"]
    assert copy_["metadata"]["name"] == "llm-chat-template"
    assert copy_["metadata"]["labels"]["pagoda.dev/inferenceservice"] == "llm"
    assert copy_["data"] == {"chat-template.jinja": GOOD}
    template = runtime_pod(children)
    pod = template["spec"]
    assert {"name": "chat-template", "configMap": {"name": "llm-chat-template"}} in pod["volumes"]
    (container,) = pod["containers"]
    mount = {"name": "chat-template", "mountPath": "/etc/pagoda/chat-template", "readOnly": True}
    assert mount in container["volumeMounts"]
    assert CHAT_TEMPLATE_PATH == "/etc/pagoda/chat-template/chat-template.jinja"
    flag = container["args"].index("--chat-template")
    assert container["args"][flag + 1] == CHAT_TEMPLATE_PATH
    assert template["metadata"]["annotations"] == {
        CHAT_TEMPLATE_HASH_ANNOTATION: hashlib.sha256(GOOD.encode()).hexdigest()[:16]
    }


def test_a_changed_template_changes_only_the_copy_and_the_hash() -> None:
    before = desired_children("llm", "ns", spec_with(REF), ChildInputs(chat_template=GOOD))
    after = desired_children("llm", "ns", spec_with(REF), ChildInputs(chat_template=TINY))
    assert by_kind(after)["ConfigMap"]["data"] == {"chat-template.jinja": TINY}
    old, new = runtime_pod(before), runtime_pod(after)
    assert old["metadata"]["annotations"] != new["metadata"]["annotations"]  # rolls the pods
    assert old["spec"] == new["spec"]  # the same file, volume and flag


def test_an_inline_template_builds_the_same_way() -> None:
    inline = desired_children("llm", "ns", spec_with({"inline": GOOD}))
    from_config_map = desired_children("llm", "ns", spec_with(REF), ChildInputs(chat_template=GOOD))
    assert inline == from_config_map


def test_without_a_chat_template_nothing_of_it_is_built() -> None:
    children = desired_children("llm", "ns", spec_with(None))
    assert "ConfigMap" not in by_kind(children)
    template = runtime_pod(children)
    assert "annotations" not in template["metadata"]
    assert "--chat-template" not in template["spec"]["containers"][0]["args"]
    assert all(v["name"] != "chat-template" for v in template["spec"]["volumes"])


def test_the_hash_and_a_scheduled_restart_share_the_annotations() -> None:
    stamps = RestartStamps(NOW, NOW)
    template = runtime_pod(
        desired_children("llm", "ns", spec_with(REF), ChildInputs(stamps=stamps, chat_template=GOOD))
    )
    assert set(template["metadata"]["annotations"]) == {
        CHAT_TEMPLATE_HASH_ANNOTATION,
        RESTARTED_AT_ANNOTATION,
    }


def test_a_config_map_template_must_be_read_before_building() -> None:
    with pytest.raises(ValueError, match="spec.engine.chatTemplate.configMap"):
        chat_template_text(spec_with(REF), None)


# --- The pass: the ConfigMap read, checked and reported; nothing applied while it is wrong ---


class FakeKube(StampingWrites):
    """The API server's answers for one ConfigMap, and a record of the pass's writes."""

    def __init__(self, config_map: Obj | None = None, status: int | None = None) -> None:
        super().__init__()
        self.config_map = config_map
        self.status = status
        self.gets: list[tuple[str, str]] = []
        self.applied: dict[str, Obj] = {}
        self.events: list[Obj] = []

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> Obj | None:
        self.gets.append((plural, name))
        if self.status is not None:
            raise KubeError(self.status, "Forbidden", 'configmaps "templates" is forbidden')
        return copy.deepcopy(self.config_map)

    def get_metadata(self, *_: Any) -> Obj | None:
        return None

    def apply(self, manifest: Obj, plural: str) -> Obj:
        self.writes.append(("apply", manifest["kind"]))
        self.applied[manifest["kind"]] = manifest
        return self._stamp({**manifest, "status": {}})

    def create(self, manifest: Obj, plural: str) -> Obj:
        self.events.append(manifest)
        return manifest

    def patch_status(self, api_version: str, kind: str, plural: str, ns: str, name: str, status: Obj) -> Obj:
        self.writes.append(("patch_status", kind))
        return self._stamp({**owner(), "status": status})

    def delete(self, *_: Any) -> None:
        self.writes.append(("delete", _[1]))


def config_map(data: dict[str, str] | None = None, binary: dict[str, str] | None = None) -> Obj:
    found: Obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "templates"}}
    if data is not None:
        found["data"] = data
    if binary is not None:
        found["binaryData"] = binary
    return found


def owner(ref: Obj | None = None) -> Obj:
    return owner_object({**BASE, "engine": {"chatTemplate": ref or REF}})


def read(kube: FakeKube, cache: ObjectCache | None = None, ref: Obj | None = None) -> tuple[Any, Any]:
    spec = spec_with(ref or REF)
    return read_chat_template(kube, cache, "ns", "llm", spec)  # type: ignore[arg-type]


def test_a_good_template_is_read_and_kept_until_the_resync() -> None:
    kube, cache = FakeKube(config_map({"chat.jinja": GOOD})), ObjectCache("InferenceService")
    assert read(kube, cache) == (GOOD, None)
    assert read(kube, cache) == (GOOD, None)
    assert kube.gets == [("configmaps", "templates")]  # once per resync
    cache.forget_chat_templates()  # the resync
    kube.config_map = config_map({"chat.jinja": TINY})
    assert read(kube, cache) == (TINY, None)
    assert len(kube.gets) == 2


@pytest.mark.parametrize(
    ("found", "reason", "words"),
    [
        (None, "ChatTemplateNotFound", "ConfigMap templates does not exist in namespace ns"),
        (
            config_map({"other.jinja": GOOD}),
            "ChatTemplateNotFound",
            "ConfigMap templates has no key chat.jinja in its data (its keys: other.jinja)",
        ),
        (
            config_map(binary={"chat.jinja": "e30="}),
            "ChatTemplateNotFound",
            "has key chat.jinja in binaryData, which is not read",
        ),
        (
            config_map({"chat.jinja": " \n"}),
            "ChatTemplateInvalid",
            "ConfigMap templates key chat.jinja is empty",
        ),
        (
            config_map({"chat.jinja": BROKEN}),
            "ChatTemplateInvalid",
            "template in ConfigMap templates key chat.jinja does not compile: line 2: unexpected '}'",
        ),
    ],
)
def test_a_missing_or_broken_template_is_a_problem_naming_the_field(
    found: Obj | None, reason: str, words: str
) -> None:
    kube, cache = FakeKube(found), ObjectCache("InferenceService")
    template, problem = read(kube, cache)
    assert template is None and problem is not None
    assert problem.reason == reason and problem.retry  # the fix is in the ConfigMap: read again
    assert problem.message.startswith("spec.engine.chatTemplate.configMap: ") and words in problem.message
    read(kube, cache)
    assert len(kube.gets) == 2  # not kept: read on every pass until it is fixed


def test_a_config_map_the_operator_may_not_read_is_forbidden() -> None:
    _, problem = read(FakeKube(status=403))
    assert problem is not None and problem.reason == "Forbidden" and "get on configmaps" in problem.message


def test_the_operators_own_copy_is_not_a_source() -> None:
    kube = FakeKube(config_map({"chat.jinja": GOOD}))
    _, problem = read(kube, ref={"configMap": {"name": "llm-chat-template", "key": "chat-template.jinja"}})
    assert problem is not None and problem.reason == "InvalidSpec" and not problem.retry
    assert "spec.engine.chatTemplate.configMap.name: llm-chat-template is the ConfigMap" in problem.message
    assert kube.gets == []


def test_no_config_map_is_read_for_an_inline_template() -> None:
    kube = FakeKube()
    assert read(kube, ref={"inline": GOOD}) == (None, None)
    assert kube.gets == []


def run_pass(kube: FakeKube, cache: ObjectCache) -> core.Outcome:
    return core.reconcile(kube, "ns", "llm", now=lambda: NOW, cache=cache)  # type: ignore[arg-type]


def degraded(cache: ObjectCache) -> tuple[str, str]:
    status = (cache.owner("ns", "llm") or {})["status"]
    (cond,) = [c for c in status["conditions"] if c["type"] == "Degraded"]
    return cond["reason"], cond["message"]


def test_a_broken_template_applies_nothing_and_says_why_then_a_fixed_one_converges() -> None:
    cache = ObjectCache("InferenceService")
    cache.observe(owner())
    kube = FakeKube(config_map({"chat.jinja": BROKEN}))
    outcome = run_pass(kube, cache)
    assert outcome.result == "error" and outcome.requeue_after == core.RETRY_AFTER_S
    assert kube.writes == [("patch_status", "InferenceService")]  # no child
    reason, message = degraded(cache)
    assert reason == "ChatTemplateInvalid" and "line 2: unexpected '}'" in message
    assert [(e["type"], e["reason"]) for e in kube.events] == [("Warning", "ChatTemplateInvalid")]

    kube.writes.clear()
    kube.config_map = config_map({"chat.jinja": GOOD})
    run_pass(kube, cache)
    applied = [write for write in kube.writes if write[1] != "NetworkPolicy"]
    assert applied[:2] == [("apply", "ConfigMap"), ("apply", "Deployment")]
    assert kube.applied["ConfigMap"]["data"] == {"chat-template.jinja": GOOD}
    annotations = kube.applied["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations[CHAT_TEMPLATE_HASH_ANNOTATION] == hashlib.sha256(GOOD.encode()).hexdigest()[:16]


def test_a_template_broken_later_leaves_the_running_children_alone() -> None:
    cache = ObjectCache("InferenceService")
    cache.observe(owner())
    kube = FakeKube(config_map({"chat.jinja": GOOD}))
    run_pass(kube, cache)
    deployment = cache.children("ns", "llm")[("Deployment", "llm")]
    cache.forget_chat_templates()  # the resync that reads the edit
    kube.config_map = config_map({"chat.jinja": BROKEN})
    kube.writes.clear()
    run_pass(kube, cache)
    assert [w for w in kube.writes if w[0] != "patch_status"] == []  # no apply, no delete
    assert cache.children("ns", "llm")[("Deployment", "llm")] == deployment
    assert degraded(cache)[0] == "ChatTemplateInvalid"
