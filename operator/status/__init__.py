"""Pure functions: the InferenceService's status from what one reconcile pass observed.

Conditions and the report (report.py), with the explanations behind them: pods that cannot run (pods.py,
admission.py, scheduling.py, nodes.py), the autoscaler's view (scaling.py, scalingmetrics.py), the SLO and
the capacity profile (slo.py, profile.py, sizing.py), start-up phases (startup.py); whether and how a new
status is written (changes.py). No I/O, no threads, no clock but the one passed in: everything here is tested
with plain values (tests/unit).
"""
