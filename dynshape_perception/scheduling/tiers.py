"""Priority tiers, their deadlines and the shedding policy: one validated, live-tunable config."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from dynshape_perception.errors import ConfigError
from dynshape_perception.paramspec import check_fields, param, read


class Tier(IntEnum):
    """Lower value, higher priority."""

    COLLISION = 1
    PLANNING = 2
    COMFORT = 3
    BEST_EFFORT = 4


TIERS: tuple[Tier, ...] = tuple(Tier)
# The nodes' parameters of the config are tiers.<field>.
PREFIX = "tiers"


def as_tier(value: int | Tier) -> Tier:
    try:
        return Tier(int(value))
    except (ValueError, TypeError) as err:
        raise ConfigError(f"tier must be one of {[int(t) for t in TIERS]}, got {value!r}") from err


@dataclass(frozen=True)
class TierConfig:
    """Deadlines per tier and the overload policy; every field is a live-tunable parameter."""

    # Ranges are what rclpy enforces on set; every field is live.
    collision_deadline_ms: float = param(
        10.0, "tier 1 (collision) deadline after arrival, ms", low=0.1, high=10_000.0
    )
    planning_deadline_ms: float = param(
        100.0, "tier 2 (planning) deadline after arrival, ms", low=0.1, high=60_000.0
    )
    comfort_deadline_ms: float = param(
        1000.0, "tier 3 (comfort) deadline after arrival, ms", low=0.1, high=600_000.0
    )
    best_effort_deadline_ms: float = param(
        5000.0, "tier 4 (best effort) deadline after arrival, ms", low=0.1, high=3.6e6
    )
    max_queue_depth: int = param(
        32, "queued units per tier above which tiers 2-4 refuse work", low=1, high=100_000
    )
    shed_infeasible: bool = param(
        True, "refuse tier 2-4 work estimated to finish past its deadline"
    )
    shed_expired: bool = param(
        True, "drop tier 2-4 work at dispatch once it cannot meet its deadline"
    )
    degrade_enter_backlog_ms: float = param(
        100.0, "tier 2-4 backlog that enters degraded mode, ms", low=0.0, high=1e6
    )
    degrade_exit_backlog_ms: float = param(
        30.0, "backlog below which degraded mode may end, ms", low=0.0, high=1e6
    )
    degrade_hold_s: float = param(
        1.0, "degraded mode lasts this long after the last shed or miss, s", low=0.0, high=3600.0
    )
    far_field_keep_fraction: float = param(
        0.5, "share of far-field points kept while degraded", low=0.01, high=1.0
    )
    chunk_budget_ms: float = param(
        5.0, "target length of one chunk of split tier 2-4 work, ms", low=0.1, high=1000.0
    )
    starvation_frames: int = param(
        5,
        "tier 2-4 units refused or expired since the tier last completed one, after which "
        "its newest unit is admitted whatever its estimate (an ERROR in diagnostics)",
        low=1,
        high=10_000,
    )

    def __post_init__(self) -> None:
        check_fields(self)
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
    def from_mapping(cls, raw: Mapping[str, Any]) -> TierConfig:
        """Build from YAML or ROS parameters; unknown keys and bad values raise ConfigError."""
        return cls().with_changes(raw)

    def with_changes(self, changes: Mapping[str, Any]) -> TierConfig:
        """A validated copy with ``changes`` applied (the on-set callback of a node)."""
        known = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - set(known))
        if unknown:
            raise ConfigError(f"unknown tier settings: {unknown}; known: {sorted(known)}")
        return read(
            TierConfig, {f"{PREFIX}.{name}": v for name, v in changes.items()}, PREFIX, self
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
