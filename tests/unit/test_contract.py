"""The operator-runtime contract (contract/__init__.py) is defined once: no module of operator/ or runtime/
spells one of its values out again (in code; docstrings and comments may name them for the reader), and the
types built from it keep the CRD's enums."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from pagoda import contract
from pagoda.operator.api.engine import EngineSpec
from pagoda.operator.api.lora import LoraSpec
from pagoda.runtime.serving.config import ServeConfig
from tests.repo import REPO

CONTRACT_FILE = REPO / "runtime" / "contract.py"

# Values whose literal copy in code is a second definition of the contract.
NUMBERS = {contract.HTTP_PORT}
TEXTS = (
    contract.CACHE_DIR,
    contract.MODELS_DIR,
    contract.TERMINATION_MESSAGE_PATH,
    contract.TERMINATION_MESSAGE_ENV,
    contract.ADAPTERS_PATH,
    contract.CAPACITY_PATH,
    contract.MANAGEMENT_KEY_DIR,
    contract.MANAGEMENT_PUBLIC_KEY_PATH,
    contract.MANAGEMENT_AUTH_SCHEME,
    contract.POD_UID_ENV,
    contract.POD_IP_ENV,
    contract.TLS_DIR,
    contract.TLS_CERT_PATH,
    contract.TLS_KEY_PATH,
    contract.QUEUE_DEPTH_METRIC,
    contract.RUNNING_REQUESTS_METRIC,
    contract.KV_CACHE_USAGE_METRIC,
    contract.ADAPTER_NAME_PATTERN,
    contract.S3_BUCKET_PATTERN,
    contract.IMAGE_MODEL_NAME,  # the oci:// served name (also in IMAGE_MODEL_DIR)
)
SETS = [
    frozenset(contract.DTYPES),
    frozenset(contract.QUANTIZATIONS),
    frozenset(contract.BLOCK_SIZES),
    frozenset(contract.LORA_RANKS),
]


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def copies(source: str) -> list[str]:
    """What of the contract `source` spells out again, one line each: `line: value`."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in skip:
            value = node.value
            if isinstance(value, int) and not isinstance(value, bool) and value in NUMBERS:
                found.append(f"{node.lineno}: {value}")
            elif isinstance(value, str):
                found += [f"{node.lineno}: {text!r}" for text in TEXTS if text in value]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
            if all(isinstance(e, ast.Constant) for e in node.elts):
                values = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if any(values >= allowed for allowed in SETS):
                    found.append(f"{node.lineno}: {sorted(values, key=str)}")
    return found


def sources() -> list[Path]:
    return sorted(p for d in ("operator", "runtime") for p in (REPO / d).rglob("*.py") if p != CONTRACT_FILE)


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_defines_its_own_copy_of_the_contract(path: Path) -> None:
    found = copies(path.read_text())
    assert not found, f"{path.relative_to(REPO)} repeats contract/__init__.py: {found}; import it instead"


def test_the_scan_finds_a_copy() -> None:
    planted = '''"""Docstrings may say /var/cache/pagoda and 8000."""
PORT = 8000
PATH = "/v1/pagoda/capacity"
SIZES = (8, 16, 32, 64, 128)
Dtype = typing.Literal["auto", "float16", "bfloat16", "float32"]
QUERY = f"sum(pagoda_queue_depth{{service='{name}'}})"
'''
    found = copies(planted)
    assert [line.split(":")[0] for line in found] == ["2", "3", "4", "5", "6"], found


def test_types_built_from_the_contract_keep_their_values() -> None:
    assert typing.get_args(contract.Dtype) == contract.DTYPES
    assert typing.get_args(contract.BlockSize) == contract.BLOCK_SIZES
    schema = EngineSpec.model_json_schema()["properties"]
    assert schema["dtype"]["enum"] == list(contract.DTYPES)
    assert schema["blockSize"]["enum"] == list(contract.BLOCK_SIZES)
    assert schema["quantization"]["enum"] == ["none", *contract.QUANTIZATIONS]
    lora = LoraSpec.model_json_schema()
    assert list(contract.LORA_RANKS) in _enums(lora)
    runtime = ServeConfig.model_json_schema()["properties"]
    assert runtime["port"]["default"] == contract.HTTP_PORT
    assert runtime["cache_dir"]["default"] == contract.CACHE_DIR


def _enums(schema: object) -> list[list[object]]:
    """Every `enum` list anywhere in a JSON schema."""
    found: list[list[object]] = []
    if isinstance(schema, dict):
        if isinstance(schema.get("enum"), list):
            found.append(schema["enum"])
        for value in schema.values():
            found += _enums(value)
    elif isinstance(schema, list):
        for value in schema:
            found += _enums(value)
    return found
