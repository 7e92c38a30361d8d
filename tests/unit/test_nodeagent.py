"""The node agent's pure parts (e2e/nodeagent.py): the image path table and the kubelet's probe counting."""

from __future__ import annotations

from e2e.nodeagent import Probe, map_paths

TABLE = {"/models": "/host/models", "/var/cache/pagoda": "/pods/x/cache", "/dev/termination-log": "/pods/x/t"}


def test_paths_are_mapped_where_they_stand_as_paths() -> None:
    assert map_paths("file:///models/tiny", TABLE) == "file:///host/models/tiny"
    assert map_paths("/var/cache/pagoda", TABLE) == "/pods/x/cache"
    assert map_paths("/var/cache/pagoda/vllm", TABLE) == "/pods/x/cache/vllm"
    assert map_paths("--cache-dir=/var/cache/pagoda", TABLE) == "--cache-dir=/pods/x/cache"
    assert map_paths("/dev/termination-log", TABLE) == "/pods/x/t"


def test_other_values_are_left_alone() -> None:
    others = ("/modelsx", "hf://org/models/x", "s3://bucket/models/tiny", "tiny", "/var/cache/pagodas", "")
    for value in others:
        assert map_paths(value, TABLE) == value


def test_longest_path_wins() -> None:
    table = {"/models": "/a", "/models/tiny": "/b"}
    assert map_paths("/models/tiny/config.json", table) == "/b/config.json"
    assert map_paths("/models/other", table) == "/a/other"


def test_probe_needs_consecutive_failures_and_resets_on_success() -> None:
    probe = Probe({"periodSeconds": 5, "failureThreshold": 3, "initialDelaySeconds": 2})
    probe.reset(100.0)
    assert not probe.due(101.0) and probe.due(102.0)
    assert probe.record(False, 102.0) is None
    assert probe.record(False, 107.0) is None
    assert probe.record(True, 112.0) == "success"
    assert probe.record(False, 117.0) is None
    assert probe.record(False, 122.0) is None
    assert probe.record(False, 127.0) == "failure"
    assert probe.next_at == 132.0


def test_probe_defaults_are_the_kubelets() -> None:
    probe = Probe({})
    probe.reset(0.0)
    assert probe.record(False, 0.0) is None and probe.record(False, 10.0) is None
    assert probe.record(False, 20.0) == "failure"
    assert probe.next_at == 30.0
