"""The runtime pod's node cache folder, environment and placement (operator/resources/pod.py): what
isolates one namespace's cached models from another's is built by the operator, no variable the operator
sets is the user's to redefine (issue #40 §5), and the replicas spread across nodes (issue #41)."""

from __future__ import annotations

from typing import Any

import pytest

from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.api.model import NODE_CACHE_ROOT
from pagoda.operator.api.rules import OPERATOR_ENV
from pagoda.operator.resources import ChildInputs, OperatorSettings, desired_children
from pagoda.operator.resources.meta import selector
from pagoda.operator.resources.pod import node_cache_host_path

PUBLIC_KEY = """-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEABJyO8IV3NuY1l+fAUATX9e3LNKd5Jk3iZNwUdNQ3cb4=
-----END PUBLIC KEY-----
"""


def _pod(spec: dict[str, Any], namespace: str = "team-a", management: bool = False) -> dict[str, Any]:
    inputs = ChildInputs(OperatorSettings(management_key=PUBLIC_KEY if management else None))
    children = desired_children("llm", namespace, InferenceServiceSpec.model_validate(spec), inputs)
    [deployment] = [c for c in children if c["kind"] == "Deployment"]
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def _node_cache(spec: dict[str, Any]) -> dict[str, Any]:
    spec["model"]["cache"] = {"scope": "Node", "size": "100Gi"}
    return spec


@pytest.mark.parametrize("namespace", ["team-a", "team-b"])
def test_the_node_cache_is_the_namespaces_own_folder_named_by_the_operator(
    llama_spec: dict[str, Any], namespace: str
) -> None:
    """The folder was `$(POD_NAMESPACE)` under the root (subPathExpr), and spec.runtime.env could redefine
    that variable: a pod could mount another namespace's models. Now the hostPath itself is the namespace's
    folder, and nothing in the pod chooses a path under it."""
    pod = _pod(_node_cache(llama_spec), namespace)
    [cache] = [v for v in pod["volumes"] if v["name"] == "model-cache"]
    assert cache["hostPath"] == {"path": f"{NODE_CACHE_ROOT}/{namespace}", "type": "DirectoryOrCreate"}
    containers = pod["containers"] + pod["initContainers"]
    assert [c["name"] for c in pod["initContainers"]] == ["cache-owner"]
    for container in containers:
        for mount in container["volumeMounts"]:
            assert "subPathExpr" not in mount and "subPath" not in mount, (container["name"], mount)
        assert "POD_NAMESPACE" not in {var["name"] for var in container.get("env", [])}


@pytest.mark.parametrize("namespace", ["", ".", "..", "a/b"])
def test_a_namespace_that_names_no_folder_of_its_own_is_refused(namespace: str) -> None:
    with pytest.raises(ValueError, match="cannot name a node cache folder"):
        node_cache_host_path(namespace)


def test_the_operator_sets_only_reserved_variables_and_each_once(llama_spec: dict[str, Any]) -> None:
    """One list (rules.OPERATOR_ENV) for the builder and the admission rules: a variable the builder adds
    without reserving it fails here, as does a reserved name the operator neither sets nor keeps for the
    pod's identity."""
    llama_spec["runtime"] = {
        "apiKeySecret": {"name": "api"},
        "env": [{"name": "LOG_LEVEL", "value": "debug"}],
    }
    pod = _pod(_node_cache(llama_spec), management=True)
    names = [var["name"] for var in pod["containers"][0]["env"]]
    assert len(names) == len(set(names)), names
    assert set(names) - {"LOG_LEVEL"} == set(OPERATOR_ENV) - {"POD_NAMESPACE"}
    for init in pod["initContainers"]:
        assert set(var["name"] for var in init.get("env", [])) <= set(OPERATOR_ENV)


def test_replicas_spread_across_nodes_by_default(llama_spec: dict[str, Any]) -> None:
    """One node drained or lost takes as few replicas as the cluster allows (issue #41): preferred, not
    required, so a one-node cluster or a full node still runs every replica."""
    [spread] = _pod(llama_spec)["topologySpreadConstraints"]
    assert spread == {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": selector("llm")},
        "matchLabelKeys": ["pod-template-hash"],
    }


def test_the_specs_spread_replaces_the_default_and_an_empty_one_turns_it_off(
    llama_spec: dict[str, Any],
) -> None:
    zone = "topology.kubernetes.io/zone"
    zones = [{"maxSkew": 2, "topologyKey": zone, "whenUnsatisfiable": "DoNotSchedule"}]
    llama_spec["scheduling"] = {"topologySpreadConstraints": zones}
    assert _pod(llama_spec)["topologySpreadConstraints"] == zones
    llama_spec["scheduling"] = {"topologySpreadConstraints": []}
    assert "topologySpreadConstraints" not in _pod(llama_spec)
