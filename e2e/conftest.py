"""Fixtures for the e2e tests: the real local control plane (see e2e/fixtures.py)."""

import pytest

from e2e.fixtures import cluster, cluster_api, namespace, operator, second_node, stack  # noqa: F401


@pytest.fixture(scope="session")
def real_node() -> bool:
    """Tier 4's cluster has the real node (e2e/lab/realnode.py) and the local registry."""
    return True
