"""Shape logs: record which signatures were hot, and reload them to start warm."""

from __future__ import annotations

import reprlib
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import yaml

from dynshape_perception.config import read_yaml
from dynshape_perception.errors import ConfigError
from dynshape_perception.fsutil import atomic_write_text
from dynshape_perception.runtime.shapes import Signature

SHAPE_LOG_VERSION = 1


def dump_shape_log(counts: Mapping[str, Counter[Signature]], path: Path) -> None:
    """Write ``{model: [{function, dims, calls}]}`` sorted by calls, most first."""
    doc: dict[str, object] = {"version": SHAPE_LOG_VERSION, "models": {}}
    models: dict[str, list[dict[str, object]]] = {}
    for model, counter in sorted(counts.items()):
        models[model] = [
            {"function": sig.function, "dims": sig.as_dict(), "calls": int(n)}
            for sig, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
        ]
    doc["models"] = models
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(doc, sort_keys=False))


def load_shape_log(path: Path) -> dict[str, Counter[Signature]]:
    """The shape log at ``path``; anything but the layout ``dump_shape_log`` writes, with integer
    dims and call counts, is a ``ConfigError``."""
    doc = read_yaml(path, "shape log")
    if not isinstance(doc, dict) or doc.get("version") != SHAPE_LOG_VERSION:
        raise ConfigError(f"{path} is not a version-{SHAPE_LOG_VERSION} shape log")
    out: dict[str, Counter[Signature]] = {}
    models = doc.get("models") or {}
    if not isinstance(models, dict):
        raise ConfigError(f"malformed shape log {path}: models must be a mapping")
    for model, entries in models.items():
        if not isinstance(entries, list):
            raise ConfigError(f"malformed shape log {path}: {model} must list signatures")
        counter: Counter[Signature] = Counter()
        for entry in entries:
            function, dims, calls = _entry(entry, path)
            counter[Signature.of(function, dims)] += calls
        out[str(model)] = counter
    return out


def _entry(entry: object, path: Path) -> tuple[str, dict[str, int], int]:
    if not isinstance(entry, dict) or not {"function", "dims", "calls"} <= entry.keys():
        raise ConfigError(
            f"malformed shape log {path}: {_short(entry)} needs function, dims, calls"
        )
    function, dims, calls = entry["function"], entry["dims"], entry["calls"]
    if not isinstance(function, str) or not isinstance(dims, dict):
        raise ConfigError(f"malformed shape log {path}: {_short(entry)}")
    # Exact ints: 3.9 or true would name a shape the run never saw.
    values = [calls, *dims.values()]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise ConfigError(f"malformed shape log {path}: dims and calls must be integers")
    if calls < 1 or any(v < 0 for v in dims.values()):
        raise ConfigError(f"malformed shape log {path}: {_short(entry)} has negative values")
    return function, {str(k): v for k, v in dims.items()}, calls


def _short(entry: object) -> str:
    # YAML aliases share structure: a few lines can stand for a billion nested items,
    # which a full repr would walk.
    return reprlib.repr(entry)
