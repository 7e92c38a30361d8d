"""Fixtures for the e2e tests: the real local control plane (see e2e/fixtures.py)."""

from e2e.fixtures import cluster, cluster_api, namespace, operator, stack  # noqa: F401
