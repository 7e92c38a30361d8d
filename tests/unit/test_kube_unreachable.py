"""An API server that does not answer (restarting, say) is an OSError to the operator's callers, never a
crash: the leader election keeps trying instead of ending the process.

A real client against a loopback port nothing listens on: the connection is refused after urllib3's
retries, as while kube-apiserver restarts (e2e/test_real_pods.py restarts it under a running operator).
"""

from __future__ import annotations

import socket

import pytest
from kubernetes import client

from pagoda.operator.kube.client import ApiUnreachable, Kube
from pagoda.operator.kube.leader import LeaderElector


def closed_port() -> int:
    """A loopback port that was free a moment ago and that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def kube() -> Kube:
    config = client.Configuration(host=f"http://127.0.0.1:{closed_port()}")
    return Kube(client.ApiClient(config))


def test_a_refused_connection_is_an_os_error_that_names_the_call(kube: Kube) -> None:
    with pytest.raises(ApiUnreachable) as raised:
        kube.get("coordination.k8s.io/v1", "leases", "ops", "pagoda-leader")
    assert isinstance(raised.value, OSError)
    assert "GET /apis/coordination.k8s.io/v1/namespaces/ops/leases/pagoda-leader" in str(raised.value)


def test_a_candidate_waits_on_through_an_unreachable_api_server(kube: Kube) -> None:
    elector = LeaderElector(kube, "ops", "pagoda-leader", "replica-a_1234")
    assert elector.try_acquire_or_renew() is False
    assert not elector.holds_lease()
