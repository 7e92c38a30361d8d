"""InferenceServiceStatus: what the operator reports (written by the controller).

One file over 400 lines on purpose: it is the status's schema, one model per status field with the description
the CRD and docs/api.md show, read top to bottom like the status itself.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pagoda.contract import TUNE_MAX_RUNS

from .base import ApiModel
from .budget import ServiceBudgetStatus

ConditionType = Literal["Ready", "Progressing", "Degraded", "DisruptionTolerant"]
CONDITION_TYPES: tuple[ConditionType, ...] = ("Ready", "Progressing", "Degraded", "DisruptionTolerant")
# With spec.slo, once a profile has measured: True while the newest profile met the SLO at no step.
SLO_UNMET = "SLOUnmet"
# With spec.autoscaling, once its ScaledObject exists: True while the autoscaler cannot read the load (KEDA's
# fallback holds the replicas, or the HPA reads nothing from KEDA's adapter); status/scalingmetrics.py.
METRICS_UNAVAILABLE = "ScalingMetricsUnavailable"
# True while the operator holds the pods' template of an upgrade for the fleet's rollout budget (the chart's
# rollouts.maxConcurrent; reconcile/rollouts.py); absent otherwise.
ROLLOUT_QUEUED = "RolloutQueued"


class Condition(ApiModel):
    """One condition, as in metav1.Condition."""

    type: str = Field(
        max_length=316,
        description="Ready, Progressing, Degraded, DisruptionTolerant, SLOUnmet (with spec.slo, once a "
        "profile has measured), ScalingMetricsUnavailable (with spec.autoscaling) or RolloutQueued (while an "
        "operator upgrade's new pod template waits for the fleet's rollout budget).",
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, description="CamelCase reason for the last transition.")
    message: str = Field(default="", max_length=32768, description="Human-readable detail.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed for."
    )
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")


class TriggerStatus(ApiModel):
    """One autoscaling trigger as the HPA last measured it."""

    name: str = Field(max_length=253, description="The ScaledObject trigger (in-flight, queue-depth, ...).")
    value: str | None = Field(default=None, max_length=64, description="Current value; absent when unknown.")
    target: str = Field(max_length=64, description="The target the autoscaler holds it to.")
    per_replica: bool = Field(description="True when value and target are per replica (AverageValue).")


class ScaleRecord(ApiModel):
    """The autoscaler's last change of the replica count."""

    time: str = Field(description="When the HPA last scaled (RFC 3339).")
    from_: int = Field(alias="from", ge=0, description="Replicas before.")
    to: int = Field(ge=0, description="Replicas asked for.")
    direction: Literal["Up", "Down", "None"] = Field(description="Up, Down or None.")
    message: str = Field(
        max_length=1024, description='Why, e.g. "1 -> 3: in-flight 14 per replica over target 5".'
    )


class AutoscalingStatus(ApiModel):
    """What the HorizontalPodAutoscaler that KEDA manages for this service sees and did."""

    current_replicas: int = Field(ge=0, description="Replicas the HPA counted at its last check.")
    desired_replicas: int = Field(ge=0, description="Replicas the HPA asks for.")
    triggers: list[TriggerStatus] = Field(default_factory=list, max_length=16, description="Each trigger.")
    last_scale: ScaleRecord | None = Field(default=None, description="The last scale, with its cause.")


class CapacityStatus(ApiModel):
    """What one replica's KV cache holds, as its runtime reported it once the model was loaded."""

    kv_cache_tokens: int = Field(ge=1, description="Tokens the KV cache of one replica holds.")
    max_model_len: int = Field(ge=1, description="The longest request (prompt + output) in tokens.")
    max_concurrency: float = Field(
        ge=0, description="Requests of maxModelLen tokens that fit at once (kvCacheTokens / maxModelLen)."
    )


class RestartStatus(ApiModel):
    """Scheduled restarts (spec.restartSchedule): the last and the next."""

    last: str | None = Field(
        default=None,
        max_length=64,
        description="When the pods were last restarted (RFC 3339): by the schedule or by `kubectl rollout "
        "restart`; absent before the first.",
    )
    next: str = Field(max_length=64, description="When the next restart is due (RFC 3339).")
    message: str | None = Field(
        default=None,
        max_length=1024,
        description='Why a due restart waits, e.g. "Postponed: a rollout is in progress".',
    )


class AdapterStatus(ApiModel):
    """One adapter of spec.lora.adapters across the Ready replicas."""

    name: str = Field(max_length=63, description="The adapter (spec.lora.adapters[].name).")
    ready_replicas: int = Field(ge=0, description="Ready replicas that serve it from the spec's uri.")
    replicas: int = Field(ge=0, description="Ready replicas (those that should serve it).")
    state: Literal["Ready", "Loading", "Failed"] = Field(
        description="Ready: every Ready replica (at least one) serves it; Failed: a replica could not load "
        "it (reason and message say why); Loading otherwise."
    )
    reason: str | None = Field(
        default=None,
        max_length=64,
        description="Why it is not Ready, e.g. AdapterRankTooLarge, AdapterSourceNotFound, "
        "AdapterBaseModelMismatch (the runtime's error type), ReplicaUnreachable.",
    )
    message: str | None = Field(
        default=None, max_length=1024, description="The detail, e.g. the runtime's error."
    )


class StartupPhases(ApiModel):
    """Seconds one replica's start spent in each phase, in order: the kubelet's (from the Pod) and the
    runtime's (runtime/serving/startup.py). A phase a start did not report is absent."""

    scheduling: float | None = Field(default=None, ge=0, description="Pod created -> scheduled to a node.")
    container_start: float | None = Field(
        default=None,
        ge=0,
        description="Scheduled -> the runtime's process started: image pull, volumes, sandbox.",
    )
    imports: float | None = Field(default=None, ge=0, description="Python, torch and vLLM imported.")
    model_fetch: float | None = Field(
        default=None, ge=0, description="The model downloaded (hf://, s3://) or checked (file://, pvc://)."
    )
    engine_setup: float | None = Field(
        default=None,
        ge=0,
        description="The engine's start other than weightLoad and engineInit (all of it when vLLM runs its "
        "engine in its own process and does not report those).",
    )
    weight_load: float | None = Field(default=None, ge=0, description="vLLM loading the weights.")
    engine_init: float | None = Field(
        default=None, ge=0, description="vLLM's profiling, KV-cache allocation, compilation and warm-up."
    )
    api_server: float | None = Field(
        default=None, ge=0, description="The OpenAI API built and the --lora adapters loaded."
    )
    readiness: float | None = Field(
        default=None, ge=0, description="The runtime ready -> the kubelet's probe marked the pod Ready."
    )


class StartupRecord(ApiModel):
    """One replica's first start, pod creation to Ready."""

    pod: str = Field(max_length=253, description="The pod.")
    ready_at: str = Field(max_length=64, description="When the pod became Ready (RFC 3339).")
    seconds: float = Field(ge=0, description="Pod created -> Ready, as the API server's timestamps say.")
    model_bytes: int | None = Field(default=None, ge=0, description="Size of the model folder it loaded.")
    fetched_bytes: int | None = Field(
        default=None,
        ge=0,
        description="What its model fetch downloaded: 0 when the model was already in the cache "
        "(spec.model.cache.scope Node).",
    )
    phases: StartupPhases = Field(description="Where the seconds went (they add up to about `seconds`).")


class StartupTypical(ApiModel):
    """The median of the recent starts, per phase."""

    starts: int = Field(ge=1, description="How many recent starts the medians are over.")
    seconds: float = Field(ge=0, description="Median seconds from pod creation to Ready.")
    phases: StartupPhases = Field(description="Median seconds per phase.")


class StartupStatus(ApiModel):
    """Where start-up time goes: the replicas' first starts (a container restarted by the kubelet is not
    counted)."""

    last: StartupRecord = Field(description="The replica that became Ready last.")
    typical: StartupTypical = Field(description="Medians over `recent`.")
    recent: list[StartupRecord] = Field(
        max_length=10, description="The last starts (at most 10), oldest first."
    )


class CachedModel(ApiModel):
    """A model in a node's cache folder."""

    uri: str = Field(max_length=2048, description="The model's URI.")
    revision: str | None = Field(default=None, max_length=255, description="The hub revision last loaded.")
    bytes: int = Field(ge=0, description="Bytes it takes on the node.")
    in_use: bool = Field(description="Whether a runtime on the node serves it (then it is never evicted).")
    last_used: str | None = Field(default=None, max_length=64, description="When a runtime last loaded it.")


class NodeModelCache(ApiModel):
    """One node's cache folder for this namespace, as the service's newest Ready pod there saw it."""

    node: str = Field(max_length=253, description="The node.")
    bytes: int = Field(ge=0, description="Bytes of the models in it.")
    max_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Its bound (spec.model.cache.size): unused models are evicted past it.",
    )
    models: list[CachedModel] = Field(max_length=16, description="The models, biggest first (at most 16).")


class ModelCacheStatus(ApiModel):
    """The node caches (spec.model.cache.scope Node) of the nodes the Ready replicas run on."""

    nodes: list[NodeModelCache] = Field(max_length=64, description="Per node (at most 64), by name.")


class ProfileStep(ApiModel):
    """One concurrency step of a capacity profile, as GuideLLM measured it."""

    concurrency: int = Field(ge=1, description="Concurrent streams sent.")
    ttft_p95_ms: float = Field(ge=0, description="Time to first token, 95th percentile (ms).")
    inter_token_p95_ms: float = Field(ge=0, description="Inter-token latency, 95th percentile (ms).")
    requests_per_second: float = Field(ge=0, description="Requests completed per second.")
    output_tokens_per_second: float = Field(ge=0, description="Tokens generated per second.")
    requests: int = Field(ge=0, description="Requests that completed.")
    errors: int = Field(ge=0, description="Requests that failed.")
    meets_slo: bool = Field(description="Both p95s within spec.slo, at most 5% errors.")


class EngineCandidate(ApiModel):
    """One server the profile measured: its batch settings (absent: the spec's own or vLLM's default) and
    its capacity within the SLO."""

    max_num_batched_tokens: int | None = Field(default=None, ge=1, description="--max-num-batched-tokens.")
    max_num_seqs: int | None = Field(default=None, ge=1, description="--max-num-seqs.")
    concurrency: int | None = Field(
        default=None, ge=1, description="The highest concurrency that met the SLO (absent: none)."
    )
    requests_per_second: float | None = Field(
        default=None, ge=0, description="Requests per second there: its goodput (absent: none)."
    )


class EngineChoice(ApiModel):
    """The engine's batch settings the profile chose (spec.slo.tuneEngine) and what they measured."""

    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        description="The token budget the replicas run with (absent: the spec's own or vLLM's default).",
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        description="The batch width the replicas run with (absent: the spec's own or vLLM's default).",
    )
    goodput: float | None = Field(
        default=None, ge=0, description="Requests per second within the SLO with the choice."
    )
    baseline_goodput: float | None = Field(
        default=None, ge=0, description="Requests per second within the SLO with the spec's own settings."
    )
    candidates: list[EngineCandidate] | None = Field(
        default=None,
        max_length=TUNE_MAX_RUNS,
        description="Every server measured, in order, the spec's own settings first.",
    )


class ProfileStatus(ApiModel):
    """The last capacity profile of one replica against spec.slo (docs/capacity.md)."""

    job: str = Field(max_length=63, description="The profile Job (kubectl logs job/<job> shows its run).")
    state: Literal["Queued", "Running", "Succeeded", "Failed"] = Field(
        description="Queued (the Job waits for the fleet's profile budget, the chart's "
        "profiles.maxConcurrent: not created yet, `message` says its place), Running, Succeeded or Failed."
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        description="The highest concurrency per replica that meets the SLO (counting up the steps to the "
        "first that misses it); absent when even the first step misses it (condition SLOUnmet) or no "
        "profile finished.",
    )
    last_met_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="While the newest profile met the SLO at no step (concurrency absent): the concurrency "
        "the last profile that met it measured, which metric SLO's target stays based on; absent when no "
        "profile met it (the target is then 1).",
    )
    requests_per_second: float | None = Field(
        default=None, ge=0, description="Requests per second one replica completes at that concurrency."
    )
    output_tokens_per_second: float | None = Field(
        default=None, ge=0, description="Tokens per second one replica generates at that concurrency."
    )
    ttft_ms: float | None = Field(default=None, gt=0, description="The TTFT objective profiled against.")
    inter_token_ms: float | None = Field(
        default=None, gt=0, description="The inter-token objective profiled against."
    )
    steps: list[ProfileStep] | None = Field(
        default=None, max_length=16, description="Every step measured, in order (the curve)."
    )
    engine: EngineChoice | None = Field(
        default=None,
        description="With spec.slo.tuneEngine: the batch settings chosen, their goodput and every candidate; "
        "concurrency, throughput and steps above are the chosen settings'.",
    )
    finished_at: str | None = Field(default=None, max_length=64, description="When the Job ended (RFC 3339).")
    measured_by: str | None = Field(
        default=None,
        max_length=63,
        description="The Job that measured concurrency, throughput and steps: the last that succeeded (a "
        "new profile that runs or fails leaves them, and metric SLO's target, as they were).",
    )
    measured_at: str | None = Field(
        default=None, max_length=64, description="When that Job ended (RFC 3339)."
    )
    message: str | None = Field(
        default=None,
        max_length=4096,
        description="Why a profile failed (its termination message), or why it waits (Queued).",
    )


class SizingStatus(ApiModel):
    """Capacity planning at spec.slo (docs/capacity.md): the load against what the profile measured, the
    replicas that load needs and what a token costs at the measured operating point. Each field is present
    only when what it is computed from is known."""

    in_flight: float | None = Field(
        default=None,
        ge=0,
        description="Requests in flight (running and waiting) over all replicas, as the autoscaler's "
        "in-flight trigger last read them (autoscaling.metric InFlight or SLO).",
    )
    capacity: int | None = Field(
        default=None,
        ge=0,
        description="Requests the Ready replicas serve within the SLO: status.profile.concurrency x "
        "readyReplicas.",
    )
    load_percent: int | None = Field(
        default=None,
        ge=0,
        description="inFlight as a percent of capacity (rounded); above 100 the SLO is likely missed "
        "(absent while no replica is Ready).",
    )
    target_per_replica: int | None = Field(
        default=None,
        ge=1,
        description="In-flight requests per replica to aim for within the SLO: autoscaling.sloTargetRatio "
        "(default 0.8) of status.profile.concurrency, rounded down, at least 1 (while the newest profile met "
        "the SLO at no step: of lastMetConcurrency, or 1); with autoscaling.metric SLO the HPA's own target.",
    )
    replicas_needed: int | None = Field(
        default=None,
        ge=0,
        description="Replicas the current load needs within the SLO: inFlight / targetPerReplica, rounded up "
        "(with autoscaling.metric SLO the count the HPA asks for before minReplicas and maxReplicas bound "
        "it).",
    )
    cost_per_million_tokens: float | None = Field(
        default=None,
        ge=0,
        description="What 1M generated tokens cost at the measured operating point (spec.cost.gpuHourPrice "
        "x resources.gpu.count / status.profile.outputTokensPerSecond): the best case, every replica busy "
        "at the SLO.",
    )
    currency: str | None = Field(
        default=None, max_length=3, description="The currency of costPerMillionTokens (spec.cost.currency)."
    )
    message: str | None = Field(
        default=None,
        max_length=1024,
        description="Why the load figures (inFlight, loadPercent, replicasNeeded) are absent although the "
        "autoscaler has a reading, e.g. while KEDA's fallback stands in for failing metrics queries (its "
        "reading is then no load).",
    )


class InferenceServiceStatus(ApiModel):
    """Observed state of an InferenceService."""

    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        description="Ready, Progressing, Degraded and DisruptionTolerant; with spec.slo, once a profile has "
        "measured, SLOUnmet (True while the newest profile met the SLO at no step); with spec.autoscaling, "
        "ScalingMetricsUnavailable (True while the autoscaler cannot read the load: KEDA's fallback holds "
        "the replicas, reason KedaFallback, naming the failing triggers; or the HPA reads nothing from "
        "KEDA's metrics adapter, reason ExternalMetricsUnavailable; lastTransitionTime says since when); "
        "RolloutQueued while an operator upgrade's new pod template waits for the fleet's rollout budget "
        "(the message names the place in the queue).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, description="metadata.generation last reconciled.")
    pod_template_inputs: str | None = Field(
        default=None,
        max_length=64,
        description="A hash of what this service alone decides about its pods (its spec, restart stamps, "
        "chat template and profile results) at the last pass: a pod template change with the same hash "
        "is the operator's own (an upgrade), rolled under the chart's rollouts.maxConcurrent.",
    )
    replicas: int | None = Field(default=None, description="Replicas of the Deployment (scale subresource).")
    ready_replicas: int | None = Field(default=None, description="Ready replicas of the Deployment.")
    ready_summary: str | None = Field(
        default=None, description="readyReplicas/replicas, e.g. 2/3 (the Ready column of kubectl get)."
    )
    selector: str | None = Field(
        default=None, description="Label selector of the pods, as a string (scale subresource)."
    )
    url: str | None = Field(
        default=None, description="In-cluster URL of the OpenAI API, http://<name>.<ns>.svc:<port>."
    )
    autoscaling: AutoscalingStatus | None = Field(
        default=None, description="The autoscaler's view (only with spec.autoscaling and KEDA)."
    )
    capacity: CapacityStatus | None = Field(
        default=None, description="KV-cache capacity of the smallest Ready replica (once one is Ready)."
    )
    restarts: RestartStatus | None = Field(
        default=None, description="Scheduled restarts (only with spec.restartSchedule)."
    )
    startup: StartupStatus | None = Field(
        default=None, description="Where the replicas' start-up time goes (once one became Ready)."
    )
    model_cache: ModelCacheStatus | None = Field(
        default=None, description="What the nodes' model caches hold (only with spec.model.cache.scope Node)."
    )
    adapters: list[AdapterStatus] | None = Field(
        default=None,
        max_length=64,
        description="Each LoRA adapter of spec.lora: how many Ready replicas serve it (only with spec.lora).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    profile: ProfileStatus | None = Field(
        default=None, description="The capacity profile against spec.slo (only with spec.slo)."
    )
    budget: ServiceBudgetStatus | None = Field(
        default=None,
        description="This service's share of the GPUBudget spec.autoscaling.budget names: what its "
        "autoscaler asks for, what the budget gives it, the maxReplicaCount now and why it gets less.",
    )
    sizing: SizingStatus | None = Field(
        default=None,
        description="The load against the measured capacity, the replicas it needs and the cost of a token "
        "at the SLO (only with spec.slo, once a profile measured; the Load% column of kubectl get).",
    )
    adapters_ready: str | None = Field(
        default=None,
        max_length=16,
        description="Adapters Ready on every Ready replica / adapters in the spec, e.g. 2/3 (the Adapters "
        "column of kubectl get; only with spec.lora).",
    )
