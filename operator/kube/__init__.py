"""The operator's I/O: the Kubernetes API client (client.py), what it last saw (cache.py), the work queue
(workqueue.py), the leader's Lease (leader.py), and the calls to runtime pods: their KV-cache capacity
(capacity.py), their LoRA adapters (adapters.py), the keys the calls are signed with (management.py) and what
the operator remembers of each pod between calls (podmemo.py)."""
