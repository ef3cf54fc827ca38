"""ROS params YAML (``/**: ros__parameters:``) read and written without ROS; tier deadlines."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dynshape_perception.errors import ConfigError
from dynshape_perception.parameters.readers import tier_config
from dynshape_perception.scheduling.tiers import Tier, TierConfig

Value = bool | int | float | str
ROS_PARAMETERS = "ros__parameters"
WILDCARD_NODE = "/**"

TIERS = tuple(int(t) for t in Tier)
DEFAULT_DEADLINES_MS: dict[int, float | None] = {t: TierConfig().deadline_ms(t) for t in TIERS}
# Which tier each stage serves, as in the nodes: tier 1 the near field, tier 2 the full
# cloud and tracking, tier 3 prediction; a tier's work is done when its last stage is.
# Replay runs the units one after the other, in this order. Markers (tier 4) exist only in
# the nodes; speculation (tier 4) runs after the frame's last stage and is timed apart.
REPLAY_STAGES = ("near_field", "segment", "cluster", "track", "predict")
STAGE_TIERS = {"near_field": 1, "segment": 2, "cluster": 2, "track": 2, "predict": 3}


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Value]:
    """Nested parameter mappings as dotted names, the way ROS 2 reads them."""
    out: dict[str, Value] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            raise ConfigError(f"parameter {name} has an unsupported value {value!r}")
    return out


def nest(values: Mapping[str, Value]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name in sorted(values):
        node = tree
        *parents, leaf = name.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"parameter {name} clashes with {part}")
            node = child
        node[leaf] = values[name]
    return tree


def load_params_file(path: Path) -> dict[str, Value]:
    """Every node section's parameters, merged in file order (``/**`` first)."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read parameters file {path}: {err}") from err
    if not isinstance(doc, dict) or not doc:
        raise ConfigError(f"{path} must map node names to {{{ROS_PARAMETERS}: ...}}")
    sections = sorted(doc.items(), key=lambda item: item[0] != WILDCARD_NODE)
    values: dict[str, Value] = {}
    for node, body in sections:
        if not isinstance(body, dict) or not isinstance(body.get(ROS_PARAMETERS), dict):
            raise ConfigError(f"{path}: section {node!r} has no {ROS_PARAMETERS} mapping")
        values.update(flatten(body[ROS_PARAMETERS]))
    return values


def dump_params(values: Mapping[str, Value], comment: str = "") -> str:
    """A ready ROS 2 parameters file for every node (``/**``)."""
    header = "".join(f"# {line}\n" for line in comment.splitlines())
    body = yaml.safe_dump(
        {WILDCARD_NODE: {ROS_PARAMETERS: nest(values)}}, sort_keys=False, default_flow_style=False
    )
    return header + body


def deadlines_from(values: Mapping[str, Value]) -> dict[int, float | None]:
    """Deadline of each tier (ms after the frame's arrival) from the tier parameters."""
    config = tier_config(values)
    return {t: config.deadline_ms(t) for t in TIERS}
