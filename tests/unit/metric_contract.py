"""The stable metric names of the contract (docs/observability.md), written out here independently of the
code that exports them, for the tests of the runtime's metrics and of the dashboards."""

from __future__ import annotations

RUNTIME_METRICS = frozenset(
    {
        "pagoda_queue_depth",
        "pagoda_running_requests",
        "pagoda_kv_cache_usage_ratio",
        "pagoda_ready",
        "pagoda_draining",
        "pagoda_model_load_seconds",
        "pagoda_requests_rejected_draining_total",
        "pagoda_kv_cache_capacity_tokens",
        "pagoda_kv_cache_max_concurrency",
    }
)
# Once the replica is ready: one observation per start-up phase (label `phase`), the model's size and what
# its fetch downloaded.
STARTUP_METRICS = frozenset(
    {
        "pagoda_startup_phase_seconds_bucket",
        "pagoda_startup_phase_seconds_sum",
        "pagoda_startup_phase_seconds_count",
        "pagoda_startup_model_bytes",
        "pagoda_startup_fetched_bytes",
    }
)
# Only with LoRA on (label `adapter` beside `model_name`); vLLM's own `vllm:lora_requests_info` stays exposed.
LORA_METRICS = frozenset({"pagoda_lora_requests_total", "pagoda_lora_generation_tokens_total"})
# The Gateway API Inference Extension's endpoint picker (spec.routing; GIE v1.5.0's pkg/epp/metrics), which
# the routing panels read; checked on the real picker by e2e/test_routing.py and e2e/test_scale_from_zero.py.
PICKER_METRICS = frozenset(
    {
        "inference_extension_flow_control_queue_size",
        "inference_extension_flow_control_pool_saturation",
        "inference_extension_scheduler_attempts_total",
    }
)
OPERATOR_METRICS = frozenset(
    {
        "pagoda_operator_reconciles_total",
        "pagoda_operator_reconcile_duration_seconds_bucket",
        "pagoda_operator_api_writes_total",
        "pagoda_operator_reconcile_errors_total",
        "pagoda_operator_queue_depth",
        "pagoda_operator_reconciles_in_progress",
        "pagoda_budget_replicas",
    }
)
