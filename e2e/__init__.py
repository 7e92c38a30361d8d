"""Tier 4: the end-to-end tests (test_*.py, their pytest fixtures in fixtures.py) on the harness library in
e2e/lab/. The tests import the lab; the lab imports nothing from here."""
