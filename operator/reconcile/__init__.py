"""Level-based reconcile of InferenceServices: apply, prune, status, events (layer below handlers)."""

from __future__ import annotations

from pagoda.operator.reconcile.core import Outcome, reconcile

__all__ = ["Outcome", "reconcile"]
