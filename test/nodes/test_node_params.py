"""The parameter table against both deployment YAMLs, rclpy descriptors and the core's checks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from dynshape_perception import parameters
from dynshape_perception.config import default_bounds, predictor_history_steps
from dynshape_perception.errors import ConfigError
from dynshape_perception.nodes.base import descriptor
from dynshape_perception.tools.replay.params import flatten

pytestmark = pytest.mark.ros

CONFIG = Path(__file__).resolve().parents[2] / "config"
PARAM_FILES = sorted(CONFIG.glob("*.param.yaml"))


def _yaml_params(path: Path) -> dict[str, Any]:
    """The file's parameters of the package (diagnostic_updater declares its own)."""
    doc = yaml.safe_load(path.read_text())
    assert list(doc) == ["/**"], f"{path.name} must configure every node with /**"
    values = flatten(doc["/**"]["ros__parameters"])
    assert set(values) >= parameters.LIBRARY_PARAMETERS - {"diagnostic_updater.use_fqn"}
    return {k: v for k, v in values.items() if k not in parameters.LIBRARY_PARAMETERS}


def test_both_deployments_exist() -> None:
    assert [p.name for p in PARAM_FILES] == ["jetson_orin.param.yaml", "x86_dev.param.yaml"]


@pytest.mark.parametrize("path", PARAM_FILES, ids=lambda p: p.name)
def test_yaml_keys_are_exactly_the_declared_parameters(path: Path) -> None:
    declared = set(parameters.all_specs())
    assert declared == set().union(*(parameters.node_specs(n) for n in parameters.NODE_GROUPS))
    keys = set(_yaml_params(path))
    assert keys - declared == set(), "keys no node declares"
    assert declared - keys == set(), "declared parameters missing from the YAML"


@pytest.mark.parametrize("path", PARAM_FILES, ids=lambda p: p.name)
def test_yaml_values_have_the_declared_types_and_pass_validation(path: Path) -> None:
    values = _yaml_params(path)
    specs = parameters.all_specs()
    for name, value in values.items():
        # rclpy refuses an int for a double parameter: 2 must be written 2.0.
        assert type(value) is type(specs[name].default), name
    parameters.validate(values, specs)
    for node in parameters.NODE_GROUPS:
        own = parameters.node_specs(node)
        parameters.validate({k: v for k, v in values.items() if k in own}, own)


def test_x86_yaml_holds_the_code_defaults() -> None:
    values = _yaml_params(CONFIG / "x86_dev.param.yaml")
    assert values == {name: spec.default for name, spec in parameters.all_specs().items()}


def test_jetson_yaml_targets_aarch64_with_tighter_jit_bounds() -> None:
    jetson = _yaml_params(CONFIG / "jetson_orin.param.yaml")
    x86 = _yaml_params(CONFIG / "x86_dev.param.yaml")
    assert jetson["target_profile"] == "aarch64" and x86["target_profile"] == "x86_64"
    assert jetson["jit.max_bytes"] < x86["jit.max_bytes"]


def test_structural_parameters_are_read_only_and_tunables_are_not() -> None:
    specs = parameters.all_specs()
    for name in (
        "target_profile",
        "model_cache_dir",
        "weights_dir",
        "jit.mode",
        "jit.compile_mode",
        "tracker.input_type",
        *(n for n in specs if n.startswith("bounds.")),
    ):
        assert specs[name].read_only, name
    for name in (
        "segmentation.score_threshold",
        "segmentation.cell_size_m",
        "tracking.gate_distance_m",
        "tracking.min_affinity",
        "jit.hotness_threshold",
        "jit.max_entries",
        "jit.max_bytes",
    ):
        assert not specs[name].read_only, name


def test_descriptors_carry_ranges_and_read_only() -> None:
    specs = parameters.all_specs()
    score = descriptor(specs["segmentation.score_threshold"])
    assert score.floating_point_range[0].from_value == 0.0
    assert score.floating_point_range[0].to_value == 1.0
    assert not score.read_only and score.description
    hot = descriptor(specs["jit.hotness_threshold"])
    assert hot.integer_range[0].from_value == 1 and not hot.floating_point_range
    points = descriptor(specs["bounds.max_points"])
    assert points.read_only and points.integer_range[0].to_value == default_bounds().P
    mode = descriptor(specs["jit.mode"])
    assert "adaptive" in mode.additional_constraints


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("segmentation.score_threshold", 1.5, "<= 1.0"),
        ("segmentation.cell_size_m", math.nan, "finite"),
        ("tracking.gate_distance_m", 2, "must be float"),
        ("jit.mode", "eager", "one of"),
        ("jit.hotness_threshold", 0, ">= 1"),
    ],
)
def test_bad_values_are_refused_with_a_reason(name: str, value: Any, match: str) -> None:
    specs = parameters.all_specs()
    values = {n: s.default for n, s in specs.items()}
    values[name] = value
    with pytest.raises(ConfigError, match=match):
        parameters.validate(values, specs)


def test_cross_parameter_check() -> None:
    specs = parameters.all_specs()
    values: dict[str, parameters.Value] = {n: s.default for n, s in specs.items()}
    values["bounds.max_history_steps"] = 8
    values["prediction.min_history_steps"] = 9
    with pytest.raises(ConfigError, match="no agent could ever be predicted"):
        parameters.validate(values, specs)


def test_values_reach_the_core_objects() -> None:
    values: dict[str, parameters.Value] = {n: s.default for n, s in parameters.all_specs().items()}
    values.update(
        {
            "segmentation.cell_size_m": 0.3,
            "tracking.gate_distance_m": 4.0,
            "jit.hotness_threshold": 3,
            "bounds.max_points": 1000,
            "points.subsample_over_bound": True,
        }
    )
    pipeline = parameters.pipeline_params(values)
    assert pipeline.cluster.cell_size_m == 0.3 and pipeline.tracker.gate_distance_m == 4.0
    assert pipeline.subsample_over_bound
    assert parameters.jit_config(values).hotness_threshold == 3
    assert parameters.bounds_from(values).P == 1000


def test_min_history_is_checked_against_the_predictor_steps() -> None:
    specs = parameters.node_specs("prediction_node")
    values: dict[str, parameters.Value] = {n: s.default for n, s in specs.items()}
    steps = predictor_history_steps(parameters.bounds_from(values))
    assert steps < default_bounds().T
    values["prediction.min_history_steps"] = steps
    parameters.validate(values, specs)
    values["prediction.min_history_steps"] = steps + 1
    with pytest.raises(ConfigError, match=f"the {steps} history steps the predictor gets"):
        parameters.validate(values, specs)


@pytest.mark.parametrize("node", ["pointcloud_node", "tracker_node"])
def test_nodes_that_do_not_predict_start_with_one_history_step(node: str) -> None:
    specs = parameters.node_specs(node)
    assert "prediction.min_history_steps" not in specs
    values: dict[str, parameters.Value] = {n: s.default for n, s in specs.items()}
    values["bounds.max_history_steps"] = 1
    parameters.validate(values, specs)
    predicting = parameters.node_specs("prediction_node")
    values = {n: s.default for n, s in predicting.items()}
    values["bounds.max_history_steps"] = 1
    with pytest.raises(ConfigError, match="no agent could ever be predicted"):
        parameters.validate(values, predicting)


def test_input_screening_parameters_carry_units_and_ranges() -> None:
    specs = parameters.all_specs()
    scale = descriptor(specs["points.intensity_scale"])
    assert specs["points.intensity_scale"].default == 1.0
    assert 0.0 < scale.floating_point_range[0].from_value <= 1.0 / 65535.0
    for name, default in (
        ("odometry.max_extrapolation_s", 0.5),
        ("stamps.future_tolerance_s", 5.0),
        ("stamps.jump_back_tolerance_s", 10.0),
    ):
        assert specs[name].default == default and descriptor(specs[name]).floating_point_range
    for node in ("tracker_node", "prediction_node", "perception_pipeline"):
        assert "stamps.future_tolerance_s" in parameters.node_specs(node)
    assert "points.intensity_scale" in parameters.node_specs("pointcloud_node")


def test_every_declaration_is_its_descriptor() -> None:
    for name, spec in parameters.all_specs().items():
        desc = descriptor(spec)
        assert (desc.description, desc.read_only) == (spec.description, spec.read_only), name
        ranges = [*desc.floating_point_range, *desc.integer_range]
        if isinstance(spec.default, bool) or spec.low is None or spec.high is None:
            assert not ranges, name
        else:
            assert [(r.from_value, r.to_value) for r in ranges] == [(spec.low, spec.high)], name
        assert all(choice in desc.additional_constraints for choice in spec.choices), name
