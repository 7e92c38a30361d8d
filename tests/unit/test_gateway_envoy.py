"""The e2e gateway's Envoy config (e2e/lab/gateway.py, from e2e/lab/envoy-bootstrap.yaml.j2): Envoy itself
accepts it (`--mode validate`) with and without the round-robin listener and with either failure mode, the
values land where they belong, and the round-robin listener that benchmarks/bench_routing.py compares against
differs from the picker's only in the picking: no ext_proc filter, a ROUND_ROBIN cluster of the given pods,
the same route and timeouts."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.lab.gateway import (
    HEALTH_CLUSTER,
    PICKER_RETRY,
    UPSTREAM_HEADER,
    Picker,
    envoy_binary,
    envoy_bootstrap,
)
from pagoda.operator.resources.routing import GRPC_PORT, HEALTH_PORT

PICKER = Picker(fail_open=False, service_ip="10.96.0.20", pod_ip="10.244.0.9")
PODS = [("10.244.0.11", 8000), ("10.244.0.12", 8000), ("10.244.0.13", 8000)]


def validate(bootstrap: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "envoy.yaml"
    config.write_text(yaml.safe_dump(bootstrap, sort_keys=False))
    command = [str(envoy_binary()), "--mode", "validate", "-c", str(config), "--log-level", "error"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def manager(listener: dict[str, Any]) -> dict[str, Any]:
    return dict(listener["filter_chains"][0]["filters"][0]["typed_config"])


@pytest.mark.parametrize("fail_open", [False, True], ids=["fail-close", "fail-open"])
@pytest.mark.parametrize("round_robin", [None, (10002, PODS)], ids=["picker", "picker-and-round-robin"])
def test_envoy_accepts_the_gateway_config(round_robin: Any, fail_open: bool, tmp_path: Path) -> None:
    picker = dataclasses.replace(PICKER, fail_open=fail_open)
    checked = validate(envoy_bootstrap(10000, 10001, picker, round_robin=round_robin), tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("fail_open", [False, True])
def test_the_values_land_where_they_belong(fail_open: bool) -> None:
    picker = dataclasses.replace(PICKER, fail_open=fail_open)
    bootstrap = envoy_bootstrap(10000, 10001, picker, timeout=42.4)
    assert bootstrap["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 10001}
    [gateway] = bootstrap["static_resources"]["listeners"]
    assert gateway["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 10000}
    http = manager(gateway)
    assert http["stream_idle_timeout"] == "42s"
    route = http["route_config"]["virtual_hosts"][0]["routes"][0]
    assert route["route"] == {"cluster": "original_destination", "timeout": "42s", "idle_timeout": "42s"}
    assert route["response_headers_to_add"][0]["header"]["key"] == UPSTREAM_HEADER
    ext_proc = http["http_filters"][0]["typed_config"]
    assert ext_proc["grpc_service"]["envoy_grpc"]["authority"] == f"10.96.0.20:{GRPC_PORT}"
    assert ext_proc["message_timeout"] == "42s"
    assert ext_proc["failure_mode_allow"] is fail_open
    # Opening a stream to the picker is retried through a leader's hand-over (a refused connection).
    retry = ext_proc["grpc_service"]["retry_policy"]
    assert "connect-failure" in retry["retry_on"].split(",")
    assert retry["num_retries"] == PICKER_RETRY["attempts"] >= 30
    assert retry["retry_back_off"] == {"base_interval": "0.25s", "max_interval": "1s"}
    # Every request waiting through a hand-over may retry at once (Envoy's default: 3 retries at a time).
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}
    assert clusters["ext_proc"]["circuit_breakers"]["thresholds"][0]["max_retries"] >= 10_000
    # A connection to a picker whose node died is ended by the kernel within seconds (TCP keepalive, and
    # TCP_USER_TIMEOUT: IPPROTO_TCP 6, option 18), not by HTTP/2 PINGs, which the picker's grpc-go server
    # answers with GOAWAY `too_many_pings` while it holds a queued request.
    picker_cluster = clusters["ext_proc"]
    keepalive = picker_cluster["upstream_connection_options"]["tcp_keepalive"]
    assert keepalive["keepalive_time"] + keepalive["keepalive_interval"] * keepalive["keepalive_probes"] <= 5
    [user_timeout] = picker_cluster["upstream_bind_config"]["socket_options"]
    assert (user_timeout["level"], user_timeout["name"], user_timeout["int_value"]) == (6, 18, 5000)
    http2 = picker_cluster["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert "connection_keepalive" not in http2["explicit_http_config"]["http2_protocol_options"]
    assert list(clusters) == ["original_destination", "ext_proc", HEALTH_CLUSTER]

    def addresses(cluster: dict[str, Any]) -> list[tuple[str, int]]:
        endpoints = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        return [tuple(e["endpoint"]["address"]["socket_address"].values()) for e in endpoints]

    assert addresses(clusters["ext_proc"]) == [("10.96.0.20", GRPC_PORT)]
    assert addresses(clusters[HEALTH_CLUSTER]) == [("10.244.0.9", HEALTH_PORT)]


def test_the_round_robin_listener_differs_only_in_the_picking() -> None:
    bootstrap = envoy_bootstrap(10000, 10001, PICKER, round_robin=(10002, PODS))
    gateway, round_robin = bootstrap["static_resources"]["listeners"]
    filters = [[f["name"] for f in manager(listener)["http_filters"]] for listener in (gateway, round_robin)]
    assert filters == [
        ["envoy.filters.http.ext_proc", "envoy.filters.http.router"],
        ["envoy.filters.http.router"],
    ]
    routes = [
        manager(listener)["route_config"]["virtual_hosts"][0]["routes"][0]
        for listener in (gateway, round_robin)
    ]
    assert [r["route"]["cluster"] for r in routes] == ["original_destination", "round_robin"]
    assert routes[0]["route"]["timeout"] == routes[1]["route"]["timeout"]
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}
    pool = clusters["round_robin"]
    assert pool["lb_policy"] == "ROUND_ROBIN"
    endpoints = pool["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [(e["endpoint"]["address"]["socket_address"]["address"]) for e in endpoints] == [
        ip for ip, _ in PODS
    ]
    # The same upstream settings as the picker's side (an idle timeout below the runtime's keep-alive).
    assert (
        pool["typed_extension_protocol_options"]
        == clusters["original_destination"]["typed_extension_protocol_options"]
    )
    assert "round_robin" not in {
        c["name"] for c in envoy_bootstrap(10000, 10001, PICKER)["static_resources"]["clusters"]
    }
