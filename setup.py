"""Maps the repository's top-level folders onto the `pagoda` import namespace.

`operator/` becomes `pagoda.operator`, `runtime/` `pagoda.runtime` and `contract/` `pagoda.contract` (what
the two agree on; docs/design/architecture.md); see
docs/design/2026-11-29-package-layout.md for why `operator/` must never be importable as a top-level
package. Everything else lives in pyproject.toml.
"""

from pathlib import Path

from setuptools import find_namespace_packages, setup

# The operator's image holds no runtime/ (the operator imports only the contract): a folder that is not there
# is left out.
FOLDERS = {"pagoda.contract": "contract", "pagoda.operator": "operator", "pagoda.runtime": "runtime"}
PRESENT = {prefix: folder for prefix, folder in FOLDERS.items() if (Path(__file__).parent / folder).is_dir()}


def packages_under(prefix: str, directory: str) -> list[str]:
    found = find_namespace_packages(directory, exclude=["*__pycache__*"])
    return [prefix] + [f"{prefix}.{name}" for name in found]


setup(
    packages=[name for prefix, folder in PRESENT.items() for name in packages_under(prefix, folder)],
    package_dir=PRESENT,
)
