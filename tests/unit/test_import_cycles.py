"""No import cycles: among the operator's and the runtime's modules, and among the harness's (e2e). A cycle
makes the import order matter and a module half-initialised when the other reads it; the graph is read from
each module's top-level imports (those inside a function or under `if TYPE_CHECKING:` are not cycles at
import time)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.repo import REPO

# Where each import namespace lives in the repository (setup.py maps operator/ and runtime/ under pagoda).
TREES = {"pagoda.operator": REPO / "operator", "pagoda.runtime": REPO / "runtime", "e2e": REPO / "e2e"}


def modules() -> dict[str, Path]:
    found = {}
    for prefix, root in TREES.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((prefix, *parts))] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules `path` imports at its top level."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import module` needs the module (and, like any import of a module, its parent
            # packages, which are not counted); `from module import name` needs the module.
            named = {f"{node.module}.{alias.name}" for alias in node.names}
            found.update(named if named <= set(known) else {node.module, *named})
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & set(known)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("prefix", ["pagoda.", "e2e"])
def test_no_import_cycle(prefix: str) -> None:
    known = modules()
    graph = {name: imports(path, known) - {name} for name, path in known.items() if name.startswith(prefix)}
    graph = {name: {dep for dep in deps if dep in graph} for name, deps in graph.items()}
    assert cycles(graph) == []
