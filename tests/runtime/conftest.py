"""Tier 3 fixtures: the tiny model (made by the CLI) and one shared runtime for the serving tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from rt_harness import CHAT_TEMPLATE_MARKER, ENGINE_FLAGS, RUNTIME, RuntimeProcess  # noqa: E402

from pagoda.runtime.tinymodel import CHAT_TEMPLATE  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "tiny"
    subprocess.run([RUNTIME, "make-tiny-model", str(out)], check=True, timeout=180)
    return out


@pytest.fixture(scope="session")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    workdir = tmp_path_factory.mktemp("serve")
    template = workdir / "chat-template.jinja"
    template.write_text(f"{CHAT_TEMPLATE_MARKER}\n{CHAT_TEMPLATE}")
    runtime = RuntimeProcess(
        model=f"file://{tiny_model}",
        workdir=workdir,
        flags=[*ENGINE_FLAGS, "--chat-template", str(template)],
    )
    runtime.start()
    try:
        runtime.wait_ready()
        yield runtime
    finally:
        runtime.terminate()
