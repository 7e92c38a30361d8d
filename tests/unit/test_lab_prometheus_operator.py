"""e2e/lab/prometheus_operator.py and the image names of e2e/lab/images.py: the Prometheus object selects
what Pagoda writes in every namespace, and the images carry the names the Prometheus Operator's manifests and
its StatefulSets ask for (taken from the pinned go.mod files)."""

from __future__ import annotations

import re
import subprocess

from e2e.lab import images, prometheus_operator
from e2e.lab.processes import REPO_ROOT


def test_the_prometheus_selects_every_monitor_rule_and_scrape_config_in_every_namespace() -> None:
    spec = prometheus_operator.prometheus_object()["spec"]
    for kind in ("serviceMonitor", "podMonitor", "rule", "scrapeConfig"):
        assert spec[f"{kind}Selector"] == {} and spec[f"{kind}NamespaceSelector"] == {}, kind
    assert spec["version"] == f"v{images.prometheus_release()}"
    assert spec["serviceAccountName"] == prometheus_operator.SERVICE_ACCOUNT


def test_the_default_prometheus_address_is_the_operators_governing_service() -> None:
    assert (prometheus_operator.SERVICE, prometheus_operator.NAMESPACE) == (
        "prometheus-operated",
        "monitoring",
    )
    assert prometheus_operator.PORT == 9090


def test_kube_state_metrics_keeps_its_own_namespace_labels() -> None:
    spec = prometheus_operator.kube_state_metrics_scrape("10.0.0.1:8080")["spec"]
    assert spec["honorLabels"] is True
    assert spec["staticConfigs"] == [{"targets": ["10.0.0.1:8080"], "labels": {"job": "kube-state-metrics"}}]


def test_build_sh_stamps_prometheus_with_the_release_its_image_is_named_after() -> None:
    """v0.316.0 is 3.16.0, v0.305.2 3.5.2: build.sh's sed, run here, agrees with images.py."""
    build = (REPO_ROOT / "e2e/lab/tools/build.sh").read_text()
    (line,) = [line for line in build.splitlines() if line.startswith("prometheus_release=")]
    sed = re.search(r"sed -E '([^']+)'", line)
    assert sed, line
    version = images.required_version("prometheus", "github.com/prometheus/prometheus")
    for module, release in ((version, images.prometheus_release()), ("v0.305.2", "3.5.2")):
        stamped = subprocess.run(
            ["sed", "-E", sed.group(1)], input=module, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert stamped == release, (module, stamped)


def test_images_carry_the_names_the_operator_asks_for() -> None:
    assert images.IMAGES["prometheus"].references() == [
        f"quay.io/prometheus/prometheus:v{images.prometheus_release()}"
    ]
    reloader = images.IMAGES["prometheus-config-reloader"].references()[0]
    operator = images.IMAGES["prometheus-operator"].references()[0]
    gomod = (REPO_ROOT / "e2e/lab/tools/prometheus-operator/go.mod").read_text()
    version = re.search(r"github\.com/prometheus-operator/prometheus-operator (v\S+)", gomod)
    assert version, gomod
    assert operator == f"quay.io/prometheus-operator/prometheus-operator:{version.group(1)}"
    assert reloader == f"quay.io/prometheus-operator/prometheus-config-reloader:{version.group(1)}"
