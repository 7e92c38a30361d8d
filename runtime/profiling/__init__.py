"""`pagoda-runtime profile`: one replica's capacity within a latency SLO, measured with GuideLLM."""
