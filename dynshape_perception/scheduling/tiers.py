"""Priority tiers, their deadlines and the shedding policy: one validated, live-tunable config."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from dynshape_perception.errors import ConfigError


class Tier(IntEnum):
    """Lower value, higher priority."""

    COLLISION = 1
    PLANNING = 2
    COMFORT = 3
    BEST_EFFORT = 4


TIERS: tuple[Tier, ...] = tuple(Tier)


def as_tier(value: int | Tier) -> Tier:
    try:
        return Tier(int(value))
    except (ValueError, TypeError) as err:
        raise ConfigError(f"tier must be one of {[int(t) for t in TIERS]}, got {value!r}") from err


@dataclass(frozen=True)
class ParamSpec:
    """What a node needs to declare one config field as a ROS parameter."""

    name: str
    default: float | int | bool
    description: str
    minimum: float | int | None = None
    maximum: float | int | None = None


# name -> (description, minimum, maximum); ranges are what rclpy enforces on set.
_SPECS: dict[str, tuple[str, float | None, float | None]] = {
    "collision_deadline_ms": ("tier 1 (collision) deadline after arrival, ms", 0.1, 10_000.0),
    "planning_deadline_ms": ("tier 2 (planning) deadline after arrival, ms", 0.1, 60_000.0),
    "comfort_deadline_ms": ("tier 3 (comfort) deadline after arrival, ms", 0.1, 600_000.0),
    "best_effort_deadline_ms": ("tier 4 (best effort) deadline after arrival, ms", 0.1, 3.6e6),
    "max_queue_depth": ("queued units per tier above which tiers 2-4 refuse work", 1, 100_000),
    "shed_infeasible": ("refuse tier 2-4 work estimated to finish past its deadline", None, None),
    "shed_expired": ("drop tier 2-4 work at dispatch once it cannot meet its deadline", None, None),
    "degrade_enter_backlog_ms": ("tier 2-4 backlog that enters degraded mode, ms", 0.0, 1e6),
    "degrade_exit_backlog_ms": ("backlog below which degraded mode may end, ms", 0.0, 1e6),
    "degrade_hold_s": ("degraded mode lasts this long after the last shed or miss, s", 0.0, 3600.0),
    "far_field_keep_fraction": ("share of far-field points kept while degraded", 0.01, 1.0),
    "chunk_budget_ms": ("target length of one chunk of split tier 2-4 work, ms", 0.1, 1000.0),
    "starvation_frames": (
        "tier 2-4 units refused or expired since the tier last completed one, after which "
        "its newest unit is admitted whatever its estimate (an ERROR in diagnostics)",
        1,
        10_000,
    ),
}


@dataclass(frozen=True)
class TierConfig:
    """Deadlines per tier and the overload policy; every field is a live-tunable parameter."""

    collision_deadline_ms: float = 10.0
    planning_deadline_ms: float = 100.0
    comfort_deadline_ms: float = 1000.0
    best_effort_deadline_ms: float = 5000.0
    max_queue_depth: int = 32
    shed_infeasible: bool = True
    shed_expired: bool = True
    degrade_enter_backlog_ms: float = 100.0
    degrade_exit_backlog_ms: float = 30.0
    degrade_hold_s: float = 1.0
    far_field_keep_fraction: float = 0.5
    chunk_budget_ms: float = 5.0
    starvation_frames: int = 5

    def __post_init__(self) -> None:
        for spec in self.parameter_specs():
            value = getattr(self, spec.name)
            if isinstance(spec.default, bool):
                if not isinstance(value, bool):
                    raise ConfigError(f"{spec.name} must be a bool, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{spec.name} must be a number, got {value!r}")
            if isinstance(spec.default, int) and not isinstance(value, int):
                raise ConfigError(f"{spec.name} must be an integer, got {value!r}")
            if not math.isfinite(value):
                raise ConfigError(f"{spec.name} must be finite, got {value!r}")
            if spec.minimum is not None and value < spec.minimum:
                raise ConfigError(f"{spec.name} must be >= {spec.minimum}, got {value!r}")
            if spec.maximum is not None and value > spec.maximum:
                raise ConfigError(f"{spec.name} must be <= {spec.maximum}, got {value!r}")
        deadlines = [self.deadline_ms(t) for t in TIERS]
        if deadlines != sorted(deadlines):
            raise ConfigError(
                f"tier deadlines must not decrease from tier 1 to tier 4, got {deadlines} ms"
            )
        if self.degrade_exit_backlog_ms > self.degrade_enter_backlog_ms:
            raise ConfigError(
                f"degrade_exit_backlog_ms ({self.degrade_exit_backlog_ms}) must not exceed "
                f"degrade_enter_backlog_ms ({self.degrade_enter_backlog_ms})"
            )

    def deadline_ms(self, tier: int | Tier) -> float:
        field = ("collision", "planning", "comfort", "best_effort")[as_tier(tier) - 1]
        return float(getattr(self, f"{field}_deadline_ms"))

    def deadline_s(self, tier: int | Tier) -> float:
        return self.deadline_ms(tier) / 1000.0

    @classmethod
    def parameter_specs(cls) -> list[ParamSpec]:
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        return [
            ParamSpec(name, defaults[name], text, lo, hi)  # type: ignore[arg-type]
            for name, (text, lo, hi) in _SPECS.items()
        ]

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> TierConfig:
        """Build from YAML or ROS parameters; unknown keys and bad values raise ConfigError."""
        return cls().with_changes(raw)

    def with_changes(self, changes: Mapping[str, Any]) -> TierConfig:
        """A validated copy with ``changes`` applied (the on-set callback of a node)."""
        known = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - set(known))
        if unknown:
            raise ConfigError(f"unknown tier settings: {unknown}; known: {sorted(known)}")
        values: dict[str, Any] = {}
        for name, value in changes.items():
            default = known[name].default
            # YAML and ROS hand over 10 for 10.0; an int where a float is expected is fine.
            if isinstance(default, float) and type(value) is int:
                value = float(value)
            values[name] = value
        return dataclasses.replace(self, **values)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
