"""Shape profiles: record which signatures were hot, and reload them to start warm."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import yaml

from dynshape_perception.core.runtime.shapes import Signature
from dynshape_perception.errors import ConfigError
from dynshape_perception.fsutil import atomic_write_text

PROFILE_VERSION = 1


def dump_profile(profiles: Mapping[str, Counter[Signature]], path: Path) -> None:
    """Write ``{model: [{function, dims, calls}]}`` sorted by calls, most first."""
    doc: dict[str, object] = {"version": PROFILE_VERSION, "models": {}}
    models: dict[str, list[dict[str, object]]] = {}
    for model, counter in sorted(profiles.items()):
        models[model] = [
            {"function": sig.function, "dims": sig.as_dict(), "calls": int(n)}
            for sig, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
        ]
    doc["models"] = models
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(doc, sort_keys=False))


def load_profile(path: Path) -> dict[str, Counter[Signature]]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read shape profile {path}: {err}") from err
    if not isinstance(doc, dict) or doc.get("version") != PROFILE_VERSION:
        raise ConfigError(f"{path} is not a version-{PROFILE_VERSION} shape profile")
    out: dict[str, Counter[Signature]] = {}
    try:
        for model, entries in (doc.get("models") or {}).items():
            counter: Counter[Signature] = Counter()
            for entry in entries:
                dims = {str(k): int(v) for k, v in entry["dims"].items()}
                if any(v < 0 for v in dims.values()):
                    raise ValueError(f"negative dim in {entry}")
                counter[Signature.of(str(entry["function"]), dims)] += int(entry["calls"])
            out[str(model)] = counter
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ConfigError(f"malformed shape profile {path}: {err}") from err
    return out
