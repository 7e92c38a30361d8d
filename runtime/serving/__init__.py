"""`pagoda-runtime serve`: the process (lifecycle.py), the gate in front of vLLM's app (server.py, routes.py),
the engine (engine.py, progress.py), drain and termination, probes, metrics, TLS, and LoRA adapters."""
