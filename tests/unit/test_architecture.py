"""docs/design/architecture.md stays true: every folder and file it names exists, and its table of floors is
the one tests/unit/test_layers.py enforces."""

from __future__ import annotations

import re

from tests.repo import REPO
from tests.unit.test_layers import FLOORS

PAGE = REPO / "docs/design/architecture.md"
# `operator/kube/client.py`, `e2e/lab/`, `contract/` ... (a backticked path that starts at a top-level folder)
NAMED = re.compile(r"`((?:contract|operator|runtime|e2e|tests|benchmarks|crds|charts|docs)/[\w./-]*)`")
PACKAGES = {"contract": "pagoda.contract", "operator": "pagoda.operator", "runtime": "pagoda.runtime"}


def named_paths(text: str) -> list[str]:
    return sorted(set(NAMED.findall(text)))


def table_floors(text: str) -> list[set[str]]:
    """The modules of each row of the floors table, as the dotted prefixes FLOORS uses."""
    floors = []
    for line in text.splitlines():
        if not re.match(r"\|\s*\d+\s*\|", line):
            continue
        prefixes = set()
        for path in re.findall(r"`([\w.]+/[\w/.]*)`", line):
            top, _, rest = path.partition("/")
            rest = rest.removesuffix("/").removesuffix(".py")
            prefixes.add(".".join(part for part in (PACKAGES[top], *rest.split("/")) if part))
        floors.append(prefixes)
    return floors


def test_every_path_the_page_names_exists() -> None:
    text = PAGE.read_text()
    named = named_paths(text)
    assert len(named) > 20, named  # the pattern sees the page's paths
    assert [path for path in named if not (REPO / path).exists()] == []


def test_the_page_finds_a_path_that_is_gone() -> None:
    assert named_paths("the pass (`operator/reconcile/core.py`) and `operator/gone/`") == [
        "operator/gone/",
        "operator/reconcile/core.py",
    ]


def test_the_table_of_floors_is_the_one_the_layer_test_enforces() -> None:
    # test_layers.py also places `python -m pagoda.operator`'s module beside main.py; the page leaves it out.
    enforced = [set(floor) - {"pagoda.operator.__main__"} for floor in FLOORS]
    assert table_floors(PAGE.read_text()) == enforced
