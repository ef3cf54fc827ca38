"""Bounds and model shapes from ``config/models.yaml``: the single source of every limit."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from dynshape_perception.errors import BoundError, ConfigError, DynshapeError
from dynshape_perception.paramspec import param
from dynshape_perception.resources import config_path

DIM_MEANINGS = {
    "P": "points",
    "N": "detections",
    "M": "tracks",
    "A": "agents",
    "T": "history steps",
}


def _bound(dim: str, default: int, what: str, key: str) -> Any:
    # Its default and upper limit as a node parameter are the compiled bound, which
    # config/models.yaml sets (parameters.engine puts them in): no class default states it.
    description = f"upper bound of {dim} ({what}) in this node"
    return param(default, description, read_only=True, low=1, key=key)


@dataclass(frozen=True)
class Bounds:
    """The compiled bounds; as node parameters (``bounds.*``) each may only lower its own."""

    P: int = _bound("P", 150_000, "points", "max_points")
    N: int = _bound("N", 128, "obstacles", "max_obstacles")
    M: int = _bound("M", 128, "tracks", "max_tracks")
    A: int = _bound("A", 64, "agents", "max_agents")
    T: int = _bound("T", 128, "history steps", "max_history_steps")

    def __post_init__(self) -> None:
        for dim in DIM_MEANINGS:
            value = getattr(self, dim)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"bound {dim} must be a positive integer, got {value!r}")

    def as_dict(self) -> dict[str, int]:
        return {dim: int(getattr(self, dim)) for dim in DIM_MEANINGS}

    def check(self, dim: str, count: int, tensor: str = "") -> None:
        """Raise BoundError if ``count`` exceeds the bound of ``dim``."""
        bound = getattr(self, dim)
        if count > bound:
            where = f" in {tensor}" if tensor else ""
            raise BoundError(
                f"{DIM_MEANINGS[dim]} count {dim}={count}{where} exceeds its bound {bound}"
            )


@dataclass(frozen=True)
class Roi:
    x_m: tuple[float, float] = (0.0, 60.0)
    y_m: tuple[float, float] = (-30.0, 30.0)
    z_m: tuple[float, float] = (-3.0, 3.0)

    def __post_init__(self) -> None:
        for name in ("x_m", "y_m", "z_m"):
            lo, hi = getattr(self, name)
            # Finite: the ROI sizes the clustering grid.
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ConfigError(f"roi {name} must be finite with min < max, got {(lo, hi)}")


@dataclass(frozen=True)
class ModelsConfig:
    bounds: Bounds
    roi: Roi
    raw: dict[str, Any]

    def section(self, name: str) -> dict[str, Any]:
        value = self.raw.get(name, {})
        if not isinstance(value, dict):
            raise ConfigError(f"models.yaml section {name!r} must be a mapping")
        return value


def read_yaml(path: Path, what: str, error: type[DynshapeError] = ConfigError) -> Any:
    """The document in the YAML file ``path``; a file that cannot be read or parsed raises
    ``error``, naming ``what`` it should hold and why it failed."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"cannot read {what} {path}: {err}") from err
    try:
        return yaml.safe_load(text)
    # ValueError: a scalar YAML types but cannot build, such as the date 2024-13-45.
    # RecursionError: nesting deeper than the parser's stack.
    except (ValueError, RecursionError, yaml.YAMLError) as err:
        raise error(f"cannot read {what} {path}: not valid YAML: {err}") from err


def load_models_config(path: Path | None = None) -> ModelsConfig:
    path = path or config_path("models.yaml")
    raw = read_yaml(path, "models configuration")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping")
    try:
        bounds = Bounds(**{k: integer(f"bound {k}", v) for k, v in _mapping(raw, "bounds").items()})
        roi = Roi(**{k: _interval(k, v) for k, v in _mapping(raw, "roi").items()})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{path}: {err}") from err
    return ModelsConfig(bounds=bounds, roi=roi, raw=raw)


def _mapping(raw: dict[str, Any], name: str) -> dict[str, Any]:
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"models.yaml section {name!r} must be a mapping, got {value!r}")
    return value


def _interval(name: str, value: object) -> tuple[float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(f"roi {name} must be [min, max], got {value!r}")
    lo, hi = value
    if isinstance(lo, bool) or isinstance(hi, bool):
        raise ConfigError(f"roi {name} must be [min, max] in metres, got {value!r}")
    return float(lo), float(hi)


@lru_cache(maxsize=1)
def default_config() -> ModelsConfig:
    return load_models_config()


def default_bounds() -> Bounds:
    return default_config().bounds


def predictor_history_steps(bounds: Bounds | None = None) -> int:
    """Steps of history fed to the predictor: the fitted window, never above the bound T."""
    bounds = bounds or default_bounds()
    steps = int(default_config().section("predictor").get("history_steps", bounds.T))
    if steps < 1:
        raise ConfigError(f"predictor.history_steps must be >= 1, got {steps}")
    return min(steps, bounds.T)


def check_seed(name: str, value: object) -> int:
    """A random seed as every generator here takes it: an integer in [0, 2**63)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ConfigError(f"{name} must be an integer >= 0 and < 2**63, got {value!r}")
    return value


def integer(name: str, value: object) -> int:
    """An integer setting as written: 6.9, true or "six" is a typo, not 6."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    return value


def number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    return float(value)
