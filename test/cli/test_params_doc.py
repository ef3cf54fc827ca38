"""docs/parameters.md is the parameter table as ``dynshape-perception params`` prints it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from dynshape_perception import parameters
from dynshape_perception.cli.main import main
from dynshape_perception.cli.params import markdown, schema_files

DOC = Path(__file__).resolve().parents[2] / "docs" / "parameters.md"


def test_docs_parameters_is_current() -> None:
    assert DOC.read_text() == markdown(), (
        "docs/parameters.md is stale: run dynshape-perception params --out docs/parameters.md"
    )


def test_every_parameter_has_a_row() -> None:
    text = markdown()
    for name, spec in parameters.all_specs().items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        assert ("read-only" if spec.read_only else "live") in row


def test_the_verb_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "p.md"
    assert main(["params", "--out", str(out)]) == 0
    assert out.read_text() == markdown()
    assert main(["params", "--out", str(tmp_path)]) == 2


SCHEMAS = Path(__file__).resolve().parents[2] / "config" / "schema"
PARAM_FILES = sorted((SCHEMAS.parent).glob("*.param.yaml"))


def test_config_schema_is_current() -> None:
    committed = {p.name: p.read_text() for p in SCHEMAS.glob("*.json")}
    assert committed == schema_files(), (
        "config/schema is stale: run dynshape-perception params --schema-dir config/schema"
    )


def validator(stem: str) -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMAS / f"{stem}.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("path", PARAM_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("stem", [*parameters.NODE_GROUPS, "dynshape_perception"])
def test_the_shipped_yaml_files_follow_every_schema(path: Path, stem: str) -> None:
    assert len(PARAM_FILES) == 2
    errors = [e.message for e in validator(stem).iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


def _edited(edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    doc = yaml.safe_load((SCHEMAS.parent / "x86_dev.param.yaml").read_text())
    edit(doc["/**"]["ros__parameters"])
    return doc


BREACHES: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    "int as string": ("pointcloud_node", lambda p: p["bounds"].update(max_points="150000")),
    "bool as int": ("tracker_node", lambda p: p["tracking"].update(publish_coasting=1)),
    "above range": ("pointcloud_node", lambda p: p["bounds"].update(max_points=10**9)),
    "below range": ("tracker_node", lambda p: p["tracking"].update(gate_distance_m=-1.0)),
    "not a choice": ("perception_pipeline", lambda p: p["jit"].update(mode="eager")),
    "missing key": ("prediction_node", lambda p: p["prediction"].pop("mode")),
    "unknown key": ("dynshape_perception", lambda p: p["tracking"].update(gate_distance=2.0)),
    "unknown group": ("dynshape_perception", lambda p: p.update(trackin={"x": 1})),
}


@pytest.mark.parametrize("breach", BREACHES)
def test_a_seeded_breach_fails_its_schema(breach: str) -> None:
    stem, edit = BREACHES[breach]
    doc = _edited(edit)
    assert list(validator(stem).iter_errors(doc)), breach


def test_the_verb_writes_the_schemas(tmp_path: Path) -> None:
    out = tmp_path / "schema"
    assert main(["params", "--schema-dir", str(out)]) == 0
    assert {p.name: p.read_text() for p in out.iterdir()} == schema_files()
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["params", "--schema-dir", str(blocker)]) == 2
