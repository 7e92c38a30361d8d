"""The capacity profile Job (spec.slo): one replica's runtime, loaded by GuideLLM, reporting its curve.

The Job's pod is a replica's pod (pod.pod_template: the same image, model, engine flags, resources, volumes
and placement) with three differences: the container runs `pagoda-runtime profile` instead of `serve`
(the runtime starts its own server on 127.0.0.1 and measures it, runtime/profiling/profile.py), it carries
labels of its own (no Service, PDB or status counts it as a replica; no NetworkPolicy needs to admit it, as
nothing connects to it), and it runs once (restartPolicy Never, no probes, a deadline). Without
spec.runtime.tls too: its server is its own client's alone, on loopback, so it serves plain HTTP and mounts no
certificate. The result is the container's termination message, which the operator copies into status.profile
(reconcile/profile.py).

The Job's name ends in a digest of what the profile measures (`measured_digest`): the spec's fields that
make one replica what it is (MEASURED_FIELDS: the model, the engine, the resources, the placement, the
runtime container, the adapters) and the SLO, the image, the chat template and the pagoda.dev/profile
annotation's value. A change of any of them names a new Job (a Job's template cannot be changed), and the
operator deletes the old one as a child no longer wanted. The operator's own template, which an upgrade may
change (a probe, a default), is not in the digest: an upgrade starts no profile
(docs/design/2026-12-06-operator-upgrades.md).
The digest is also the Job's PROFILE_INPUTS_ANNOTATION, by which reconcile/profile.py keeps a Job of an
earlier operator that measured the same inputs.

With spec.slo.tuneEngine the profile also chooses the engine's batch settings (`--tune-engine`,
runtime/profiling/tune.py) and the replicas run them (`with_engine_choice`) for the fields the spec leaves
unset. The Job itself is always made from the spec's own settings: a choice applied to the replicas must not
change the Job's template, or every choice would start a new profile.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from pagoda.contract import TUNE_MAX_RUNS, tune
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.api.engine import batch_holds_its_sequences
from pagoda.operator.api.slo import SloSpec

from .meta import content_hash, labels
from .pod import DEFAULT_RUNTIME_IMAGE, pod_template

# A new value (any text, e.g. a date) asks for a new profile with nothing else changed.
PROFILE_REQUEST_ANNOTATION = "pagoda.dev/profile"
PROFILE_LABEL = "pagoda.dev/profile-of"
PROFILE_APP_NAME = "pagoda-profile"
# On the Job: its measured_digest (also the end of its name).
PROFILE_INPUTS_ANNOTATION = "pagoda.dev/profile-inputs"
# The spec's fields that make one replica (the profile's subject); the others (replicas, autoscaling,
# rollout, disruption, Service, monitoring, NetworkPolicy, restarts, routing, cost) do not change what one
# replica serves. TLS is left out before (the profile serves plain HTTP on loopback).
MEASURED_FIELDS = frozenset({"model", "engine", "resources", "scheduling", "runtime", "lora", "slo"})
NAME_SUFFIX = "-profile-"
DIGEST_LENGTH = 10
# A Job's name is also its pods' job-name label value: at most 63 characters.
MAX_NAME = 63
# The deadline: the replica's start (its startup budget), the steps, and GuideLLM's own start and warm-up.
MARGIN_SECONDS = 300
STEP_OVERHEAD = 1.5


def profile_job(
    name: str,
    namespace: str,
    spec: InferenceServiceSpec,
    default_image: str = DEFAULT_RUNTIME_IMAGE,
    chat_template: str | None = None,
    request: str | None = None,
) -> dict[str, Any] | None:
    """The profile Job of spec.slo, or None without it. `chat_template`: as for pod_template; `request`:
    the pagoda.dev/profile annotation's value."""
    slo = spec.slo
    if slo is None:
        return None
    if spec.runtime.tls is not None:  # its server listens on loopback for the profile alone: plain HTTP
        spec = spec.model_copy(update={"runtime": spec.runtime.model_copy(update={"tls": None})})
    template = pod_template(name, namespace, spec, default_image, chat_template)
    pod = template["spec"]
    pod["restartPolicy"] = "Never"
    runtime = pod["containers"][0]
    for key in ("startupProbe", "livenessProbe", "readinessProbe", "lifecycle", "ports"):
        runtime.pop(key, None)
    runtime["args"] = profile_args(runtime["args"], slo)
    template["metadata"]["labels"] = {
        "app.kubernetes.io/name": PROFILE_APP_NAME,
        "app.kubernetes.io/instance": name,
        PROFILE_LABEL: name,
    }
    if request:
        template["metadata"].setdefault("annotations", {})[PROFILE_REQUEST_ANNOTATION] = request
    digest = measured_digest(name, spec, default_image, chat_template, request)
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(name, digest),
            "namespace": namespace,
            "labels": labels(name),
            "annotations": {PROFILE_INPUTS_ANNOTATION: digest},
        },
        "spec": {
            "backoffLimit": 0,  # a failed profile is reported, not retried: its message says why
            "activeDeadlineSeconds": deadline_seconds(spec),
            "template": template,
        },
    }
    return job


def measured_digest(
    name: str, spec: InferenceServiceSpec, default_image: str, chat_template: str | None, request: str | None
) -> str:
    """A digest of what a profile of service `name`'s `spec` measures (see the module's docstring); with the
    name, so that two services whose long names `job_name` cuts alike get Jobs of their own."""
    measured = {
        "service": name,
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True, include=set(MEASURED_FIELDS)),
        "image": spec.runtime.image or default_image,
        "chatTemplate": chat_template,
        "request": request,
    }
    return content_hash(json.dumps(measured, sort_keys=True))[:DIGEST_LENGTH]


def job_name(name: str, digest: str) -> str:
    """`<service>-profile-<digest>`, the service's name cut to fit 63 characters."""
    return name[: MAX_NAME - len(NAME_SUFFIX) - len(digest)].rstrip("-") + NAME_SUFFIX + digest


def profile_args(serve_args: list[str], slo: SloSpec) -> list[str]:
    """A replica's `serve ...` arguments turned into `profile ...`: the same flags, the server on loopback
    only (the profile is its one client), then the SLO's flags, then the engine's extra arguments."""
    args = copy.copy(serve_args)
    extra: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, extra = args[:cut], args[cut:]
    if args[0] != "serve":
        raise ValueError(f"expected the runtime's serve arguments, got {args[0]!r}")
    args[0] = "profile"
    if "--host" in args:
        args[args.index("--host") + 1] = "127.0.0.1"
    shape, plan = slo.request, slo.profile
    args += ["--slo-ttft-ms", _number(slo.ttft_ms), "--slo-itl-ms", _number(slo.inter_token_ms)]
    args += ["--prompt-tokens", str(shape.prompt_tokens), "--output-tokens", str(shape.output_tokens)]
    args += ["--streams", ",".join(str(s) for s in plan.streams), "--step-seconds", str(plan.step_seconds)]
    if slo.tune_engine:
        args.append("--tune-engine")
    return args + extra


def deadline_seconds(spec: InferenceServiceSpec) -> int:
    """How long the Job may run before Kubernetes stops it (then status.profile says Failed): a server's
    start and load, for each server the profile may start (TUNE_MAX_RUNS with tuneEngine)."""
    assert spec.slo is not None
    load = spec.slo.profile.seconds * STEP_OVERHEAD
    servers = TUNE_MAX_RUNS if spec.slo.tune_engine and free_batch_settings(spec) else 1
    return int(servers * (spec.runtime.startup_timeout_seconds + load) + MARGIN_SECONDS)


def with_engine_choice(spec: InferenceServiceSpec, choice: dict[str, Any] | None) -> InferenceServiceSpec:
    """The spec the replicas run: with spec.slo.tuneEngine, the profile's choice (status.profile.engine)
    for each batch setting the spec leaves unset (`free_batch_settings`); the spec itself otherwise (a user's
    setting always wins). A choice measured before the spec set the other setting may no longer fit it
    (vLLM refuses a token budget below the batch's width): then the choice is left out until a new profile
    chooses again."""
    if spec.slo is None or not spec.slo.tune_engine or not choice:
        return spec
    engine = spec.engine
    chosen = {
        field: choice[tune.KEYS[field]]
        for field in free_batch_settings(spec)
        if isinstance(choice.get(tune.KEYS[field]), int)
    }
    if not chosen:
        return spec
    tokens = chosen.get("max_num_batched_tokens", engine.max_num_batched_tokens)
    seqs = chosen.get("max_num_seqs", engine.max_num_seqs)
    if not batch_holds_its_sequences(tokens, seqs):
        return spec
    return spec.model_copy(update={"engine": engine.model_copy(update=chosen)})


def free_batch_settings(spec: InferenceServiceSpec) -> frozenset[str]:
    """The batch settings (tune.FLAGS' fields) the spec leaves to the profile: neither its engine field nor
    the same flag in engine.extraArgs (contract/tune.py decides the same in the profile)."""
    values = {field: getattr(spec.engine, field) for field in tune.FLAGS.values()}
    return tune.unset(values, spec.engine.extra_args)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
