"""Tier 3 fixtures: the tiny model (made by the CLI), vLLM's model-registry answers seeded once (as the
runtime images carry them, runtime/models/modelinfo.py) for every runtime of the session, and one shared
runtime for the serving tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from rt_harness import CHAT_TEMPLATE_MARKER, ENGINE_FLAGS, RUNTIME, RuntimeProcess  # noqa: E402

from pagoda.runtime.models.modelinfo import SEED_ENV  # noqa: E402
from pagoda.runtime.tools.tinymodel import CHAT_TEMPLATE  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "tiny"
    subprocess.run([RUNTIME, "make-tiny-model", str(out)], check=True, timeout=180)
    return out


@pytest.fixture(scope="session", autouse=True)
def model_info_seed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`pagoda-runtime seed-model-info`, as the images' build runs it; every runtime started from here on
    gets PAGODA_VLLM_SEED_DIR (runtime_env copies this process's environment)."""
    seed = tmp_path_factory.mktemp("vllm-seed")
    subprocess.run([RUNTIME, "seed-model-info", str(seed)], check=True, timeout=300, capture_output=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SEED_ENV, str(seed))
        yield seed


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
