"""GPUBudget (cluster-scoped, pagoda.dev/v1alpha1): a fixed pool of GPUs that InferenceServices share by
priority (docs/budget.md, docs/design/2026-12-06-gpu-budget.md), and the member's side of it,
spec.autoscaling.budget. The pool is the platform team's (the GPUBudget, with who may join); the priority is
the service owner's (its reference). The allocation is operator/status/gpubudget.py's; the operator applies
it as each member's ScaledObject maxReplicaCount.
"""

from __future__ import annotations

from pydantic import Field

from .base import NAME_PATTERN, ApiModel

BUDGET_KIND = "GPUBudget"
BUDGET_PLURAL = "gpubudgets"
BUDGET_SINGULAR = "gpubudget"
BUDGET_SHORT_NAMES = ["gpub"]
MAX_PRIORITY = 1_000_000


class BudgetRef(ApiModel):
    """This service's membership of a GPUBudget."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=NAME_PATTERN,
        description="The GPUBudget (cluster-scoped) whose GPUs this service shares with its other members. "
        "The budget's namespaceSelector (and product, when it names one) must admit the service; until it "
        "does, or while the budget does not exist, the service holds only its guaranteed minReplicas "
        "(status.budget says why).",
    )
    priority: int = Field(
        default=0,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="Higher first: GPUs above the members' guarantees (their minReplicas) go to the "
        "replicas that higher-priority members' autoscalers ask for; a lower member hands a replica over "
        "through its normal drain. Equal priorities share evenly, counted in GPUs. Default: 0.",
    )


class LabelSelectorRequirement(ApiModel):
    """One requirement of a label selector, as in Kubernetes."""

    key: str = Field(min_length=1, max_length=317, description="The label key.")
    operator: str = Field(
        pattern=r"^(In|NotIn|Exists|DoesNotExist)$",
        description="In, NotIn, Exists or DoesNotExist.",
    )
    values: list[str] = Field(
        default_factory=list, max_length=64, description="Values (In and NotIn only; empty otherwise)."
    )


class NamespaceSelector(ApiModel):
    """Which namespaces' services may join (a Kubernetes label selector; empty: every namespace)."""

    match_labels: dict[str, str] = Field(default_factory=dict, description="Labels the namespace must carry.")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=16, description="Requirements on the namespace's labels."
    )


class PriorityLimit(ApiModel):
    """A grant: the highest priority the services of some namespaces may claim in this budget."""

    namespace_selector: NamespaceSelector = Field(
        description="The namespaces this limit holds for ({} selects every namespace)."
    )
    max_priority: int = Field(
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="The highest spec.autoscaling.budget.priority their members may claim.",
    )


class GPUBudgetSpec(ApiModel):
    """The pool."""

    gpus: int = Field(ge=0, le=100_000, description="GPUs the members share, all replicas together.")
    product: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description="Only services whose spec.resources.gpu.product is this GPU model may join (e.g. "
        "NVIDIA-H100-80GB-HBM3). Unset: any.",
    )
    namespace_selector: NamespaceSelector | None = Field(
        default=None,
        description="Whose services may join: the namespaces this selects. Unset: none may (a budget admits "
        "only the namespaces its owner names); {} selects every namespace.",
    )
    priority_limits: list[PriorityLimit] = Field(
        default_factory=list,
        max_length=32,
        description="The budget owner's grants of priority (a service's owner sets its priority; without "
        "these any admitted team may claim the highest). Set, a member may claim at most the highest "
        "maxPriority of the entries that select its namespace, and 0 (the default priority) where none does; "
        "a member above that is not admitted: it holds only its guarantee and the budget lists it under "
        "refused. Unset: no limit.",
    )


class BudgetMemberStatus(ApiModel):
    """One member's share, in the budget's status."""

    service: str = Field(max_length=317, description="namespace/name of the InferenceService.")
    priority: int = Field(description="Its priority (spec.autoscaling.budget.priority).")
    gpus_per_replica: int = Field(ge=0, description="spec.resources.gpu.count.")
    demand: int = Field(ge=0, description="Replicas its autoscaler asks for, up to its maxReplicas.")
    allocated: int = Field(ge=0, description="Replicas the budget gives it.")
    limit: int = Field(ge=0, description="Its ScaledObject's maxReplicaCount now (see status.budget).")
    holding: int = Field(ge=0, description="Replicas whose pods hold GPUs now.")


class GPUBudgetStatus(ApiModel):
    """The pool's use, written by the operator."""

    gpus_allocated: int = Field(default=0, ge=0, description="GPUs the members' allocations add up to.")
    gpus_held: int = Field(default=0, ge=0, description="GPUs the members' pods hold now.")
    members: list[BudgetMemberStatus] = Field(
        default_factory=list, max_length=256, description="Every admitted member, highest priority first."
    )
    refused: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Services that name this budget but are not admitted, each with the reason.",
    )
    problems: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Why the budget cannot be honoured as declared (e.g. spec.gpus below the members' "
        "guarantees), each naming the field to change.",
    )


class ServiceBudgetStatus(ApiModel):
    """This service's share of its GPUBudget (status.budget of an InferenceService)."""

    name: str = Field(max_length=253, description="The GPUBudget.")
    admitted: bool = Field(description="Whether the budget admits this service (message says why not).")
    demand: int = Field(
        ge=0, description="Replicas its autoscaler asks for, up to spec.autoscaling.maxReplicas."
    )
    allocated: int = Field(ge=0, description="Replicas the budget gives it.")
    limit: int = Field(
        ge=0,
        description="The ScaledObject's maxReplicaCount now: on the way to allocated, raised only into GPUs "
        "that are free now (another member's hand-over drains first).",
    )
    message: str | None = Field(
        default=None,
        max_length=1024,
        description='Why it gets fewer replicas than it asks for, e.g. "budget team-gpus is full (4 of 4 '
        'GPUs): ns/chat (priority 100) holds 3; ..."; absent when it gets them all.',
    )
