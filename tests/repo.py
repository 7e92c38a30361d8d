"""The repository's root for every test tier: `from tests.repo import REPO`.

The tiers' folders are not packages (pytest puts a test file's own folder on sys.path, hence helper modules
with names unique across the tiers); the root is on sys.path as well (`python -m pytest` run from it, as the
Makefile does), so `tests` imports as a namespace package from any tier, as `e2e` does. The benchmarks,
run as scripts, have their own: benchmarks/servers.py's ROOT."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
