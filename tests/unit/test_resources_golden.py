"""Golden YAML: the children built from each example, committed under tests/unit/golden/.

A normal run compares and fails with a diff; `make golden` (PAGODA_UPDATE_GOLDEN=1) rewrites them.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import yaml

from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.resources import ChildInputs, OperatorSettings, desired_children

GOLDEN_DIR = Path(__file__).parent / "golden"
# An operator's public management key (resources/management.py), as every real pass has one.
PUBLIC_KEY = """-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEABJyO8IV3NuY1l+fAUATX9e3LNKd5Jk3iZNwUdNQ3cb4=
-----END PUBLIC KEY-----
"""
HEADER = "# Children of examples/{stem}.yaml. Regenerate with `make golden`; review the diff.\n"


def render(document: dict[str, Any]) -> str:
    spec = InferenceServiceSpec.model_validate(document["spec"])
    meta = document["metadata"]
    children = desired_children(
        meta["name"], meta["namespace"], spec, ChildInputs(OperatorSettings(management_key=PUBLIC_KEY))
    )
    return yaml.safe_dump_all(children, sort_keys=False, width=120)


def test_golden_children(example_path: Path, example: dict[str, Any]) -> None:
    golden = GOLDEN_DIR / f"{example_path.stem}.yaml"
    actual = HEADER.format(stem=example_path.stem) + render(example)
    if os.environ.get("PAGODA_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(actual)
    assert golden.is_file(), f"{golden.name} is missing: run `make golden`"
    expected = golden.read_text()
    if expected != actual:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=f"golden/{golden.name}",
                tofile="built",
            )
        )
        raise AssertionError(
            f"children differ from golden/{golden.name} (run `make golden` if intended):\n{diff}"
        )


def test_golden_files_have_an_example(all_examples: dict[str, dict[str, Any]]) -> None:
    """No stale golden file is left behind when an example is renamed or removed."""
    assert {path.stem for path in GOLDEN_DIR.glob("*.yaml")} == set(all_examples)
