"""kopf registration only: every watch event turns into "reconcile this InferenceService" on the queue.

The InferenceService itself, every child kind and the pods (labelled managed-by pagoda-operator, filtered
by the API server) are watched with `kopf.on.event`, which keeps no state on the objects: no finalizer, no
last-handled annotation, nothing written back by kopf. A child's or a pod's event queues its owner (the
`pagoda.dev/inferenceservice` label), so a deleted or hand-edited child is restored, status follows the
Deployment's readiness, and a crashing pod's reason reaches the Degraded condition. Nodes are watched too
(all of them, cluster-scoped, when the operator may list them): a Node whose readiness or node lifecycle
taints change queues every owner with a pod on it (NodeLost, status/nodes.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import kopf

from pagoda.operator.api import GROUP, PLURAL, VERSION
from pagoda.operator.api.budget import BUDGET_PLURAL
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.workqueue import WorkQueue
from pagoda.operator.reconcile.gpubudget import GPUBudgets
from pagoda.operator.resources import CHILD_KINDS, meta
from pagoda.operator.resources.meta import OWNER_LABEL
from pagoda.operator.status.nodes import NODE_KIND
from pagoda.operator.status.pods import POD_KIND
from pagoda.operator.status.scaling import HPA_KIND

MANAGED_BY = {"app.kubernetes.io/managed-by": meta.MANAGED_BY}
MANAGED_BY_SELECTOR = ",".join(f"{key}={value}" for key, value in MANAGED_BY.items())
# Kinds watched but never written: the pods of the ReplicaSets (for the Degraded condition) and the HPA
# that KEDA makes from the ScaledObject, which carries the ScaledObject's labels (for status.autoscaling).
OBSERVED_KINDS: list[tuple[str, str, str]] = [POD_KIND, HPA_KIND]
# Every kind watched for its owner's sake.
WATCHED_KINDS: list[tuple[str, str, str]] = [*CHILD_KINDS, *OBSERVED_KINDS]


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: kopf's change detection serves on.create/on.update handlers, and only on.event
    handlers are registered. kopf's own storages deep-copied every watched object on every event to build
    one (a quarter of the operator's event-loop time while 500 services were created)."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return None  # type: ignore[return-value]  # kopf skips the diff when there is no essence

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass  # nothing is kept: nothing would read it


def configure(settings: kopf.OperatorSettings, watch_timeout: int) -> None:
    """kopf settings that keep it from writing to user objects or posting its own Events."""
    settings.posting.enabled = False  # we record our own Events, only for real changes
    settings.peering.standalone = True
    settings.watching.server_timeout = watch_timeout
    settings.watching.client_timeout = watch_timeout + 30
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    # Unused while only event handlers are registered; set so that nothing would land in annotations.
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf")
    settings.persistence.diffbase_storage = NoDiffBase()
    # Server-side filtering: the API server sends only Pagoda's objects (not every pod in the cluster).
    for api_version, _kind, plural in WATCHED_KINDS:
        settings.watching.label_selectors[api_version, plural] = MANAGED_BY_SELECTOR


def connection_info(config: Any) -> kopf.ConnectionInfo:
    """kopf's credentials from the kubernetes client's loaded Configuration (the same kubeconfig/in-cluster
    identity the reconciler uses)."""
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (
        (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    )
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        username=config.username or None,
        password=config.password or None,
        scheme=scheme,
        token=token,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )


def build_registry(
    queue: WorkQueue,
    cache: ObjectCache,
    client_config: Any,
    watch_timeout: int = 600,
    watch_nodes: bool = True,
    budgets: GPUBudgets | None = None,
) -> kopf.OperatorRegistry:
    """`watch_nodes`: also watch Nodes (off when the operator may not list them); `budgets`: watch the
    GPUBudgets into it (off when they could not be listed)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, watch_timeout)

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(client_config)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def owner_event(
        type: str, event: kopf.RawEvent, name: str, namespace: str | None, **_: Any
    ) -> None:
        cache.observe(dict(event["object"]), deleted=type == "DELETED")
        if namespace:  # deleted too: its pass finds it gone and frees what it held in the fleet's budgets
            queue.add((namespace, name))

    async def child_event(
        type: str,
        event: kopf.RawEvent,
        labels: kopf.Labels,
        namespace: str | None,
        param: Any = None,
        **_: Any,
    ) -> None:
        api_version, kind = param
        cache.observe(dict(event["object"]), api_version=api_version, kind=kind, deleted=type == "DELETED")
        owner = labels.get(OWNER_LABEL)
        if owner and namespace:
            queue.add((namespace, owner))

    async def budget_event(type: str, event: kopf.RawEvent, name: str, **_: Any) -> None:
        assert budgets is not None
        budgets.observe(dict(event["object"]), deleted=type == "DELETED")
        budgets.wake_members(cache, name)  # its pool, or whom it admits, may have changed

    if budgets is not None:
        kopf.on.event(GROUP, VERSION, BUDGET_PLURAL, registry=registry, id="gpubudgets")(budget_event)

    for api_version, kind, plural in WATCHED_KINDS:
        kopf.on.event(
            api_version,
            plural,
            labels=MANAGED_BY,
            registry=registry,
            id=f"child-{plural}",
            param=(api_version, kind),
        )(child_event)

    async def node_event(type: str, event: kopf.RawEvent, name: str, **_: Any) -> None:
        if cache.observe_node(dict(event["object"]), deleted=type == "DELETED"):
            for key in cache.owners_on_node(name):
                queue.add(key)

    if watch_nodes:
        api_version, _kind, plural = NODE_KIND
        kopf.on.event(api_version, plural, registry=registry, id="nodes")(node_event)

    logging.getLogger("kopf").setLevel(logging.WARNING)
    return registry
