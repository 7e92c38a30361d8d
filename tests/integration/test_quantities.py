"""The quantity table of the unit tests (operator/resources/quantity.py builds quantities in the API
server's canonical form) holds for the real API server: each entry sent as a Pod's memory limit in a
server-side dry run comes back exactly as the table says, and what the table calls no quantity is refused.
"""

from __future__ import annotations

from typing import Any

import pytest

from e2e.lab._objects import request
from tests.unit.test_resources_quantity import CANONICAL, NOT_QUANTITIES


def pod(memory_limits: list[int | str]) -> dict[str, Any]:
    """One container per limit, so the whole table goes in one request."""
    containers = [
        {"name": f"c{index}", "image": "example.invalid/none", "resources": {"limits": {"memory": limit}}}
        for index, limit in enumerate(memory_limits)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "quantities"},
        "spec": {"containers": containers},
    }


def dry_run(cluster_api: Any, namespace: str, body: dict[str, Any]) -> tuple[int, Any]:
    """Create `body` with a server-side dry run, as raw JSON (the client's models would retype quantities)."""
    return request(cluster_api, "POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", body)


def test_the_api_server_returns_the_tables_canonical_forms(cluster_api: Any, namespace: str) -> None:
    status, created = dry_run(cluster_api, namespace, pod([given for given, _ in CANONICAL]))
    assert status == 201, created
    returned = [container["resources"]["limits"]["memory"] for container in created["spec"]["containers"]]
    mismatches = {
        str(given): (table, server)
        for (given, table), server in zip(CANONICAL, returned, strict=True)
        if server != table
    }
    assert not mismatches, f"given: (table, API server): {mismatches}"


@pytest.mark.parametrize("bad", NOT_QUANTITIES)
def test_the_api_server_refuses_what_the_table_calls_no_quantity(
    cluster_api: Any, namespace: str, bad: str
) -> None:
    status, result = dry_run(cluster_api, namespace, pod([bad]))
    assert status in (400, 422), result
