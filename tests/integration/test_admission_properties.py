"""Property-based admission: specs generated from the CRD's own schema, judged by the real API server and by
the operator's pydantic models side by side.

- Specs that satisfy every field's schema (types, ranges, patterns, lengths) but not necessarily the
  cross-field CEL rules: the API server and pydantic accept the same ones; when both refuse, pydantic names
  a field the API server's message names too; every accepted spec builds its children without an
  exception, and the API server accepts each built child (server-side dry run).
- The same specs with one field broken (a number out of range, a string too long or off its pattern, a value
  outside its enum, an unknown field): both refuse, naming that field.

The generator reads crds/pagoda.dev_inferenceservices.yaml (made from the pydantic models by crdgen), so a
new field is covered without touching this file. Server-side dry runs only: nothing is stored.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from isvc import GROUP, PLURAL, VERSION
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError
from pydantic import ValidationError

from pagoda.contract import IMAGE_MODEL_NAME, default_served_name
from pagoda.operator.api import InferenceServiceSpec, error_messages
from pagoda.operator.api.rules import MODEL_URI_PATTERN, MSG_ADAPTER_SERVED_NAME
from pagoda.operator.resources import ChildInputs, OperatorSettings, desired_children
from tests.repo import REPO

CRD = REPO / "crds" / "pagoda.dev_inferenceservices.yaml"
SPEC_SCHEMA: dict[str, Any] = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"][
    "openAPIV3Schema"
]["properties"]["spec"]
# Bounds that keep generated values small where the schema sets none (the schema's own bounds win).
MAX_ITEMS = 2
MAX_TEXT = 12
EXAMPLES = 60  # each one is two or three dry-run requests


def _bounded(
    schema: dict[str, Any], low: str, high: str, default_low: int, default_high: int
) -> tuple[int, int]:
    return int(schema.get(low, default_low)), int(min(schema.get(high, default_high), default_high))


def _string(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    low, high = _bounded(schema, "minLength", "maxLength", 0, 64)
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: low <= len(s) <= high)
    return st.text(
        st.characters(codec="ascii", categories=("L", "N")), min_size=low, max_size=min(high, MAX_TEXT)
    )


# Fields whose valid values a CEL rule, not a pattern, describes: drawn from values of each kind.
URIS = ["hf://org/model", "s3://bucket/models/m", "pvc://claim/models/m", "file:///models/m"]
HINTS: dict[str, st.SearchStrategy[Any]] = {
    "model.uri": st.sampled_from(URIS),
    "lora.adapters[].uri": st.sampled_from(["hf://org/adapter", "s3://bucket/adapters/a", "pvc://claim/a"]),
    "engine.extraArgs[]": st.sampled_from(["--enable-chunked-prefill", "--max-num-seqs=8", "--seed=1"]),
    # The API server cannot tell a time zone from any other string; the operator refuses an unknown one
    # (InvalidSpec), as tests/unit/test_api_validation.py shows.
    "restartSchedule.window.timeZone": st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]),
}


def valid(schema: dict[str, Any], path: str = "") -> st.SearchStrategy[Any]:
    """Values that satisfy `schema` field by field (CEL rules aside; HINTS for fields only CEL describes)."""
    if path in HINTS:
        return HINTS[path]
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if schema.get("x-kubernetes-int-or-string"):
        pattern = re.compile(schema.get("pattern", r"^[0-9]+%?$"))
        return st.one_of(st.integers(0, 100), _string({"pattern": pattern.pattern}))
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties")
        if properties is None:  # a map (labels, selectors)
            values = schema.get("additionalProperties") or {"type": "string"}
            keys = st.from_regex(r"^[a-z][a-z0-9]{0,7}$", fullmatch=True)
            return st.dictionaries(keys, valid(values), max_size=min(schema.get("maxProperties", 2), 2))
        required = set(schema.get("required", []))
        within = f"{path}." if path else ""
        return st.fixed_dictionaries(
            {key: valid(sub, within + key) for key, sub in properties.items() if key in required},
            optional={
                key: valid(sub, within + key) for key, sub in properties.items() if key not in required
            },
        )
    if kind == "array":
        low, high = _bounded(schema, "minItems", "maxItems", 0, MAX_ITEMS)
        return st.lists(valid(schema["items"], f"{path}[]"), min_size=low, max_size=max(low, high))
    if kind == "string":
        return _string(schema)
    if kind == "integer":
        return st.integers(int(schema.get("minimum", -5)), int(schema.get("maximum", 100_000)))
    if kind == "number":
        return st.floats(
            float(schema.get("minimum", -5)),
            float(schema.get("maximum", 1e6)),
            exclude_min=bool(schema.get("exclusiveMinimum")),
            exclude_max=bool(schema.get("exclusiveMaximum")),
            allow_nan=False,
        )
    if kind == "boolean":
        return st.booleans()
    raise AssertionError(f"no generator for schema {schema}")


def specs() -> st.SearchStrategy[dict[str, Any]]:
    """Whole specs: the required fields, and a few of the optional top-level ones (each generated whole), so
    that both specs every rule accepts and specs some cross-field rule refuses come up."""
    properties = SPEC_SCHEMA["properties"]
    required = SPEC_SCHEMA.get("required", [])
    optional = sorted(key for key in properties if key not in required)
    base = st.fixed_dictionaries({key: valid(properties[key], key) for key in required})
    chosen = st.lists(st.sampled_from(optional), max_size=3, unique=True)
    return st.tuples(base, chosen).flatmap(
        lambda drawn: st.fixed_dictionaries(
            {**{k: st.just(v) for k, v in drawn[0].items()}, **{k: valid(properties[k], k) for k in drawn[1]}}
        )
    )


def _breakable(schema: dict[str, Any], path: tuple[str, ...]) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every field (path, schema) of an object schema, nested objects included, that a value can break."""
    found = []
    for key, sub in (schema.get("properties") or {}).items():
        here = (*path, key)
        if sub.get("type") == "object" and "properties" in sub:
            found.append((here, {"unknown-field": True}))
            found += _breakable(sub, here)
        elif "enum" in sub or "maximum" in sub or "minimum" in sub or "maxLength" in sub or "pattern" in sub:
            found.append((here, sub))
    return found


BREAKABLE = _breakable(SPEC_SCHEMA, ())


def broken(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A value `schema` refuses on its own (no other field needed to tell)."""
    if schema.get("unknown-field"):
        return st.just({"notAField": 1})
    options: list[st.SearchStrategy[Any]] = []
    if "enum" in schema:
        options.append(st.just("NotOneOfThem"))
    if "maximum" in schema:
        options.append(st.integers(int(schema["maximum"]) + 1, int(schema["maximum"]) + 1000))
    if "minimum" in schema:
        options.append(st.integers(int(schema["minimum"]) - 1000, int(schema["minimum"]) - 1))
    if "maxLength" in schema:
        options.append(st.just("a" * (int(schema["maxLength"]) + 1)))
    if "pattern" in schema and not re.fullmatch(schema["pattern"], "Not A Valid Value!"):
        options.append(st.just("Not A Valid Value!"))
    return st.one_of(options)


def _set(spec: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    spec = json.loads(json.dumps(spec))
    node = spec
    for key in path[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise AssertionError(f"{path}: not an object")
    node[path[-1]] = value
    return spec


def _admit(api: client.CustomObjectsApi, namespace: str, spec: dict[str, Any]) -> str | None:
    """None when the API server would store the InferenceService, else its message."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService", "metadata": {"name": "gen"}}
    try:
        api.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            {**body, "spec": spec},
            dry_run="All",
            field_validation="Strict",
        )
        return None
    except ApiException as exc:
        assert exc.status in (400, 422), exc.body
        return str(json.loads(exc.body)["message"])


def _pydantic(spec: dict[str, Any]) -> tuple[InferenceServiceSpec | None, list[str]]:
    try:
        return InferenceServiceSpec.model_validate(spec), []
    except ValidationError as exc:
        return None, error_messages(exc)


def _fields(messages: list[str]) -> list[str]:
    """The field paths pydantic's messages start with (`spec.engine.dtype: ...` -> `spec.engine.dtype`)."""
    return [re.sub(r"\[\d+\]", "", message.split(":", 1)[0]) for message in messages]


def _names_one(api_message: str, fields: list[str]) -> bool:
    flat = re.sub(r"\[\d+\]", "", api_message)
    return any(field in flat for field in fields)


COMMON = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)


def test_api_server_and_pydantic_agree_and_every_accepted_spec_builds(
    crd: None, cluster_api: Any, namespace: str
) -> None:
    api = client.CustomObjectsApi(cluster_api)
    children_api = dynamic.DynamicClient(cluster_api)

    @COMMON
    @given(specs())
    def check(spec: dict[str, Any]) -> None:
        refused = _admit(api, namespace, spec)
        parsed, messages = _pydantic(spec)
        assert (refused is None) == (parsed is not None), (spec, refused, messages)
        if refused is not None:
            assert _names_one(refused, _fields(messages)), (refused, messages)
            return
        assert parsed is not None
        settings = OperatorSettings(management_key="key", trusted_namespaces=("m",))
        for child in desired_children("gen", namespace, parsed, ChildInputs(settings)):
            try:
                resource = children_api.resources.get(api_version=child["apiVersion"], kind=child["kind"])
            except ResourceNotFoundError:  # a kind whose CRD tier 2 does not install (the InferencePool)
                continue
            resource.create(body=child, namespace=namespace, query_params=[("dryRun", "All")])
            built.add(child["kind"])

    built: set[str] = set()
    check()
    # Some generated specs were accepted, and their children went to the API server.
    assert {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"} <= built, built


def test_one_broken_field_is_refused_by_both_naming_it(crd: None, cluster_api: Any, namespace: str) -> None:
    api = client.CustomObjectsApi(cluster_api)

    @COMMON
    @given(st.data())
    def check(data: st.DataObject) -> None:
        path, schema = data.draw(st.sampled_from(BREAKABLE))
        spec = _set(data.draw(specs()), path, data.draw(broken(schema)))
        field = "spec." + ".".join(path)
        refused = _admit(api, namespace, spec)
        assert refused is not None and field in re.sub(r"\[\d+\]", "", refused), (field, refused)
        parsed, messages = _pydantic(spec)
        assert parsed is None and any(f.startswith(field) for f in _fields(messages)), (field, messages)

    check()


# The served-name rule (contract/__init__.py) on every scheme: model URIs built from parts that make each path
# rule come up (empty parts, '.', '..', trailing slashes, dotted names), without spec.model.servedName, and
# adapters named from the same parts.
_NAMES = ["tiny", "models", "a.b", "x-1", "c", IMAGE_MODEL_NAME, "gpt2"]
_PATH = st.lists(st.sampled_from([*_NAMES, ".", "..", ""]), max_size=4).map("/".join)
SERVED_NAME_URIS = st.one_of(
    st.builds(lambda p, end: f"file:///{p}{end}", _PATH, st.sampled_from(["", "/", "/."])),
    st.builds(lambda c, p: f"pvc://{c}/{p}", st.sampled_from(["c", "models"]), _PATH),
    st.sampled_from(["pvc://c", "pvc://tiny", "oci://registry.example/models/tiny:1"]),
    st.builds(lambda p, end: f"s3://my-bucket/{p}{end}", _PATH.filter(bool), st.sampled_from(["", "/"])),
    st.builds(
        lambda org, name, end: f"hf://{org}{name}{end}",
        st.sampled_from(["gpt2", "org", "a.b"]),
        st.sampled_from(["", "/tiny", "/x-1"]),
        st.sampled_from(["", "/"]),
    ),
)


def test_api_server_and_pydantic_agree_on_the_served_name_on_every_scheme(
    crd: None, cluster_api: Any, namespace: str
) -> None:
    """The API server's CEL spelling of the rule and the operator's (the contract's Python) refuse the same
    adapters: those named like the name the runtime would serve the model under, and no others."""
    api = client.CustomObjectsApi(cluster_api)

    @settings(COMMON, max_examples=80)
    @given(SERVED_NAME_URIS, st.lists(st.sampled_from(_NAMES), min_size=1, max_size=2, unique=True))
    @example("file:///models/tiny/.", ["tiny"])
    @example("pvc://c", ["x-1", "c"])
    @example("oci://registry.example/models/tiny:1", [IMAGE_MODEL_NAME])
    @example("s3://my-bucket/models/a.b/", ["a.b"])
    @example("hf://gpt2/", ["gpt2"])
    def check(uri: str, names: list[str]) -> None:
        adapters = [{"name": name, "uri": f"pvc://adapters/{name}"} for name in names]
        spec = {"model": {"uri": uri}, "resources": {"gpu": {"count": 1}}}
        spec["lora"] = {"maxLoras": 2, "adapters": adapters}
        refused = _admit(api, namespace, spec)
        parsed, messages = _pydantic(spec)
        assert (refused is None) == (parsed is not None), (spec, refused, messages)
        if not re.match(MODEL_URI_PATTERN, uri):
            return  # refused by both for the URI itself
        clash = default_served_name(uri) in names
        assert (MSG_ADAPTER_SERVED_NAME in messages) == clash, (uri, names, messages)
        assert refused is None or (MSG_ADAPTER_SERVED_NAME in refused) == clash, (uri, names, refused)
        seen.add((uri.split("://")[0], clash))

    seen: set[tuple[str, bool]] = set()
    check()
    # Each scheme came up, and on each but hf:// two-part names (org/name) an adapter clashed.
    assert {scheme for scheme, _ in seen} == {"file", "pvc", "oci", "s3", "hf"}, seen
    assert {scheme for scheme, clash in seen if clash} == {"file", "pvc", "oci", "s3", "hf"}, seen
