"""What the unit tests' fake API servers share: a write answered as the API server answers it."""

from __future__ import annotations

import copy
from typing import Any

Obj = dict[str, Any]


class StampingWrites:
    """Records a pass's writes and answers each with the object back, a new resourceVersion and a uid."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []
        self.version = 100

    def check_leader(self, what: str) -> None:
        """The leader fence (kube.py): one replica, no leader election, so every pass and write may go."""

    def _stamp(self, obj: Obj) -> Obj:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        obj["metadata"].setdefault("uid", f"uid-{obj['kind']}")
        return obj


def owner_object(spec: Obj) -> Obj:
    """The InferenceService `llm` in namespace `ns` as the API server returns it, generation 1."""
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {
            "name": "llm",
            "namespace": "ns",
            "uid": "uid-owner",
            "resourceVersion": "1",
            "generation": 1,
        },
        "spec": spec,
    }


def deployment_of(children: list[Obj]) -> Obj:
    """The runtime Deployment among desired_children's manifests."""
    [deployment] = [
        c
        for c in children
        if c["kind"] == "Deployment" and "pagoda.dev/endpoint-picker" not in c["metadata"]["labels"]
    ]
    return deployment


class StatusWrites(StampingWrites):
    """The writes of `write_status` for the InferenceService of `spec`: its status patch answered with the
    owner as the API server returns it, and the Events it creates recorded in `events`."""

    def __init__(self, spec: Obj) -> None:
        super().__init__()
        self.spec = spec
        self.events: list[Obj] = []

    def patch_status(
        self, api_version: str, kind: str, plural: str, namespace: str, name: str, status: Obj
    ) -> Obj:
        return self._stamp({**owner_object(self.spec), "status": status})

    def create(self, manifest: Obj, plural: str, counted: bool = True) -> Obj:
        self.events.append(manifest)
        return manifest
