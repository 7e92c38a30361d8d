"""`pagoda-operator`: the kopf watches, the reconcile workers, the periodic resync, /healthz and /metrics."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import re
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import kopf
from kubernetes import client, config

from pagoda.operator import metrics
from pagoda.operator.api import API_VERSION, KIND, PLURAL
from pagoda.operator.api.network import NAMESPACE_PATTERN
from pagoda.operator.handlers import MANAGED_BY_SELECTOR, WATCHED_KINDS, build_registry
from pagoda.operator.kube.adapters import AdapterSync
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.capacity import CapacityReader
from pagoda.operator.kube.client import Kube, KubeError
from pagoda.operator.kube.leader import LeaderElector
from pagoda.operator.kube.management import (
    KUBELET_SYNC_SECONDS,
    KeyUnavailable,
    load_keys,
    parse_namespaced_name,
)
from pagoda.operator.kube.podcalls import PodTrust
from pagoda.operator.kube.workqueue import Outcome, WorkQueue, work
from pagoda.operator.reconcile import apply
from pagoda.operator.reconcile.core import reconcile
from pagoda.operator.reconcile.gpubudget import GPUBudgets
from pagoda.operator.reconcile.profile import DEFAULT_MAX_CONCURRENT_PROFILES, ProfileBudget
from pagoda.operator.reconcile.rollouts import DEFAULT_MAX_CONCURRENT, FleetRollouts
from pagoda.operator.resources import DEFAULT_RUNTIME_IMAGE, OperatorSettings
from pagoda.operator.status.nodes import NODE_KIND

WAKE_DELAY_S = 0.5  # a GPUBudget member's pass queued by another's (reconcile/gpubudget.py)
log = logging.getLogger("pagoda.operator")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="pagoda-operator", description="Reconciles pagoda.dev InferenceServices."
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--namespace", help="watch only this namespace (default: all namespaces)")
    parser.add_argument("--metrics-port", type=int, default=8080, help="port of /healthz and /metrics")
    parser.add_argument("--metrics-host", default="0.0.0.0", help="address of /healthz and /metrics")
    parser.add_argument("--workers", type=int, default=8, help="InferenceServices reconciled in parallel")
    parser.add_argument(
        "--resync-seconds", type=float, default=300.0, help="re-check every InferenceService this often"
    )
    parser.add_argument(
        "--runtime-image",
        default=DEFAULT_RUNTIME_IMAGE,
        help="runtime image for InferenceServices that set no spec.runtime.image",
    )
    parser.add_argument(
        "--read-capacity",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask each Ready runtime pod once for its KV-cache capacity (status.capacity); turn off where "
        "the operator cannot reach pod IPs",
    )
    parser.add_argument(
        "--management-key-secret",
        metavar="NAMESPACE/NAME",
        help="the Secret holding the key the operator signs its calls to the runtimes' management API with "
        "(made there when missing); default: a key of this process only, new at each start",
    )
    parser.add_argument(
        "--management-key-overlap-seconds",
        type=float,
        default=None,
        help="during a rotation of the management key, how long the new public key is published beside the "
        "old before the operator signs with it: long enough for every service's ConfigMap to be rewritten "
        f"and every pod's volume to follow; default: --resync-seconds + {KUBELET_SYNC_SECONDS:.0f}",
    )
    parser.add_argument(
        "--leader-elect",
        metavar="NAMESPACE/NAME",
        help="run as one of several replicas: only the holder of this Lease reconciles, the others wait to "
        "take over (kube/leader.py); default: this process alone reconciles",
    )
    parser.add_argument(
        "--leader-identity",
        default=os.environ.get("POD_NAME") or socket.gethostname(),
        help="this replica's name in the Lease, with a random suffix (default: $POD_NAME, else the host)",
    )
    parser.add_argument(
        "--allow-from-namespace",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="a namespace every InferenceService's NetworkPolicy admits (repeat it): the operator's own, for "
        "its calls to the pods, and Prometheus's (resources/networkpolicy.py)",
    )
    parser.add_argument(
        "--picker-cluster-role",
        metavar="NAME",
        help="the ClusterRole (rules: resources/routing.py PICKER_CLUSTER_RULES) that spec.routing's "
        "endpoint pickers are bound to in their namespace, which the operator may `bind`; default: each "
        "picker gets a Role of its own, which the operator may grant only if it holds its rules",
    )
    parser.add_argument(
        "--max-concurrent-rollouts",
        type=int,
        default=DEFAULT_MAX_CONCURRENT,
        metavar="N",
        help="how many services may roll at once for a pod template the operator changed (an upgrade's "
        "defaults), not their own spec: the others keep their pods and wait, with the status condition "
        "RolloutQueued (reconcile/rollouts.py); at least 1",
    )
    parser.add_argument(
        "--max-concurrent-profiles",
        type=int,
        default=DEFAULT_MAX_CONCURRENT_PROFILES,
        metavar="N",
        help="how many capacity profile Jobs (spec.slo) may run at once across the cluster: a new one waits, "
        "its status.profile Queued (reconcile/profile.py); at least 1",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    if args.leader_elect is not None:
        try:
            args.leader_elect = parse_namespaced_name(args.leader_elect, "--leader-elect")
        except ValueError as exc:
            parser.error(str(exc))
    if args.management_key_secret is not None:
        try:
            args.management_key_secret = parse_namespaced_name(
                args.management_key_secret, "--management-key-secret"
            )
        except ValueError as exc:
            parser.error(str(exc))
    if args.max_concurrent_rollouts < 1:
        parser.error(f"--max-concurrent-rollouts must be at least 1, got {args.max_concurrent_rollouts}")
    if args.max_concurrent_profiles < 1:
        parser.error(f"--max-concurrent-profiles must be at least 1, got {args.max_concurrent_profiles}")
    for namespace in args.allow_from_namespace:
        if not re.fullmatch(NAMESPACE_PATTERN, namespace) or len(namespace) > 63:
            parser.error(f"--allow-from-namespace: {namespace!r} is not a namespace name (a DNS label)")
    args.allow_from_namespace = tuple(args.allow_from_namespace)
    role = args.picker_cluster_role
    if role is not None and (not role or len(role) > 253 or any(c in role for c in "/% \t\n")):
        parser.error(f"--picker-cluster-role: {role!r} is not a ClusterRole name")
    if not 0 < args.metrics_port < 65536:
        parser.error(f"--metrics-port: {args.metrics_port} is not a TCP port (1-65535)")
    if args.workers < 1:
        parser.error(f"--workers: must be at least 1, got {args.workers}")
    if not args.runtime_image or any(c.isspace() for c in args.runtime_image):
        parser.error(
            f"--runtime-image: must be an image reference without spaces, got {args.runtime_image!r}"
        )
    if args.resync_seconds <= 0:
        parser.error(f"--resync-seconds: must be positive, got {args.resync_seconds}")
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        parser.error(f"--kubeconfig: no such file: {args.kubeconfig}")
    return args


def api_client(kubeconfig: str | None, pool_size: int) -> client.ApiClient:
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def refresh(
    kube: Kube, cache: ObjectCache, namespace: str | None, nodes: bool = True
) -> list[dict[str, object]]:
    """List InferenceServices, every child kind, the pods and the Nodes into the cache (one list per kind,
    read a page at a time so that only the cache's slim copy of each pod and Node is kept), and forget which
    Secrets were seen and the chat templates read from ConfigMaps; returns the owners. `nodes`: the Nodes
    too (not when they are not watched: a listed copy would go stale between resyncs)."""
    cache.forget_secrets()
    cache.forget_chat_templates()
    for api_version, kind, plural in WATCHED_KINDS:
        try:
            pages = kube.list_pages(api_version, plural, namespace, MANAGED_BY_SELECTOR)
            cache.replace(api_version, kind, pages)
        except KubeError as exc:
            if exc.status != 404:  # 404: that API (e.g. KEDA) is not installed
                raise
    if nodes:
        refresh_nodes(kube, cache)
    owners = kube.list(API_VERSION, PLURAL, namespace)
    cache.replace(API_VERSION, KIND, owners)
    return list(owners)


def refresh_nodes(kube: Kube, cache: ObjectCache) -> None:
    """List every Node into the cache (slim); when the operator may not (RBAC), it holds none and reports
    no node lost."""
    api_version, _kind, plural = NODE_KIND
    try:
        cache.replace_nodes(kube.list_pages(api_version, plural, None))
    except KubeError as exc:
        if exc.status != 403:
            raise
        log.warning("Failed to list nodes: forbidden; replicas on lost nodes are not reported")
        cache.forget_nodes()


async def resync(
    kube: Kube, cache: ObjectCache, queue: WorkQueue, namespace: str | None, every: float, nodes: bool = True
) -> None:
    """Periodically refresh the cache and queue every InferenceService: catches what no watch reports
    (a Secret created later, an edited chat template ConfigMap) and anything a watch missed."""
    while True:
        await asyncio.sleep(every)
        try:
            owners = await asyncio.to_thread(refresh, kube, cache, namespace, nodes)
        except Exception as exc:
            log.warning("Failed to list objects for resync error=%r", str(exc))
            continue
        for item in owners:
            meta = item["metadata"]
            assert isinstance(meta, dict)
            queue.add((meta["namespace"], meta["name"]))
        log.info("Queued resync count=%d", len(owners))


async def lead(elector: LeaderElector) -> None:
    """Waits until this replica holds the Lease."""
    log.info("Waiting for lease=%s/%s identity=%s", elector.namespace, elector.name, elector.identity)
    while True:
        if await asyncio.to_thread(elector.try_acquire_or_renew):
            return
        await asyncio.sleep(elector.timing.retry_period)


async def keep_leading(elector: LeaderElector) -> None:
    """Renews the Lease every retry period. When a renewal has not succeeded for the renew deadline (the
    API server unreachable, or another replica took the Lease) the process exits at once: a reconcile
    worker thread cannot be stopped, and another replica may take over once the lease duration passes.
    The exit needs this loop to run; the fence does not: every pass and write checks
    `elector.holds_lease` itself (kube/client.py), so a stalled loop or a paused process that resumes
    writes nothing before it exits."""
    timing = elector.timing
    while True:
        await asyncio.sleep(timing.retry_period)
        renewed_at = elector.renewed_at or 0.0
        attempt = asyncio.ensure_future(asyncio.to_thread(elector.try_acquire_or_renew))
        await asyncio.wait({attempt}, timeout=max(0.0, renewed_at + timing.renew_deadline - time.monotonic()))
        if not elector.holds_lease():
            metrics.LEADER.set(0)
            log.error(
                "Lost lease=%s/%s identity=%s: exiting", elector.namespace, elector.name, elector.identity
            )
            logging.shutdown()
            os._exit(1)


async def run(args: argparse.Namespace) -> None:
    api = api_client(args.kubeconfig, args.workers + apply.WRITERS + 2)
    kube = Kube(api)
    elector = None
    if args.leader_elect is not None:
        identity = f"{args.leader_identity}_{uuid.uuid4().hex[:8]}"
        lease_namespace, lease_name = args.leader_elect
        elector = LeaderElector(Kube(api), lease_namespace, lease_name, identity)  # renews unfenced
        kube = Kube(api, fence=elector.holds_lease)  # every other write: only while the Lease is held
    tasks: list[asyncio.Task[None]] = []
    operator_task: asyncio.Task[None] | None = None
    executor: ThreadPoolExecutor | None = None

    def healthy() -> bool:
        """A standby (not yet leading) is healthy too; a leader while its watches and workers run."""
        running = [operator_task, *tasks] if operator_task is not None else tasks
        return not any(task.done() for task in running)

    runner = await metrics.serve(args.metrics_host, args.metrics_port, healthy)
    try:
        if elector is not None:
            await lead(elector)
            tasks.append(asyncio.create_task(keep_leading(elector)))
        operator_task, executor = await reconcile_all(api, kube, args, tasks)
        await operator_task
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if elector is not None:
            await asyncio.to_thread(elector.release)
        await runner.cleanup()
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        log.info("Stopped operator")


async def reconcile_all(
    api: client.ApiClient, kube: Kube, args: argparse.Namespace, tasks: list[asyncio.Task[None]]
) -> tuple[asyncio.Task[None], ThreadPoolExecutor]:
    """Starts the reconcile workers on their thread pool and the resync (added to `tasks`), and kopf's
    watches; returns kopf's task and the pool."""
    queue = WorkQueue()
    metrics.watch_queue(queue)
    cache = ObjectCache(KIND)
    # Prime the cache before any pass runs, so a restart never mistakes "not seen yet" for "missing".
    for item in await asyncio.to_thread(refresh, kube, cache, args.namespace):
        queue.add((item["metadata"]["namespace"], item["metadata"]["name"]))  # type: ignore[index]
    executor = ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="reconcile")
    loop = asyncio.get_running_loop()

    def wake(key: tuple[str, str]) -> None:
        """From a pass's thread (the queue is the event loop's), a moment later: wakes of one member by
        several others' passes become one pass, and two members can never wake each other in a tight loop."""
        loop.call_soon_threadsafe(queue.add_after, key, WAKE_DELAY_S)

    budgets = GPUBudgets(wake=wake)
    # A GPUBudget is the cluster's: only an operator that watches every namespace applies them.
    watch_budgets = args.namespace is None and await asyncio.to_thread(budgets.prime, kube)
    budgets.known = watch_budgets
    trust = PodTrust(kube, cache.owner)  # the CA each TLS service's pods are verified against
    capacity = CapacityReader(trust=trust) if args.read_capacity else None
    overlap = args.management_key_overlap_seconds
    if overlap is None:
        overlap = args.resync_seconds + KUBELET_SYNC_SECONDS
    keys = await asyncio.to_thread(load_keys, kube, args.management_key_secret, overlap)
    reconcile_one = functools.partial(
        reconcile,
        kube,
        cache=cache,
        capacity=capacity,
        adapters=AdapterSync(keys, trust=trust),
        rollouts=FleetRollouts(args.max_concurrent_rollouts),
        profiles=ProfileBudget(args.max_concurrent_profiles),
        budgets=budgets,
    )
    settings = OperatorSettings(
        default_image=args.runtime_image,
        trusted_namespaces=args.allow_from_namespace,
        picker_cluster_role=args.picker_cluster_role,
    )

    def job(namespace: str, name: str) -> Outcome:
        """One pass, with the management keys as the Secret has them now (a rotation's steps: KeyRing)."""
        keys.refresh()
        return reconcile_one(namespace, name, settings=replace(settings, management_key=keys.public_pem))

    metrics.LEADER.set(1)
    tasks += [asyncio.create_task(work(queue, job, executor)) for _ in range(args.workers)]
    watch_nodes = cache.nodes_known()  # the first list of Nodes was allowed
    tasks.append(
        asyncio.create_task(resync(kube, cache, queue, args.namespace, args.resync_seconds, watch_nodes))
    )
    operator_task = asyncio.create_task(
        kopf.operator(
            registry=build_registry(
                queue,
                cache,
                api.configuration,
                watch_nodes=watch_nodes,
                budgets=budgets if watch_budgets else None,
            ),
            clusterwide=args.namespace is None,
            namespaces=[args.namespace] if args.namespace else [],
            standalone=True,
        )
    )

    log.info(
        "Started operator namespace=%s workers=%d metrics_port=%d",
        args.namespace or "*",
        args.workers,
        args.metrics_port,
    )
    return operator_task, executor


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    try:
        asyncio.run(run(args))
    except KeyUnavailable as exc:
        log.error("Failed to start: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
