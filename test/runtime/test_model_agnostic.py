"""The runtime and compiler know no model by name: what a model needs, its spec declares."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.runtime.policy import JitConfig

PACKAGE = Path(__file__).resolve().parents[2] / "dynshape_perception"


def model_names_in(source: str) -> list[tuple[int, str]]:
    """Lines where a string that is not a docstring equals a model's name."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in MODEL_NAMES
        and id(node) not in docstrings
    ]


def test_the_check_finds_a_model_keyed_by_name() -> None:
    seeded = '"""A docstring may say predictor."""\nCHECKS = {"predictor": 1}\n'
    assert model_names_in(seeded) == [(2, "predictor")]
    assert model_names_in('"""predictor"""\n') == []


def test_no_runtime_or_compiler_module_names_a_model() -> None:
    found = {
        str(path.relative_to(PACKAGE)): hits
        for layer in ("runtime", "compiler")
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        if (hits := model_names_in(path.read_text()))
    }
    assert found == {}


def test_bucket_edges_come_from_the_spec_unless_the_config_replaces_them() -> None:
    spec = model_definition("associator").spec
    declared = dataclasses.replace(spec, bucket_edges={"N": (4, 16)})
    assert JitConfig().dim_policy(spec).weak_edges == {}
    assert JitConfig().dim_policy(declared).weak_edges == {"N": (4, 16)}
    replaced = JitConfig(weak_edges={"associator": {"M": (8,)}}).dim_policy(declared)
    assert replaced.weak_edges == {"M": (8,)}
    other = JitConfig(weak_edges={"predictor": {"A": (8,)}}).dim_policy(declared)
    assert other.weak_edges == {"N": (4, 16)}
