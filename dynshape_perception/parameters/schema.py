"""JSON schemas of the node parameters, generated from the parameter table.

One per node, in the layout Autoware's packages use (``/**`` → ``ros__parameters`` → the
node's parameters, nested as in the YAML, all required), and one for a file shared by every
node, which also refuses keys that no node declares.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dynshape_perception.parameters.table import (
    LIBRARY_PARAMETERS,
    NODE_GROUPS,
    UPDATER_PERIOD,
    all_specs,
    node_specs,
)
from dynshape_perception.paramspec import ParamSpec

DRAFT = "http://json-schema.org/draft-07/schema#"
PACKAGE = "dynshape_perception"
SHARED = PACKAGE
# Declared by diagnostic_updater, not by the table: its period is in both YAML files.
LIBRARY_SCHEMAS: dict[str, dict[str, Any]] = {
    UPDATER_PERIOD: {"type": "number", "exclusiveMinimum": 0, "default": 1.0},
    "diagnostic_updater.use_fqn": {"type": "boolean", "default": False},
}


def value_schema(spec: ParamSpec) -> dict[str, Any]:
    """rclpy's types: a bool is no integer, and an integer is no double."""
    out: dict[str, Any] = {"description": spec.description, "default": spec.default}
    if isinstance(spec.default, bool):
        out["type"] = "boolean"
    elif isinstance(spec.default, int):
        out["type"] = "integer"
    elif isinstance(spec.default, float):
        out["type"] = "number"
    else:
        out["type"] = "string"
    if spec.choices:
        out["enum"] = list(spec.choices)
    if out["type"] in ("integer", "number"):
        cast = int if out["type"] == "integer" else float
        if spec.low is not None:
            out["minimum"] = cast(spec.low)
        if spec.high is not None:
            out["maximum"] = cast(spec.high)
    if spec.read_only:
        out["readOnly"] = True
    return out


def _nested(
    leaves: Mapping[str, dict[str, Any]], required: Iterable[str], closed: bool
) -> dict[str, Any]:
    """Dotted names as the YAML nests them; ``closed`` refuses keys not named here."""
    root: dict[str, Any] = {"type": "object", "properties": {}}
    wanted = set(required)
    for name, schema in leaves.items():
        *path, leaf = name.split(".")
        node = root
        prefix: list[str] = []
        for part in path:
            prefix.append(part)
            child = node["properties"].setdefault(part, {"type": "object", "properties": {}})
            if any(w.startswith(".".join(prefix) + ".") for w in wanted):
                _require(node, part)
            node = child
        node["properties"][leaf] = schema
        if name in wanted:
            _require(node, leaf)
    if closed:
        _close(root)
    return root


def _require(node: dict[str, Any], key: str) -> None:
    names = node.setdefault("required", [])
    if key not in names:
        names.append(key)


def _close(node: dict[str, Any]) -> None:
    if node.get("type") == "object":
        node["additionalProperties"] = False
        for child in node["properties"].values():
            _close(child)


def _document(title: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": DRAFT,
        "title": title,
        "type": "object",
        "definitions": {name: body},
        "properties": {
            "/**": {
                "type": "object",
                "properties": {"ros__parameters": {"$ref": f"#/definitions/{name}"}},
                "required": ["ros__parameters"],
            }
        },
        "required": ["/**"],
    }


def node_schema(node: str) -> dict[str, Any]:
    """Every parameter ``node`` declares, each required; other keys are left to the shared
    schema, since one file may serve several nodes."""
    specs = node_specs(node)
    leaves = {name: value_schema(spec) for name, spec in specs.items()}
    leaves[UPDATER_PERIOD] = LIBRARY_SCHEMAS[UPDATER_PERIOD]
    body = _nested(leaves, leaves, closed=False)
    return _document(f"Parameters of {PACKAGE} {node}", node, body)


def shared_schema() -> dict[str, Any]:
    """A file for every node: any parameter of any node, and nothing else."""
    leaves = {name: value_schema(spec) for name, spec in all_specs().items()}
    leaves.update({name: LIBRARY_SCHEMAS[name] for name in sorted(LIBRARY_PARAMETERS)})
    body = _nested(leaves, (), closed=True)
    return _document(f"Parameters of the {PACKAGE} nodes, one file for all", SHARED, body)


def schemas() -> dict[str, dict[str, Any]]:
    """File stem → schema: each node's, then the shared file's."""
    out = {node: node_schema(node) for node in NODE_GROUPS}
    out[SHARED] = shared_schema()
    return out
