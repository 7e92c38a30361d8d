"""Maps the repository's top-level folders onto the `pagoda` import namespace.

`operator/` becomes `pagoda.operator` and `runtime/` becomes `pagoda.runtime`; see
docs/design/2026-11-29-package-layout.md for why `operator/` must never be importable as a top-level
package. Everything else lives in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup


def packages_under(prefix: str, directory: str) -> list[str]:
    found = find_namespace_packages(directory, exclude=["*__pycache__*"])
    return [prefix] + [f"{prefix}.{name}" for name in found]


setup(
    packages=packages_under("pagoda.operator", "operator") + packages_under("pagoda.runtime", "runtime"),
    package_dir={"pagoda.operator": "operator", "pagoda.runtime": "runtime"},
)
