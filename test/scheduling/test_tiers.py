"""Tier config: defaults, mapping round trip, validation of values and of their relations."""

from __future__ import annotations

import dataclasses

import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.paramspec import declarations
from dynshape_perception.scheduling.tiers import Tier, TierConfig, as_tier


def test_defaults_are_the_reference_deadlines() -> None:
    config = TierConfig()
    assert [config.deadline_ms(t) for t in Tier] == [10.0, 100.0, 1000.0, 5000.0]
    assert config.deadline_s(Tier.COLLISION) == pytest.approx(0.010)


def test_from_mapping_coerces_integers_and_round_trips() -> None:
    config = TierConfig.from_mapping({"collision_deadline_ms": 8, "max_queue_depth": 4})
    assert config.collision_deadline_ms == 8.0
    assert isinstance(config.collision_deadline_ms, float)
    assert TierConfig.from_mapping(config.as_dict()) == config


def test_unknown_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown tier settings.*collision_deadline"):
        TierConfig.from_mapping({"collision_deadline": 5.0})


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"collision_deadline_ms": 0.0}, "collision_deadline_ms must be >= 0.1"),
        ({"collision_deadline_ms": float("nan")}, "must be finite"),
        ({"max_queue_depth": 2.5}, "max_queue_depth must be an integer"),
        ({"shed_expired": 1}, "shed_expired must be a bool"),
        ({"far_field_keep_fraction": 1.5}, "far_field_keep_fraction must be <= 1.0"),
        ({"planning_deadline_ms": 5.0}, "must not decrease from tier 1 to tier 4"),
        ({"degrade_exit_backlog_ms": 500.0}, "must not exceed degrade_enter_backlog_ms"),
        ({"chunk_budget_ms": "5"}, "chunk_budget_ms must be a number"),
    ],
)
def test_invalid_values_are_refused(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TierConfig().with_changes(changes)


def test_a_refused_change_leaves_the_config_as_it_was() -> None:
    config = TierConfig(planning_deadline_ms=50.0)
    with pytest.raises(ConfigError):
        config.with_changes({"planning_deadline_ms": 1.0})
    assert config.planning_deadline_ms == 50.0


def test_parameter_specs_cover_every_field_with_its_default() -> None:
    specs = declarations(TierConfig)
    fields = {f.name: f.default for f in dataclasses.fields(TierConfig)}
    assert set(specs) == set(fields)
    for name, spec in specs.items():
        assert spec.default == fields[name]
        assert spec.description


def test_as_tier_refuses_unknown_tiers() -> None:
    assert as_tier(3) is Tier.COMFORT
    with pytest.raises(ConfigError, match="tier must be one of"):
        as_tier(5)
