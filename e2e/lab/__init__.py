"""The lab: a small local Kubernetes distribution for people (`make cluster-up`, `make demo`) and tests.

The control plane and real nodes (cluster.py, realnode.py, podnet.py, clusterdns.py), the registry and the
images (registry.py, images.py, dockerfiles/, modelimage.py), the add-ons a cluster has (addons.py,
stack.py, prometheus_operator.py, argocd.py, gateway.py, minio.py), the processes they run as (processes.py),
and the scenarios the tests and benchmarks share (autoscaling.py, observability.py, openai_surface.py,
samples.py). tools/ holds the Go modules that pin every Go-built binary. Nothing here imports pytest or the
tests (e2e/test_*.py).
"""
