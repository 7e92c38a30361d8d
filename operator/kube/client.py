"""A thin, synchronous Kubernetes API layer for the reconciler: server-side apply, list, delete, status.

Built on the kubernetes client's ApiClient (authentication, TLS, kubeconfig) but speaking plain JSON, so
any kind (core, apps, policy, KEDA's CRDs) goes through the same few calls. Every write is counted in
`pagoda_operator_api_writes_total{kind,verb}`.

The leader fence: with leader election, every write (apply, delete, status patch, create) goes through
`_write`, which asks the `fence` (the elector's `holds_lease`) first and refuses with NotLeader when this
replica may have lost the Lease, so a reconcile thread that outlives its leadership (the event loop
stalled, the process paused) writes nothing. The elector renews the Lease through its own unfenced Kube.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import urllib3.exceptions
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from pagoda.operator import metrics
from pagoda.operator.resources.meta import FIELD_MANAGER

REQUEST_TIMEOUT = (5.0, 30.0)
log = logging.getLogger("pagoda.operator.kube")
LIST_PAGE = 100  # objects per page of a paged list (a page of pods is about 1 MB of JSON)

Obj = dict[str, Any]


class KubeError(Exception):
    """An API call the server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @classmethod
    def from_api_exception(cls, exc: ApiException) -> KubeError:
        message = str(exc.reason or "")
        reason = str(exc.reason or "")
        try:
            status = json.loads(exc.body or "{}")
            message = str(status.get("message", message))
            reason = str(status.get("reason", reason))
        except (TypeError, ValueError):
            pass
        return cls(int(exc.status or 0), reason, message)


class NotLeader(Exception):
    """A write (or a pass) refused: this replica may no longer hold the leader Lease (kube/leader.py).
    Neither a KubeError nor an OSError, so that no caller that rides out a failed call swallows it."""


class ApiUnreachable(ConnectionError):
    """The API server did not answer (connection refused or reset, a timeout) after the client's retries.

    urllib3 raises its own exception family for these, outside OSError; as an OSError here, a caller that
    rides out an API server restart (the leader election, the event recorder) catches one family."""


def resource_path(api_version: str, plural: str, namespace: str | None, name: str | None = None) -> str:
    """The REST path of a collection or an object, e.g. /apis/apps/v1/namespaces/ns/deployments/x."""
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
    return f"{path}/{name}" if name else path


class Kube:
    """The calls the reconciler makes; one instance is shared by all worker threads."""

    def __init__(self, api: ApiClient, fence: Callable[[], bool] | None = None) -> None:
        """`fence`: True while this replica may write (the leader elector's `holds_lease`); None: always
        (one replica, no leader election)."""
        self.api = api
        self.fence = fence

    def check_leader(self, what: str) -> None:
        """Raise NotLeader unless this replica may write now: the one check before every pass and write."""
        if self.fence is None or self.fence():
            return
        log.warning("Skipped %s: not leader (the lease may have been lost)", what)
        raise NotLeader(what)

    def _write(self, method: str, path: str, **call: Any) -> Obj:
        """Every write's one way to the API server, behind the leader fence."""
        self.check_leader(f"write {method} {path}")
        return self._call(method, path, **call)

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Obj:
        request = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": accept},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(*request, _request_timeout=REQUEST_TIMEOUT)
            data = response.read()  # type: ignore[no-untyped-call]
        except ApiException as exc:
            raise KubeError.from_api_exception(exc) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise ApiUnreachable(f"{method} {path}: {exc}") from exc
        if not 200 <= response.status <= 299:
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            try:
                status = json.loads(text)
                raise KubeError(
                    response.status, str(status.get("reason", "")), str(status.get("message", text))
                )
            except ValueError:
                raise KubeError(response.status, "", text) from None
        parsed: Obj = json.loads(data) if data else {}
        return parsed

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> Obj | None:
        try:
            return self._call("GET", resource_path(api_version, plural, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def get_metadata(self, api_version: str, plural: str, namespace: str | None, name: str) -> Obj | None:
        """The object's metadata only (PartialObjectMetadata), e.g. to see that a Secret exists."""
        try:
            return self._call(
                "GET",
                resource_path(api_version, plural, namespace, name),
                accept="application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, api_version: str, plural: str, namespace: str | None, label_selector: str | None = None
    ) -> list[Obj]:
        query = [("labelSelector", label_selector)] if label_selector else []
        items: list[Obj] = self._call("GET", resource_path(api_version, plural, namespace), query=query).get(
            "items", []
        )
        return items

    def list_pages(
        self,
        api_version: str,
        plural: str,
        namespace: str | None,
        label_selector: str | None = None,
        page: int = LIST_PAGE,
    ) -> Iterator[Obj]:
        """The items of a list, fetched `page` at a time (one consistent snapshot, like `list`), so a caller
        that keeps a slimmed copy of each item never holds the whole list at once."""
        query = [("labelSelector", label_selector)] if label_selector else []
        query.append(("limit", str(page)))
        token = ""
        while True:
            data = self._call(
                "GET",
                resource_path(api_version, plural, namespace),
                query=query + ([("continue", token)] if token else []),
            )
            yield from data.get("items") or []
            token = (data.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    def apply(self, manifest: Obj, plural: str, field_manager: str = FIELD_MANAGER) -> Obj:
        """Server-side apply with our field manager, forcing conflicts (we are the controller)."""
        meta = manifest["metadata"]
        path = resource_path(manifest["apiVersion"], plural, meta.get("namespace"), meta["name"])
        result = self._write(
            "PATCH",
            path,
            query=[("fieldManager", field_manager), ("force", "true")],
            body=manifest,
            content_type="application/apply-patch+yaml",
        )
        metrics.API_WRITES.labels(kind=manifest["kind"], verb="apply").inc()
        return result

    def delete(self, api_version: str, kind: str, plural: str, namespace: str, name: str, uid: str) -> None:
        """Delete one object, only if it is still the one we saw (uid precondition)."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
            "preconditions": {"uid": uid},
        }
        try:
            self._write("DELETE", resource_path(api_version, plural, namespace, name), body=body)
        except KubeError as exc:
            if exc.status not in (404, 409):
                raise
        metrics.API_WRITES.labels(kind=kind, verb="delete").inc()

    def patch_status(
        self, api_version: str, kind: str, plural: str, namespace: str | None, name: str, status: Obj
    ) -> Obj:
        path = resource_path(api_version, plural, namespace, name) + "/status"
        result = self._write(
            "PATCH", path, body={"status": status}, content_type="application/merge-patch+json"
        )
        metrics.API_WRITES.labels(kind=kind, verb="patch_status").inc()
        return result

    def replace(self, manifest: Obj, plural: str) -> Obj:
        """PUT the whole object; with metadata.resourceVersion set, only if nobody changed it since (409).
        Used for the leader Lease (through the elector's unfenced Kube) and the management key Secret's
        rotation (kube/management.py, behind the leader fence), and not counted in the API writes:
        renewing a Lease every few seconds is not work on an InferenceService."""
        meta = manifest["metadata"]
        path = resource_path(manifest["apiVersion"], plural, meta.get("namespace"), meta["name"])
        return self._write("PUT", path, body=manifest)

    def create(self, manifest: Obj, plural: str, counted: bool = True) -> Obj:
        """POST a new object; `counted`: in the API writes (not for the leader Lease, see `replace`)."""
        meta = manifest["metadata"]
        result = self._write(
            "POST", resource_path(manifest["apiVersion"], plural, meta.get("namespace")), body=manifest
        )
        if counted:
            metrics.API_WRITES.labels(kind=manifest["kind"], verb="create").inc()
        return result
