"""Shared helpers for the API, CRD and builder unit tests: the examples and a CEL evaluator for the CRD."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from tests.repo import REPO


def _is_inference_service(path: Path) -> bool:
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return len(documents) == 1 and documents[0].get("kind") == "InferenceService"


EXAMPLES = sorted(path for path in (REPO / "examples").glob("*.yaml") if _is_inference_service(path))

# The user shape of issue #2: the base of the invalid-spec cases.
LLAMA: dict[str, Any] = {
    "model": {
        "uri": "hf://meta-llama/Llama-3.1-70B-Instruct",
        "servedName": "llama-3.1-70b",
        "credentialsSecret": "hf-token",
    },
    "engine": {
        "dtype": "bfloat16",
        "quantization": "awq",
        "tensorParallelSize": 4,
        "maxModelLen": 8192,
        "gpuMemoryUtilization": 0.92,
    },
    "resources": {"gpu": {"count": 4, "product": "NVIDIA-H100-80GB-HBM3"}},
    # The shape before `metric` existed: targetQueueDepth alone keeps scaling on the queue depth.
    "autoscaling": {"minReplicas": 1, "maxReplicas": 4, "targetQueueDepth": 5},
    "monitoring": {"serviceMonitor": {"enabled": True}},
}


def load_example(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test taking `example_path` runs once per InferenceService sample in examples/."""
    if "example_path" in metafunc.fixturenames:
        metafunc.parametrize("example_path", EXAMPLES, ids=[path.stem for path in EXAMPLES])


@pytest.fixture
def example(example_path: Path) -> dict[str, Any]:
    return load_example(example_path)


@pytest.fixture(scope="session")
def all_examples() -> dict[str, dict[str, Any]]:
    return {path.stem: load_example(path) for path in EXAMPLES}


@pytest.fixture
def llama_spec() -> dict[str, Any]:
    return copy.deepcopy(LLAMA)


def _substring(text: Any, start: Any, end: Any = None) -> celpy.celtypes.StringType:
    stop = len(text) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(text):
        raise ValueError(f"substring({start}, {end}) out of range of a string of {len(text)}")
    return celpy.celtypes.StringType(text[int(start) : stop])


# The functions of the Kubernetes CEL strings library the CRD's rules use (celpy has the core language only),
# as the API server's cel-go has them; tier 2 runs the same rules in the real API server.
K8S_STRINGS: dict[str, Callable[..., Any]] = {
    "split": lambda text, sep: celpy.celtypes.ListType(
        [celpy.celtypes.StringType(part) for part in str(text).split(str(sep))]
    ),
    "substring": _substring,
    "indexOf": lambda text, sub: celpy.celtypes.IntType(str(text).find(str(sub))),
}


@functools.cache
def _program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression), functions=K8S_STRINGS)


def cel_evaluate(expression: str, **variables: Any) -> Any:
    """One CEL expression, with the Kubernetes strings library, on JSON values."""
    program = _program(expression)
    activation = {name: celpy.json_to_cel(value) for name, value in variables.items()}
    result = program.evaluate(activation)
    if isinstance(result, Exception):
        raise AssertionError(f"{expression!r} failed to evaluate: {result}")
    return result


def cel_violations(schema: dict[str, Any], value: Any) -> list[str]:
    """Messages of the x-kubernetes-validations rules `value` breaks, evaluated as the API server would
    (numbers as doubles, each rule at its own node, absent optional fields skipped)."""
    env = celpy.Environment()
    found: list[str] = []
    for node_schema, node_value in _walk(schema, value):
        for entry in node_schema.get("x-kubernetes-validations", []):
            program = env.program(env.compile(entry["rule"]), functions=K8S_STRINGS)
            result = program.evaluate({"self": celpy.json_to_cel(_typed(node_schema, node_value))})
            if isinstance(result, Exception):
                raise AssertionError(f"rule {entry['rule']!r} failed to evaluate: {result}")
            if not bool(result):
                found.append(entry["message"])
    return found


def _walk(schema: dict[str, Any], value: Any) -> Iterator[tuple[dict[str, Any], Any]]:
    yield schema, value
    if isinstance(value, dict):
        for key, sub in value.items():
            child = schema.get("properties", {}).get(key)
            if child is None and isinstance(schema.get("additionalProperties"), dict):
                child = schema["additionalProperties"]
            if child is not None:
                yield from _walk(child, sub)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            yield from _walk(schema["items"], item)


def _typed(schema: dict[str, Any], value: Any) -> Any:
    """JSON numbers under `type: number` become floats, as CEL sees them in the API server."""
    if schema.get("type") == "number" and isinstance(value, int | float):
        return float(value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = (
            schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else {}
        )
        return {key: _typed(props.get(key, extra or {}), sub) for key, sub in value.items()}
    if isinstance(value, list):
        return [_typed(schema.get("items", {}), item) for item in value]
    return value


@pytest.fixture(scope="session")
def crd_root_schema() -> dict[str, Any]:
    from pagoda.operator.api.crdgen import crd

    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.fixture(scope="session")
def cel_check(crd_root_schema: dict[str, Any]) -> Callable[[dict[str, Any]], list[str]]:
    """Evaluates every CEL rule of the CRD on a whole InferenceService object."""

    def check(obj: dict[str, Any]) -> list[str]:
        return cel_violations(crd_root_schema, obj)

    return check
