"""The no-op check: desired manifest vs live object (projection onto our keys)."""

from __future__ import annotations

import copy
from typing import Any

from pagoda.operator.reconcile.compare import differences, matches, stale_fields

DESIRED: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "m", "namespace": "ns", "labels": {"a": "b"}},
    "spec": {
        "selector": {"matchLabels": {"a": "b"}},
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "runtime",
                        "image": "img:1",
                        "args": ["serve", "--model", "hf://x/y"],
                        "ports": [{"name": "http", "containerPort": 8000}],
                        "resources": {"limits": {"cpu": "4", "memory": "2Gi", "nvidia.com/gpu": 1}},
                    }
                ],
                "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
            }
        },
    },
}


def live_version() -> dict[str, Any]:
    """What the API server returns: defaults added, quantities canonicalised, extra managers' fields."""
    live = copy.deepcopy(DESIRED)
    live["metadata"].update(
        resourceVersion="7", uid="u", annotations={"deployment.kubernetes.io/revision": "1"}
    )
    live["spec"]["replicas"] = 3  # owned by the HPA
    container = live["spec"]["template"]["spec"]["containers"][0]
    container.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
    container["ports"][0]["protocol"] = "TCP"
    container["resources"]["limits"] = {"cpu": "4", "memory": "2048Mi", "nvidia.com/gpu": "1"}
    container["env"] = [{"name": "ADDED_BY_SOMEONE", "value": "1"}]
    live["spec"]["template"]["spec"]["volumes"].insert(0, {"name": "other", "emptyDir": {}})
    live["status"] = {"replicas": 3}
    return live


def test_defaults_and_foreign_fields_are_not_drift() -> None:
    assert differences(DESIRED, live_version()) == []


def test_changed_image_is_drift_with_its_path() -> None:
    live = live_version()
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "img:2"
    assert differences(DESIRED, live) == ["spec.template.spec.containers[name=runtime].image"]


def test_changed_args_length_is_drift() -> None:
    live = live_version()
    live["spec"]["template"]["spec"]["containers"][0]["args"].append("--extra")
    assert not matches(DESIRED, live)


def test_changed_quantity_value_is_drift() -> None:
    live = live_version()
    live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "1Gi"
    assert differences(DESIRED, live) == [
        "spec.template.spec.containers[name=runtime].resources.limits.memory"
    ]


def test_missing_label_and_missing_list_item_are_drift() -> None:
    live = live_version()
    del live["metadata"]["labels"]["a"]
    live["spec"]["template"]["spec"]["volumes"] = [{"name": "other", "emptyDir": {}}]
    assert differences(DESIRED, live) == ["metadata.labels.a", "spec.template.spec.volumes[name=shm]"]


def test_string_is_not_a_number_outside_quantities() -> None:
    desired = {"spec": {"maxUnavailable": 1}}
    assert not matches(desired, {"spec": {"maxUnavailable": "1"}})
    assert matches(desired, {"spec": {"maxUnavailable": 1}})
    assert not matches({"x": True}, {"x": 1})


def test_empty_desired_map_matches_absent_field() -> None:
    assert matches({"spec": {"emptyDir": {}, "a": 1}}, {"spec": {"a": 1}})
    assert not matches({"spec": {"a": 1}}, {"spec": {}})


def test_absent_live_object_is_drift() -> None:
    assert not matches(DESIRED, {})


def with_owned(live: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    live["metadata"]["managedFields"] = [
        {
            "manager": "kube-controller-manager",
            "operation": "Update",
            "fieldsV1": {"f:spec": {"f:replicas": {}}},
        },
        {"manager": "pagoda-operator", "operation": "Apply", "fieldsV1": fields},
    ]
    return live


OWNED = {
    "f:metadata": {"f:labels": {"f:a": {}}},
    "f:spec": {
        "f:selector": {},
        "f:template": {
            "f:spec": {
                "f:containers": {
                    'k:{"name":"runtime"}': {
                        ".": {},
                        "f:image": {},
                        "f:ports": {'k:{"containerPort":8000,"protocol":"TCP"}': {".": {}, "f:name": {}}},
                    }
                },
                "f:volumes": {'k:{"name":"shm"}': {"f:emptyDir": {"f:medium": {}}}},
            }
        },
    },
}


def test_fields_we_still_set_are_not_stale() -> None:
    assert matches(DESIRED, with_owned(live_version(), OWNED))


def test_field_dropped_from_desired_is_stale() -> None:
    owned = {**OWNED, "f:spec": {**OWNED["f:spec"], "f:replicas": {}}}  # we set replicas last time
    live = with_owned(live_version(), owned)
    assert differences(DESIRED, live) == []  # the projection alone cannot see it
    assert stale_fields(DESIRED, live) == ["spec.replicas"]
    assert not matches(DESIRED, live)


def test_list_item_dropped_from_desired_is_stale() -> None:
    owned = {"f:spec": {"f:template": {"f:spec": {"f:volumes": {'k:{"name":"old"}': {}}}}}}
    assert stale_fields(DESIRED, with_owned(live_version(), owned)) == [
        'spec.template.spec.volumes[{"name":"old"}]'
    ]
