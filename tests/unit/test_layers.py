"""The floors of docs/design/architecture.md: each imports only the floors below it, and no module imports
in a cycle.

- Layers: every import (at the top, inside a function, under `if TYPE_CHECKING:`) runs down the floors, never
  up: pagoda.contract at the bottom (it imports neither side), then the operator's api, resources, status,
  kube, reconcile and its entry points; the runtime's models, serving, profiling, tools and its CLI. The
  operator never imports pagoda.runtime, nor the runtime pagoda.operator: what they share is the contract.
- The lab (e2e/lab/) imports no test module or fixture; nothing outside the tests imports pytest.
- No cycles among modules (a cycle makes the import order matter and a module half-initialised when the
  other reads it), read from each module's top-level imports (those inside a function or under
  `if TYPE_CHECKING:` are not cycles at import time).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.repo import REPO

# Where each import namespace lives in the repository (setup.py maps operator/ and runtime/ under pagoda).
TREES = {
    "pagoda.contract": REPO / "contract",
    "pagoda.operator": REPO / "operator",
    "pagoda.runtime": REPO / "runtime",
    "e2e": REPO / "e2e",
    "benchmarks": REPO / "benchmarks",
}

# Each floor, bottom first: a module imports modules of its own floor and of the floors below. A module
# belongs to the floor of its longest matching prefix.
FLOORS: list[tuple[str, ...]] = [
    ("pagoda.contract",),
    ("pagoda.operator.api", "pagoda.operator.metrics", "pagoda.runtime.tools"),
    ("pagoda.operator.resources", "pagoda.runtime.models"),
    ("pagoda.operator.status", "pagoda.runtime.serving"),
    ("pagoda.operator.kube", "pagoda.runtime.profiling"),
    ("pagoda.operator.reconcile", "pagoda.runtime.cli"),
    ("pagoda.operator.handlers",),
    ("pagoda.operator.main", "pagoda.operator.__main__"),
]
# The two sides never import each other.
APART = [("pagoda.operator", "pagoda.runtime"), ("pagoda.runtime", "pagoda.operator")]


def modules() -> dict[str, Path]:
    found = {}
    for prefix, root in TREES.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((prefix, *parts))] = path
    return found


def every_import(path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules `path` imports anywhere (at the top, in functions, under TYPE_CHECKING)."""
    return imports(path, known, anywhere=True)


def floor(module: str) -> int | None:
    """The floor of `module` (its longest matching prefix in FLOORS), None for a module on none."""
    best: tuple[int, int] | None = None
    for number, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (number, len(prefix))
    return None if best is None else best[0]


def upward(known: dict[str, Path]) -> list[str]:
    """Every import that runs up the floors or across the two sides, as `importer -> imported`."""
    found = []
    for name, path in sorted(known.items()):
        if not name.startswith("pagoda."):
            continue
        for dep in sorted(every_import(path, known)):
            low, high = floor(name), floor(dep)
            if low is not None and high is not None and high > low:
                found.append(f"{name} (floor {low}) -> {dep} (floor {high})")
            elif any(name.startswith(a + ".") and dep.startswith(b + ".") for a, b in APART):
                found.append(f"{name} -> {dep} (the two sides share only pagoda.contract)")
    return found


def test_every_product_module_is_on_a_floor() -> None:
    # The runtime's package itself (an empty __init__.py) is no floor's.
    assert [name for name in modules() if name.startswith("pagoda.") and floor(name) is None] == [
        "pagoda.runtime"
    ]


def test_no_import_runs_up_the_floors() -> None:
    assert upward(modules()) == []


def test_the_floor_check_finds_an_import_up(tmp_path: Path) -> None:
    """A status module that imported the kube floor (or the runtime) would be caught."""
    known = {
        "pagoda.operator.status.report": tmp_path / "report.py",
        "pagoda.operator.kube.client": tmp_path / "client.py",
        "pagoda.runtime.serving.server": tmp_path / "server.py",
    }
    known["pagoda.operator.status.report"].write_text(
        "def f():\n"
        "    from pagoda.operator.kube.client import Kube\n"
        "    from pagoda.runtime.serving import server\n"
    )
    known["pagoda.operator.kube.client"].write_text("import pagoda.operator.status.report\n")
    known["pagoda.runtime.serving.server"].write_text("")
    assert upward(known) == [
        "pagoda.operator.status.report (floor 3) -> pagoda.operator.kube.client (floor 4)",
        "pagoda.operator.status.report -> pagoda.runtime.serving.server"
        " (the two sides share only pagoda.contract)",
    ]


def test_the_contract_imports_neither_side() -> None:
    known = modules()
    reached = {
        dep
        for name, path in known.items()
        if name.startswith("pagoda.contract")
        for dep in every_import(path, known)
        if not dep.startswith("pagoda.contract")
    }
    assert reached == set()


def test_the_operator_does_not_import_the_runtime() -> None:
    known = modules()
    reached = sorted(
        f"{name} -> {dep}"
        for name, path in known.items()
        if name.startswith("pagoda.operator")
        for dep in every_import(path, known)
        if dep.startswith("pagoda.runtime")
    )
    assert reached == []


def test_the_lab_imports_no_test_and_only_tests_import_pytest() -> None:
    known = modules()
    lab = {name: path for name, path in known.items() if name.startswith("e2e.lab")}
    into_tests = sorted(
        f"{name} -> {dep}"
        for name, path in lab.items()
        for dep in every_import(path, known)
        if not dep.startswith("e2e.lab") and dep.startswith("e2e")
    )
    assert into_tests == []
    pytest_users = sorted(
        name
        for name, path in known.items()
        if not (name.startswith("e2e.") and ("test_" in name or name in ("e2e.conftest", "e2e.fixtures")))
        and any(
            (isinstance(node, ast.Import) and any(a.name == "pytest" for a in node.names))
            or (isinstance(node, ast.ImportFrom) and node.module == "pytest")
            for node in ast.walk(ast.parse(path.read_text()))
        )
    )
    assert pytest_users == []


def test_no_module_shares_its_name_with_a_folder_beside_it() -> None:
    roots = [REPO / "contract", REPO / "operator", REPO / "runtime", REPO / "e2e", REPO / "benchmarks"]
    clashes = sorted(
        str(path.relative_to(REPO))
        for root in roots
        for path in root.rglob("*.py")
        if path.with_suffix("").is_dir()
    )
    assert clashes == []


def imports(path: Path, known: dict[str, Path], *, anywhere: bool = False) -> set[str]:
    """The known modules `path` imports at its top level (`anywhere`: also in functions and blocks)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree) if anywhere else tree.body:
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


@pytest.mark.parametrize("prefix", ["pagoda.", "e2e", "benchmarks"])
def test_no_import_cycle(prefix: str) -> None:
    known = modules()
    graph = {name: imports(path, known) - {name} for name, path in known.items() if name.startswith(prefix)}
    graph = {name: {dep for dep in deps if dep in graph} for name, deps in graph.items()}
    assert cycles(graph) == []
