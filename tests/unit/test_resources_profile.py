"""The capacity profile Job (resources/profile.py): a replica's pod running `pagoda-runtime profile`, named
by a digest of what it measures, invisible to the service's Service, PDB and status."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pagoda.contract import TUNE_MAX_RUNS
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.resources import ChildInputs, OperatorSettings, desired_children, profile, selector
from pagoda.operator.resources.deployment import deployment
from pagoda.operator.resources.meta import OWNER_LABEL
from pagoda.operator.resources.profile import (
    MAX_NAME,
    PROFILE_INPUTS_ANNOTATION,
    profile_args,
    profile_job,
    with_engine_choice,
)

SLO = {"ttftMs": 500, "interTokenMs": 50.5, "request": {"promptTokens": 64, "outputTokens": 16}}


def spec_with(llama_spec: dict[str, Any], **changes: Any) -> InferenceServiceSpec:
    data = copy.deepcopy(llama_spec)
    data["slo"] = SLO
    data.update(changes)
    return InferenceServiceSpec.model_validate(data)


def job_of(spec: InferenceServiceSpec, name: str = "llm", request: str | None = None) -> dict[str, Any]:
    job = profile_job(name, "ns", spec, "runtime:1", request=request)
    assert job is not None
    return job


def test_no_slo_no_job(llama_spec: dict[str, Any]) -> None:
    spec = InferenceServiceSpec.model_validate(llama_spec)
    assert profile_job("llm", "ns", spec) is None
    assert all(child["kind"] != "Job" for child in desired_children("llm", "ns", spec))


def test_the_job_is_the_last_child_and_belongs_to_the_service(llama_spec: dict[str, Any]) -> None:
    children = desired_children("llm", "ns", spec_with(llama_spec))
    job = children[-1]
    assert job["kind"] == "Job" and job["metadata"]["labels"][OWNER_LABEL] == "llm"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_its_pod_is_no_replica(llama_spec: dict[str, Any]) -> None:
    """The Deployment's selector (also the Service's and the PDB's) must not match the profile's pod."""
    spec = spec_with(llama_spec)
    pod_labels = job_of(spec)["spec"]["template"]["metadata"]["labels"]
    assert not set(selector("llm").items()) <= set(pod_labels.items())
    assert OWNER_LABEL not in pod_labels


def test_its_container_is_a_replicas_with_profile_instead_of_serve(llama_spec: dict[str, Any]) -> None:
    spec = spec_with(llama_spec)
    replica = deployment("llm", "ns", spec, "runtime:1")["spec"]["template"]["spec"]["containers"][0]
    profiler = job_of(spec)["spec"]["template"]["spec"]["containers"][0]
    assert profiler["image"] == replica["image"] and profiler["resources"] == replica["resources"]
    assert profiler["volumeMounts"] == replica["volumeMounts"] and profiler["env"] == replica["env"]
    assert not {"startupProbe", "livenessProbe", "readinessProbe", "lifecycle", "ports"} & set(profiler)
    args = profiler["args"]
    assert args[0] == "profile" and args[args.index("--host") + 1] == "127.0.0.1"
    assert args[1 : args.index("--host")] == replica["args"][1 : replica["args"].index("--host")]
    assert args[args.index("--slo-itl-ms") + 1] == "50.5" and args[args.index("--slo-ttft-ms") + 1] == "500"
    assert args[args.index("--streams") + 1] == "1,2,4,8,16"


def test_its_pod_pulls_with_the_replicas_secrets_and_keeps_their_body_limit(
    llama_spec: dict[str, Any],
) -> None:
    """The Job runs the runtime image (and mounts an oci:// model) too: without the pull secrets a private
    image would leave it in ImagePullBackOff until its deadline."""
    secrets = [{"name": "regcred"}]
    spec = spec_with(llama_spec, runtime={"imagePullSecrets": secrets, "maxRequestBodyBytes": 1024**2})
    replica = deployment("llm", "ns", spec, "runtime:1")["spec"]["template"]["spec"]
    pod = job_of(spec)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == replica["imagePullSecrets"] == secrets
    args = pod["containers"][0]["args"]
    assert args[args.index("--max-request-body-bytes") + 1] == str(1024**2)
    assert "imagePullSecrets" not in job_of(spec_with(llama_spec))["spec"]["template"]["spec"]


def test_engine_extra_args_stay_after_the_profile_flags() -> None:
    slo = spec_with({**_tiny(), "engine": {"extraArgs": ["--max-num-batched-tokens", "512"]}}).slo
    assert slo is not None
    args = profile_args(["serve", "--model", "file:///m", "--", "--max-num-batched-tokens", "512"], slo)
    assert args[-3:] == ["--", "--max-num-batched-tokens", "512"]
    assert args.index("--slo-ttft-ms") < args.index("--")
    with pytest.raises(ValueError, match="serve arguments"):
        profile_args(["profile", "--model", "file:///m"], slo)


@pytest.mark.parametrize(
    "change",
    [
        {"engine": {"maxModelLen": 4096}},
        {"slo": {**SLO, "ttftMs": 400}},
        {"slo": {**SLO, "profile": {"streams": [1, 3]}}},
        {"runtime": {"image": "runtime:2"}},
    ],
)
def test_what_it_measures_changes_its_name(llama_spec: dict[str, Any], change: dict[str, Any]) -> None:
    before = job_of(spec_with(llama_spec))["metadata"]["name"]
    after = job_of(spec_with(llama_spec, **change))["metadata"]["name"]
    assert before != after and before.startswith("llm-profile-") and after.startswith("llm-profile-")


@pytest.mark.parametrize(
    "change",
    [
        {"autoscaling": {"minReplicas": 1, "maxReplicas": 7}},
        {"monitoring": {"serviceMonitor": {"enabled": True}}},
        {"disruption": {"maxUnavailable": 0}},
        {"rollout": {"maxSurge": 0, "maxUnavailable": 1}},
    ],
)
def test_what_it_does_not_measure_keeps_its_name(llama_spec: dict[str, Any], change: dict[str, Any]) -> None:
    """A profile measures one replica: the fleet's shape is not in its digest."""
    assert (
        job_of(spec_with(llama_spec))["metadata"]["name"]
        == job_of(spec_with(llama_spec, **change))["metadata"]["name"]
    )


def test_an_operator_template_change_keeps_its_name(
    llama_spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade that changes the operator's pod template (here: a new annotation and a probe period, as
    a release may) names the same Job, so no profile runs again; the Job carries its digest."""
    spec = spec_with(llama_spec)
    before = job_of(spec)
    original = profile.pod_template

    def newer(*args: Any, **kwargs: Any) -> dict[str, Any]:
        template = original(*args, **kwargs)
        template["metadata"].setdefault("annotations", {})["pagoda.dev/new-default"] = "1"
        template["spec"]["terminationGracePeriodSeconds"] = 77
        return template

    monkeypatch.setattr(profile, "pod_template", newer)
    after = job_of(spec)
    assert after["spec"]["template"] != before["spec"]["template"]  # the template did change
    assert after["metadata"]["name"] == before["metadata"]["name"]
    digest = before["metadata"]["name"].rsplit("-", 1)[1]
    assert before["metadata"]["annotations"] == {PROFILE_INPUTS_ANNOTATION: digest}


def test_a_request_annotation_asks_for_a_new_profile(llama_spec: dict[str, Any]) -> None:
    spec = spec_with(llama_spec)
    names = {job_of(spec, request=value)["metadata"]["name"] for value in (None, "a", "b")}
    assert len(names) == 3
    assert job_of(spec, request="a") == job_of(spec, request="a")  # the same spec, the same Job


def test_the_name_fits_a_label_value_for_the_longest_service_name(llama_spec: dict[str, Any]) -> None:
    long_a, long_b = "a" * 62 + "b", "a" * 62 + "c"
    spec = spec_with(llama_spec)
    name_a, name_b = job_of(spec, long_a)["metadata"]["name"], job_of(spec, long_b)["metadata"]["name"]
    assert len(name_a) <= MAX_NAME and len(name_b) <= MAX_NAME and name_a != name_b


def test_the_deadline_covers_the_start_and_every_step_of_every_server(llama_spec: dict[str, Any]) -> None:
    plan = {"streams": [1, 2, 4], "stepSeconds": 100}
    one = spec_with(llama_spec, slo={**SLO, "profile": plan, "tuneEngine": False})
    tuned = spec_with(llama_spec, slo={**SLO, "profile": plan})
    server = one.runtime.startup_timeout_seconds + 300
    assert job_of(one)["spec"]["activeDeadlineSeconds"] > server
    assert job_of(tuned)["spec"]["activeDeadlineSeconds"] > TUNE_MAX_RUNS * server


def test_tune_engine_is_on_by_default_and_asks_the_runtime_to_tune(llama_spec: dict[str, Any]) -> None:
    def args(spec: InferenceServiceSpec) -> list[str]:
        return list(job_of(spec)["spec"]["template"]["spec"]["containers"][0]["args"])

    assert "--tune-engine" in args(spec_with(llama_spec))
    assert "--tune-engine" not in args(spec_with(llama_spec, slo={**SLO, "tuneEngine": False}))


RUNTIME_1 = OperatorSettings(default_image="runtime:1")
CHOICE = {"maxNumBatchedTokens": 1024, "maxNumSeqs": 8, "goodput": 6.5, "baselineGoodput": 5.0}


def replica_args(spec: InferenceServiceSpec, choice: dict[str, Any] | None) -> list[str]:
    children = desired_children("llm", "ns", spec, ChildInputs(RUNTIME_1, engine_choice=choice))
    (deployment_,) = [child for child in children if child["kind"] == "Deployment"]
    return list(deployment_["spec"]["template"]["spec"]["containers"][0]["args"])


def flag(args: list[str], name: str) -> str | None:
    """The value of the runtime's flag `name` (before `--`: what follows is vLLM's, the spec's extraArgs)."""
    own = args[: args.index("--")] if "--" in args else args
    return own[own.index(name) + 1] if name in own else None


def test_the_replicas_run_the_choice_and_the_job_stays_as_it_was(llama_spec: dict[str, Any]) -> None:
    """Applying a choice must not rename the profile Job: a new Job would profile again, choose again, and
    so on for ever."""
    llama_spec = {**llama_spec, "engine": {**llama_spec.get("engine", {}), "maxNumSeqs": None}}
    spec = spec_with(llama_spec)
    before = [c for c in desired_children("llm", "ns", spec, ChildInputs(RUNTIME_1)) if c["kind"] == "Job"]
    after = [
        c
        for c in desired_children("llm", "ns", spec, ChildInputs(RUNTIME_1, engine_choice=CHOICE))
        if c["kind"] == "Job"
    ]
    assert before == after
    args = replica_args(spec, CHOICE)
    assert (flag(args, "--max-num-batched-tokens"), flag(args, "--max-num-seqs")) == ("1024", "8")
    assert flag(replica_args(spec, None), "--max-num-batched-tokens") is None


@pytest.mark.parametrize(
    ("engine", "tokens", "seqs"),
    [
        ({"maxNumSeqs": 4}, "1024", "4"),  # the spec's width wins, the free budget is the choice's
        ({"maxNumBatchedTokens": 2048}, "2048", "8"),
        ({"extraArgs": ["--max_num_batched_tokens=4096"]}, None, "8"),  # given to vLLM directly: set
        ({"maxNumSeqs": 16, "extraArgs": ["--max-num-batched-tokens", "4096"]}, None, "16"),
    ],
)
def test_a_setting_the_spec_gives_always_wins(
    engine: dict[str, Any], tokens: str | None, seqs: str | None
) -> None:
    spec = spec_with({**_tiny(), "engine": engine})
    args = replica_args(spec, CHOICE)
    assert (flag(args, "--max-num-batched-tokens"), flag(args, "--max-num-seqs")) == (tokens, seqs)


@pytest.mark.parametrize(
    ("engine", "choice"),
    [
        ({"maxNumSeqs": 512}, {"maxNumBatchedTokens": 256}),  # the spec's width set after the choice
        ({"maxNumBatchedTokens": 64}, {"maxNumSeqs": 128}),
    ],
)
def test_a_choice_that_no_longer_fits_the_spec_is_left_out(
    engine: dict[str, Any], choice: dict[str, Any]
) -> None:
    """vLLM refuses a token budget below the batch's width: the replicas would not start until a new profile
    (hours with tuning on a large model) chose again."""
    spec = spec_with({**_tiny(), "engine": engine})
    assert with_engine_choice(spec, choice) is spec


def test_a_spec_that_gives_both_settings_gets_one_servers_deadline() -> None:
    both = spec_with({**_tiny(), "engine": {"maxNumSeqs": 8, "maxNumBatchedTokens": 512}})
    plain = spec_with(
        {**_tiny(), "engine": {"maxNumSeqs": 8, "maxNumBatchedTokens": 512}}, slo={**SLO, "tuneEngine": False}
    )
    assert job_of(both)["spec"]["activeDeadlineSeconds"] == job_of(plain)["spec"]["activeDeadlineSeconds"]


def test_without_tune_engine_or_a_choice_the_replicas_run_the_spec() -> None:
    spec = spec_with({**_tiny()}, slo={**SLO, "tuneEngine": False})
    assert with_engine_choice(spec, CHOICE) is spec
    tuned = spec_with({**_tiny()})
    assert with_engine_choice(tuned, None) is tuned
    assert with_engine_choice(tuned, {"goodput": 5.0, "baselineGoodput": 5.0}) is tuned  # the baseline kept


def _tiny() -> dict[str, Any]:
    return {"model": {"uri": "file:///models/tiny"}, "resources": {"gpu": {"count": 1}}}
