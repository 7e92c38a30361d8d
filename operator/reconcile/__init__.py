"""Level-based reconcile of InferenceServices (the floor below handlers): one pass, `reconcile`.

Where each step lives: the pass itself in core.py, what it carries from step to step in state.py; what it
reads of the cluster in observe.py (with chattemplate.py for a template in a ConfigMap and profile.py for a
profile Job's result); the children it wants in desired.py (with restarts.py for the restart schedule, and
rollouts.py for the fleet's budget of rollouts an operator upgrade starts);
their apply and prune in apply.py (compare.py decides what differs); its Events in events.py; the problems
it reports in problems.py. The status itself is computed in operator/status/.
"""

from __future__ import annotations

from pagoda.operator.kube.workqueue import Outcome
from pagoda.operator.reconcile.core import reconcile

__all__ = ["Outcome", "reconcile"]
