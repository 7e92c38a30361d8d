"""operator/Dockerfile builds the image the chart deploys; no container engine runs here, so these check
what must agree between the Dockerfile, the chart and pyproject.toml."""

from __future__ import annotations

import re
import tomllib

import yaml

from tests.repo import REPO

DOCKERFILE = (REPO / "operator" / "Dockerfile").read_text()


def test_image_runs_the_console_script_declared_in_pyproject() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pagoda-operator"] == "pagoda.operator.main:main"
    assert 'ENTRYPOINT ["pagoda-operator"]' in DOCKERFILE


def test_image_user_is_the_chart_security_context_user() -> None:
    values = yaml.safe_load((REPO / "charts" / "pagoda" / "values.yaml").read_text())
    user = re.search(r"^USER (\d+)$", DOCKERFILE, re.MULTILINE)
    assert user, "operator/Dockerfile must switch to a numeric non-root USER"
    assert int(user.group(1)) == values["operator"]["podSecurityContext"]["runAsUser"] != 0


def test_image_leaves_the_engine_out() -> None:
    instructions = [line for line in DOCKERFILE.splitlines() if line and not line.startswith("#")]
    assert instructions[0].startswith("FROM python:3.11")
    assert not any("vllm" in line.lower() for line in instructions)
