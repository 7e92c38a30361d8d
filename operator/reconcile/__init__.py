"""Level-based reconcile of InferenceServices: apply, prune, status, events (layer below handlers)."""

from __future__ import annotations

from pagoda.operator.kube.workqueue import Outcome
from pagoda.operator.reconcile.core import reconcile

__all__ = ["Outcome", "reconcile"]
