"""One node parameter: its type, default, range or choices, and the check of a value."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dynshape_perception.errors import ConfigError

Value = bool | int | float | str


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its default also fixes its type (rclpy rejects other types)."""

    name: str
    default: Value
    description: str
    read_only: bool = False
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    def check(self, value: Value) -> None:
        """Raise ConfigError unless ``value`` fits; rclpy enforces ranges too, this adds choices."""
        if type(value) is not type(self.default):
            raise ConfigError(f"{self.name} must be {type(self.default).__name__}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{self.name} must be one of {list(self.choices)}, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{self.name} must be finite, got {value!r}")
            if self.low is not None and value < self.low:
                raise ConfigError(f"{self.name} must be >= {self.low}, got {value!r}")
            if self.high is not None and value > self.high:
                raise ConfigError(f"{self.name} must be <= {self.high}, got {value!r}")
